//! Iteration detection: the repeating unit of a training run and where each instance starts.
//!
//! The input is the trace's op sequence reduced to symbols (kernel handle for a launch, direction
//! for a copy). Detection has two stages, both tolerant to noise (a longer first step that creates
//! optimizer state, a kernel that runs only every k steps, a different prologue):
//!
//! 1. **Period.** Candidate lags come from n-gram repetition (3- and 8-grams): for every
//!    position, the distance to the previous occurrence of the same n-gram. Each candidate lag
//!    `p` is scored on the later part of the trace by comparing `s[i]` with `s[i + p]` in chunks
//!    at least a period long and taking the median chunk's match fraction, so the few chunks an
//!    occasional extra kernel shifts out of step do not count, while a repeated layer (which
//!    matches only inside the forward or backward pass) never scores high. Among lags within a
//!    small margin of the best, the smallest one that anchors confirm wins (so a multiple of the
//!    period never beats the period), and the anchors' most regular gap gives the step length. A
//!    period that splits into 2 to 8 anchor-confirmed parts (a kernel every k steps) is split.
//! 2. **Boundaries.** An *anchor* is an n-gram that occurs about once per period (no two
//!    occurrences closer than half a period). Among anchors found in the most iterations, the one
//!    where the fewest bytes are allocated is chosen: iterations then start at the footprint's low
//!    point (between steps), so few tensors straddle a boundary. Each occurrence starts an
//!    iteration; insertions and deletions inside a step only change that step's length.
//!
//! This module finds the structure only; giving tensors identities is `cycle`'s job.

use std::collections::HashMap;
use std::ops::Range;

use serde::Serialize;

use crate::model::{CopyDir, OpKind, Trace};

/// Length of the longest anchor n-gram.
const GRAM: usize = 12;
/// A lag scoring within this of the best lag counts as equally good (then the smallest wins).
const SCORE_MARGIN: f64 = 0.05;
/// Below this match fraction there is no repetition worth planning on.
const MIN_SCORE: f64 = 0.5;
/// How many of the most frequent n-gram gaps are scored as candidate periods.
const CANDIDATE_LAGS: usize = 64;

/// The iteration structure of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Iterations {
    /// Ops per iteration in the steady state (the detected period).
    pub period: usize,
    /// Op ranges of the detected iterations, in order. Ops before the first are the prologue.
    pub spans: Vec<Range<usize>>,
    /// Index in `spans` of the instance that represents the steady state (used for planning).
    pub representative: usize,
    /// Fraction of positions matching at the period's lag (1.0 = perfectly periodic).
    pub score_millis: u32,
}

impl Iterations {
    /// The steady-state instance's op range.
    pub fn representative_span(&self) -> Range<usize> {
        self.spans[self.representative].clone()
    }

    /// Op indices where each iteration starts.
    pub fn starts(&self) -> Vec<usize> {
        self.spans.iter().map(|s| s.start).collect()
    }
}

/// Why no iteration could be found.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IterationError {
    /// The trace has no device work.
    #[error("the trace has no kernel launches or copies")]
    Empty,
    /// Nothing repeats: not a training loop, or too short to see two steps.
    #[error(
        "no repeating iteration found in {ops} ops (best repetition score {score:.2}); \
         a trace needs at least two training steps"
    )]
    NoRepetition {
        /// Ops in the trace.
        ops: usize,
        /// Best lag score found.
        score: f64,
    },
}

/// The symbol an op contributes to the sequence that is searched for repetition.
pub fn op_symbols(trace: &Trace) -> Vec<u64> {
    trace
        .ops
        .iter()
        .map(|op| match op.kind {
            OpKind::Launch { kernel } => u64::from(kernel),
            OpKind::Copy { dir } => {
                1 << 40
                    | match dir {
                        CopyDir::HostToDevice => 1,
                        CopyDir::DeviceToHost => 2,
                        CopyDir::DeviceToDevice => 3,
                        CopyDir::Any => 4,
                    }
            }
            OpKind::Memset => 2 << 40,
        })
        .collect()
}

