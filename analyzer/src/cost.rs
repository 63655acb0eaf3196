//! The cost model (copy bandwidths, default durations) and the memory budget.
//!
//! Defaults are the measurements in GPU_FACTS.md (H100, PCIe Gen5, pinned memory). Durations are
//! computed here and nowhere else, so every part of the analyzer prices a copy the same way.

use serde::Serialize;

/// Launch duration assumed when the trace has none for a launch and no other launch of the same
/// kernel was measured (documented in docs/planner.md and reported by `tensile replay`).
pub const DEFAULT_LAUNCH_NS: u64 = 10_000;

/// The page the shim moves: a frame of its own, the driver's 2 MiB granularity.
pub const SHIM_PAGE_BYTES: u64 = 2 << 20;

/// What one of the driver's VMM calls costs its caller, in ns, on each side (device memory
/// and pinned host memory): `cuMemMap`, `cuMemSetAccess` and `cuMemUnmap` cost per *mapping*
/// in their range, plus, on the host side, per page of it (docs/gpu-results.md). The simulated
/// GPU charges the same figures (`tensile-simgpu`'s `VmmCosts`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct VmmCallCosts {
    /// Device memory: `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`, per mapping.
    pub device_map_ns: u64,
    pub device_access_ns: u64,
    pub device_unmap_ns: u64,
    /// Host memory: per mapping, and per page of it for access and unmap.
    pub host_map_ns: u64,
    pub host_access_ns: u64,
    pub host_access_page_ns: u64,
    pub host_unmap_ns: u64,
    pub host_unmap_page_ns: u64,
}

impl VmmCallCosts {
    /// The H100 with the CUDA 13.0 driver (session 15, `vmm_sync_probe.py`): each call alone,
    /// as the memory manager makes them, with the GPU busy.
    pub const H100: VmmCallCosts = VmmCallCosts {
        device_map_ns: 9_000,
        device_access_ns: 76_000,
        device_unmap_ns: 43_000,
        host_map_ns: 9_000,
        host_access_ns: 128_000,
        host_access_page_ns: 25_000,
        host_unmap_ns: 67_000,
        host_unmap_page_ns: 5_300,
    };

    /// The H200 with the CUDA 13.0 driver (`vmm_probe.py`: 64 one-page mappings in a row,
    /// cheaper per call than calls one at a time).
    pub const H200: VmmCallCosts = VmmCallCosts {
        device_map_ns: 1_900,
        device_access_ns: 22_000,
        device_unmap_ns: 14_700,
        host_map_ns: 4_000,
        host_access_ns: 57_000,
        host_access_page_ns: 0,
        host_unmap_ns: 30_000,
        host_unmap_page_ns: 0,
    };
}

/// How the shim holds a swapped-out page's address (`TENSILE_SWAPPED`, `TENSILE_HOST_UNITS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SwappedMapping {
    /// Mapped to a host unit: one pinned allocation for the pages of a device unit that one
    /// tensor covers, mapped once (the library's default).
    HostUnits,
    /// Mapped to single host frames, one mapping per page.
    SingleFrames,
    /// Not mapped at all until it comes back.
    Unmapped,
}

/// What remapping costs the shim per page it moves, besides the copy: the driver's calls
/// ([`VmmCallCosts`]) for the way swapped-out pages are held ([`SwappedMapping`]). Device
/// memory moves in units, one physical allocation mapped whole, of up to
/// [`SHIM_MAX_UNIT_PAGES`] pages of one tensor (docs/memory.md), so the per-mapping terms are
/// shared by a unit's pages: a workload of large tensors pays them once per 32 pages, one of
/// small tensors once per page ([`RemapModel::per_page`] takes the pages per unit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RemapModel {
    pub calls: VmmCallCosts,
    pub mapping: SwappedMapping,
}

impl RemapModel {
    /// The H100's calls, for the way swapped-out pages are held.
    pub fn h100(mapping: SwappedMapping) -> RemapModel {
        RemapModel {
            calls: VmmCallCosts::H100,
            mapping,
        }
    }

