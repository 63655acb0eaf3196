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
//! - Process "libtensile": what the library did (format 2 traces). Each copy it queued is an
//!   instant at its host time on the track of its direction ("swap-outs queued", "swap-ins
//!   queued"; pages, bytes and cause in `args`: when the device ran the copy is not
//!   recorded), with counters of the bytes moved each way so far; each span of host time it
//!   spent (stalled accesses, remaps, pinning host memory, lock waits) is a span on a track
//!   per thread, as measured; plans loaded and dropped are instants across the process. The
//!   swap statistics written at exit are one instant at the end with the totals. A timeline
//!   of a simulated policy is `tensile replay --timeline`.

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use tensile_analyzer::model::{CopyDir, OpKind, SyncScope, Trace};
use tensile_analyzer::CostModel;
use tensile_trace::{PlanChangeKind, Stats, SwapDir};

use super::library::{busy_name, cause_name, LibraryWork};
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

/// Builds the timeline of `trace`; `stats` are the swap statistics records the file held,
/// `library` the library's own records.
pub fn build(trace: &Trace, stats: &[Stats], library: &LibraryWork) -> ChromeTrace {
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

    if !library.is_empty() {
        end_ns = end_ns.max(library_tracks(&mut out, library));
    }
    if !stats.is_empty() {
        if library.is_empty() {
            out.process_name(SWAP_PID, "libtensile swapping (process totals at exit)");
        }
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
                "swap statistics (process totals at exit)",
                "swap",
                us(end_ns),
                InstantScope::Process,
                a,
            );
        }
    }
    out
}

/// Tracks of the swap process for the library's own records; returns the latest time drawn.
fn library_tracks(out: &mut ChromeTrace, library: &LibraryWork) -> u64 {
    const OUT_TID: u32 = 2;
    const IN_TID: u32 = 3;
    out.process_name(
        SWAP_PID,
        "libtensile (swaps as queued on the host; host time as measured)",
    );
    out.thread_name(SWAP_PID, OUT_TID, "swap-outs queued", 1);
    out.thread_name(SWAP_PID, IN_TID, "swap-ins queued", 2);
    let mut end_ns = 0u64;
    let (mut to_host, mut to_device) = (0u64, 0u64);
    for s in &library.swaps {
        let (tid, moved, label) = match s.dir {
            SwapDir::ToHost => (OUT_TID, &mut to_host, "out"),
            SwapDir::ToDevice => (IN_TID, &mut to_device, "in"),
        };
        *moved += s.bytes;
        let cause = cause_name(s.dir, s.cause);
        out.instant(
            SWAP_PID,
            tid,
            &format!("{label} {} pages ({cause})", s.pages),
            "swap",
            us(s.t_ns),
            InstantScope::Thread,
            args(&[
                ("pages", json!(s.pages)),
                ("bytes", json!(s.bytes)),
                ("cause", json!(cause)),
                // Where the pages are (format 3): the first address and the pages of each run.
                (
                    "at",
                    json!(s
                        .runs
                        .iter()
                        .map(|&(addr, n)| json!([format!("{addr:#x}"), n]))
                        .collect::<Vec<_>>()),
                ),
            ]),
        );
        out.counter(
            SWAP_PID,
            "bytes swapped so far",
            us(s.t_ns),
            &[("to host", to_host as f64), ("to device", to_device as f64)],
        );
        end_ns = end_ns.max(s.t_ns);
    }
    // One track per thread, numbered in order of first appearance after the swap tracks.
    let mut tids: HashMap<u32, u32> = HashMap::new();
    for b in &library.busy {
        let next = 10 + tids.len() as u32;
        let tid = *tids.entry(b.thread).or_insert_with(|| {
            out.thread_name(
                SWAP_PID,
                next,
                &format!("thread {} (library host time)", b.thread),
                i64::from(next),
            );
            next
        });
        out.complete(
            SWAP_PID,
            tid,
            busy_name(b.kind),
            "library host time",
            us(b.t_ns),
            us(b.dur_ns),
            args(&[("pages", json!(b.pages))]),
        );
        end_ns = end_ns.max(b.t_ns + b.dur_ns);
    }
    for p in &library.plans {
        let (name, a) = match &p.change {
            PlanChangeKind::Loaded {
                applies_from, plan, ..
            } => (
                format!("plan {} loaded", p.version),
                args(&[
                    ("launches", json!(p.launches)),
                    ("applies_from_launch", json!(applies_from)),
                    ("plan_bytes", json!(plan.len())),
                ]),
            ),
            PlanChangeKind::Dropped { reason } => (
                format!("plan {} dropped", p.version),
                args(&[("launches", json!(p.launches)), ("reason", json!(reason))]),
            ),
        };
        out.instant(
            SWAP_PID,
            OUT_TID,
            &name,
            "plan",
            us(p.t_ns),
            InstantScope::Process,
            a,
        );
        end_ns = end_ns.max(p.t_ns);
    }
    end_ns
}
