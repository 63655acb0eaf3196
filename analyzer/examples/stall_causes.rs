//! What a run's stalled accesses waited for, between two launches of a trace the library
//! wrote: each `Stall` span of host time is put beside the swaps queued while it lasted. A
//! stall that queued an on-demand read waited for data the plan did not bring (or brought
//! too late to be found coming); one that queued none waited for pages already on their way
//! (a prefetch late) or for frames (swap-outs landing and being completed).
//!
//! ```text
//! cargo run --release -p tensile-analyzer --example stall_causes -- TRACE FROM TO
//! ```
//! `FROM` and `TO` are launch numbers: a run's steady iterations (docs/rerun.md).

use tensile_trace::{BusyKind, Reader, Record, SwapCause, SwapDir};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, from, to] = &args[..] else {
        return Err("usage: stall_causes TRACE FROM_LAUNCH TO_LAUNCH".into());
    };
    let launch = |s: &str| s.parse::<u64>().map_err(|e| format!("launch {s:?}: {e}"));
    let (from, to) = (launch(from)?, launch(to)?);
    let mut stalls: Vec<(u64, u64, u32)> = Vec::new();
    let mut demand: Vec<(u64, u32)> = Vec::new();
    let mut swaps_in = [0u64; 2];
    let (mut on, mut first, mut last) = (false, 0, 0);
    for record in Reader::open(path).map_err(|e| format!("{path}: {e}"))? {
        match record.map_err(|e| format!("{path}: {e}"))? {
            Record::Launch(l) => {
                if l.seq == from {
                    on = true;
                    first = l.t_ns;
                }
                if l.seq == to {
                    on = false;
                    last = l.t_ns;
                }
            }
            Record::Busy(b) if on && b.kind == BusyKind::Stall => {
                stalls.push((b.t_ns, b.t_ns + b.dur_ns, b.pages))
            }
            Record::Swap(s) if on && s.dir == SwapDir::ToDevice => {
                let on_demand = s.cause == SwapCause::Access;
                swaps_in[usize::from(on_demand)] += u64::from(s.pages);
                if on_demand {
                    demand.push((s.t_ns, s.pages));
                }
            }
            _ => {}
        }
    }
    let (mut with, mut without) = ((0u64, 0u64, 0u64), (0u64, 0u64));
    for &(start, end, _) in &stalls {
        let pages: u64 = demand
            .iter()
            .filter(|&&(t, _)| t >= start && t <= end)
            .map(|&(_, p)| u64::from(p))
            .sum();
        if pages > 0 {
            with = (with.0 + 1, with.1 + (end - start), with.2 + pages);
        } else {
            without = (without.0 + 1, without.1 + (end - start));
        }
    }
    let ms = |ns: u64| ns as f64 / 1e6;
    println!(
        "launches {from} to {to}: {:.1} ms of host time; pages in: {} prefetched, {} on demand",
        ms(last.saturating_sub(first)),
        swaps_in[0],
        swaps_in[1]
    );
    println!(
        "stalls that read on demand: {} for {:.1} ms ({} pages)",
        with.0,
        ms(with.1),
        with.2
    );
    println!(
        "stalls that read nothing (pages on their way, or frames): {} for {:.1} ms",
        without.0,
        ms(without.1)
    );
    Ok(())
}
