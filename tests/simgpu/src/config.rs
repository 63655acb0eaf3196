//! The simulator's knobs, read from the environment at `cuInit`.
//!
//! - `TENSILE_SIM_DEVICE_MEMORY`: device capacity (`268435456`, `256MiB`, `1GiB`, `1.5GiB`;
//!   default 16 GiB).
//! - `TENSILE_SIM_CARD`: the name of a card shared by every process naming it
//!   ([`crate::shared_card`]); unset or empty: a card of this process's own.
//! - `TENSILE_SIM_DEVICE_COUNT`: simulated devices, 1 to [`MAX_DEVICES`] (default 1), each
//!   with `TENSILE_SIM_DEVICE_MEMORY` of its own and engines of its own.
//! - `TENSILE_SIM_KERNEL_US`: modelled duration of every kernel in microseconds (default 0). A
//!   kernel whose twin reads its duration from its parameters (`Twin::modelled_duration`, the
//!   stand-in kernel of `tensile rerun`) takes that instead.
//! - `TENSILE_SIM_KERNEL_CONCURRENCY`: kernels that may run at once across all streams
//!   (default 1: one compute engine, kernels of different streams take turns).
//! - `TENSILE_SIM_TIMING`: `h100` times copies like the H100 of docs/GPU_FACTS.md: host to
//!   device 55 GB/s, device to host 55 GB/s, both directions at once 92 GB/s in total, pageable
//!   host memory 8 GB/s (staged), kernels reading or writing host-located memory 50 GB/s
//!   (zero-copy over PCIe), copies and memsets on the device 1,500 GB/s. Unset or `off`:
//!   every copy is instantaneous (the test suite's default). All bandwidths in GB/s (10^9
//!   bytes per second); each can be set on its own, over either default:
//!   `TENSILE_SIM_H2D_GBPS`, `TENSILE_SIM_D2H_GBPS`, `TENSILE_SIM_DUPLEX_GBPS` (both directions
//!   together), `TENSILE_SIM_PAGEABLE_GBPS`, `TENSILE_SIM_HOST_ACCESS_GBPS`,
//!   `TENSILE_SIM_DEVICE_GBPS`.
//! - `TENSILE_SIM_COPY_GBPS`: one bandwidth for every copy and memset, either direction and on
//!   the device (both directions together: twice it), before the settings above.
//! - `TENSILE_SIM_JITTER_US`: each stream operation first waits a pseudo-random 0..N
//!   microseconds (default 0), shuffling the interleaving of streams to shake out races.
//! - `TENSILE_SIM_VMM_TIME`: the calling thread of a VMM call (`cuMemCreate`, `cuMemMap`,
//!   `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`) is held for what the call took on the H100
//!   ([`VmmCosts::H100`], per mapping and page: docs/gpu-results.md) times this factor. Default 1 with
//!   `TENSILE_SIM_TIMING=h100`, else 0 (free, the test suite's default).
//!
//! - `TENSILE_SIM_PAGE`: the VMM allocation and mapping granularity, a power of two from
//!   64 KiB to 2 MiB (default 2 MiB, the H100's). `tensile rerun --scale F` sets it to
//!   2 MiB / F, so that a scaled tensor covers as many pages as the real one.
//!
//! - `TENSILE_SIM_CALL_COUNTS`: count the calls of every export and write them at exit
//!   ([`crate::calls`]); with VMM time on, also per VMM call and side the mappings and pages
//!   it covered and the time it was modelled to take and took (`vmm ...` lines).
//!
//! - `TENSILE_SIM_ENGINE_LOG`: log every kernel and host copy a stream ran, with when it was
//!   queued, ready and ended ([`crate::engine_log`]).
//!
//! A value that does not parse is reported on stderr once and the default is used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub const DEFAULT_CAPACITY: u64 = 16 << 30;

/// The most simulated devices.
pub const MAX_DEVICES: usize = 8;

static DEVICE_COUNT: AtomicU64 = AtomicU64::new(1);

static KERNEL_NS: AtomicU64 = AtomicU64::new(0);
static KERNEL_CONCURRENCY: AtomicU64 = AtomicU64::new(1);

/// Bandwidths of the card's transfers in bytes per second; 0 = unlimited (instantaneous).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rates {
    /// Host to device, pinned host memory, alone on the bus.
    pub to_device: u64,
    /// Device to host, pinned host memory, alone on the bus.
    pub to_host: u64,
    /// Both directions at once, in total.
    pub duplex: u64,
    /// Either direction from or to pageable host memory (staged by the driver).
    pub pageable: u64,
    /// A kernel reading or writing host-located memory (zero-copy over the bus).
    pub host_access: u64,
    /// Copies and memsets within device memory.
    pub device: u64,
}

const GB: f64 = 1e9;

