//! The library's host time in a trace of its own, thread by thread: each kind of `Busy`
//! span (stalled accesses, calls that waited, remaps in and out, lock waits, host pinning)
//! summed per thread id, between two launches, with the allocations and frees made there.
//! `tensile trace-info` sums the kinds over all threads; this shows which thread is the
//! bottleneck (docs/rerun.md, "Session 25": the swap-out thread waiting for the lock).
//!
//! ```text
//! cargo run --release -p tensile-analyzer --example host_time_by_thread -- TRACE [FROM [TO]]
//! ```
//! `FROM` and `TO` are launch numbers (default: the whole trace). Thread ids are the
//! kernel's (`gettid`); the application's main thread is usually the lowest.

use std::collections::BTreeMap;

use tensile_trace::{Reader, Record};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        return Err("usage: host_time_by_thread TRACE [FROM_LAUNCH [TO_LAUNCH]]".into());
    };
    let launch = |i: usize, default: u64| -> Result<u64, String> {
        args.get(i).map_or(Ok(default), |s| {
            s.parse().map_err(|e| format!("launch {s:?}: {e}"))
        })
    };
    let (from, to) = (launch(1, 0)?, launch(2, u64::MAX)?);
    // (thread, kind) -> (spans, ns, pages)
    let mut busy: BTreeMap<(u32, String), (u64, u64, u64)> = BTreeMap::new();
    let (mut allocs, mut frees) = (0u64, 0u64);
    let (mut on, mut first_ns, mut last_ns) = (from == 0, 0u64, 0u64);
    for record in Reader::open(path).map_err(|e| format!("{path}: {e}"))? {
        match record.map_err(|e| format!("{path}: {e}"))? {
            Record::Launch(l) => {
                if l.seq == from {
                    on = true;
                    first_ns = l.t_ns;
                }
                if on {
                    last_ns = l.t_ns;
                }
                if l.seq == to {
                    on = false;
                }
            }
            Record::Alloc(_) if on => allocs += 1,
            Record::Free(_) if on => frees += 1,
            Record::Busy(b) if on => {
                let e = busy.entry((b.thread, format!("{:?}", b.kind))).or_default();
                e.0 += 1;
                e.1 += b.dur_ns;
                e.2 += u64::from(b.pages);
            }
            _ => {}
        }
    }
    println!(
        "launches {from} to {}: {:.1} ms of host time, {allocs} allocations, {frees} frees",
        if to == u64::MAX {
            "the end".to_string()
        } else {
            to.to_string()
        },
        last_ns.saturating_sub(first_ns) as f64 / 1e6
    );
    println!(
        "{:>8}  {:<10} {:>6} {:>12} {:>8}",
        "thread", "kind", "spans", "ms", "pages"
    );
    for ((thread, kind), (spans, ns, pages)) in busy {
        println!(
            "{thread:>8}  {kind:<10} {spans:>6} {:>12.1} {pages:>8}",
            ns as f64 / 1e6
        );
    }
    Ok(())
}
