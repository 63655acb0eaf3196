//! What the plan executor did, counted (relaxed atomics: read at exit and by tests).

use std::sync::atomic::{AtomicU64, Ordering};

/// The executor's counters.
#[derive(Debug, Default)]
pub struct Counters {
    /// Plans installed.
    pub plans_loaded: AtomicU64,
    /// Plans dropped (a kernel mismatch, or replaced by none).
    pub plans_dropped: AtomicU64,
    /// Launches whose kernel was not the plan's at their position.
    pub mismatches: AtomicU64,
    /// Steps whose verb ran without error.
    pub steps_done: AtomicU64,
    /// Steps whose role did not resolve (missing, another size, freed, out of bounds), or
    /// whose piece holds no whole page to swap out.
    pub steps_skipped: AtomicU64,
    /// Steps dropped because the worker's queue was full.
    pub steps_dropped: AtomicU64,
    /// Steps whose verb failed.
    pub steps_failed: AtomicU64,
    /// Verb calls that failed.
    pub verb_errors: AtomicU64,
    /// Pages the plan's swap-outs started moving to the host.
    pub pages_out: AtomicU64,
    /// Pages the plan's prefetches started moving to the device.
    pub pages_in: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecutorStats {
    pub plans_loaded: u64,
    pub plans_dropped: u64,
    pub mismatches: u64,
    pub steps_done: u64,
    pub steps_skipped: u64,
    pub steps_dropped: u64,
    pub steps_failed: u64,
    pub verb_errors: u64,
    pub pages_out: u64,
    pub pages_in: u64,
}

impl Counters {
    /// The counters now.
    pub fn snapshot(&self) -> ExecutorStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ExecutorStats {
            plans_loaded: l(&self.plans_loaded),
            plans_dropped: l(&self.plans_dropped),
            mismatches: l(&self.mismatches),
            steps_done: l(&self.steps_done),
            steps_skipped: l(&self.steps_skipped),
            steps_dropped: l(&self.steps_dropped),
            steps_failed: l(&self.steps_failed),
            verb_errors: l(&self.verb_errors),
            pages_out: l(&self.pages_out),
            pages_in: l(&self.pages_in),
        }
    }
}

impl std::fmt::Display for ExecutorStats {
    /// The line logged at exit (tests parse it: keep the `name value` pairs).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plan executor: plans_loaded {} plans_dropped {} mismatches {} steps_done {} \
             steps_skipped {} steps_dropped {} steps_failed {} pages_out {} pages_in {}",
            self.plans_loaded,
            self.plans_dropped,
            self.mismatches,
            self.steps_done,
            self.steps_skipped,
            self.steps_dropped,
            self.steps_failed,
            self.pages_out,
            self.pages_in
        )
    }
}
