//! libtensile's configuration: `TENSILE_LOG`, `TENSILE_TRACE`, `TENSILE_POLICY`,
//! `TENSILE_PLAN`, `TENSILE_COORDINATOR` and the memory sizes (environment variables are a contract, see
//! ARCHITECTURE.md), parsed once.
//!
//! A bad value never stops the application: it becomes a clear one-line problem report
//! (logged at start) and the safe default. This module only parses; it does not act on
//! the values. The memory settings (`TENSILE_DEVICE_MEMORY`, `TENSILE_HOST_MEMORY`) are
//! checked here with the memory manager's parser ([`SizeSpec`]) so that a bad value is
//! reported at start; a byte count below one page is refused here, a percentage is resolved
//! (and checked the same way) when the manager starts, since it needs the card
//! ([`crate::managed::sizing`]).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use tensile_protocol::Priority;

use crate::memory::SizeSpec;

/// The smallest memory setting that means anything: one 2 MiB page, the unit the manager
/// maps and swaps. Below it the budget could hold nothing and every call would fail.
pub const MIN_MEMORY_SETTING: u64 = 2 << 20;

/// Longest shared-memory name `TENSILE_COORDINATOR` accepts (`NAME_MAX` is 255; the
/// coordinator adds its own suffixes).
pub const MAX_COORDINATOR_NAME: usize = 200;

/// Which coordinator to use (`TENSILE_COORDINATOR`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Coordinator {
    /// Join the machine's coordinator, starting one if none runs (default).
    #[default]
    Auto,
    /// No coordinator: learn and plan in the process.
    Off,
    /// Join the coordinator of this shared-memory segment name (checked: no `/`, at most
    /// [`MAX_COORDINATOR_NAME`] characters, printable ASCII without spaces).
    Named(String),
}

impl Coordinator {
    /// Parses a `TENSILE_COORDINATOR` value; the error says why it is not a valid name.
    pub fn parse(text: &str) -> Result<Coordinator, String> {
        let t = text.trim();
        match t.to_ascii_lowercase().as_str() {
            "" | "auto" => return Ok(Coordinator::Auto),
            "off" => return Ok(Coordinator::Off),
            _ => {}
        }
        if t.len() > MAX_COORDINATOR_NAME {
            return Err(format!(
                "a shared-memory name of {} bytes is longer than {MAX_COORDINATOR_NAME}",
                t.len()
            ));
        }
        if t.contains('/') {
            return Err("a shared-memory name must not contain '/'".into());
        }
        if let Some(c) = t.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(format!(
                "a shared-memory name must be printable ASCII without spaces ({c:?} is not)"
            ));
        }
        if t == "." || t == ".." {
            return Err(format!("`{t}` is not a file name"));
        }
        Ok(Coordinator::Named(t.to_owned()))
    }
}

/// How long an access that needs more device memory than this job's grant waits for the
/// coordinator to grant more before it fails with out of memory (`TENSILE_GRANT_WAIT`:
/// seconds, or `forever`). A job that shares a card waits while the others give memory back;
/// one whose largest launch cannot fit beside the others' floors is told so in one line at
/// once, and then waits this long for them to leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantWait {
    For(Duration),
    Forever,
}

impl Default for GrantWait {
    fn default() -> Self {
        GrantWait::For(Duration::from_secs(30))
    }
}

impl GrantWait {
    /// Parses `SECS` (a number of seconds, 0 or more) or `forever`.
    pub fn parse(text: &str) -> Result<GrantWait, String> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("forever") {
            return Ok(GrantWait::Forever);
        }
        match t.parse::<f64>() {
            Ok(secs) if (0.0..1e9).contains(&secs) => {
                Ok(GrantWait::For(Duration::from_secs_f64(secs)))
            }
            _ => Err("expected a number of seconds (0 or more) or forever".into()),
        }
    }

    /// As a bound on a wait: [`Duration::MAX`] for ever.
    pub fn bound(self) -> Duration {
        match self {
            GrantWait::For(d) => d,
            GrantWait::Forever => Duration::MAX,
        }
    }
}

/// The swap policy (`TENSILE_POLICY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Plan swaps from the learned iteration (default).
    #[default]
    Plan,
    /// On-demand LRU swapping only.
    Lru,
    /// Track and trace, never swap.
    Off,
}