impl Rates {
    /// No modelled time at all.
    pub const UNLIMITED: Rates = Rates {
        to_device: 0,
        to_host: 0,
        duplex: 0,
        pageable: 0,
        host_access: 0,
        device: 0,
    };

    /// The H100 of docs/GPU_FACTS.md.
    pub const H100: Rates = Rates {
        to_device: 55_000_000_000,
        to_host: 55_000_000_000,
        duplex: 92_000_000_000,
        pageable: 8_000_000_000,
        host_access: 50_000_000_000,
        device: 1_500_000_000_000,
    };

    /// Every copy and memset at `gbps`, both directions together at twice it (what
    /// `TENSILE_SIM_COPY_GBPS` sets).
    pub fn uniform(gbps: f64) -> Rates {
        let bps = (gbps * GB) as u64;
        Rates {
            to_device: bps,
            to_host: bps,
            duplex: bps.saturating_mul(2),
            pageable: bps,
            host_access: bps,
            device: bps,
        }
    }
}

static RATES: [AtomicU64; 6] = [
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];
static JITTER_US: AtomicU64 = AtomicU64::new(0);

/// What the driver's VMM calls cost the calling thread, in ns (`bench/gpu/vmm_probe.py`,
/// `bench/gpu/vmm_sync_probe.py`, docs/gpu-results.md). `cuMemMap`, `cuMemSetAccess` and
/// `cuMemUnmap` cost per *mapping* in their range, plus per page of each mapping where the
/// card showed it; creating host memory costs per page (pinning).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VmmCosts {
    /// `cuMemCreate`, per allocation: device, host (per 2 MiB page of it).
    pub create_ns: [u64; 2],
    /// `cuMemMap`, per mapping: device, host.
    pub map_ns: [u64; 2],
    /// `cuMemSetAccess`, per mapping in the range, and per page of each: device, host.
    pub access_ns: [u64; 2],
    pub access_page_ns: [u64; 2],
    /// `cuMemUnmap`, per mapping in the range, and per page of each: device, host.
    pub unmap_ns: [u64; 2],
    pub unmap_page_ns: [u64; 2],
    /// `cuMemRelease`, per allocation: device, host.
    pub release_ns: [u64; 2],
}

impl VmmCosts {
    /// The H100 with the CUDA 13.0 driver (session 15), what the simulated GPU charges: each
    /// call alone, as the memory manager makes them, with the GPU busy (`vmm_sync_probe.py`,
    /// one page and 32 pages; the per-page terms are the difference). `cuMemMap` and
    /// `cuMemRelease` of host memory were not measured there: the device's map, the H200's
    /// release.
    pub const H100: VmmCosts = VmmCosts {
        create_ns: [32_000, 356_000],
        map_ns: [9_000, 9_000],
        access_ns: [76_000, 128_000],
        access_page_ns: [0, 25_000],
        unmap_ns: [43_000, 67_000],
        unmap_page_ns: [0, 5_300],
        release_ns: [40_000, 43_000],
    };

    /// The H200 with the CUDA 13.0 driver, one-page mappings (64 of them in a row): cheaper
    /// per call than the H100's calls one at a time.
    pub const H200: VmmCosts = VmmCosts {
        create_ns: [9_500, 400_000],
        map_ns: [1_900, 4_000],
        access_ns: [22_000, 57_000],
        access_page_ns: [0, 0],
        unmap_ns: [14_700, 30_000],
        unmap_page_ns: [0, 0],
        release_ns: [10_000, 43_000],
    };

    /// What the simulated GPU charges.
    pub const SIMULATED: VmmCosts = VmmCosts::H100;
}

/// The H100's VMM granularity, and the default of `TENSILE_SIM_PAGE`.
pub const H100_GRANULARITY: u64 = 2 << 20;

/// The smallest `TENSILE_SIM_PAGE`.
pub const MIN_GRANULARITY: u64 = 64 << 10;

static GRANULARITY: AtomicU64 = AtomicU64::new(H100_GRANULARITY);

/// Allocation and mapping granularity (device and host-NUMA): `TENSILE_SIM_PAGE`.
#[inline]
pub fn granularity() -> u64 {
    GRANULARITY.load(Ordering::Relaxed)
}

