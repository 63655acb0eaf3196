//! `tensile replay --timeline out.json`: one simulated steady-state iteration per policy as a
//! Chrome trace-event file, for Perfetto (ui.perfetto.dev) and `chrome://tracing`.
//!
//! Each policy is a process (`pid` 1, 2, ... in the order asked) with four tracks: the compute
//! stream (one complete event per op), the host-to-device and the device-to-host copy engines
//! (one per copy, named by the tensor or piece it moved), and stalls (the compute stream waiting
//! before an op); plus a counter of the bytes on the device at each op start. Times are in
//! microseconds from the start of the iteration (a copy begun in the previous iteration starts
//! before 0). What it shows is the simulator's model (docs/planner.md), not a measured run: for
//! a recorded run, `tensile trace-info --timeline`. This module only writes the file.

use serde_json::{json, Value};
use tensile_analyzer::{Cycle, Evaluation, PolicyKind};

const COMPUTE_TID: u32 = 1;
const H2D_TID: u32 = 2;
const D2H_TID: u32 = 3;
const STALL_TID: u32 = 4;

/// The trace-event document for `results` (each evaluated with the resident curve recorded).
pub fn timeline_json(cycle: &Cycle, results: &[Evaluation]) -> Value {
    let us = |ns: f64| ns / 1e3;
    let mut events = Vec::new();
    for (i, r) in results.iter().enumerate() {
        let pid = i as u32 + 1;
        let name = match r.policy {
            PolicyKind::Plan => "plan",
            PolicyKind::Lru => "lru",
            PolicyKind::None => "none",
        };
        events.push(
            json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": format!("{name} (simulated steady-state iteration)")}}),
        );
        for (tid, track) in [
            (COMPUTE_TID, "compute"),
            (H2D_TID, "copy engine host-to-device"),
            (D2H_TID, "copy engine device-to-host"),
            (STALL_TID, "stalls"),
        ] {
            events.push(
                json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                "args": {"name": track}}),
            );
        }
        let rep = &r.report;
        // Op starts come from the resident curve (one point per op start).
        let mut previous_end = 0.0f64;
        for (pos, (op, &(start, resident))) in cycle.ops.iter().zip(&rep.resident_curve).enumerate()
        {
            let start = start as f64;
            if start > previous_end {
                events.push(json!({"name": format!("stall before op {pos}"), "ph": "X",
                    "pid": pid, "tid": STALL_TID, "ts": us(previous_end),
                    "dur": us(start - previous_end)}));
            }
            events.push(json!({"name": format!("op {pos}"), "ph": "X", "pid": pid,
                "tid": COMPUTE_TID, "ts": us(start), "dur": us(op.duration_ns as f64),
                "args": {"tensors": op.tensors.len()}}));
            events.push(
                json!({"name": "resident bytes", "ph": "C", "pid": pid, "tid": 0,
                "ts": us(start), "args": {"bytes": resident}}),
            );
            previous_end = start + op.duration_ns as f64;
        }
        for c in &rep.copies {
            let (tid, dir) = if c.to_device {
                (H2D_TID, "read-back")
            } else {
                (D2H_TID, "write-out")
            };
            events.push(
                json!({"name": format!("{dir} {}", c.tensor), "ph": "X", "pid": pid,
                "tid": tid, "ts": us(c.start_ns), "dur": us(c.end_ns - c.start_ns),
                "args": {"bytes": c.bytes}}),
            );
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_analyzer::cost::{Budget, CostModel};
    use tensile_analyzer::cycle::{Identity, Tensor};
    use tensile_analyzer::{evaluate_many, BoundOptions};

    /// Checks every event against the trace-event format's required fields.
    fn check_events(doc: &Value) -> Vec<Value> {
        let events = doc["traceEvents"]
            .as_array()
            .expect("traceEvents array")
            .clone();
        for e in &events {
            let ph = e["ph"].as_str().expect("ph");
            assert!(e["name"].is_string(), "{e}");
            assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
            match ph {
                "X" => {
                    assert!(e["ts"].is_number(), "{e}");
                    assert!(e["dur"].as_f64().expect("dur") >= 0.0, "{e}");
                }
                "C" => {
                    assert!(e["ts"].is_number(), "{e}");
                    assert!(e["args"].as_object().is_some_and(|a| !a.is_empty()), "{e}");
                }
                "M" => assert!(e["args"]["name"].is_string(), "{e}"),
                other => panic!("unexpected phase {other}: {e}"),
            }
        }
        events
    }

    #[test]
    fn the_timeline_file_has_every_track_and_well_formed_events() {
        // Two 64 MiB tensors taking turns with room for one and a bit: the plan must copy.
        let tensor = |i: u32, accesses| Tensor {
            identity: Identity::Persistent {
                trace_id: u64::from(i) + 1,
            },
            bytes: 64 << 20,
            accesses,
            alloc_at: None,
            free_at: None,
            source: i,
        };
        let cycle = Cycle::from_parts(
            &[100_000, 100_000],
            vec![tensor(0, vec![0]), tensor(1, vec![1])],
        )
        .unwrap();
        let results = evaluate_many(
            &cycle,
            &[PolicyKind::Plan, PolicyKind::Lru],
            Budget::new(96 << 20),
            &CostModel::default(),
            &BoundOptions::default(),
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!("tensile-timeline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.json");
        std::fs::write(&path, timeline_json(&cycle, &results).to_string()).unwrap();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let events = check_events(&doc);
        for pid in [1, 2] {
            let of = |ph: &str, tid: u64| {
                events
                    .iter()
                    .filter(|e| e["pid"] == pid && e["ph"] == ph && e["tid"] == tid)
                    .count()
            };
            assert_eq!(of("X", 1), 2, "one event per op");
            assert!(of("X", 2) >= 1 && of("X", 3) >= 1, "copies both ways");
            assert!(of("X", 4) >= 1, "the copies cannot hide: stalls");
            assert_eq!(of("C", 0), 2, "a counter point per op start");
            assert_eq!(
                of("M", 0) + of("M", 1) + of("M", 2) + of("M", 3) + of("M", 4),
                5
            );
        }
    }
}