    /// The same calls, each taking `factor` times as long (a simulated card that keeps time
    /// `factor` times slower, as `tensile rerun` plays it; 0: free).
    pub fn times(self, factor: f64) -> RemapModel {
        let f = |ns: u64| (ns as f64 * factor.max(0.0)).round() as u64;
        let c = self.calls;
        RemapModel {
            calls: VmmCallCosts {
                device_map_ns: f(c.device_map_ns),
                device_access_ns: f(c.device_access_ns),
                device_unmap_ns: f(c.device_unmap_ns),
                host_map_ns: f(c.host_map_ns),
                host_access_ns: f(c.host_access_ns),
                host_access_page_ns: f(c.host_access_page_ns),
                host_unmap_ns: f(c.host_unmap_ns),
                host_unmap_page_ns: f(c.host_unmap_page_ns),
            },
            ..self
        }
    }

    /// The cost per page of `page_bytes` moved when units average `pages_per_unit` pages
    /// (at least 1). A page in: the device unit's map and access call, shared by its pages,
    /// and the host mapping's removal; a page out: the device unit's unmap, and the host
    /// mapping's map and access call.
    pub fn per_page(&self, pages_per_unit: f64, page_bytes: u64) -> PageRemapCost {
        let c = &self.calls;
        let unit = pages_per_unit.max(1.0);
        let shared = |ns: u64| ns as f64 / unit;
        let (host_in, host_out) = match self.mapping {
            SwappedMapping::HostUnits => (
                shared(c.host_unmap_ns) + c.host_unmap_page_ns as f64,
                shared(c.host_map_ns + c.host_access_ns) + c.host_access_page_ns as f64,
            ),
            SwappedMapping::SingleFrames => (
                (c.host_unmap_ns + c.host_unmap_page_ns) as f64,
                (c.host_map_ns + c.host_access_ns + c.host_access_page_ns) as f64,
            ),
            SwappedMapping::Unmapped => (0.0, 0.0),
        };
        PageRemapCost {
            page_bytes,
            in_ns: (shared(c.device_map_ns + c.device_access_ns) + host_in).round() as u64,
            out_ns: (shared(c.device_unmap_ns) + host_out).round() as u64,
        }
    }
}

/// The most pages one device unit of the shim holds (`shim::memory::manager::MAX_UNIT_PAGES`
/// is this).
pub const SHIM_MAX_UNIT_PAGES: u64 = 32;

/// The most pages per unit while the shim runs a plan: the executor caps units at the
/// pieces the plan moves, but at no fewer pages than this (`shim::executor`), so the units of
/// a planned run are at most this large unless every piece is a multiple of more.
pub const SHIM_PLAN_UNIT_PAGES: u64 = 8;

/// What the driver's VMM calls cost the shim per page it moves, besides the copy
/// ([`RemapModel::per_page`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PageRemapCost {
    /// Bytes per page.
    pub page_bytes: u64,
    /// Per page moved to the device.
    pub in_ns: u64,
    /// Per page moved to the host.
    pub out_ns: u64,
}

/// Bandwidths and default durations used to price copies and unmeasured launches.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostModel {
    /// Host-to-device bandwidth with only that direction active, GB/s (1 GB = 1e9 bytes).
    pub h2d_gbps: f64,
    /// Device-to-host bandwidth with only that direction active, GB/s.
    pub d2h_gbps: f64,
    /// Total bandwidth with both directions active at once, GB/s (shared equally).
    pub bidir_gbps: f64,
    /// Device-to-device copy bandwidth (application copies), GB/s.
    pub d2d_gbps: f64,
    /// Memset bandwidth (application memsets), GB/s.
    pub memset_gbps: f64,
    /// Duration of a launch with no measurement at all.
    pub default_launch_ns: u64,
    /// What each page moved pays besides its copy: the driver's calls that remap it
    /// ([`Self::with_page_remaps`]). `None`: moves cost their copies alone.
    pub remaps: Option<PageRemapCost>,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            h2d_gbps: 55.0,
            d2h_gbps: 55.0,
            bidir_gbps: 92.0,
            // HBM3 copy throughput (read + write) is well above a terabyte per second; the
            // application's own device copies are few and small, so this only needs to be sane.
            d2d_gbps: 1300.0,
            memset_gbps: 2000.0,
            default_launch_ns: DEFAULT_LAUNCH_NS,
            remaps: None,
        }
    }
}

