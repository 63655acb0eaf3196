//! The simulator's knobs, read from the environment at `cuInit`.
//!
//! - `TENSILE_SIM_DEVICE_MEMORY`: device capacity (`268435456`, `256MiB`, `1GiB`, `1.5GiB`;
//!   default 16 GiB).
//! - `TENSILE_SIM_KERNEL_US`: modelled duration of every kernel in microseconds (default 0).
//! - `TENSILE_SIM_COPY_GBPS`: modelled copy bandwidth in GB/s (10^9 bytes per second) for
//!   copies and memsets (default: unlimited).
//! - `TENSILE_SIM_JITTER_US`: each stream operation first waits a pseudo-random 0..N
//!   microseconds (default 0), shuffling the interleaving of streams to shake out races.
//!
//! A value that does not parse is reported on stderr once and the default is used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub const DEFAULT_CAPACITY: u64 = 16 << 30;

static KERNEL_NS: AtomicU64 = AtomicU64::new(0);
/// Copy bandwidth in bytes per second; 0 = unlimited.
static COPY_BPS: AtomicU64 = AtomicU64::new(0);
static JITTER_US: AtomicU64 = AtomicU64::new(0);

/// Parses a byte count with an optional binary (`KiB`, `MiB`, `GiB`, `TiB`) or decimal
/// (`KB`, `MB`, `GB`, `TB`) suffix.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "tib" | "t" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult);
    }
    let f: f64 = num.parse().ok()?;
    let v = f * mult as f64;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

fn env_or<T>(name: &str, default: T, parse: impl Fn(&str) -> Option<T>) -> T {
    match std::env::var(name) {
        Ok(v) => parse(&v).unwrap_or_else(|| {
            eprintln!("tensile-simgpu: cannot parse {name}={v:?}; using the default");
            default
        }),
        Err(_) => default,
    }
}

/// Reads the environment; returns the device capacity (the other knobs are global).
pub fn load() -> u64 {
    let us = env_or("TENSILE_SIM_KERNEL_US", 0u64, |v| v.trim().parse().ok());
    set_kernel_duration(Duration::from_micros(us));
    let gbps = env_or("TENSILE_SIM_COPY_GBPS", 0f64, |v| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|g| g.is_finite() && *g > 0.0)
    });
    set_copy_gbps(gbps);
    let jitter = env_or("TENSILE_SIM_JITTER_US", 0u64, |v| v.trim().parse().ok());
    JITTER_US.store(jitter, Ordering::Relaxed);
    env_or("TENSILE_SIM_DEVICE_MEMORY", DEFAULT_CAPACITY, parse_bytes)
}

/// Modelled duration of each kernel (tests may change it at run time).
pub fn set_kernel_duration(d: Duration) {
    KERNEL_NS.store(
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

pub fn kernel_duration() -> Duration {
    Duration::from_nanos(KERNEL_NS.load(Ordering::Relaxed))
}

/// Modelled copy bandwidth in GB/s; 0 = unlimited.
pub fn set_copy_gbps(gbps: f64) {
    COPY_BPS.store((gbps * 1e9) as u64, Ordering::Relaxed);
}

/// How long moving `bytes` takes at the modelled bandwidth.
pub fn copy_duration(bytes: u64) -> Duration {
    match COPY_BPS.load(Ordering::Relaxed) {
        0 => Duration::ZERO,
        bps => Duration::from_secs_f64(bytes as f64 / bps as f64),
    }
}

/// Maximum random delay before each stream operation.
pub fn set_jitter(max: Duration) {
    JITTER_US.store(
        u64::try_from(max.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// A pseudo-random delay in `0..=jitter` (xorshift over a per-thread state; the sequence
/// only needs to be varied, not unpredictable).
pub fn jitter_delay() -> Duration {
    let max = JITTER_US.load(Ordering::Relaxed);
    if max == 0 {
        return Duration::ZERO;
    }
    thread_local! {
        static STATE: std::cell::Cell<u64> = std::cell::Cell::new(
            0x9e37_79b9_7f4a_7c15 ^ (thread_seed() << 1 | 1),
        );
    }
    let r = STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    Duration::from_micros(r % (max + 1))
}

/// A number that differs between threads, to seed each thread's jitter sequence.
fn thread_seed() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().id().hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse() {
        assert_eq!(parse_bytes("268435456"), Some(256 << 20));
        assert_eq!(parse_bytes("256MiB"), Some(256 << 20));
        assert_eq!(parse_bytes("1GiB"), Some(1 << 30));
        assert_eq!(parse_bytes("1.5 GiB"), Some(3 << 29));
        assert_eq!(parse_bytes("2GB"), Some(2_000_000_000));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("5 parsecs"), None);
    }
}
