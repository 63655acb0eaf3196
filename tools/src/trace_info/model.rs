//! The summary of a trace loaded into the analyzer's model: how `trace-info` reports a capture
//! v1 file (the text format of the shared PyTorch traces), which has no header, no record
//! count and no swap statistics. Native traces get the fuller streamed report of `native`.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use tensile_analyzer::model::{CopyDir, OpKind, Trace};

use super::{bytes, ms};

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
    let mut kernels: HashMap<u32, (u64, u64, u64)> = HashMap::new();
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
                k.0 += 1;
                if let Some(ns) = op.gpu_ns {
                    k.1 += ns;
                    k.2 += 1;
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
    let pct = |part: u64, whole: u64| {
        if whole == 0 {
            "-".to_string()
        } else {
            format!("{:.5}%", 100.0 * part as f64 / whole as f64)
        }
    };
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

    let mut kernels: Vec<_> = kernels.into_iter().collect();
    let timed = kernels.iter().any(|(_, k)| k.2 > 0);
    kernels.sort_by(|a, b| {
        let key = |k: &(u64, u64, u64)| if timed { k.1 } else { k.0 };
        key(&b.1).cmp(&key(&a.1)).then(a.0.cmp(&b.0))
    });
    let _ = writeln!(
        out,
        "top kernels by {}:",
        if timed {
            "GPU time"
        } else {
            "launch count (no GPU times recorded)"
        }
    );
    let _ = writeln!(
        out,
        "  {:>10} {:>12} {:>10}  name",
        "launches", "gpu total", "mean"
    );
    for (id, (count, gpu_ns, timed)) in kernels.into_iter().take(top) {
        let name = trace.kernel_name(id).unwrap_or("?");
        let (total, mean) = match gpu_ns.checked_div(timed) {
            Some(mean) => (ms(gpu_ns), ms(mean)),
            None => ("-".into(), "-".into()),
        };
        let _ = writeln!(out, "  {count:>10} {total:>12} {mean:>10}  {name}");
    }
    out
}