impl CostModel {
    /// Checks that every bandwidth is a positive finite number.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("h2d", self.h2d_gbps),
            ("d2h", self.d2h_gbps),
            ("bidir", self.bidir_gbps),
            ("d2d", self.d2d_gbps),
            ("memset", self.memset_gbps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!(
                    "{name} bandwidth must be a positive number of GB/s, got {v}"
                ));
            }
        }
        Ok(())
    }

    /// The same card with `share` (0 to 1] of its copy engines: the host-to-device,
    /// device-to-host and combined rates times `share`; copies and memsets on the device, and
    /// remaps (made on the job's own threads), unchanged. For a job whose swaps share the
    /// engines with other jobs' swaps (the coordinator's share, `tools/src/coordinator`).
    pub fn with_copy_share(self, share: f64) -> CostModel {
        let share = if share.is_finite() {
            share.clamp(1e-3, 1.0)
        } else {
            1.0
        };
        CostModel {
            h2d_gbps: self.h2d_gbps * share,
            d2h_gbps: self.d2h_gbps * share,
            bidir_gbps: self.bidir_gbps * share,
            ..self
        }
    }

    /// Time to move `bytes` at `gbps`, rounded up to whole ns.
    pub fn ns_at(bytes: u64, gbps: f64) -> u64 {
        (bytes as f64 / gbps).ceil() as u64
    }

    /// Host-to-device time for `bytes` with that direction alone, from the copy's start to
    /// the data's arrival: its copy and, with [`Self::remaps`], its remap.
    pub fn h2d_ns(&self, bytes: u64) -> u64 {
        Self::ns_at(bytes, self.h2d_gbps) + self.remap_ns(bytes, true).ceil() as u64
    }

    /// Device-to-host time for `bytes` with that direction alone, from the copy's start to
    /// the memory's release: its copy and, with [`Self::remaps`], its remap.
    pub fn d2h_ns(&self, bytes: u64) -> u64 {
        Self::ns_at(bytes, self.d2h_gbps) + self.remap_ns(bytes, false).ceil() as u64
    }

    /// What remapping `bytes` moved one way takes (0 without [`Self::remaps`]): the per-page
    /// cost for each page of them, part pages in proportion.
    pub fn remap_ns(&self, bytes: u64, to_device: bool) -> f64 {
        self.remaps.map_or(0.0, |r| {
            let per_page = if to_device { r.in_ns } else { r.out_ns };
            bytes as f64 / r.page_bytes.max(1) as f64 * per_page as f64
        })
    }

    /// The same copies, each page moved also paying `remap`. How the two add up depends on
    /// who makes the remaps, which the simulator decides by policy: a plan's moves are made
    /// by the executor's two threads, each remapping one page while the engine copies the
    /// next (a direction keeps the pace of the slower of the two); LRU's on the paths that
    /// need the pages, one page's copy and then its remap ([`Self::folded`]). Either way a
    /// page arrives (or leaves the device) once both are done ([`Self::h2d_ns`]).
    pub fn with_page_remaps(self, remap: PageRemapCost) -> CostModel {
        CostModel {
            remaps: Some(remap),
            ..self
        }
    }

    /// The rates moves keep up over many pages with remaps made beside the copies, each
    /// direction held back by the slower of the two (for the bounds, which reason about
    /// rates; no policy moves faster): the same model without [`Self::remaps`].
    pub fn sustained(&self) -> CostModel {
        let Some(remap) = self.remaps else {
            return *self;
        };
        let page = remap.page_bytes.max(1) as f64;
        let rate = |gbps: f64, ns: u64| page / (page / gbps).max(ns as f64);
        CostModel {
            h2d_gbps: rate(self.h2d_gbps, remap.in_ns),
            d2h_gbps: rate(self.d2h_gbps, remap.out_ns),
            // A page each way: both copies at the shared rate, each remap on its own thread.
            bidir_gbps: 2.0 * page
                / (2.0 * page / self.bidir_gbps)
                    .max(remap.in_ns as f64)
                    .max(remap.out_ns as f64),
            remaps: None,
            ..*self
        }
    }

    /// The rates at which pages move when each one pays its remap after its copy, serially
    /// (as on-demand swaps make them: the path that needs a page copies and remaps it in
    /// turn): one page's copy time plus its remap, per page; both directions at once, two
    /// pages' copies at the shared rate plus both remaps. The same model without
    /// [`Self::remaps`].
    pub fn folded(&self) -> CostModel {
        let Some(remap) = self.remaps else {
            return *self;
        };
        let page = remap.page_bytes as f64;
        let rate = |gbps: f64, ns: u64| page / (page / gbps + ns as f64);
        CostModel {
            h2d_gbps: rate(self.h2d_gbps, remap.in_ns),
            d2h_gbps: rate(self.d2h_gbps, remap.out_ns),
            bidir_gbps: 2.0 * page
                / (2.0 * page / self.bidir_gbps + (remap.in_ns + remap.out_ns) as f64),
            remaps: None,
            ..*self
        }
    }

    /// The same copies with pages written out paying their remaps ([`Self::remaps`]) and
    /// pages brought in paying none here: the shim's LRU maps those on the host before it
    /// queues their copies, and the simulator prices that on the host's own timeline.
    pub fn without_remaps_in(&self) -> CostModel {
        CostModel {
            remaps: self.remaps.map(|r| PageRemapCost { in_ns: 0, ..r }),
            ..*self
        }
    }

    /// Per-direction rates (bytes per ns) for (h2d, d2h) when both directions are active.
    pub fn shared_rates(&self) -> (f64, f64) {
        // Each direction gets its share of the bidirectional total, never more than alone.
        let half = self.bidir_gbps / 2.0;
        (half.min(self.h2d_gbps), half.min(self.d2h_gbps))
    }
}

