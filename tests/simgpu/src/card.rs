//! The card's engines: when each piece of stream work may run and how long it takes.
//!
//! Each simulated device has one compute engine (a number of kernel slots,
//! [`config::kernel_concurrency`], default 1), one host-to-device copy engine and one
//! device-to-host copy engine, shared by every stream of the process on that device. Each is a
//! *busy-until* time on the `CLOCK_MONOTONIC` clock. A stream worker that executes an operation first
//! reserves its interval on the engine it needs (it starts when the engine is free, or when the
//! operation is ready, whichever is later, and lasts as long as the bandwidths of
//! [`config::Rates`] say), sleeps until the interval's end, and only then applies the
//! operation's effect, so work that races ahead of it sees the old data, as on a card. An
//! operation is ready when it was queued, the one before it on its stream ended and what it
//! waits for ended (`stream.rs`), all on this clock: the simulator's own cost per operation
//! does not accumulate as long as the modelled durations leave room for it.
//!
//! - Two copies in one direction take turns: two 64 MiB uploads on two streams take twice as
//!   long as one.
//! - Copies in both directions overlap, capped in total ([`config::Rates::duplex`]): a copy
//!   reserved while the other direction is busy runs at what the cap leaves it (92 - 55 =
//!   37 GB/s on the H100) for as long as that copy lasts, then at its own rate. The earlier copy
//!   keeps its reservation; the cap holds throughout, and both directions at once never take
//!   longer than one after the other.
//! - Pageable host memory is staged by the driver ([`config::Rates::pageable`]); copies and
//!   memsets within device memory run at [`config::Rates::device`] and use no copy engine.
//! - A kernel that reads or writes host-located memory (pinned host memory, or a virtual range
//!   mapped to a host allocation) pays those bytes at [`config::Rates::host_access`] on top of
//!   its duration; they are counted ([`host_access_bytes`]) so that a tensor the shim left on
//!   the host shows in time, not only in data.
//!
//! The state is one small lock over plain integers ([`Engines`]): this process's own, or, on a
//! card shared by processes (`TENSILE_SIM_CARD`, [`crate::shared_card`]), the one in the
//! card's shared memory, so that jobs on one card take turns on its engines as streams do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::config;

/// Which way a copy goes over the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    ToDevice,
    ToHost,
}

/// The most kernel slots tracked (a setting above it is clamped).
pub const MAX_KERNEL_SLOTS: usize = 128;

/// Busy-until times, nanoseconds on `CLOCK_MONOTONIC` (0: idle since the start).
#[repr(C)]
#[derive(Debug)]
pub struct Engines {
    pub compute: [u64; MAX_KERNEL_SLOTS],
    pub to_device: u64,
    pub to_host: u64,
}

/// Each device's engines (a private card).
static ENGINES: [Mutex<Engines>; config::MAX_DEVICES] = [const {
    Mutex::new(Engines {
        compute: [0; MAX_KERNEL_SLOTS],
        to_device: 0,
        to_host: 0,
    })
}; config::MAX_DEVICES];

static HOST_ACCESS_BYTES: AtomicU64 = AtomicU64::new(0);

/// Runs `f` on the engines of `device`, under their lock.
fn with_engines<R>(device: usize, f: impl FnOnce(&mut Engines) -> R) -> R {
    match crate::shared_card::current(device) {
        Some(card) => card.with_engines(f),
        None => f(&mut ENGINES[device.min(config::MAX_DEVICES - 1)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())),
    }
}

/// Now on `CLOCK_MONOTONIC`, in nanoseconds (the clock every process sees alike).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps until `CLOCK_MONOTONIC` reaches `end_ns`, or a little after: the engines keep time on
/// that clock, so a late wake delays what this worker does next, not when the card's next
/// operation starts or ends (spinning the last 300 µs of every operation took CPU time the two
/// cores' other threads needed: planned runs were no faster).
pub fn sleep_until(end_ns: u64) {
    loop {
        let now = now_ns();
        if now >= end_ns {
            return;
        }
        std::thread::sleep(Duration::from_nanos(end_ns - now));
    }
}

/// How late a sleep wakes on this machine, learned (a moving average, in ns): [`wait_out`]
/// asks for that much less. On this two-core VM a thread asleep wakes 100 to 250 µs after the
/// time it asked for, whatever the length of the sleep (`nanosleep` of 0.3, 1 and 3 ms, idle,
/// default timer slack): every VMM call the simulator holds came that late, on the card's
/// clock 6 to 16 µs at time scale 16, which a thread making remaps one after another waited
/// out once per call. Spinning the last 300 µs instead cost the two cores' other threads
/// (docs/rerun.md, "Session 28").
static OVERSLEEP_NS: AtomicU64 = AtomicU64::new(0);

/// The most one late wake counts for in [`OVERSLEEP_NS`] (a thread descheduled for long).
const MAX_OVERSLEEP_NS: u64 = 2_000_000;

/// The estimate of how late sleeps wake after one woke `over` ns late: an eighth of each new
/// observation (a wake delayed by a busy machine counts too: the next sleep meets that
/// machine), at most [`MAX_OVERSLEEP_NS`] of it.
fn learned_oversleep(old: u64, over: u64) -> u64 {
    old - old / 8 + over.min(MAX_OVERSLEEP_NS) / 8
}

