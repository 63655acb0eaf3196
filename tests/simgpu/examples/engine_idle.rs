//! Where the simulated card's compute engine sat idle in a `tensile rerun`, from the engine log
//! of the run (`TENSILE_SIM_ENGINE_LOG`, `src/engine_log.rs`): per played iteration, the time
//! the compute engine waited for the host (a kernel queued after the one before it had
//! ended: the application's thread was stalled or busy) and for copies or events (queued
//! earlier, ready later), how busy each copy engine was and how much of the idle time it was
//! busy; then, over the last three iterations, the same idle split by position in the
//! iteration.
//!
//! ```text
//! TENSILE_SIM_ENGINE_LOG=/tmp/eng-%p.log tensile rerun TRACE --policy lru ...
//! cargo run --release -p tensile-simgpu --example engine_idle -- LOG [TIME_SCALE [SCALE [BUCKETS]]]
//! ```
//! The player's iterations end with a read of its result buffer (a device-to-host copy of
//! `RESULT_BYTES`), which is how they are told apart; those with the usual number of kernels
//! are shown (not the prologue, nor the check after the last). `TIME_SCALE` (default 16, the
//! rerun's on the simulated GPU) turns card time into trace time, `SCALE` (the rerun's
//! `--scale`, default 1) played bytes into trace bytes. docs/rerun.md, "Session 31", reads
//! BERT, the MLP and ResNet-50 under LRU with it.

use std::collections::HashMap;

use tensile_kernels::rerun::RESULT_BYTES;

#[derive(Clone, Copy)]
struct Item {
    kind: u8,
    queued: u64,
    ready: u64,
    end: u64,
    bytes: u64,
}

/// One iteration's kernels' idle time before each (waiting for the host, for the rest) and
/// the figures of its copy engines.
struct Iteration {
    span: u64,
    kernels: usize,
    busy: u64,
    idle_host: Vec<u64>,
    idle_other: Vec<u64>,
    /// Per copy engine (`H`, `D`): busy time, bytes, busy time while compute was idle.
    engines: [(u64, u64, u64); 2],
}

fn parse(path: &str) -> Result<Vec<Item>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut items = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("{path}:{}: not an engine log line: {line:?}", n + 1);
        if f.len() != 6 || f[0].len() != 1 {
            return Err(bad());
        }
        let num = |i: usize| f[i].parse::<u64>().map_err(|_| bad());
        items.push(Item {
            kind: f[0].as_bytes()[0],
            queued: num(2)?,
            ready: num(3)?,
            end: num(4)?,
            bytes: num(5)?,
        });
    }
    Ok(items)
}

/// Busy intervals of one engine from its items in order of end (each starts when it is
/// ready or when the one before ended).
fn busy_intervals(items: &[Item], from: u64) -> Vec<(u64, u64)> {
    let mut prev = from;
    items
        .iter()
        .map(|i| {
            let start = i.ready.max(prev);
            prev = i.end;
            (start, i.end)
        })
        .collect()
}

fn overlap(a: &[(u64, u64)], b: &[(u64, u64)]) -> u64 {
    let mut total = 0;
    for &(s, e) in a {
        for &(s2, e2) in b {
            if e2 > s && s2 < e {
                total += e.min(e2) - s.max(s2);
            }
        }
    }
    total
}