/// Bytes allocated (not yet freed) just before each op, and after the last one.
pub fn allocated_before_ops(trace: &Trace) -> Vec<u64> {
    let n = trace.ops.len();
    let mut delta = vec![0i128; n + 1];
    for a in &trace.allocations {
        delta[a.before_op as usize] += i128::from(a.bytes);
        if let Some(f) = a.free {
            delta[f.before_op as usize] -= i128::from(a.bytes);
        }
    }
    let mut live = 0i128;
    delta
        .into_iter()
        .map(|d| {
            live += d;
            live.max(0) as u64
        })
        .collect()
}

/// Finds the iterations of a trace: in its ops, or, where they do not repeat, in its launches
/// alone ([`detect_in_launches`]).
pub fn detect(trace: &Trace) -> Result<Iterations, IterationError> {
    let symbols = op_symbols(trace);
    let allocated = allocated_before_ops(trace);
    match detect_in(&symbols, &allocated) {
        Err(e @ IterationError::NoRepetition { .. }) => {
            detect_in_launches(trace, &symbols, &allocated).ok_or(e)
        }
        found => found,
    }
}

/// The iterations of a trace whose ops do not repeat but whose launches do: a copy made in
/// some steps and not others (a loss read back every few steps, or from some step on, as
/// `tensile rerun`'s player reads its result only in the steps it measures) shifts every op
/// after it by one, and no single lag matches most of the trace. The launches are found to
/// repeat on their own, and each iteration is the ops from the launch that starts it to the
/// launch that starts the next (copies between two steps go with the earlier). `period` is
/// the representative iteration's length in ops.
fn detect_in_launches(trace: &Trace, symbols: &[u64], allocated: &[u64]) -> Option<Iterations> {
    let launches = crate::exec_plan::launch_ops(trace);
    if launches.len() == trace.ops.len() {
        return None; // nothing but launches: the ops were the launches
    }
    let launch_symbols: Vec<u64> = launches.iter().map(|&i| symbols[i]).collect();
    let launch_cost: Vec<u64> = launches.iter().map(|&i| allocated[i]).collect();
    let found = detect_in(&launch_symbols, &launch_cost).ok()?;
    let n = trace.ops.len();
    let op_of = |launch: usize| launches.get(launch).copied().unwrap_or(n);
    let spans: Vec<Range<usize>> = found
        .spans
        .iter()
        .map(|s| op_of(s.start)..op_of(s.end))
        .collect();
    let representative = pick_representative(symbols, &spans);
    Some(Iterations {
        period: spans[representative].len(),
        spans,
        representative,
        score_millis: found.score_millis,
    })
}

/// Finds the iterations of a symbol sequence; `cost[i]` ranks boundary positions (lower is a
/// better place for an iteration to start; typically bytes allocated before op `i`).
pub fn detect_in(symbols: &[u64], cost: &[u64]) -> Result<Iterations, IterationError> {
    let n = symbols.len();
    if n == 0 {
        return Err(IterationError::Empty);
    }
    let (period, score) = find_period(symbols);
    if score < MIN_SCORE || period == 0 {
        return Err(IterationError::NoRepetition { ops: n, score });
    }
    let period = split_multiple(symbols, period);
    // Anchors of several lengths: long ones are unique in a step, short ones miss noisy spots
    // (a replaced kernel, an inserted one) more easily. The anchor seen in the most iterations
    // wins; on a tie, the longer one.
    let mut starts: Vec<usize> = Vec::new();
    for gram in [GRAM, 8, 5, 3] {
        let gram = gram.min(period).max(1);
        let occ = find_anchor_occurrences(&gram_hashes(symbols, gram), period, cost);
        if occ.len() > starts.len() {
            starts = occ;
        }
    }
    let spans = spans_from_starts(&starts, period, n);
    if spans.len() < 2 {
        return Err(IterationError::NoRepetition { ops: n, score });
    }
    let representative = pick_representative(symbols, &spans);
    Ok(Iterations {
        period,
        spans,
        representative,
        score_millis: (score * 1000.0).round() as u32,
    })
}

