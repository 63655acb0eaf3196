//! What the library swapped between two launches of a trace it wrote, by direction and
//! cause (a plan's step, an access that found pages on the host or lacked frames, a prefetch's
//! or an allocation's frames, the free reserve), then the same by position in the range: where
//! a planned run fell back on the on-demand path, and what for. From trace format 3 (whose
//! swaps name their pages), also by allocation: the pages each one sent out and got back over
//! the range, where it was made and freed; those that left most and came back least first
//! (`TENSILE_ALL_ALLOCATIONS=1`: every one; `TENSILE_FOLLOW=ID`: each swap of allocation ID).
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
    // Live allocations by address: (id, bytes, launch made at); and, per allocation the range
    // swapped, its pages out and in, and where it was freed.
    let mut live: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    let mut last_launch = 0u64;
    let mut by_alloc: BTreeMap<u64, AllocSwaps> = BTreeMap::new();
    // TENSILE_FOLLOW=ID: each swap of allocation ID, as it comes.
    let follow: Option<u64> = std::env::var("TENSILE_FOLLOW")
        .ok()
        .and_then(|v| v.parse().ok());
    // The launch that last touched each allocation; and, per cause of a swap-out, its pages
    // by how many launches before it their allocation was last touched (0: by the launch
    // just made).
    let mut last_touched: BTreeMap<u64, u64> = BTreeMap::new();
    let mut out_age: BTreeMap<String, [u64; AGE_BUCKETS.len() + 1]> = BTreeMap::new();
    for record in Reader::open(path).map_err(|e| format!("{path}: {e}"))? {
        match record.map_err(|e| format!("{path}: {e}"))? {
            Record::Launch(l) => {
                last_launch = l.seq;
                at = (from..to).contains(&l.seq).then_some(l.seq);
                for a in &l.accesses {
                    last_touched.insert(a.alloc, l.seq);
                }
            }
            Record::Alloc(a) => {
                live.insert(a.ptr, (a.id, a.bytes, last_launch));
            }
            Record::Free(f) => {
                live.retain(|_, v| v.0 != f.id);
                if let Some(a) = by_alloc.get_mut(&f.id) {
                    a.freed_at.get_or_insert(last_launch);
                }
            }
            Record::Swap(s) => {
                let Some(seq) = at else { continue };
                let page = if s.pages > 0 && s.bytes > 0 {
                    s.bytes / u64::from(s.pages)
                } else {
                    0
                };
                for &(addr, n) in &s.runs {
                    for i in 0..u64::from(n) {
                        let a = addr + i * page;
                        let Some((&ptr, &(id, bytes, made))) = live.range(..=a).next_back() else {
                            continue;
                        };
                        if a >= ptr + bytes.max(1) {
                            continue;
                        }
                        let e = by_alloc.entry(id).or_insert(AllocSwaps {
                            bytes,
                            made_at: made,
                            ..AllocSwaps::default()
                        });
                        match s.dir {
                            tensile_trace::SwapDir::ToHost => {
                                e.out += 1;
                                let age = last_touched.get(&id).map_or(u64::MAX, |&l| seq - l);
                                let b = AGE_BUCKETS.iter().position(|&top| age <= top);
                                out_age.entry(format!("{:?}", s.cause)).or_default()
                                    [b.unwrap_or(AGE_BUCKETS.len())] += 1;
                            }
                            tensile_trace::SwapDir::ToDevice => e.back += 1,
                        }
                        if follow == Some(id) && i == 0 {
                            println!(
                                "allocation {id}: after launch {} ({:+}), {:?} {:?}, a run of {n} pages at page {}",
                                seq,
                                seq as i64 - from as i64,
                                s.dir,
                                s.cause,
                                (a - ptr) / page.max(1)
                            );
                        }
                    }
                }
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
    if !by_alloc.is_empty() {
        let mut rows: Vec<(&u64, &AllocSwaps)> = by_alloc.iter().collect();
        rows.sort_by_key(|(_, a)| std::cmp::Reverse(a.out as i64 - a.back as i64));
        let (out, back): (u64, u64) = rows
            .iter()
            .fold((0, 0), |(o, b), (_, a)| (o + a.out, b + a.back));
        println!(
            "\nby allocation (the pages each run names, from format 3): {out} pages out, {back} \
             back, in {} allocations; the 25 with most out and not back:",
            rows.len()
        );
        println!(
            "{:>8} {:>12} {:>8} {:>8} {:>9} {:>9}",
            "alloc", "bytes", "out", "back", "made at", "freed at"
        );
        // TENSILE_ALL_ALLOCATIONS=1: every one.
        let shown = if std::env::var_os("TENSILE_ALL_ALLOCATIONS").is_some() {
            rows.len()
        } else {
            25
        };
        for (id, a) in rows.iter().take(shown) {
            println!(
                "{id:>8} {:>12} {:>8} {:>8} {:>9} {:>9}",
                a.bytes,
                a.out,
                a.back,
                a.made_at as i64 - from as i64,
                a.freed_at
                    .map_or("live".to_string(), |f| (f as i64 - from as i64).to_string())
            );
        }
    }
    if !out_age.is_empty() {
        println!(
            "\npages sent out, by how many launches before the swap their allocation was last \
             touched (0: by the launch just made):"
        );
        let mut lo = 0;
        let mut heads: Vec<String> = Vec::new();
        for &top in &AGE_BUCKETS {
            heads.push(if lo == top {
                format!("{top}")
            } else {
                format!("{lo}-{top}")
            });
            lo = top + 1;
        }
        heads.push("more".into());
        let row = |cells: Vec<String>| cells.iter().map(|c| format!("{c:>7}")).collect::<String>();
        println!("{:<11} {}", "cause", row(heads));
        for (cause, counts) in &out_age {
            println!(
                "{cause:<11} {}",
                row(counts.iter().map(u64::to_string).collect())
            );
        }
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

/// The age buckets (launches since the last touch, inclusive tops) of the swap-out table.
const AGE_BUCKETS: [u64; 5] = [0, 1, 3, 15, 63];

/// What one allocation's pages did over the range (launch numbers absolute).
#[derive(Default)]
struct AllocSwaps {
    bytes: u64,
    out: u64,
    back: u64,
    made_at: u64,
    freed_at: Option<u64>,
}
