//! Cost of the arena allocator's alloc + free, as an ignored test that prints a table:
//! `cargo test --release -p tensile-shim --lib memory::suballoc::bench -- --ignored --nocapture`.
//!
//! Uses only the API the manager calls (`new`, `alloc`, `remove`, `release_after`,
//! `release_now`, `frontier`), so the same file also measures an older allocator (the figures
//! in `docs/memory.md` compare with the one before the rewrite, built the same way).

use std::time::Instant;

use crate::memory::suballoc::Suballocator;

const PAGE: u64 = 1 << 21;
const MIB: u64 = 1 << 20;

/// splitmix64: a fixed, seeded sequence without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A tensor size as a training step makes them: mostly small, some around a page, a few
/// large, exactly 1 MiB often (the case the old allocator failed on).
fn tensor_size(r: &mut Rng) -> u64 {
    match r.below(10) {
        0..=3 => 1 + r.below(64 << 10),
        4 | 5 => 1 + r.below(MIB),
        6 => MIB,
        7 => PAGE - 64 * 1024 + r.below(128 * 1024),
        8 => 1_769_472,
        _ => PAGE + r.below(32 * PAGE),
    }
}

/// [`tensor_size`] without spans from 1 MiB - 64 KiB to 1 MiB (what the old allocator
/// survives), to compare the cost of the two.
fn tensor_size_no_mib(r: &mut Rng) -> u64 {
    let n = tensor_size(r);
    if (MIB - (64 << 10)..=MIB).contains(&n) {
        n / 2
    } else {
        n
    }
}

/// Keeps `live` allocations of `size(rng)` bytes, then replaces a random one `iters` times
/// (frees stream-ordered on one of two streams, fences completing a few calls later).
/// Returns (ns per alloc + free, frontier / peak live bytes, pages holding live data / live
/// bytes in pages at the end), or the call at which an allocation failed. The frontier is
/// the arena's virtual high-water mark (holes and frees waiting for a fence are under it);
/// the pages holding live data are what must be backed (or swapped) at the end.
fn churn(live: usize, iters: usize, size: fn(&mut Rng) -> u64) -> Result<(f64, f64, f64), String> {
    let mut s = Suballocator::new(0, 1 << 44, PAGE, 16 * PAGE);
    let mut r = Rng(42);
    let mut issued = [0u64; 2];
    let mut held: Vec<(u64, u64)> = Vec::with_capacity(live);
    let mut completed = [0u64; 2];
    let mut live_bytes = 0u64;
    let mut peak = 0u64;
    let mut step = |s: &mut Suballocator,
                    r: &mut Rng,
                    held: &mut Vec<(u64, u64)>,
                    i: usize|
     -> Result<(), String> {
        let slot = i % 2;
        if held.len() >= live {
            let (ptr, span) = held.swap_remove(r.below(held.len() as u64) as usize);
            live_bytes -= span;
            let a = s.remove(ptr).map_err(|e| format!("{e:?}"))?;
            issued[slot] += 1;
            s.release_after(a, slot, issued[slot]);
            // The free's fence completes eight frees later.
            completed[slot] = issued[slot].saturating_sub(8);
        }
        let n = size(r);
        let p = s.alloc(n, slot, &completed).map_err(|e| {
            format!(
                "{n} bytes refused at call {i} with {} live: {e:?}",
                held.len()
            )
        })?;
        held.push((p.alloc.ptr, p.alloc.span));
        live_bytes += p.alloc.span;
        peak = peak.max(live_bytes);
        Ok(())
    };
    for i in 0..live {
        step(&mut s, &mut r, &mut held, i)?;
    }
    let t = Instant::now();
    for i in 0..iters {
        step(&mut s, &mut r, &mut held, live + i)?;
    }
    let ns = t.elapsed().as_nanos() as f64 / iters as f64;
    let mut pages: Vec<u64> = held
        .iter()
        .flat_map(|&(ptr, span)| ptr / PAGE..=(ptr + span - 1) / PAGE)
        .collect();
    pages.sort_unstable();
    pages.dedup();
    Ok((
        ns,
        s.frontier() as f64 / peak as f64,
        (pages.len() as u64 * PAGE) as f64 / live_bytes as f64,
    ))
}