/// Every setting, with defaults applied.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// `TENSILE_LOG`: a `tracing` filter; `None` means the default (`warn`).
    pub log: Option<String>,
    /// `TENSILE_TRACE`: where to write the trace (`%p` already replaced by the pid).
    pub trace: Option<PathBuf>,
    /// `TENSILE_POLICY`.
    pub policy: Policy,
    /// `TENSILE_DEVICE_MEMORY`: the device budget (`None`: the card's free memory).
    pub device_memory: Option<SizeSpec>,
    /// `TENSILE_HOST_MEMORY`: the pinned host pool's cap (`None`: half the host's memory).
    pub host_memory: Option<SizeSpec>,
    /// `TENSILE_COORDINATOR`.
    pub coordinator: Coordinator,
    /// `TENSILE_PLAN`: an encoded plan to execute from the start (`%p` replaced by the pid);
    /// read when the runtime starts, used under `TENSILE_POLICY=plan`.
    pub plan_file: Option<PathBuf>,
    /// `TENSILE_PLAN_GBPS`: the copy bandwidths the planner assumes, GB/s (`None`: the H100's
    /// measured 55 each way, 92 both at once). Remaps are priced on top.
    pub plan_gbps: Option<PlanBandwidths>,
    /// `TENSILE_PLAN_VMM_TIME`: how many times the H100's the planner prices the driver's
    /// remap calls at (`None`: 1; `tensile rerun` sets its time scale, at which the simulated
    /// card charges them).
    pub plan_vmm_time: Option<f64>,
    /// `TENSILE_PLAN_ROOM`: the share of the budget learned plans leave free, for what the
    /// run does that a plan cannot place (`None`: the analyzer's `DEFAULT_PLAN_ROOM`, 20%).
    pub plan_room: Option<f64>,
    /// `TENSILE_PRIORITY`: how this job ranks against others on the GPU when the coordinator
    /// divides its memory.
    pub priority: Priority,
    /// `TENSILE_SWAPPED=host|unmapped`: whether a swapped-out page's address is left unmapped
    /// (true: each page moved costs about a third of the driver's VMM time, but an access the
    /// shim did not foresee faults the GPU) rather than mapped to its host copy (false, the
    /// default: such an access runs at PCIe speed). docs/memory.md.
    pub swapped_unmapped: bool,
    /// `TENSILE_HOST_UNITS=on|off` (default on): whether pages that leave the device
    /// together (one tensor's) go into one pinned allocation, mapped once at their address,
    /// and come back together, instead of one pinned page and one mapping each. Halves the
    /// MLP's step on the H200 and cuts GPT-2's by a fifth (docs/gpu-results.md, "Host units");
    /// docs/memory.md.
    pub host_frames: HostFrames,
    /// `TENSILE_HANDOVER=on|off` (default on; true here: off): whether a page read back when
    /// no device frame is free may take the frames of a unit still leaving, its copy in
    /// ordered after that unit's copy out on the device, rather than wait for the copy out
    /// and remap the unit first on the reading thread (docs/memory.md, "Frames handed over").
    pub handover_off: bool,
    /// `TENSILE_GRANT_WAIT`: how long an access larger than this job's grant waits for it to
    /// grow (default 30 s).
    pub grant_wait: GrantWait,
}

/// How swapped-out pages are held in pinned host memory (`TENSILE_HOST_UNITS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostFrames {
    /// The pages that leave together share one allocation, mapped once (`on`).
    #[default]
    Units,
    /// One allocation and one mapping per page (`off`).
    Singles,
}

/// Copy bandwidths for the planner's cost model, GB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanBandwidths {
    pub to_device: f64,
    pub to_host: f64,
    /// Both directions at once, in total.
    pub both: f64,
}

