//! libtensile's general configuration: `TENSILE_LOG`, `TENSILE_TRACE` and `TENSILE_POLICY`
//! (environment variables are a contract, see ARCHITECTURE.md), parsed once.
//!
//! A bad value never stops the application: it becomes a clear one-line problem report
//! (logged at start) and the safe default. This module only parses; it does not act on
//! the values. The memory settings (`TENSILE_DEVICE_MEMORY`, `TENSILE_HOST_MEMORY`) are
//! checked here with the memory manager's parser ([`SizeSpec`]) so that a bad value is
//! reported at start; a percentage is resolved when the manager starts (it needs the card).

use std::fmt;
use std::path::PathBuf;

use crate::memory::SizeSpec;

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

        if let Some(v) = get("TENSILE_DEVICE_MEMORY").filter(|v| !v.trim().is_empty()) {
            match SizeSpec::parse(&v) {
                Ok(spec) => c.device_memory = Some(spec),
                Err(e) => bad(
                    "TENSILE_DEVICE_MEMORY",
                    &v,
                    format!("{e}; expected e.g. 6GiB, 512MiB or 40%"),
                    "the card's free memory",
                ),
            }
        }
        if let Some(v) = get("TENSILE_HOST_MEMORY").filter(|v| !v.trim().is_empty()) {
            match SizeSpec::parse(&v) {
                Ok(spec) => c.host_memory = Some(spec),
                Err(e) => bad(
                    "TENSILE_HOST_MEMORY",
                    &v,
                    format!("{e}; expected e.g. 32GiB or 50%"),
                    "half the host's memory",
                ),
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
        assert_eq!(parse(&[("TENSILE_POLICY", " off ")]).0.policy, Policy::Off);
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
                && line.contains("using the card's free memory"),
            "{line}"
        );
        assert!(p[1].to_string().contains("TENSILE_HOST_MEMORY"), "{}", p[1]);
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
