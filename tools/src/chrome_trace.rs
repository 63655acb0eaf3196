//! A writer for the Chrome trace-event JSON format, which Perfetto (ui.perfetto.dev) and
//! `chrome://tracing` open.
//!
//! The document is one object, `{"traceEvents": [...], "displayTimeUnit": "ms"}`. Events used
//! here, each with `ph` (phase), `pid`, `tid`, `ts` and `name`:
//! - `X` complete events: a span with a `dur`; `ts` and `dur` are microseconds (fractions kept).
//! - `i` instant events: a point in time, `s` = `t` (thread), `p` (process) or `g` (global).
//! - `C` counter events: `args` maps series names to numbers; one track per (pid, name).
//! - `M` metadata events: `process_name` / `thread_name` / `thread_sort_index`, at `ts` 0.
//!
//! [`ChromeTrace::to_json`] writes the metadata first, then every other event sorted by `ts`
//! (stable, so events of one track keep the order they were added in at equal times): `ts` is
//! therefore monotone on every track. This module only writes the format; what goes on which
//! track is the caller's business (for `trace-info` see `trace_info::timeline`).

use std::path::Path;

use serde_json::{json, Map, Value};

/// Microseconds, the format's time unit.
pub fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The scope of an instant event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstantScope {
    /// Drawn on its thread's track.
    Thread,
    /// Drawn across its process.
    Process,
}

/// A trace being built; see the module doc for the format.
#[derive(Debug, Default)]
pub struct ChromeTrace {
    metadata: Vec<Value>,
    events: Vec<(f64, Value)>,
}

impl ChromeTrace {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names a process (a group of tracks).
    pub fn process_name(&mut self, pid: u32, name: &str) {
        self.metadata.push(json!({
            "ph": "M", "pid": pid, "tid": 0, "ts": 0, "name": "process_name",
            "args": { "name": name },
        }));
    }

    /// Names a thread (one track) and places it: tracks are drawn by ascending `sort_index`.
    pub fn thread_name(&mut self, pid: u32, tid: u32, name: &str, sort_index: i64) {
        self.metadata.push(json!({
            "ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": "thread_name",
            "args": { "name": name },
        }));
        self.metadata.push(json!({
            "ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": "thread_sort_index",
            "args": { "sort_index": sort_index },
        }));
    }

    /// A span of `dur_us` from `ts_us` on track (`pid`, `tid`).
    #[allow(clippy::too_many_arguments)]
    pub fn complete(
        &mut self,
        pid: u32,
        tid: u32,
        name: &str,
        category: &str,
        ts_us: f64,
        dur_us: f64,
        args: Map<String, Value>,
    ) {
        self.events.push((
            ts_us,
            json!({
                "ph": "X", "pid": pid, "tid": tid, "ts": ts_us, "dur": dur_us.max(0.0),
                "name": name, "cat": category, "args": args,
            }),
        ));
    }

    /// A point event at `ts_us`.
    #[allow(clippy::too_many_arguments)]
    pub fn instant(
        &mut self,
        pid: u32,
        tid: u32,
        name: &str,
        category: &str,
        ts_us: f64,
        scope: InstantScope,
        args: Map<String, Value>,
    ) {
        let s = match scope {
            InstantScope::Thread => "t",
            InstantScope::Process => "p",
        };
        self.events.push((
            ts_us,
            json!({
                "ph": "i", "pid": pid, "tid": tid, "ts": ts_us, "s": s,
                "name": name, "cat": category, "args": args,
            }),
        ));
    }

    /// A counter sample: `series` values of counter `name` from `ts_us` on.
    pub fn counter(&mut self, pid: u32, name: &str, ts_us: f64, series: &[(&str, f64)]) {
        let args: Map<String, Value> = series
            .iter()
            .map(|(k, v)| ((*k).to_string(), json!(v)))
            .collect();
        self.events.push((
            ts_us,
            json!({ "ph": "C", "pid": pid, "tid": 0, "ts": ts_us, "name": name, "args": args }),
        ));
    }

    /// Number of events other than metadata.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// The whole document: metadata first, then the events by time.
    pub fn to_json(&self) -> Value {
        let mut events: Vec<&(f64, Value)> = self.events.iter().collect();
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        let all: Vec<Value> = self
            .metadata
            .iter()
            .cloned()
            .chain(events.into_iter().map(|(_, e)| e.clone()))
            .collect();
        json!({ "traceEvents": all, "displayTimeUnit": "ms" })
    }

    /// Writes the document to `path`.
    pub fn write(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string(&self.to_json()).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_comes_first_and_events_are_sorted_by_time() {
        let mut t = ChromeTrace::new();
        t.complete(1, 2, "late", "kernel", 50.0, 5.0, Map::new());
        t.process_name(1, "GPU");
        t.counter(1, "bytes", 10.0, &[("allocated", 3.0)]);
        t.instant(1, 2, "sync", "host", 20.0, InstantScope::Thread, Map::new());
        t.thread_name(1, 2, "stream 0", 0);
        let doc = t.to_json();
        let events = doc["traceEvents"].as_array().unwrap();
        let phases: Vec<&str> = events.iter().map(|e| e["ph"].as_str().unwrap()).collect();
        assert_eq!(phases, ["M", "M", "M", "C", "i", "X"]);
        assert_eq!(events[5]["dur"], 5.0);
        assert_eq!(events[3]["args"]["allocated"], 3.0);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn negative_durations_are_clamped_to_zero() {
        let mut t = ChromeTrace::new();
        t.complete(1, 1, "k", "kernel", 1.0, -3.0, Map::new());
        assert_eq!(t.to_json()["traceEvents"][0]["dur"], 0.0);
    }
}