/// Waits until `left()` says nothing is left: asleep for what is left less how late sleeps
/// wake ([`OVERSLEEP_NS`]), then spinning what a sleep left over (little, when the estimate
/// holds).
pub fn wait_out(mut left: impl FnMut() -> Duration) {
    const SPIN: Duration = Duration::from_micros(20);
    loop {
        let l = left();
        if l.is_zero() {
            return;
        }
        let late = Duration::from_nanos(OVERSLEEP_NS.load(Ordering::Relaxed));
        if l > late + SPIN {
            let asked = l - late;
            let slept = std::time::Instant::now();
            std::thread::sleep(asked);
            let over = slept.elapsed().saturating_sub(asked).as_nanos() as u64;
            let old = OVERSLEEP_NS.load(Ordering::Relaxed);
            OVERSLEEP_NS.store(learned_oversleep(old, over), Ordering::Relaxed);
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Nanoseconds to move `bytes` at `bps` bytes per second (0: no time).
fn transfer_ns(bytes: u64, bps: u64) -> u64 {
    if bps == 0 {
        0
    } else {
        (bytes as u128 * 1_000_000_000 / bps as u128) as u64
    }
}

/// Reserves `duration` on the first kernel slot of `device` to come free, from `ready` at the
/// earliest; returns the end.
pub fn reserve_kernel(device: usize, duration: Duration, ready: u64) -> u64 {
    let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX / 4);
    let slots = (config::kernel_concurrency() as usize).clamp(1, MAX_KERNEL_SLOTS);
    with_engines(device, |e| {
        let slot = e.compute[..slots]
            .iter_mut()
            .min()
            .expect("at least one kernel slot");
        let end = (*slot).max(ready) + ns;
        *slot = end;
        end
    })
}

/// Reserves a copy of `bytes` between the host and `device`, from `ready` at the earliest;
/// `pageable`: the host side is pageable memory (staged by the driver). Returns the end.
pub fn reserve_copy(
    device: usize,
    direction: Direction,
    bytes: u64,
    pageable: bool,
    ready: u64,
) -> u64 {
    let rates = config::rates();
    let (own_rate, other_rate) = match direction {
        Direction::ToDevice => (rates.to_device, rates.to_host),
        Direction::ToHost => (rates.to_host, rates.to_device),
    };
    let own_rate = if pageable && rates.pageable != 0 {
        if own_rate == 0 {
            rates.pageable
        } else {
            own_rate.min(rates.pageable)
        }
    } else {
        own_rate
    };
    with_engines(device, |e| {
        let (own, other) = match direction {
            Direction::ToDevice => (e.to_device, e.to_host),
            Direction::ToHost => (e.to_host, e.to_device),
        };
        let start = own.max(ready);
        let end = if own_rate == 0 {
            start
        } else {
            // While the other direction is busy, this copy gets what the duplex cap leaves.
            let shared_rate = if rates.duplex == 0 || other_rate == 0 {
                own_rate
            } else {
                rates.duplex.saturating_sub(other_rate).clamp(1, own_rate)
            };
            let overlap_ns = other.saturating_sub(start);
            let shared_bytes =
                ((overlap_ns as u128 * shared_rate as u128 / 1_000_000_000) as u64).min(bytes);
            start
                + transfer_ns(shared_bytes, shared_rate)
                + transfer_ns(bytes - shared_bytes, own_rate)
        };
        match direction {
            Direction::ToDevice => e.to_device = end,
            Direction::ToHost => e.to_host = end,
        }
        end
    })
}

/// The end of a copy or memset of `bytes` within device memory, starting at `ready` (device
/// bandwidth is not a queue here: streams copying on the device at once each get it whole).
pub fn device_transfer_end(bytes: u64, ready: u64) -> u64 {
    ready + transfer_ns(bytes, config::rates().device)
}

/// Counts `bytes` a kernel read or wrote in host-located memory and returns how long they
/// take over the bus.
pub fn host_access(bytes: u64) -> Duration {
    HOST_ACCESS_BYTES.fetch_add(bytes, Ordering::Relaxed);
    Duration::from_nanos(transfer_ns(bytes, config::rates().host_access))
}

/// Bytes kernels have read or written in host-located memory since the process started.
pub fn host_access_bytes() -> u64 {
    HOST_ACCESS_BYTES.load(Ordering::Relaxed)
}

/// Forgets every reservation on every device (tests that change the settings between cases).
pub fn reset() {
    for device in 0..config::MAX_DEVICES {
        with_engines(device, |e| {
            e.compute = [0; MAX_KERNEL_SLOTS];
            e.to_device = 0;
            e.to_host = 0;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_stops_at_the_first_look_that_finds_nothing_left() {
        // What is left, as the waiter looks at it: far off, then within a spin twice, then
        // done.
        let script = [
            Duration::from_millis(1),
            Duration::from_micros(10),
            Duration::from_micros(5),
            Duration::ZERO,
        ];
        let mut looks = 0;
        wait_out(|| {
            looks += 1;
            script[looks - 1]
        });
        assert_eq!(looks, script.len());
    }

    #[test]
    fn how_late_sleeps_wake_is_learned_and_one_long_delay_moves_it_little() {
        let mut late = 0;
        for _ in 0..40 {
            late = learned_oversleep(late, 200_000);
        }
        assert!((195_000..=200_000).contains(&late), "{late}");
        // A thread descheduled for a second counts as 2 ms.
        let after = learned_oversleep(late, 1_000_000_000);
        assert_eq!(after, late - late / 8 + MAX_OVERSLEEP_NS / 8);
    }

    #[test]
    fn a_transfer_takes_bytes_over_rate() {
        assert_eq!(transfer_ns(55_000_000, 55_000_000_000), 1_000_000);
        assert_eq!(transfer_ns(1 << 30, 0), 0);
    }
}
