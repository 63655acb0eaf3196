//! What the library swapped between two launches of a trace it wrote, by direction and
//! cause (a plan's step, an access that found pages on the host or lacked frames, a prefetch's
//! or an allocation's frames, the free reserve), then the same by position in the range: where
//! a planned run fell back on the on-demand path, and what for.
//!
//! ```text
//! cargo run --release -p tensile-analyzer --example swaps_by_cause -- TRACE FROM TO [BUCKETS]
//! ```
//! `FROM` and `TO` are launch numbers: a run's steady iteration (docs/rerun.md). Pages are the
//! played run's (the simulated page, at `--scale`).

use std::collections::BTreeMap;

use tensile_trace::{Reader, Record};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return Err("usage: swaps_by_cause TRACE FROM_LAUNCH TO_LAUNCH [BUCKETS]".into());
    }
    let path = &args[0];
    let number = |s: &str| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let (from, to) = (number(&args[1])?, number(&args[2])?);
    let buckets = args.get(3).map_or(Ok(10), |s| number(s))?.max(1);
    let width = (to.saturating_sub(from)).div_ceil(buckets).max(1);
    // (dir, cause) -> (copies, pages, bytes); per bucket, (dir, cause) -> pages.
    let mut total: BTreeMap<(String, String), (u64, u64, u64)> = BTreeMap::new();
    let mut by_bucket: BTreeMap<u64, BTreeMap<(String, String), u64>> = BTreeMap::new();
    let mut at: Option<u64> = None;
    for record in Reader::open(path).map_err(|e| format!("{path}: {e}"))? {
        match record.map_err(|e| format!("{path}: {e}"))? {
            Record::Launch(l) => at = (from..to).contains(&l.seq).then_some(l.seq),
            Record::Swap(s) => {
                let Some(seq) = at else { continue };
                let key = (format!("{:?}", s.dir), format!("{:?}", s.cause));
                let e = total.entry(key.clone()).or_default();
                e.0 += 1;
                e.1 += u64::from(s.pages);
                e.2 += s.bytes;
                *by_bucket
                    .entry((seq - from) / width)
                    .or_default()
                    .entry(key)
                    .or_default() += u64::from(s.pages);
            }
            _ => {}
        }
    }
    println!("launches {from} to {to}: swaps queued after each launch, until the next");
    println!(
        "{:<8} {:<11} {:>7} {:>8} {:>10}",
        "dir", "cause", "copies", "pages", "MiB"
    );
    for ((dir, cause), (copies, pages, bytes)) in &total {
        println!(
            "{dir:<8} {cause:<11} {copies:>7} {pages:>8} {:>10.1}",
            *bytes as f64 / (1u64 << 20) as f64
        );
    }
    println!("\npages by position (launches from {from}):");
    let keys: Vec<&(String, String)> = total.keys().collect();
    let header: Vec<String> = keys.iter().map(|(d, c)| format!("{d}/{c}")).collect();
    println!("{:>11} {}", "launches", header.join(" "));
    for b in 0..buckets {
        let row = by_bucket.get(&b);
        let cells: Vec<String> = keys
            .iter()
            .zip(&header)
            .map(|(k, h)| {
                let n = row.and_then(|r| r.get(*k)).copied().unwrap_or(0);
                format!("{n:>w$}", w = h.len())
            })
            .collect();
        println!(
            "{:>5}-{:<5} {}",
            b * width,
            (b + 1) * width,
            cells.join(" ")
        );
    }
    Ok(())
}
