//! `trace-info --timeline`: a recorded run as a Chrome trace-event timeline (see
//! `chrome_trace`), for Perfetto or `chrome://tracing`.
//!
//! What a trace holds decides what can be drawn, and this module invents nothing beyond the
//! placement rule below:
//! - Process "device (recorded)": one track per stream, in order of first use. Each op starts
//!   at its host call time or when the stream's previous op ends, whichever is later (the
//!   trace records when work was submitted, not when the GPU started it). Kernels with a
//!   measured GPU time are spans of that length; kernels without one are instants (the trace
//!   does not say how long they ran). Application copies and memsets are spans of a modelled
//!   length (bytes at the analyzer's default bandwidths, named in their `args`): the trace
//!   records their size, not their duration. A counter track follows the bytes allocated.
//! - Process "host": the host's waits for the device (syncs), as instants at their call time.
//! - Process "libtensile swapping": the swap statistics the shim wrote at exit, as one
//!   instant at the end of the run with the totals (bytes each way, stalled launches, stall
//!   time) in its `args`. The trace format records no individual swaps or stalls, so none
//!   are drawn; a timeline of a simulated policy is `tensile replay --timeline`.

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use tensile_analyzer::model::{CopyDir, OpKind, SyncScope, Trace};
use tensile_analyzer::CostModel;
use tensile_trace::Stats;

use crate::chrome_trace::{us, ChromeTrace, InstantScope};

const DEVICE_PID: u32 = 1;
const HOST_PID: u32 = 2;
const SWAP_PID: u32 = 3;

fn stream_label(stream: u64) -> String {
    if stream == 0 {
        "stream 0 (legacy default)".to_string()
    } else {
        format!("stream {stream:#x}")
    }
}

fn args(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

/// Modelled duration of `bytes` at `gbps` (1 GB = 1e9 bytes), in ns.
fn modelled_ns(bytes: u64, gbps: f64) -> u64 {
    (bytes as f64 / gbps).round() as u64
}

/// Builds the timeline of `trace`; `stats` are the swap statistics records the file held.
pub fn build(trace: &Trace, stats: &[Stats]) -> ChromeTrace {
    let cost = CostModel::default();
    let mut out = ChromeTrace::new();
    out.process_name(DEVICE_PID, "device (recorded; ops placed in stream order)");
    out.process_name(HOST_PID, "host");
    out.thread_name(HOST_PID, 1, "host waits (syncs)", 0);

    let mut tids: HashMap<u64, u32> = HashMap::new();
    let mut free_at: HashMap<u64, u64> = HashMap::new();
    let mut end_ns = 0u64;
    for op in &trace.ops {
        let next = tids.len() as u32 + 1;
        let tid = *tids.entry(op.stream).or_insert_with(|| {
            out.thread_name(DEVICE_PID, next, &stream_label(op.stream), i64::from(next));
            next
        });
        let ready = free_at.entry(op.stream).or_insert(0);
        let start = op.t_ns.max(*ready);
        let touches = json!(op.touches.len());
        let (name, category, dur_ns, extra) = match op.kind {
            OpKind::Launch { kernel } => {
                let name = trace.kernel_name(kernel).unwrap_or("?").to_string();
                let seq = ("launch_seq", json!(op.seq));
                match op.gpu_ns {
                    Some(ns) => (name, "kernel", Some(ns), vec![seq, ("gpu_ns", json!(ns))]),
                    None => (name, "kernel (no measured time)", None, vec![seq]),
                }
            }
            OpKind::Copy { dir } => {
                let (label, gbps) = match dir {
                    CopyDir::HostToDevice => ("copy H2D", cost.h2d_gbps),
                    CopyDir::DeviceToHost => ("copy D2H", cost.d2h_gbps),
                    CopyDir::DeviceToDevice => ("copy D2D", cost.d2d_gbps),
                    CopyDir::Any => ("copy (direction inferred)", cost.h2d_gbps),
                };
                (
                    label.to_string(),
                    "copy",
                    Some(modelled_ns(op.bytes, gbps)),
                    vec![
                        ("bytes", json!(op.bytes)),
                        ("modelled_at_gbps", json!(gbps)),
                    ],
                )
            }
            OpKind::Memset => (
                "memset".to_string(),
                "memset",
                Some(modelled_ns(op.bytes, cost.memset_gbps)),
                vec![
                    ("bytes", json!(op.bytes)),
                    ("modelled_at_gbps", json!(cost.memset_gbps)),
                ],
            ),
        };
        let mut a = args(&[("allocations", touches)]);
        a.extend(extra.into_iter().map(|(k, v)| (k.to_string(), v)));
        match dur_ns {
            Some(dur) => {
                out.complete(DEVICE_PID, tid, &name, category, us(start), us(dur), a);
                *ready = start + dur;
            }
            None => {
                out.instant(
                    DEVICE_PID,
                    tid,
                    &name,
                    category,
                    us(start),
                    InstantScope::Thread,
                    a,
                );
                *ready = start;
            }
        }
        end_ns = end_ns.max(*ready);
    }

    // Bytes allocated, a step at every allocation and free (frees first at equal times).
    let mut changes: Vec<(u64, bool, u64)> = Vec::new();
    for a in &trace.allocations {
        changes.push((a.t_ns, true, a.bytes));
        if let Some(f) = a.free {
            changes.push((f.t_ns, false, a.bytes));
        }
    }
    changes.sort_by_key(|&(t, is_alloc, _)| (t, is_alloc));
    let mut live = 0u64;
    for (t, is_alloc, n) in changes {
        live = if is_alloc {
            live + n
        } else {
            live.saturating_sub(n)
        };
        out.counter(
            DEVICE_PID,
            "bytes allocated",
            us(t),
            &[("bytes", live as f64)],
        );
        end_ns = end_ns.max(t);
    }

    for s in &trace.syncs {
        let name = match s.scope {
            SyncScope::Stream(h) => format!("wait for {}", stream_label(h)),
            SyncScope::Event(h) => format!("wait for event {h:#x}"),
            SyncScope::Device => "wait for the device".to_string(),
        };
        out.instant(
            HOST_PID,
            1,
            &name,
            "sync",
            us(s.t_ns),
            InstantScope::Thread,
            Map::new(),
        );
        end_ns = end_ns.max(s.t_ns);
    }

    if !stats.is_empty() {
        out.process_name(SWAP_PID, "libtensile swapping (process totals at exit)");
        out.thread_name(SWAP_PID, 1, "swap statistics", 0);
        for s in stats {
            let a = args(&[
                ("bytes_to_host", json!(s.bytes_to_host)),
                ("bytes_to_device", json!(s.bytes_to_device)),
                ("stalled_launches", json!(s.stalled_launches)),
                ("stall_ns", json!(s.stall_ns)),
                ("peak_resident_bytes", json!(s.peak_resident_bytes)),
                ("host_pool_bytes", json!(s.host_pool_bytes)),
            ]);
            out.instant(
                SWAP_PID,
                1,
                "swap statistics (totals; the trace records no single swaps)",
                "swap",
                us(end_ns),
                InstantScope::Process,
                a,
            );
        }
    }
    out
}