/// A device memory budget in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budget {
    /// Bytes of device memory the job's tensors may occupy at any instant.
    pub bytes: u64,
}

impl Budget {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> Self {
        Budget { bytes }
    }
}

/// Formats a byte count for people: `512 B`, `1.50 MiB`, `4.00 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// Parses a byte size: `4GiB`, `512MiB`, `1.5GB`, `123456`, or a percentage (`50%`) of `peak`.
pub fn parse_size(text: &str, peak: Option<u64>) -> Result<u64, String> {
    let t = text.trim();
    if let Some(pct) = t.strip_suffix('%') {
        let value: f64 = pct
            .trim()
            .parse()
            .map_err(|_| format!("{text:?} is not a percentage"))?;
        let peak = peak.ok_or_else(|| format!("{text:?}: a percentage needs a known peak"))?;
        if !(value.is_finite() && value > 0.0) {
            return Err(format!("{text:?}: the percentage must be positive"));
        }
        return Ok((peak as f64 * value / 100.0).round() as u64);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "ki" | "kib" => 1024.0,
        "mi" | "mib" => 1024.0 * 1024.0,
        "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "ti" | "tib" => 1024.0f64.powi(4),
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use B, MiB, GiB, MB, GB or %)"
            ))
        }
    };
    let bytes = value * scale;
    if !(bytes.is_finite() && bytes >= 1.0) {
        return Err(format!("{text:?} is not a positive size"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_percentages() {
        assert_eq!(parse_size("4GiB", None), Ok(4 << 30));
        assert_eq!(parse_size(" 512 MiB ", None), Ok(512 << 20));
        assert_eq!(parse_size("1.5GB", None), Ok(1_500_000_000));
        assert_eq!(parse_size("123456", None), Ok(123_456));
        assert_eq!(parse_size("50%", Some(1000)), Ok(500));
        assert_eq!(parse_size("12.5%", Some(800)), Ok(100));
        assert!(parse_size("50%", None)
            .unwrap_err()
            .contains("needs a known peak"));
        assert!(parse_size("-3%", Some(10)).is_err());
        assert!(parse_size("4 parsecs", None)
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("GiB", None).is_err());
        assert!(parse_size("0", None).is_err());
    }

    #[test]
    fn bytes_format_for_people() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(4 << 30), "4.00 GiB");
    }

    #[test]
    fn remaps_share_the_per_mapping_calls_among_a_units_pages() {
        let page = SHIM_PAGE_BYTES;
        let units = RemapModel::h100(SwappedMapping::HostUnits);
        // One-page units pay every call per page: in, map 9 + access 76 + host unmap 67 + 5.3;
        // out, unmap 43 + host map 9 + access 128 + 25.
        assert_eq!(
            units.per_page(1.0, page),
            PageRemapCost {
                page_bytes: page,
                in_ns: 157_300,
                out_ns: 205_000,
            }
        );
        // 32-page units share them: only the host's per-page terms stay whole.
        let big = units.per_page(32.0, page);
        assert_eq!(
            big.in_ns,
            ((9_000.0 + 76_000.0 + 67_000.0) / 32.0 + 5_300.0) as u64
        );
        assert_eq!(
            big.out_ns,
            ((43_000.0 + 9_000.0 + 128_000.0) / 32.0 + 25_000.0) as u64
        );
        // Single host frames pay the host side per page whatever the unit.
        let singles = RemapModel::h100(SwappedMapping::SingleFrames).per_page(32.0, page);
        assert!(singles.in_ns > 72_000 && singles.out_ns > 162_000);
        let unmapped = RemapModel::h100(SwappedMapping::Unmapped).per_page(32.0, page);
        assert_eq!(
            (unmapped.in_ns, unmapped.out_ns),
            (
                ((9_000.0 + 76_000.0) / 32.0f64).round() as u64,
                (43_000.0f64 / 32.0).round() as u64
            )
        );
        assert_eq!(
            units.per_page(0.0, page),
            units.per_page(1.0, page),
            "at least a page"
        );
    }

    #[test]
    fn copy_times_follow_the_bandwidths() {
        let c = CostModel::default();
        assert_eq!(c.h2d_ns(55_000), 1000);
        // On the H200 with single host frames and one-page units, a page in: 38.1 µs of copy
        // at 55 GB/s and 53.9 µs of remapping (map 1.9, access 22, host unmap 30); out, 75.7.
        let page = SHIM_PAGE_BYTES;
        let singles = RemapModel {
            calls: VmmCallCosts::H200,
            mapping: SwappedMapping::SingleFrames,
        };
        let moved = c.with_page_remaps(singles.per_page(1.0, page)).folded();
        let copy = page as f64 / 55.0;
        assert!((moved.h2d_ns(page) as f64 - (copy + 53_900.0)).abs() < 2.0);
        assert!((moved.d2h_ns(page) as f64 - (copy + 75_700.0)).abs() < 2.0);
        assert!(moved.bidir_gbps < moved.h2d_gbps + moved.d2h_gbps);
        assert_eq!(moved.d2d_gbps, c.d2d_gbps);
        assert_eq!(c.d2h_ns(55_001), 1001, "rounded up");
        assert_eq!(c.shared_rates(), (46.0, 46.0));
        let slow = CostModel {
            bidir_gbps: 200.0,
            ..c
        };
        assert_eq!(
            slow.shared_rates(),
            (55.0, 55.0),
            "never faster than one direction alone"
        );
        assert!(CostModel {
            d2h_gbps: f64::NAN,
            ..c
        }
        .validate()
        .is_err());
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_copy_share_slows_the_copy_engines_and_nothing_else() {
        let card = CostModel::default().with_page_remaps(PageRemapCost {
            page_bytes: 2 << 20,
            in_ns: 10_000,
            out_ns: 20_000,
        });
        let half = card.with_copy_share(0.5);
        assert_eq!(half.h2d_gbps, card.h2d_gbps / 2.0);
        assert_eq!(half.d2h_gbps, card.d2h_gbps / 2.0);
        assert_eq!(half.bidir_gbps, card.bidir_gbps / 2.0);
        assert_eq!(half.d2d_gbps, card.d2d_gbps);
        assert_eq!(half.memset_gbps, card.memset_gbps);
        assert_eq!(
            half.remaps, card.remaps,
            "remaps are made on the job's own threads"
        );
        let bytes = 64 << 20;
        let copy = |c: &CostModel| c.h2d_ns(bytes) - c.remap_ns(bytes, true).ceil() as u64;
        assert!(copy(&half).abs_diff(2 * copy(&card)) <= 1);
        assert_eq!(card.with_copy_share(1.0), card);
        assert_eq!(card.with_copy_share(f64::NAN), card);
        assert_eq!(card.with_copy_share(7.0), card, "never more than the card");
    }
}
