//! Who a process is, beyond its pid: the pid and the kernel's record of when it started.
//!
//! A slot in the shared segment names its owner by both, because pids are reused: a slot
//! whose pid now belongs to another process (a different start time) belongs to a dead job.
//! The start time is field 22 of `/proc/PID/stat` (clock ticks since boot), which no process
//! can change.
//!
//! Also the one clock both sides stamp heartbeats with: `CLOCK_MONOTONIC`, which on Linux is
//! one clock for every process of the machine (not per process), so ages compare across them.

use std::io;

/// A process, told apart from a later one that reuses its pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessIdentity {
    /// The process id.
    pub pid: u32,
    /// Field 22 of `/proc/PID/stat`: when it started, in clock ticks since boot.
    pub start_time: u64,
}

impl ProcessIdentity {
    /// This process.
    pub fn current() -> io::Result<ProcessIdentity> {
        let pid = std::process::id();
        let start_time = start_time_of(pid)?;
        Ok(ProcessIdentity { pid, start_time })
    }

    /// Whether this process (not merely its pid) still runs. A pid that exists but whose
    /// start time cannot be read (a `/proc` mounted with `hidepid`) counts as running: a live
    /// job must never lose its slot to a guess.
    pub fn is_running(&self) -> bool {
        if !pid_exists(self.pid) {
            return false;
        }
        match start_time_of(self.pid) {
            Ok(t) => t == self.start_time,
            Err(e) => e.kind() != io::ErrorKind::NotFound,
        }
    }
}

/// Whether any process has `pid` (`kill(pid, 0)` is not `ESRCH`).
pub fn pid_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Field 22 of `/proc/PID/stat`.
pub fn start_time_of(pid: u32) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_start_time(&stat).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat has no start time"),
        )
    })
}

/// The command name (field 2) may hold spaces and parentheses, so fields are counted after
/// the last `)`: the first one there is field 3.
fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
}

/// `CLOCK_MONOTONIC` in nanoseconds: the heartbeat clock of every process on the machine.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_even_when_the_name_has_parentheses() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 \
                    10 18446744073709551615";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("42 (x) S 1"), None);
    }

    #[test]
    fn this_process_runs_and_a_changed_start_time_does_not() {
        let me = ProcessIdentity::current().unwrap();
        assert!(me.is_running());
        let reused = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!reused.is_running());
    }
}
