//! The summary of a trace loaded into the analyzer's model: how `trace-info` reports a capture
//! v1 file (the text format of the shared PyTorch traces), which has no header, no record
//! count and no swap statistics. Native traces get the fuller streamed report of `native`.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use tensile_analyzer::model::{CopyDir, OpKind, Trace};

use super::{bytes, pct, write_top_kernels, KernelStats};

/// The report of a loaded trace, in the same shape as the native one where the data allows.
pub fn report(trace: &Trace, top: usize) -> String {
    let mut out = String::new();
    let span_ns = trace
        .ops
        .iter()
        .map(|op| op.t_ns)
        .chain(trace.allocations.iter().map(|a| a.t_ns))
        .chain(trace.syncs.iter().map(|s| s.t_ns))
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "device ops: {} over {:.3} s",
        trace.ops.len(),
        span_ns as f64 / 1e9
    );

    // Peak live bytes: allocations and frees by time, frees first at equal times.
    let mut changes: Vec<(u64, bool, u64)> = Vec::with_capacity(trace.allocations.len() * 2);
    for a in &trace.allocations {
        changes.push((a.t_ns, true, a.bytes));
        if let Some(free) = a.free {
            changes.push((free.t_ns, false, a.bytes));
        }
    }
    changes.sort_by_key(|&(t, is_alloc, _)| (t, is_alloc));
    let (mut live, mut peak) = (0u64, 0u64);
    for (_, is_alloc, n) in changes {
        if is_alloc {
            live += n;
            peak = peak.max(live);
        } else {
            live = live.saturating_sub(n);
        }
    }
    let total: u64 = trace.allocations.iter().map(|a| a.bytes).sum();
    let largest = trace.allocations.iter().map(|a| a.bytes).max().unwrap_or(0);
    let frees = trace
        .allocations
        .iter()
        .filter(|a| a.free.is_some())
        .count();
    let _ = writeln!(
        out,
        "allocations: {} ({}), largest {}, peak live {}; frees: {frees}",
        trace.allocations.len(),
        bytes(total),
        bytes(largest),
        bytes(peak)
    );

    let mut streams = HashSet::new();
    let mut touched = vec![false; trace.allocations.len()];
    let mut kernels: HashMap<u32, KernelStats> = HashMap::new();
    let mut copies: HashMap<CopyDir, (u64, u64)> = HashMap::new();
    let (mut launches, mut resolved, mut memsets) = (0u64, 0u64, 0u64);
    for op in &trace.ops {
        streams.insert(op.stream);
        match op.kind {
            OpKind::Launch { kernel } => {
                launches += 1;
                resolved += u64::from(!op.touches.is_empty());
                for &a in &op.touches {
                    if let Some(t) = touched.get_mut(a as usize) {
                        *t = true;
                    }
                }
                let k = kernels.entry(kernel).or_default();
                k.launches += 1;
                if let Some(ns) = op.gpu_ns {
                    k.time(ns);
                }
            }
            OpKind::Copy { dir } => {
                let c = copies.entry(dir).or_default();
                c.0 += 1;
                c.1 += op.bytes;
            }
            OpKind::Memset => memsets += 1,
        }
    }
    let _ = writeln!(
        out,
        "launches: {launches} on {} streams, {} kernels; with a resolved allocation: {}",
        streams.len(),
        kernels.len(),
        pct(resolved, launches)
    );
    let (mut freed, mut freed_seen) = (0u64, 0u64);
    for (a, seen) in trace.allocations.iter().zip(&touched) {
        if a.free.is_some() {
            freed += a.bytes;
            if *seen {
                freed_seen += a.bytes;
            }
        }
    }
    let _ = writeln!(
        out,
        "freed bytes seen in some launch: {} of {}",
        pct(freed_seen, freed),
        bytes(freed)
    );
    let mut copies: Vec<_> = copies.into_iter().collect();
    copies.sort_by_key(|(dir, _)| format!("{dir:?}"));
    for (dir, (count, total)) in copies {
        let _ = writeln!(out, "copies {dir:?}: {count} ({})", bytes(total));
    }
    let _ = writeln!(out, "memsets: {memsets}; host syncs: {}", trace.syncs.len());
    let _ = writeln!(
        out,
        "swap statistics: none (this format records the program, not libtensile's swapping)"
    );

    write_top_kernels(&mut out, &kernels, |id| trace.kernel_name(id), top);
    out
}