/// Hash of the n-gram starting at each position that has a full n-gram.
fn gram_hashes(symbols: &[u64], gram: usize) -> Vec<u64> {
    if symbols.len() < gram {
        return Vec::new();
    }
    (0..=symbols.len() - gram)
        .map(|i| {
            // FNV-1a over the symbols: cheap, and collisions only cost a weaker anchor.
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for &s in &symbols[i..i + gram] {
                h ^= s;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            h
        })
        .collect()
}

/// How well the trace repeats at lag `p`: positions are compared with those `p` later, in
/// chunks of at least a period (and at least a sixteenth of the trace), and the median chunk's
/// match fraction is the score. The median ignores the few chunks an occasional extra kernel
/// shifts out of step; chunks that long always include the parts of a step that a repeated
/// layer does not explain. Only the later part of the trace counts (from a third of the way in,
/// or earlier if that leaves less than two periods): the steady state is at the end, the
/// prologue and the longer first step at the start.
fn lag_score(symbols: &[u64], p: usize) -> f64 {
    let n = symbols.len();
    if p == 0 || 2 * p > n {
        return 0.0;
    }
    let from = (n / 3).min(n - 2 * p);
    let window = &symbols[from..];
    let m = window.len() - p;
    let chunk = p.max(n / 16).min(m).max(1);
    let mut fractions: Vec<f64> = (0..m)
        .step_by(chunk)
        .map(|start| {
            let end = (start + chunk).min(m);
            let hits = (start..end).filter(|&i| window[i] == window[i + p]).count();
            hits as f64 / (end - start) as f64
        })
        .collect();
    fractions.sort_unstable_by(f64::total_cmp);
    fractions[fractions.len() / 2]
}

fn find_period(symbols: &[u64]) -> (usize, f64) {
    let n = symbols.len();
    let mut gap_counts: HashMap<usize, usize> = HashMap::new();
    // Short n-grams survive noise, long ones see past repeated layers; take candidates from both.
    for gram in [3, 8] {
        let hashes = gram_hashes(symbols, gram.min(n));
        let mut last_seen: HashMap<u64, usize> = HashMap::with_capacity(hashes.len());
        for (i, &h) in hashes.iter().enumerate() {
            if let Some(prev) = last_seen.insert(h, i) {
                *gap_counts.entry(i - prev).or_default() += 1;
            }
        }
    }
    let mut gaps: Vec<(usize, usize)> = gap_counts
        .into_iter()
        .filter(|&(g, _)| g <= n / 2)
        .collect();
    gaps.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    gaps.truncate(CANDIDATE_LAGS);
    let mut scored: Vec<(usize, f64)> = gaps
        .iter()
        .map(|&(g, _)| (g, lag_score(symbols, g)))
        .collect();
    if scored.is_empty() {
        return (0, 0.0);
    }
    let best = scored.iter().map(|s| s.1).fold(0.0, f64::max);
    scored.sort_unstable_by_key(|s| s.0);
    // The smallest good lag that anchors also confirm: a repeated layer scores well but has no
    // n-gram that occurs once per layer-length throughout the trace.
    let good: Vec<(usize, f64)> = scored
        .into_iter()
        .filter(|s| s.1 >= best - SCORE_MARGIN)
        .collect();
    // The anchors also measure the step better than the lag does (the lag of a trace with an
    // extra kernel every few steps can be off by one).
    good.iter()
        .find_map(|s| anchored_step(symbols, s.0, 2).map(|step| (step, s.1)))
        .or(good.last().copied())
        .unwrap_or((0, 0.0))
}

/// A kernel that runs every k steps makes the exact period k steps long. If `period` splits
/// into `m` parts (2 to 8) that each hold an anchor as regularly as a step would, the step is
/// the part: the most parts wins.
fn split_multiple(symbols: &[u64], period: usize) -> usize {
    for m in (2..=8usize).rev() {
        let q = period / m;
        if q >= 3 {
            if let Some(step) = anchored_step(symbols, q, m + 1) {
                return step;
            }
        }
    }
    period
}

/// Whether some anchor n-gram repeats every `q` ops (give or take a tenth) through the trace,
/// at least `min_count` times; returns the step length it shows: the shortest gap seen twice
/// (steps without the occasional extra kernel), else the most common gap.
fn anchored_step(symbols: &[u64], q: usize, min_count: usize) -> Option<usize> {
    let hashes = gram_hashes(symbols, (q / 4).clamp(3, GRAM).min(q));
    let occ = find_anchor_occurrences(&hashes, q, &[]);
    if occ.len() < min_count.max(2) {
        return None;
    }
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for w in occ.windows(2) {
        *counts.entry(w[1] - w[0]).or_default() += 1;
    }
    let repeated = counts
        .iter()
        .filter(|(_, &c)| c >= 2)
        .map(|(&g, _)| g)
        .min();
    let mode = counts
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(&g, _)| g);
    let step = repeated.or(mode)?;
    // Regular: the step is about `q`, and the anchor shows up in nearly every step of the trace
    // after its first occurrence.
    let expected = (symbols.len() - occ[0]) / q;
    (step.abs_diff(q) * 10 <= q && occ.len() * 10 >= expected * 8).then_some(step)
}

