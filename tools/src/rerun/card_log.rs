//! Where the simulated card's time went in a managed run, from its engine log
//! (`TENSILE_SIM_ENGINE_LOG`, tests/simgpu/README.md): one line per kernel and host copy a
//! stream ran, `KIND STREAM QUEUED READY END BYTES` on the card's clock.
//!
//! Per played iteration (the player ends each with a read of its result buffer, a
//! device-to-host copy of [`RESULT_BYTES`]), the compute engine's time is split into running
//! kernels, waiting for the host (a kernel queued after the one before it had ended: the
//! application's thread was stalled or busy in the library) and waiting for copies or events
//! (queued earlier, ready later: a read-back not yet landed). Beside it, how long each copy
//! engine was busy. That tells at a glance what a step lost to: the library's host work, or
//! the copies (docs/rerun.md, "Session 31").

use std::collections::HashMap;
use std::path::Path;

use tensile_kernels::rerun::RESULT_BYTES;

/// One iteration's figures, ns on the card's clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CardTime {
    pub compute_ns: u64,
    pub idle_host_ns: u64,
    pub idle_copies_ns: u64,
    pub h2d_busy_ns: u64,
    pub d2h_busy_ns: u64,
}

impl CardTime {
    /// Each figure through `f` (to trace time).
    pub fn scaled(self, f: impl Fn(u64) -> u64) -> CardTime {
        CardTime {
            compute_ns: f(self.compute_ns),
            idle_host_ns: f(self.idle_host_ns),
            idle_copies_ns: f(self.idle_copies_ns),
            h2d_busy_ns: f(self.h2d_busy_ns),
            d2h_busy_ns: f(self.d2h_busy_ns),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Item {
    kind: u8,
    ready: u64,
    queued: u64,
    end: u64,
    bytes: u64,
}

fn parse(text: &str) -> Result<Vec<Item>, String> {
    text.lines()
        .enumerate()
        .map(|(n, line)| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let bad = || format!("line {}: not an engine log line: {line:?}", n + 1);
            if f.len() != 6 || f[0].len() != 1 {
                return Err(bad());
            }
            let num = |i: usize| f[i].parse::<u64>().map_err(|_| bad());
            Ok(Item {
                kind: f[0].as_bytes()[0],
                queued: num(2)?,
                ready: num(3)?,
                end: num(4)?,
                bytes: num(5)?,
            })
        })
        .collect()
}

fn is_result_read(i: &Item) -> bool {
    i.kind == b'D' && i.bytes == RESULT_BYTES as u64
}

/// The figures of the iteration whose items are `items`, from `start` (the end of the result
/// read before it); the number of kernels with them.
fn iteration(items: &[Item], start: u64) -> (usize, CardTime) {
    let mut kernels: Vec<&Item> = items.iter().filter(|i| i.kind == b'K').collect();
    kernels.sort_by_key(|k| k.end);
    let mut t = CardTime::default();
    let mut prev = start;
    for k in &kernels {
        let gap = k.ready.saturating_sub(prev);
        let host = k.queued.min(k.ready).saturating_sub(prev);
        t.idle_host_ns += host;
        t.idle_copies_ns += gap - host;
        t.compute_ns += k.end.saturating_sub(prev.max(k.ready));
        prev = prev.max(k.end);
    }
    let busy = |kind: u8| {
        let mut copies: Vec<&Item> = items
            .iter()
            .filter(|i| i.kind == kind && !is_result_read(i))
            .collect();
        copies.sort_by_key(|c| c.end);
        let mut prev = start;
        let mut busy = 0;
        for c in copies {
            busy += c.end.saturating_sub(prev.max(c.ready));
            prev = prev.max(c.end);
        }
        busy
    };
    t.h2d_busy_ns = busy(b'H');
    t.d2h_busy_ns = busy(b'D');
    (kernels.len(), t)
}

/// The average over the last `iterations` played iterations in the engine log `text` (those
/// with the usual number of kernels: not the prologue, nor the check after the last), in ns
/// on the card's clock; `None` if it holds none.
pub fn measured(text: &str, iterations: u32) -> Result<Option<CardTime>, String> {
    let items = parse(text)?;
    let reads: Vec<usize> = (0..items.len())
        .filter(|&i| is_result_read(&items[i]))
        .collect();
    let all: Vec<(usize, CardTime)> = reads
        .windows(2)
        .map(|w| iteration(&items[w[0] + 1..w[1]], items[w[0]].end))
        .collect();
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for &(k, _) in &all {
        *counts.entry(k).or_default() += 1;
    }
    let Some(usual) = counts
        .into_iter()
        .filter(|&(k, _)| k > 0)
        .max_by_key(|&(k, n)| (n, k))
        .map(|(k, _)| k)
    else {
        return Ok(None);
    };
    let played: Vec<CardTime> = all
        .into_iter()
        .filter(|&(k, _)| k == usual)
        .map(|(_, t)| t)
        .collect();
    let last = &played[played.len().saturating_sub(iterations.max(1) as usize)..];
    let n = last.len() as u64;
    let avg = |f: fn(&CardTime) -> u64| last.iter().map(f).sum::<u64>() / n;
    Ok(Some(CardTime {
        compute_ns: avg(|t| t.compute_ns),
        idle_host_ns: avg(|t| t.idle_host_ns),
        idle_copies_ns: avg(|t| t.idle_copies_ns),
        h2d_busy_ns: avg(|t| t.h2d_busy_ns),
        d2h_busy_ns: avg(|t| t.d2h_busy_ns),
    }))
}

/// [`measured`] of the log at `path`.
pub fn read(path: &Path, iterations: u32) -> Result<Option<CardTime>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("the card's engine log {}: {e}", path.display()))?;
    measured(&text, iterations).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_compute_is_split_into_waiting_for_the_host_and_for_copies() {
        // Result reads end at 100 and 1000. Kernel A queued at 100, ready at 150 (its
        // copy in landed then), runs to 250; the host queues B at 400 (stalled), it runs
        // to 500; C queued at 450, waits for a copy until 600, runs to 700. A copy in from
        // 100 to 150, one out from 300 to 600 (ready at 300).
        let r = RESULT_BYTES;
        let log = format!(
            "D 1 0 90 100 {r}\n\
             H 2 100 100 150 4096\n\
             K 1 100 150 250 0\n\
             D 3 300 300 600 8192\n\
             K 1 400 400 500 0\n\
             K 1 450 600 700 0\n\
             D 1 700 990 1000 {r}\n"
        );
        let t = measured(&log, 1).unwrap().unwrap();
        assert_eq!(
            t,
            CardTime {
                compute_ns: 300,
                idle_host_ns: 150,
                idle_copies_ns: 50 + 100,
                h2d_busy_ns: 50,
                d2h_busy_ns: 300,
            }
        );
    }

    #[test]
    fn only_the_usual_iterations_count_and_the_last_ones_are_averaged() {
        let r = RESULT_BYTES;
        // Three iterations of one kernel (idle 10, 20, 30 for the host), then a check of
        // two kernels after the last.
        let log = format!(
            "D 1 0 0 0 {r}\n\
             K 1 10 10 20 0\n\
             D 1 20 20 20 {r}\n\
             K 1 40 40 50 0\n\
             D 1 50 50 50 {r}\n\
             K 1 80 80 90 0\n\
             D 1 90 90 90 {r}\n\
             K 1 90 90 91 0\n\
             K 1 91 91 92 0\n\
             D 1 92 92 92 {r}\n"
        );
        let t = measured(&log, 2).unwrap().unwrap();
        assert_eq!(t.idle_host_ns, 25);
        assert_eq!(t.compute_ns, 10);
        assert!(measured("K 1 0 0 1 0\n", 1).unwrap().is_none());
        assert!(measured("X 1 2\n", 1).unwrap_err().contains("line 1"));
    }
}
