//! Taking turns on a shared card: while the coordinator says another job has the card, this
//! job's launches wait at the launch hook.
//!
//! When the jobs on a card need more memory together than it has, the coordinator lets the
//! jobs that fit run and pauses the others for a turn (docs/sharing.md): a paused job gives its
//! memory back down to its floor, and its kernels would only thrash the little it keeps. The
//! planning thread, which reads the coordinator's word, grants the pause as a *lease*
//! ([`hold_until`]) that it renews every poll; if the planning thread or the coordinator goes
//! away the lease runs out within [`LEASE`] and launches go on, so no pause can outlive the
//! coordinator's will to keep it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tensile_protocol::process::monotonic_ns;

/// How long one renewal of a pause lasts: several polls of the planning thread.
pub const LEASE: Duration = Duration::from_millis(500);

/// `CLOCK_MONOTONIC` ns until which launches wait; 0: none.
static HELD_UNTIL: AtomicU64 = AtomicU64::new(0);
/// Nanoseconds launches spent waiting, in all.
static WAITED_NS: AtomicU64 = AtomicU64::new(0);

/// Launches wait until `until_ns` (`CLOCK_MONOTONIC`) unless renewed or released.
pub fn hold_until(until_ns: u64) {
    HELD_UNTIL.store(until_ns, Ordering::Release);
}

/// Launches go on.
pub fn release() {
    HELD_UNTIL.store(0, Ordering::Release);
}

/// Whether launches are held now.
pub fn held() -> bool {
    let until = HELD_UNTIL.load(Ordering::Acquire);
    until != 0 && monotonic_ns() < until
}

/// Called by the launch hook: returns at once unless a pause is in force, then waits (in
/// 1 ms sleeps) until it is released or runs out. One relaxed load when not paused.
#[inline]
pub fn wait_for_turn() {
    if HELD_UNTIL.load(Ordering::Relaxed) == 0 {
        return;
    }
    wait_slow();
}

#[cold]
fn wait_slow() {
    let started = monotonic_ns();
    while held() {
        std::thread::sleep(Duration::from_millis(1));
    }
    // A lease that ran out without a release (the planning thread or the coordinator went
    // away): clear it, so that later launches take the one-load path again. A renewal made
    // meanwhile stores another deadline and wins.
    let until = HELD_UNTIL.load(Ordering::Acquire);
    if until != 0 && monotonic_ns() >= until {
        let _ = HELD_UNTIL.compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
    WAITED_NS.fetch_add(monotonic_ns().saturating_sub(started), Ordering::Relaxed);
}

/// Time launches have waited for their turn, ns.
pub fn waited_ns() -> u64 {
    WAITED_NS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_launch_waits_while_held_and_goes_on_when_released_or_the_lease_runs_out() {
        // Released by another thread.
        hold_until(monotonic_ns() + 10_000_000_000);
        assert!(held());
        let releaser = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(30));
            release();
        });
        let t = Instant::now();
        wait_for_turn();
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "{:?}",
            t.elapsed()
        );
        releaser.join().unwrap();
        assert!(!held());
        // A lease nobody renews runs out by itself.
        hold_until(monotonic_ns() + 40_000_000);
        let t = Instant::now();
        wait_for_turn();
        assert!(
            t.elapsed() >= Duration::from_millis(35),
            "{:?}",
            t.elapsed()
        );
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(waited_ns() >= 60_000_000);
        assert_eq!(
            HELD_UNTIL.load(Ordering::Relaxed),
            0,
            "a lease that ran out is cleared for the fast path"
        );
        release();
        let t = Instant::now();
        wait_for_turn();
        assert!(t.elapsed() < Duration::from_millis(5));
    }
}
