//! Out-of-memory failures by cause: the first failure of each cause is logged at ERROR with
//! the full explanation, later ones only counted (at DEBUG), and the counts are logged once at
//! shutdown. A training job that fails ten thousand allocations gets a handful of lines.

use std::fmt;

use tensile_driver_abi::{CUresult, CUDA_ERROR_OUT_OF_MEMORY};

/// Why the manager could not serve a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureCause {
    /// One request needs more device memory than the whole budget.
    Budget,
    /// The pinned host pool is full (its cap) or the driver refused pinned memory.
    HostPool,
    /// Every evictable page was pinned by in-flight calls for longer than the pin wait.
    PinnedByCalls,
    /// The arena's address space has no hole large enough.
    Fragmentation,
    /// None of the above: the manager's own state kept a request waiting too long, or a
    /// request failed for want of memory without a cause recorded. A bug, reported as one.
    Internal,
}

impl FailureCause {
    const ALL: [FailureCause; 5] = [
        FailureCause::Budget,
        FailureCause::HostPool,
        FailureCause::PinnedByCalls,
        FailureCause::Fragmentation,
        FailureCause::Internal,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureCause::Budget => "device budget",
            FailureCause::HostPool => "host pool",
            FailureCause::PinnedByCalls => "pages pinned by in-flight calls",
            FailureCause::Fragmentation => "arena fragmentation",
            FailureCause::Internal => "manager's own state (a bug: please report it)",
        })
    }
}

/// Failure counts by cause, and the log-once rule.
#[derive(Debug, Default)]
pub struct FailureLog {
    counts: [u64; 5],
}

impl FailureLog {
    /// Counts one failure of `cause`, logs it if it is the first of its cause, and returns
    /// the error code to hand to the application.
    pub fn record(&mut self, cause: FailureCause, what: fmt::Arguments<'_>) -> CUresult {
        let n = &mut self.counts[cause.index()];
        *n += 1;
        if *n == 1 {
            tracing::error!(
                "tensile: out of memory ({cause}): {what} (later failures of this cause are \
                 counted and reported at exit)"
            );
        } else {
            tracing::debug!("tensile: out of memory ({cause}): {what}");
        }
        CUDA_ERROR_OUT_OF_MEMORY
    }

    /// Failures so far, all causes together.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Failures so far, by cause (causes with none left out).
    pub fn summary(&self) -> Vec<(FailureCause, u64)> {
        FailureCause::ALL
            .iter()
            .map(|&c| (c, self.counts[c.index()]))
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// One line per cause that failed at least once (at shutdown).
    pub fn log_summary(&self) {
        for (cause, n) in self.summary() {
            tracing::warn!("tensile: {n} out-of-memory failures caused by the {cause}");
        }
    }
}

/// Bytes in human units for messages: `8 MiB`, `1.5 GiB`, `512 bytes`.
pub fn human_bytes(bytes: usize) -> String {
    const UNITS: [(&str, usize); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, unit) in UNITS {
        if bytes >= unit {
            let whole = bytes / unit;
            let tenths = (bytes % unit) * 10 / unit;
            return if tenths == 0 {
                format!("{whole} {name}")
            } else {
                format!("{whole}.{tenths} {name}")
            };
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_counted_separately() {
        let mut log = FailureLog::default();
        for _ in 0..3 {
            assert_eq!(
                log.record(FailureCause::HostPool, format_args!("full")),
                CUDA_ERROR_OUT_OF_MEMORY
            );
        }
        log.record(FailureCause::PinnedByCalls, format_args!("pinned"));
        assert_eq!(
            log.summary(),
            vec![
                (FailureCause::HostPool, 3),
                (FailureCause::PinnedByCalls, 1)
            ]
        );
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(8 << 20), "8 MiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
    }
}
