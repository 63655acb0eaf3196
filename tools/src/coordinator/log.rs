//! The coordinator's log: one line per event (a job joined, left, was planned), stamped with
//! UTC time, to a file or stderr. Writing the log never stops the coordinator.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where log lines go.
pub struct Log {
    out: Box<dyn Write + Send>,
}

impl Log {
    pub fn new(out: Box<dyn Write + Send>) -> Log {
        Log { out }
    }

    /// Writes one line (a line break in `message` is replaced, so one event stays one line).
    pub fn line(&mut self, message: &str) {
        let stamp = utc_stamp(SystemTime::now());
        let message = message.replace('\n', " ");
        let _ = writeln!(self.out, "{stamp} {message}");
        let _ = self.out.flush();
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc_stamp(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stamps_are_utc_calendar_time() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_588_924_123);
        assert_eq!(utc_stamp(t), "2026-11-25T06:42:04.123Z");
        assert_eq!(utc_stamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // A leap day.
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc_stamp(t), "2000-02-29T00:00:00.000Z");
    }
}