/// A bench case: name, live allocations, timed calls, size of each allocation.
type Case = (&'static str, usize, usize, fn(&mut Rng) -> u64);

/// Runs every case and prints one row each.
pub fn run() {
    println!(
        "{:<46} {:>14} {:>19} {:>17}",
        "case", "ns/alloc+free", "frontier/peak live", "live pages/live"
    );
    let cases: [Case; 6] = [
        (
            "mixed sizes but none near 1 MiB, 4,096 live",
            4096,
            200_000,
            tensor_size_no_mib,
        ),
        (
            "mixed sizes, 4,096 live, 2 streams",
            4096,
            200_000,
            tensor_size,
        ),
        (
            "mixed sizes, 16,384 live, 2 streams",
            16_384,
            200_000,
            tensor_size,
        ),
        (
            "exactly 1 MiB, 2,000 live, 2 streams",
            2000,
            200_000,
            |_| MIB,
        ),
        ("256 KiB, 64 live, 2 streams", 64, 500_000, |_| 256 << 10),
        ("up to 64 KiB, 4,096 live, 2 streams", 4096, 200_000, |r| {
            1 + r.below(64 << 10)
        }),
    ];
    for (name, live, iters, size) in cases {
        match churn(live, iters, size) {
            Ok((ns, ratio, pages)) => {
                println!("{name:<46} {ns:>14.0} {ratio:>19.3} {pages:>17.3}")
            }
            Err(e) => println!("{name:<46} fails: {e}"),
        }
    }
}

/// One allocator call of a replayed trace.
enum TraceOp {
    Alloc {
        bytes: u64,
        slot: usize,
        id: u64,
    },
    Free {
        slot: usize,
        id: u64,
    },
    /// The host waited for the device: every fence issued so far has completed.
    Wait,
}

/// Parses the allocations, frees and host waits of a capture trace (the shared traces'
/// text format: `A <t> <stream> <id> <ptr> <bytes>`, `F <t> <stream> <id>`, `S ...`).
fn parse_trace(text: impl std::io::BufRead) -> Result<Vec<TraceOp>, String> {
    let mut slots: std::collections::HashMap<String, usize> = Default::default();
    let mut slot = |name: &str| {
        let n = slots.len();
        *slots.entry(name.to_owned()).or_insert(n)
    };
    let mut ops = Vec::new();
    for line in text.lines() {
        let line = line.map_err(|e| e.to_string())?;
        let f: Vec<&str> = line.split(' ').collect();
        let num = |t: &str| t.parse::<u64>().map_err(|_| format!("bad line: {line}"));
        match f.as_slice() {
            ["A", _, stream, id, _, bytes] => ops.push(TraceOp::Alloc {
                bytes: num(bytes)?.max(1),
                slot: slot(stream),
                id: num(id)?,
            }),
            ["F", _, stream, id] => ops.push(TraceOp::Free {
                slot: slot(stream),
                id: num(id)?,
            }),
            ["S", ..] => ops.push(TraceOp::Wait),
            _ => {}
        }
    }
    Ok(ops)
}

/// Replays a capture trace's allocations and frees through the allocator. A free is
/// stream-ordered on its stream, and its fence completes at the next host wait
/// (conservative: a GPU is usually further along). Returns (allocations, ns per
/// alloc+free over the whole replay, peak live bytes, frontier, the most pages holding live
/// data over the peak of live bytes in pages).
pub fn replay(text: impl std::io::BufRead) -> Result<(usize, f64, u64, u64, f64), String> {
    use std::collections::HashMap;
    let ops = parse_trace(text)?;
    let streams = 1 + ops
        .iter()
        .map(|op| match op {
            TraceOp::Alloc { slot, .. } | TraceOp::Free { slot, .. } => *slot,
            TraceOp::Wait => 0,
        })
        .max()
        .unwrap_or(0);
    let mut s = Suballocator::new(0, 1 << 44, PAGE, 16 * PAGE);
    let mut issued = vec![0u64; streams];
    let mut completed = vec![0u64; streams];
    let mut placed: HashMap<u64, (u64, u64)> = HashMap::with_capacity(ops.len());
    // Timed: the allocator's calls and the id map, nothing else.
    let mut events: Vec<(bool, u64, u64)> = Vec::with_capacity(ops.len());
    let t = Instant::now();
    for op in &ops {
        match *op {
            TraceOp::Alloc { bytes, slot, id } => {
                let p = s
                    .alloc(bytes, slot, &completed)
                    .map_err(|e| format!("allocation {id} of {bytes} bytes: {e:?}"))?
                    .alloc;
                placed.insert(id, (p.ptr, p.span));
                events.push((true, p.ptr, p.span));
            }
            TraceOp::Free { slot, id } => {
                let Some((ptr, span)) = placed.remove(&id) else {
                    continue;
                };
                let a = s.remove(ptr).map_err(|e| format!("free of {id}: {e:?}"))?;
                issued[slot] += 1;
                s.release_after(a, slot, issued[slot]);
                events.push((false, ptr, span));
            }
            TraceOp::Wait => completed.clone_from(&issued),
        }
    }
    let elapsed = t.elapsed();
    let allocs = events.iter().filter(|e| e.0).count();
    // Untimed: live bytes and pages holding live data over the replay.
    let (mut live, mut peak, mut peak_pages) = (0u64, 0u64, 0usize);
    let mut pages: HashMap<u64, u32> = HashMap::new();
    for (is_alloc, ptr, span) in events {
        for page in ptr / PAGE..=(ptr + span - 1) / PAGE {
            let n = pages.entry(page).or_default();
            if is_alloc {
                *n += 1;
            } else {
                *n -= 1;
                if *n == 0 {
                    pages.remove(&page);
                }
            }
        }
        if is_alloc {
            live += span;
            peak = peak.max(live);
            peak_pages = peak_pages.max(pages.len());
        } else {
            live -= span;
        }
    }
    let ns = elapsed.as_nanos() as f64 / allocs.max(1) as f64;
    let ratio = peak_pages as f64 / peak.div_ceil(PAGE).max(1) as f64;
    Ok((allocs, ns, peak, s.frontier(), ratio))
}

#[cfg(test)]
#[test]
#[ignore = "benchmark; run with --ignored --nocapture in release"]
fn alloc_free_cost() {
    run();
}

/// The shared traces' allocation sequences (set `TENSILE_SHARED_TRACES` to their directory).
#[cfg(test)]
#[test]
#[ignore = "benchmark; run with --ignored --nocapture in release"]
fn shared_traces() {
    let Some(dir) = std::env::var_os("TENSILE_SHARED_TRACES") else {
        println!("set TENSILE_SHARED_TRACES to the directory of the shared *.trace.gz");
        return;
    };
    println!(
        "{:<10} {:>8} {:>14} {:>12} {:>12} {:>16}",
        "trace", "allocs", "ns/alloc+free", "peak live", "frontier", "peak pages/live"
    );
    for name in ["mlp", "resnet50", "bert"] {
        let path = std::path::Path::new(&dir).join(format!("{name}.trace.gz"));
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let text = std::io::BufReader::new(flate2::read::MultiGzDecoder::new(file));
        let (allocs, ns, peak, frontier, pages) = replay(text).unwrap();
        println!(
            "{name:<10} {allocs:>8} {ns:>14.0} {:>12} {:>12} {pages:>16.3}",
            crate::memory::budget::format_size(peak),
            crate::memory::budget::format_size(frontier)
        );
    }
}