impl PlanBandwidths {
    /// Parses `H2D,D2H,BOTH`, or one number for each direction (both at once then gets the
    /// H100's ratio, 92/55 of it).
    pub fn parse(text: &str) -> Result<PlanBandwidths, String> {
        let values: Vec<f64> = text
            .split(',')
            .map(|v| {
                let v = v.trim();
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| format!("`{v}` is not a positive number of GB/s"))
            })
            .collect::<Result<_, _>>()?;
        match values[..] {
            [one] => Ok(PlanBandwidths {
                to_device: one,
                to_host: one,
                both: one * 92.0 / 55.0,
            }),
            [to_device, to_host, both] => Ok(PlanBandwidths {
                to_device,
                to_host,
                both,
            }),
            _ => Err(format!("{} numbers given, expected 1 or 3", values.len())),
        }
    }
}

/// A variable whose value could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub variable: &'static str,
    pub value: String,
    pub why: String,
    pub fallback: &'static str,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} is not valid ({}); using {}",
            self.variable, self.value, self.why, self.fallback
        )
    }
}

/// What an unset or refused `TENSILE_DEVICE_MEMORY` means (see [`crate::memory::budget`]).
pub const DEFAULT_DEVICE_MEMORY: &str =
    "the card's free memory less headroom for libraries that allocate around the arena";
/// What an unset or refused `TENSILE_HOST_MEMORY` means.
pub const DEFAULT_HOST_MEMORY: &str = "half the host's memory";

/// A switch's value: `on`, `1`, `true` or `off`, `0`, `false`, in any case, spaces around
/// ignored; `None` for anything else.
fn on_off(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "true" => Some(true),
        "off" | "0" | "false" => Some(false),
        _ => None,
    }
}