/// Occurrences of the best anchor n-gram: the starts of the iterations.
fn find_anchor_occurrences(hashes: &[u64], period: usize, cost: &[u64]) -> Vec<usize> {
    let mut positions: HashMap<u64, Vec<usize>> = HashMap::with_capacity(hashes.len());
    for (i, &h) in hashes.iter().enumerate() {
        positions.entry(h).or_default().push(i);
    }
    let min_gap = (period / 2).max(1);
    let mut best: Option<(usize, u64, usize)> = None; // (count, cost, first occurrence)
    let mut best_occ: Vec<usize> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for &h in hashes {
        if !seen.insert(h) {
            continue;
        }
        let Some(occ) = positions.get(&h) else {
            continue;
        };
        if occ.len() < 2 || occ.windows(2).any(|w| w[1] - w[0] < min_gap) {
            continue;
        }
        // Rank by the cost where the steady state runs (the last occurrence), not the prologue.
        let last = occ[occ.len() - 1];
        let c = cost.get(last).copied().unwrap_or(u64::MAX);
        let key = (occ.len(), c, occ[0]);
        let better = match best {
            None => true,
            Some((bc, bcost, bfirst)) => {
                key.0 > bc || (key.0 == bc && (key.1 < bcost || (key.1 == bcost && key.2 < bfirst)))
            }
        };
        if better {
            best = Some(key);
            best_occ.clone_from(occ);
        }
    }
    best_occ
}

fn spans_from_starts(starts: &[usize], period: usize, n: usize) -> Vec<Range<usize>> {
    let mut spans: Vec<Range<usize>> = starts.windows(2).map(|w| w[0]..w[1]).collect();
    if let Some(&last) = starts.last() {
        // The last anchor starts an iteration too; it ends with the trace, or after a typical
        // iteration's length if the trace goes on with something else (an epilogue). It may be
        // partial when the trace was cut; `pick_representative` never picks a partial one.
        let typical = median_len(&spans).unwrap_or(period);
        spans.push(last..n.min(last + typical));
    }
    spans
}

fn median_len(spans: &[Range<usize>]) -> Option<usize> {
    let mut lens: Vec<usize> = spans.iter().map(|s| s.len()).collect();
    lens.sort_unstable();
    lens.get(lens.len() / 2).copied()
}

/// The instance whose exact symbol sequence is the most common, preferring one that has a
/// successor (tensors allocated in it may be freed in the next one).
fn pick_representative(symbols: &[u64], spans: &[Range<usize>]) -> usize {
    let mut groups: HashMap<&[u64], Vec<usize>> = HashMap::new();
    for (k, span) in spans.iter().enumerate() {
        groups.entry(&symbols[span.clone()]).or_default().push(k);
    }
    let group = groups
        .into_values()
        .max_by_key(|members| (members.len(), members[members.len() - 1]))
        .unwrap_or_default();
    match group.as_slice() {
        [] => 0,
        [only] => *only,
        [.., before_last, last] => {
            if *last + 1 < spans.len() {
                *last
            } else {
                *before_last
            }
        }
    }
}