fn iteration(items: &[Item], start: u64, end: u64) -> Iteration {
    let mut kernels: Vec<Item> = items.iter().filter(|i| i.kind == b'K').copied().collect();
    kernels.sort_by_key(|k| k.end);
    let (mut prev, mut busy) = (start, 0);
    let (mut idle_host, mut idle_other, mut idle) = (Vec::new(), Vec::new(), Vec::new());
    for k in &kernels {
        let gap = k.ready.saturating_sub(prev);
        let host = k.queued.min(k.ready).saturating_sub(prev);
        idle_host.push(host);
        idle_other.push(gap - host);
        if gap > 0 {
            idle.push((prev, k.ready));
        }
        busy += k.end - prev.max(k.ready);
        prev = k.end;
    }
    let engine = |kind: u8| {
        let mut copies: Vec<Item> = items
            .iter()
            .filter(|i| i.kind == kind && !(kind == b'D' && i.bytes == RESULT_BYTES as u64))
            .copied()
            .collect();
        copies.sort_by_key(|c| c.end);
        let intervals = busy_intervals(&copies, start);
        (
            intervals.iter().map(|(s, e)| e - s).sum(),
            copies.iter().map(|c| c.bytes).sum(),
            overlap(&idle, &intervals),
        )
    };
    Iteration {
        span: end - start,
        kernels: kernels.len(),
        busy,
        idle_host,
        idle_other,
        engines: [engine(b'H'), engine(b'D')],
    }
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        return Err("usage: engine_idle LOG [TIME_SCALE [SCALE [BUCKETS]]]".into());
    };
    let arg = |i: usize, default: f64| -> Result<f64, String> {
        args.get(i).map_or(Ok(default), |s| {
            s.parse().map_err(|e| format!("{s:?}: {e}"))
        })
    };
    let (time_scale, scale, buckets) = (arg(1, 16.0)?, arg(2, 1.0)?, arg(3, 20.0)? as usize);
    let items = parse(path)?;
    let reads: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].kind == b'D' && items[i].bytes == RESULT_BYTES as u64)
        .collect();
    let mut iterations: Vec<Iteration> = reads
        .windows(2)
        .map(|w| iteration(&items[w[0] + 1..w[1]], items[w[0]].end, items[w[1]].end))
        .collect();
    // The played iterations have the usual number of kernels.
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for it in &iterations {
        *counts.entry(it.kernels).or_default() += 1;
    }
    let Some((&usual, _)) = counts
        .iter()
        .filter(|(&k, _)| k > 0)
        .max_by_key(|(_, &n)| n)
    else {
        return Err(format!("{path}: no iteration between two result reads"));
    };
    iterations.retain(|it| it.kernels == usual);
    let ms = |ns: u64| ns as f64 / time_scale / 1e6;
    let gib = |b: u64| b as f64 * scale / (1u64 << 30) as f64;
    println!(
        "{} iterations of {usual} kernels; ms of trace time, GiB at trace size",
        iterations.len()
    );
    println!(
        "{:>9} {:>9} {:>11} {:>11} | {:>8} {:>6} {:>10} | {:>8} {:>6} {:>10}",
        "step",
        "compute",
        "idle: host",
        "copies",
        "H2D busy",
        "GiB",
        "while idle",
        "D2H busy",
        "GiB",
        "while idle"
    );
    for it in &iterations {
        let [h, d] = it.engines;
        println!(
            "{:>9.2} {:>9.2} {:>11.2} {:>11.2} | {:>8.2} {:>6.2} {:>10.2} | {:>8.2} {:>6.2} {:>10.2}",
            ms(it.span),
            ms(it.busy),
            ms(it.idle_host.iter().sum()),
            ms(it.idle_other.iter().sum()),
            ms(h.0),
            gib(h.1),
            ms(h.2),
            ms(d.0),
            gib(d.1),
            ms(d.2),
        );
    }
    let last = &iterations[iterations.len().saturating_sub(3)..];
    let n = last.len() as u64;
    println!("\nby position, average of the last {n}: kernels, idle for the host, for copies (ms)");
    for b in 0..buckets.max(1) {
        let (from, to) = (b * usual / buckets, (b + 1) * usual / buckets);
        let sum = |v: fn(&Iteration) -> &Vec<u64>| -> u64 {
            last.iter()
                .map(|it| v(it)[from..to].iter().sum::<u64>())
                .sum::<u64>()
                / n
        };
        println!(
            "{from:>6}-{:<6} {:>9.2} {:>9.2}",
            to,
            ms(sum(|it| &it.idle_host)),
            ms(sum(|it| &it.idle_other))
        );
    }
    Ok(())
}
