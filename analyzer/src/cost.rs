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

/// What the driver's VMM calls cost the shim per page it moves, besides the copy, on the H200
/// with the CUDA 13.0 driver (`bench/gpu/vmm_probe.py`, docs/gpu-results.md). Setting access
/// and unmapping cost per mapping, whatever its size. Device memory moves in units of up to
/// 32 pages mapped whole (docs/memory.md): a unit in costs a map (1.9 µs) and an access call
/// (22 µs) plus about 0.6 µs per page, a unit out an unmap (14.7 µs) plus 0.3 µs per page;
/// spread over units of about 8 pages, 4 µs per page in and 2 µs out. With host units
/// (`TENSILE_HOST_UNITS`, the default: docs/memory.md) the pages of a unit leave into one
/// pinned allocation mapped once, whose access call still costs about 18 µs per page: about
/// 24 µs per page out and 8 in on the host side. With single host frames a page in removes
/// its host mapping (30 µs); a page out maps its host frame (4 µs) and sets its access
/// (57 µs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PageRemapCost {
    /// Bytes per page.
    pub page_bytes: u64,
    /// Per page moved to the device.
    pub in_ns: u64,
    /// Per page moved to the host.
    pub out_ns: u64,
}

impl PageRemapCost {
    /// The device side's share per page, in and out (see the type).
    const DEVICE_IN_NS: u64 = 4_000;
    const DEVICE_OUT_NS: u64 = 2_000;
    /// The host side's share per page when swapped-out pages are mapped to single host frames.
    const HOST_IN_NS: u64 = 30_000;
    const HOST_OUT_NS: u64 = 4_000 + 57_000;
    /// The host side's share per page when they are mapped to host units.
    const HOST_UNIT_IN_NS: u64 = 8_000;
    const HOST_UNIT_OUT_NS: u64 = 24_000;

    /// The H200's, with swapped-out pages mapped to host units (see the type): the library's
    /// default.
    pub const H200_HOST_UNITS: PageRemapCost = PageRemapCost {
        page_bytes: SHIM_PAGE_BYTES,
        in_ns: Self::HOST_UNIT_IN_NS + Self::DEVICE_IN_NS,
        out_ns: Self::DEVICE_OUT_NS + Self::HOST_UNIT_OUT_NS,
    };

    /// The H200's, with swapped-out pages mapped to single host frames (see the type).
    pub const H200: PageRemapCost = PageRemapCost {
        page_bytes: SHIM_PAGE_BYTES,
        in_ns: Self::HOST_IN_NS + Self::DEVICE_IN_NS,
        out_ns: Self::DEVICE_OUT_NS + Self::HOST_OUT_NS,
    };

    /// The H200's when swapped-out pages are left unmapped (`TENSILE_SWAPPED=unmapped`): no
    /// host mapping to remove on the way in, none to make on the way out.
    pub const H200_UNMAPPED: PageRemapCost = PageRemapCost {
        page_bytes: SHIM_PAGE_BYTES,
        in_ns: Self::DEVICE_IN_NS,
        out_ns: Self::DEVICE_OUT_NS,
    };
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

    /// Time to move `bytes` at `gbps`, rounded up to whole ns.
    pub fn ns_at(bytes: u64, gbps: f64) -> u64 {
        (bytes as f64 / gbps).ceil() as u64
    }

    /// Host-to-device time for `bytes` with that direction alone.
    pub fn h2d_ns(&self, bytes: u64) -> u64 {
        Self::ns_at(bytes, self.h2d_gbps)
    }

    /// Device-to-host time for `bytes` with that direction alone.
    pub fn d2h_ns(&self, bytes: u64) -> u64 {
        Self::ns_at(bytes, self.d2h_gbps)
    }

    /// The rates at which pages actually move when each one also pays `remap` before or after
    /// its copy, serially (as the shim's swaps do): one page's copy time plus its remap, per
    /// page. Both directions at once: two pages' copies at the shared rate plus both remaps.
    pub fn with_page_remaps(self, remap: PageRemapCost) -> CostModel {
        let page = remap.page_bytes as f64;
        let rate = |gbps: f64, ns: u64| page / (page / gbps + ns as f64);
        CostModel {
            h2d_gbps: rate(self.h2d_gbps, remap.in_ns),
            d2h_gbps: rate(self.d2h_gbps, remap.out_ns),
            bidir_gbps: 2.0 * page
                / (2.0 * page / self.bidir_gbps + (remap.in_ns + remap.out_ns) as f64),
            ..self
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
    fn copy_times_follow_the_bandwidths() {
        let c = CostModel::default();
        assert_eq!(c.h2d_ns(55_000), 1000);
        // A page in: 38.1 µs of copy at 55 GB/s and 34 µs of remapping; out, 63 µs.
        let moved = c.with_page_remaps(PageRemapCost::H200);
        let page = SHIM_PAGE_BYTES;
        let copy = page as f64 / 55.0;
        assert!((moved.h2d_ns(page) as f64 - (copy + 34_000.0)).abs() < 2.0);
        assert!((moved.d2h_ns(page) as f64 - (copy + 63_000.0)).abs() < 2.0);
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
}