/// Parses a memory size setting, refusing a byte count below one page (a percentage is
/// checked once it is resolved against the card or the host).
pub fn parse_memory_setting(text: &str) -> Result<SizeSpec, String> {
    match SizeSpec::parse(text) {
        Ok(SizeSpec::Bytes(b)) if b < MIN_MEMORY_SETTING => Err(format!(
            "{} is below one page ({}), the least the manager can use",
            crate::memory::budget::format_size(b),
            crate::memory::budget::format_size(MIN_MEMORY_SETTING)
        )),
        Ok(spec) => Ok(spec),
        Err(e) => Err(e.to_string()),
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> (Config, Vec<Problem>) {
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the settings through `get` (the environment, or a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> (Config, Vec<Problem>) {
        let mut problems = Vec::new();
        let mut c = Config::default();
        let mut bad = |variable: &'static str, value: &str, why: String, fallback: &'static str| {
            problems.push(Problem {
                variable,
                value: value.to_owned(),
                why,
                fallback,
            })
        };

        c.log = get("TENSILE_LOG").filter(|v| !v.trim().is_empty());

        if let Some(v) = get("TENSILE_TRACE").filter(|v| !v.is_empty()) {
            c.trace = Some(PathBuf::from(
                v.replace("%p", &std::process::id().to_string()),
            ));
        }

        if let Some(v) = get("TENSILE_PLAN").filter(|v| !v.trim().is_empty()) {
            c.plan_file = Some(PathBuf::from(
                v.replace("%p", &std::process::id().to_string()),
            ));
        }

        if let Some(v) = get("TENSILE_POLICY") {
            match v.trim().to_ascii_lowercase().as_str() {
                "" | "plan" => c.policy = Policy::Plan,
                "lru" => c.policy = Policy::Lru,
                "off" => c.policy = Policy::Off,
                _ => bad(
                    "TENSILE_POLICY",
                    &v,
                    "expected plan, lru or off".into(),
                    "plan",
                ),
            }
        }

        let memory = |variable: &'static str, example: &str, fallback: &'static str| {
            let v = get(variable).filter(|v| !v.trim().is_empty())?;
            Some(match parse_memory_setting(&v) {
                Ok(spec) => Ok(spec),
                Err(why) => Err(Problem {
                    variable,
                    value: v,
                    why: format!("{why}; expected e.g. {example}"),
                    fallback,
                }),
            })
        };
        match memory(
            "TENSILE_DEVICE_MEMORY",
            "6GiB, 512MiB or 40%",
            DEFAULT_DEVICE_MEMORY,
        ) {
            Some(Ok(spec)) => c.device_memory = Some(spec),
            Some(Err(p)) => problems.push(p),
            None => {}
        }
        match memory("TENSILE_HOST_MEMORY", "32GiB or 50%", DEFAULT_HOST_MEMORY) {
            Some(Ok(spec)) => c.host_memory = Some(spec),
            Some(Err(p)) => problems.push(p),
            None => {}
        }

        if let Some(v) = get("TENSILE_PLAN_GBPS").filter(|v| !v.trim().is_empty()) {
            match PlanBandwidths::parse(&v) {
                Ok(b) => c.plan_gbps = Some(b),
                Err(why) => problems.push(Problem {
                    variable: "TENSILE_PLAN_GBPS",
                    value: v,
                    why: format!(
                        "{why}; expected e.g. 55,55,92 (to the device, to the host, both)"
                    ),
                    fallback: "the H100's 55,55,92",
                }),
            }
        }

        if let Some(v) = get("TENSILE_PLAN_VMM_TIME").filter(|v| !v.trim().is_empty()) {
            match v.trim().parse::<f64>() {
                Ok(k) if k.is_finite() && k >= 0.0 => c.plan_vmm_time = Some(k),
                _ => problems.push(Problem {
                    variable: "TENSILE_PLAN_VMM_TIME",
                    value: v,
                    why: "not a number of times the H100's call times (0 or more)".into(),
                    fallback: "the H100's call times",
                }),
            }
        }

        if let Some(v) = get("TENSILE_PLAN_ROOM").filter(|v| !v.trim().is_empty()) {
            match tensile_analyzer::online::parse_room(&v) {
                Ok(room) => c.plan_room = Some(room),
                Err(why) => problems.push(Problem {
                    variable: "TENSILE_PLAN_ROOM",
                    value: v,
                    why,
                    fallback: tensile_analyzer::online::DEFAULT_PLAN_ROOM_TEXT,
                }),
            }
        }

        if let Some(v) = get("TENSILE_PRIORITY").filter(|v| !v.trim().is_empty()) {
            match Priority::parse(&v) {
                Some(p) => c.priority = p,
                None => problems.push(Problem {
                    variable: "TENSILE_PRIORITY",
                    value: v,
                    why: "not a priority; expected high, normal or low".into(),
                    fallback: "normal",
                }),
            }
        }

        if let Some(v) = get("TENSILE_GRANT_WAIT").filter(|v| !v.trim().is_empty()) {
            match GrantWait::parse(&v) {
                Ok(w) => c.grant_wait = w,
                Err(why) => problems.push(Problem {
                    variable: "TENSILE_GRANT_WAIT",
                    value: v,
                    why,
                    fallback: "30",
                }),
            }
        }

        if let Some(v) = get("TENSILE_SWAPPED").filter(|v| !v.trim().is_empty()) {
            match v.trim().to_ascii_lowercase().as_str() {
                "host" => c.swapped_unmapped = false,
                "unmapped" => c.swapped_unmapped = true,
                _ => problems.push(Problem {
                    variable: "TENSILE_SWAPPED",
                    value: v,
                    why: "expected host or unmapped".into(),
                    fallback: "host",
                }),
            }
        }

        if let Some(v) = get("TENSILE_HOST_UNITS").filter(|v| !v.trim().is_empty()) {
            match on_off(&v) {
                Some(true) => c.host_frames = HostFrames::Units,
                Some(false) => c.host_frames = HostFrames::Singles,
                None => problems.push(Problem {
                    variable: "TENSILE_HOST_UNITS",
                    value: v,
                    why: "expected on or off".into(),
                    fallback: "off",
                }),
            }
        }

        if let Some(v) = get("TENSILE_HANDOVER").filter(|v| !v.trim().is_empty()) {
            match on_off(&v) {
                Some(on) => c.handover_off = !on,
                None => problems.push(Problem {
                    variable: "TENSILE_HANDOVER",
                    value: v,
                    why: "expected on or off".into(),
                    fallback: "on",
                }),
            }
        }

        if let Some(v) = get("TENSILE_COORDINATOR") {
            match Coordinator::parse(&v) {
                Ok(coordinator) => c.coordinator = coordinator,
                Err(why) => problems.push(Problem {
                    variable: "TENSILE_COORDINATOR",
                    value: v,
                    why: format!("{why}; expected auto, off or a shared-memory name"),
                    fallback: "auto",
                }),
            }
        }

        (c, problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> (Config, Vec<Problem>) {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let (c, p) = parse(&[]);
        assert!(p.is_empty());
        assert_eq!(c, Config::default());
        assert_eq!(c.policy, Policy::Plan);
        assert_eq!(c.trace, None);
    }

    #[test]
    fn valid_values_are_taken() {
        let (c, p) = parse(&[
            ("TENSILE_LOG", "tensile_shim=debug"),
            ("TENSILE_TRACE", "/tmp/run-%p.trace"),
            ("TENSILE_POLICY", "LRU"),
            ("TENSILE_PLAN", "/tmp/job.plan"),
        ]);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.log.as_deref(), Some("tensile_shim=debug"));
        assert_eq!(
            c.trace,
            Some(PathBuf::from(format!(
                "/tmp/run-{}.trace",
                std::process::id()
            )))
        );
        assert_eq!(c.policy, Policy::Lru);
        assert_eq!(c.plan_file, Some(PathBuf::from("/tmp/job.plan")));
        assert_eq!(parse(&[("TENSILE_POLICY", " off ")]).0.policy, Policy::Off);
        assert_eq!(parse(&[("TENSILE_PLAN", " ")]).0.plan_file, None);
    }

    #[test]
    fn memory_sizes_are_parsed_and_bad_ones_reported() {
        let (c, p) = parse(&[
            ("TENSILE_DEVICE_MEMORY", "6GiB"),
            ("TENSILE_HOST_MEMORY", "40%"),
        ]);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.device_memory, Some(SizeSpec::Bytes(6 << 30)));
        assert_eq!(c.host_memory.map(|s| s.resolve(100)), Some(40));
        let (c, p) = parse(&[
            ("TENSILE_DEVICE_MEMORY", "6 parsecs"),
            ("TENSILE_HOST_MEMORY", "0"),
        ]);
        assert_eq!((c.device_memory, c.host_memory), (None, None));
        assert_eq!(p.len(), 2, "{p:?}");
        let line = p[0].to_string();
        assert!(
            line.contains("TENSILE_DEVICE_MEMORY=\"6 parsecs\"")
                && line.contains("using the card's free memory less headroom"),
            "{line}"
        );
        assert!(p[1].to_string().contains("TENSILE_HOST_MEMORY"), "{}", p[1]);
    }

    #[test]
    fn a_size_below_one_page_is_refused_with_the_default() {
        for v in ["1", "1KiB", "0.5MiB", "2097151"] {
            for var in ["TENSILE_DEVICE_MEMORY", "TENSILE_HOST_MEMORY"] {
                let (c, p) = parse(&[(var, v)]);
                assert_eq!((c.device_memory, c.host_memory), (None, None), "{var}={v}");
                assert_eq!(p.len(), 1, "{var}={v}: {p:?}");
                let line = p[0].to_string();
                assert!(
                    line.starts_with(&format!("{var}=\"{v}\""))
                        && line.contains("below one page (2 MiB)")
                        && line.contains("using "),
                    "{line}"
                );
            }
        }
        let (c, p) = parse(&[
            ("TENSILE_DEVICE_MEMORY", "2MiB"),
            ("TENSILE_HOST_MEMORY", "2MiB"),
        ]);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.device_memory, Some(SizeSpec::Bytes(2 << 20)));
        assert_eq!(c.host_memory, Some(SizeSpec::Bytes(2 << 20)));
    }

    #[test]
    fn a_value_that_is_not_a_number_is_quoted() {
        let (_, p) = parse(&[("TENSILE_DEVICE_MEMORY", "abc")]);
        let line = p[0].to_string();
        assert!(
            line.contains("TENSILE_DEVICE_MEMORY=\"abc\" is not valid (`abc` is not a number"),
            "{line}"
        );
    }

    #[test]
    fn the_plans_room_is_a_percentage_and_a_bad_one_is_refused_in_one_line() {
        assert_eq!(parse(&[]).0.plan_room, None);
        for (v, want) in [("20%", 0.2), ("5", 0.05), (" 0 ", 0.0), ("90%", 0.9)] {
            let (c, problems) = parse(&[("TENSILE_PLAN_ROOM", v)]);
            assert!(problems.is_empty(), "{v}: {problems:?}");
            assert!((c.plan_room.unwrap() - want).abs() < 1e-12, "{v}");
        }
        for v in ["lots", "95%", "-1", "0.2x"] {
            let (c, problems) = parse(&[("TENSILE_PLAN_ROOM", v)]);
            assert_eq!(c.plan_room, None, "{v}");
            assert_eq!(problems.len(), 1, "{v}");
            assert_eq!(problems[0].variable, "TENSILE_PLAN_ROOM");
            let line = problems[0].to_string();
            assert_eq!(line.lines().count(), 1, "{line}");
            assert!(line.contains("20%"), "{line}");
        }
    }

    #[test]
    fn the_planners_bandwidths_are_parsed_and_checked() {
        let c = parse(&[("TENSILE_PLAN_GBPS", "10, 12,20")]).0;
        assert_eq!(
            c.plan_gbps,
            Some(PlanBandwidths {
                to_device: 10.0,
                to_host: 12.0,
                both: 20.0
            })
        );
        let one = parse(&[("TENSILE_PLAN_GBPS", "55")]).0.plan_gbps.unwrap();
        assert_eq!((one.to_device, one.to_host), (55.0, 55.0));
        assert!((one.both - 92.0).abs() < 1e-9);
        for v in ["fast", "1,2", "0", "-3,1,1", "inf"] {
            let (c, problems) = parse(&[("TENSILE_PLAN_GBPS", v)]);
            assert_eq!(c.plan_gbps, None, "{v}");
            assert_eq!(problems.len(), 1, "{v}");
            assert_eq!(problems[0].variable, "TENSILE_PLAN_GBPS");
        }
        assert_eq!(parse(&[]).0.plan_vmm_time, None);
        assert_eq!(
            parse(&[("TENSILE_PLAN_VMM_TIME", " 16 ")]).0.plan_vmm_time,
            Some(16.0)
        );
        for v in ["slow", "-1", "nan"] {
            let (c, problems) = parse(&[("TENSILE_PLAN_VMM_TIME", v)]);
            assert_eq!(c.plan_vmm_time, None, "{v}");
            assert_eq!(problems[0].variable, "TENSILE_PLAN_VMM_TIME", "{v}");
        }
    }

    #[test]
    fn the_priority_is_parsed_and_a_bad_one_named() {
        assert_eq!(parse(&[]).0.priority, Priority::Normal);
        for (v, want) in [
            ("high", Priority::High),
            (" LOW ", Priority::Low),
            ("Normal", Priority::Normal),
        ] {
            let (c, problems) = parse(&[("TENSILE_PRIORITY", v)]);
            assert!(problems.is_empty(), "{v}: {problems:?}");
            assert_eq!(c.priority, want, "{v}");
        }
        let (c, problems) = parse(&[("TENSILE_PRIORITY", "urgent")]);
        assert_eq!(c.priority, Priority::Normal);
        assert_eq!(problems.len(), 1);
        let line = problems[0].to_string();
        assert!(
            line.contains("TENSILE_PRIORITY=\"urgent\"") && line.contains("high, normal or low"),
            "{line}"
        );
    }

    #[test]
    fn the_grant_wait_is_seconds_or_forever_and_a_bad_one_named() {
        assert_eq!(
            parse(&[]).0.grant_wait,
            GrantWait::For(Duration::from_secs(30))
        );
        for (v, want) in [
            ("0", GrantWait::For(Duration::ZERO)),
            (" 2.5 ", GrantWait::For(Duration::from_millis(2500))),
            ("Forever", GrantWait::Forever),
        ] {
            let (c, problems) = parse(&[("TENSILE_GRANT_WAIT", v)]);
            assert!(problems.is_empty(), "{v}: {problems:?}");
            assert_eq!(c.grant_wait, want, "{v}");
        }
        assert_eq!(GrantWait::Forever.bound(), Duration::MAX);
        for v in ["-1", "soon", "inf", "NaN"] {
            let (c, problems) = parse(&[("TENSILE_GRANT_WAIT", v)]);
            assert_eq!(c.grant_wait, GrantWait::default(), "{v}");
            assert_eq!(problems.len(), 1, "{v}");
            let line = problems[0].to_string();
            assert!(
                line.contains("TENSILE_GRANT_WAIT") && line.contains("forever"),
                "{line}"
            );
        }
    }

    #[test]
    fn swapped_pages_stay_mapped_to_the_host_unless_asked_and_a_bad_value_says_so() {
        assert!(!parse(&[]).0.swapped_unmapped, "host mappings by default");
        assert!(
            parse(&[("TENSILE_SWAPPED", " Unmapped ")])
                .0
                .swapped_unmapped
        );
        assert!(!parse(&[("TENSILE_SWAPPED", "host")]).0.swapped_unmapped);
        let frames = |v: &str| parse(&[("TENSILE_HOST_UNITS", v)]).0.host_frames;
        assert_eq!(
            parse(&[]).0.host_frames,
            HostFrames::Units,
            "host units by default"
        );
        assert_eq!(frames(" Off "), HostFrames::Singles);
        assert_eq!(frames("on"), HostFrames::Units);
        let (c, problems) = parse(&[("TENSILE_HOST_UNITS", "maybe")]);
        assert_eq!(
            c.host_frames,
            HostFrames::Units,
            "a bad value keeps the default"
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].variable, "TENSILE_HOST_UNITS");
        assert!(!parse(&[]).0.handover_off, "frames handed over by default");
        assert!(parse(&[("TENSILE_HANDOVER", " OFF")]).0.handover_off);
        let (c, problems) = parse(&[("TENSILE_HANDOVER", "later")]);
        assert!(!c.handover_off, "a bad value keeps the default");
        assert_eq!(problems[0].variable, "TENSILE_HANDOVER");
        let (c, problems) = parse(&[("TENSILE_SWAPPED", "nowhere")]);
        assert!(!c.swapped_unmapped);
        assert_eq!(problems.len(), 1);
        let line = problems[0].to_string();
        assert!(line.contains("host or unmapped"), "{line}");
    }

    #[test]
    fn the_coordinator_is_parsed_and_checked() {
        assert_eq!(parse(&[]).0.coordinator, Coordinator::Auto);
        for (v, want) in [
            ("auto", Coordinator::Auto),
            (" OFF ", Coordinator::Off),
            ("tensile-lab-7", Coordinator::Named("tensile-lab-7".into())),
        ] {
            let (c, p) = parse(&[("TENSILE_COORDINATOR", v)]);
            assert!(p.is_empty(), "{v}: {p:?}");
            assert_eq!(c.coordinator, want, "{v}");
        }
        let long = "x".repeat(MAX_COORDINATOR_NAME + 1);
        for (v, why) in [
            ("/dev/shm/x", "'/'"),
            ("two words", "printable ASCII"),
            ("bell\u{7}", "printable ASCII"),
            ("..", "not a file name"),
            (long.as_str(), "longer than 200"),
        ] {
            let (c, p) = parse(&[("TENSILE_COORDINATOR", v)]);
            assert_eq!(c.coordinator, Coordinator::Auto, "{v}");
            assert_eq!(p.len(), 1, "{v}");
            let line = p[0].to_string();
            assert!(
                line.starts_with("TENSILE_COORDINATOR=")
                    && line.contains(why)
                    && line.ends_with("using auto"),
                "{line}"
            );
        }
        assert_eq!(
            Coordinator::parse(&"y".repeat(MAX_COORDINATOR_NAME)),
            Ok(Coordinator::Named("y".repeat(MAX_COORDINATOR_NAME)))
        );
    }

    #[test]
    fn bad_values_fall_back_with_a_clear_problem() {
        let (c, p) = parse(&[
            ("TENSILE_POLICY", "fast"),
            ("TENSILE_LOG", "  "),
            ("TENSILE_TRACE", ""),
        ]);
        assert_eq!(c.policy, Policy::Plan);
        assert_eq!(c.log, None);
        assert_eq!(c.trace, None);
        assert_eq!(p.len(), 1);
        let line = p[0].to_string();
        assert!(line.contains("TENSILE_POLICY"), "{line}");
        assert!(
            line.contains("TENSILE_POLICY=\"fast\"") && line.contains("using plan"),
            "{line}"
        );
    }
}