/// `TENSILE_SIM_VMM_TIME` in thousandths.
static VMM_MILLI: AtomicU64 = AtomicU64::new(0);

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
    let concurrency = env_or("TENSILE_SIM_KERNEL_CONCURRENCY", 1u64, |v| {
        v.trim().parse().ok().filter(|&n| n > 0)
    });
    set_kernel_concurrency(concurrency);
    set_rates(rates_from_env());
    let jitter = env_or("TENSILE_SIM_JITTER_US", 0u64, |v| v.trim().parse().ok());
    JITTER_US.store(jitter, Ordering::Relaxed);
    let timed = rates() != Rates::UNLIMITED;
    let vmm = env_or("TENSILE_SIM_VMM_TIME", if timed { 1.0 } else { 0.0 }, |v| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f >= 0.0)
    });
    set_vmm_time(vmm);
    let page = env_or("TENSILE_SIM_PAGE", H100_GRANULARITY, |v| {
        parse_bytes(v)
            .filter(|&b| b.is_power_of_two() && (MIN_GRANULARITY..=H100_GRANULARITY).contains(&b))
    });
    GRANULARITY.store(page, Ordering::Relaxed);
    let devices = env_or("TENSILE_SIM_DEVICE_COUNT", 1u64, |v| {
        v.trim()
            .parse()
            .ok()
            .filter(|n| (1..=MAX_DEVICES as u64).contains(n))
    });
    DEVICE_COUNT.store(devices, Ordering::Relaxed);
    env_or("TENSILE_SIM_DEVICE_MEMORY", DEFAULT_CAPACITY, parse_bytes)
}

/// Scales the modelled cost of VMM calls ([`VmmCosts::SIMULATED`] times `factor`; 0: free).
pub fn set_vmm_time(factor: f64) {
    VMM_MILLI.store((factor * 1000.0).round() as u64, Ordering::Relaxed);
}

/// How long a VMM call of `ns` modelled nanoseconds (at factor 1) holds its caller now.
pub fn vmm_duration(ns: u64) -> Duration {
    let milli = VMM_MILLI.load(Ordering::Relaxed);
    Duration::from_nanos(ns.saturating_mul(milli) / 1000)
}

/// Simulated devices (`TENSILE_SIM_DEVICE_COUNT`, read at `cuInit`).
pub fn device_count() -> usize {
    DEVICE_COUNT.load(Ordering::Relaxed) as usize
}

/// `TENSILE_SIM_CARD`: the shared card to join, if any.
pub fn card_name() -> Option<String> {
    std::env::var("TENSILE_SIM_CARD")
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
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

/// The bandwidths the environment asks for (see the module doc).
fn rates_from_env() -> Rates {
    let gbps = |v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|g| g.is_finite() && *g > 0.0)
    };
    let mut rates = match std::env::var("TENSILE_SIM_TIMING") {
        Ok(v) if v.trim().eq_ignore_ascii_case("h100") => Rates::H100,
        Ok(v) if v.trim().is_empty() || v.trim().eq_ignore_ascii_case("off") => Rates::UNLIMITED,
        Ok(v) => {
            eprintln!("tensile-simgpu: TENSILE_SIM_TIMING={v:?} is not h100 or off; using off");
            Rates::UNLIMITED
        }
        Err(_) => Rates::UNLIMITED,
    };
    if std::env::var_os("TENSILE_SIM_COPY_GBPS").is_some() {
        rates = Rates::uniform(env_or("TENSILE_SIM_COPY_GBPS", 0.0, gbps));
    }
    let fields: [(&str, &mut u64); 6] = [
        ("TENSILE_SIM_H2D_GBPS", &mut rates.to_device),
        ("TENSILE_SIM_D2H_GBPS", &mut rates.to_host),
        ("TENSILE_SIM_DUPLEX_GBPS", &mut rates.duplex),
        ("TENSILE_SIM_PAGEABLE_GBPS", &mut rates.pageable),
        ("TENSILE_SIM_HOST_ACCESS_GBPS", &mut rates.host_access),
        ("TENSILE_SIM_DEVICE_GBPS", &mut rates.device),
    ];
    for (name, field) in fields {
        if std::env::var_os(name).is_some() {
            *field = (env_or(name, *field as f64 / GB, gbps) * GB) as u64;
        }
    }
    rates
}

/// The card's bandwidths (tests may change them at run time).
pub fn set_rates(rates: Rates) {
    let values = [
        rates.to_device,
        rates.to_host,
        rates.duplex,
        rates.pageable,
        rates.host_access,
        rates.device,
    ];
    for (slot, v) in RATES.iter().zip(values) {
        slot.store(v, Ordering::Relaxed);
    }
}

pub fn rates() -> Rates {
    let v = |i: usize| RATES[i].load(Ordering::Relaxed);
    Rates {
        to_device: v(0),
        to_host: v(1),
        duplex: v(2),
        pageable: v(3),
        host_access: v(4),
        device: v(5),
    }
}

/// Every copy and memset at `gbps` (as `TENSILE_SIM_COPY_GBPS`); 0 = unlimited.
pub fn set_copy_gbps(gbps: f64) {
    set_rates(if gbps > 0.0 {
        Rates::uniform(gbps)
    } else {
        Rates::UNLIMITED
    });
}

/// Kernels that may run at once (at least 1).
pub fn set_kernel_concurrency(n: u64) {
    KERNEL_CONCURRENCY.store(n.max(1), Ordering::Relaxed);
}

pub fn kernel_concurrency() -> u64 {
    KERNEL_CONCURRENCY.load(Ordering::Relaxed)
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
