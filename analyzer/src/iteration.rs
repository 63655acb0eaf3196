//! Iteration detection: the repeating unit of a training run and where each instance starts.
//!
//! The input is the trace's op sequence reduced to symbols (kernel handle for a launch, direction
//! for a copy). Detection has two stages, both tolerant to noise (a longer first step that creates
//! optimizer state, a kernel that runs only every k steps, a different prologue):
//!
//! 1. **Period.** Candidate lags come from n-gram repetition: for every position, the distance to
//!    the previous occurrence of the same n-gram. Each candidate lag `p` is scored by the fraction
//!    of positions `i` with `s[i] == s[i + p]`. The period is the smallest lag scoring within a
//!    small margin of the best, so a multiple of the period never wins over the period itself and
//!    a repeated layer (which matches only inside the forward or backward pass) never scores high.
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

/// Length of the n-grams used for candidate lags and anchors.
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

/// Finds the iterations of a trace.
pub fn detect(trace: &Trace) -> Result<Iterations, IterationError> {
    let symbols = op_symbols(trace);
    let allocated = allocated_before_ops(trace);
    detect_in(&symbols, &allocated)
}

/// Finds the iterations of a symbol sequence; `cost[i]` ranks boundary positions (lower is a
/// better place for an iteration to start; typically bytes allocated before op `i`).
pub fn detect_in(symbols: &[u64], cost: &[u64]) -> Result<Iterations, IterationError> {
    let n = symbols.len();
    if n == 0 {
        return Err(IterationError::Empty);
    }
    let gram = GRAM.min(n / 4).max(1);
    let hashes = gram_hashes(symbols, gram);
    let (period, score) = find_period(symbols, &hashes);
    if score < MIN_SCORE || period == 0 {
        return Err(IterationError::NoRepetition { ops: n, score });
    }
    let gram = gram.min(period);
    let hashes = if gram == GRAM.min(n / 4).max(1) {
        hashes
    } else {
        gram_hashes(symbols, gram)
    };
    let starts = find_anchor_occurrences(&hashes, period, cost);
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

/// Fraction of positions that match at lag `p`.
fn lag_score(symbols: &[u64], p: usize) -> f64 {
    let n = symbols.len();
    if p == 0 || p >= n {
        return 0.0;
    }
    let matches = symbols[..n - p]
        .iter()
        .zip(&symbols[p..])
        .filter(|(a, b)| a == b)
        .count();
    matches as f64 / (n - p) as f64
}

fn find_period(symbols: &[u64], hashes: &[u64]) -> (usize, f64) {
    let n = symbols.len();
    let mut last_seen: HashMap<u64, usize> = HashMap::with_capacity(hashes.len());
    let mut gap_counts: HashMap<usize, usize> = HashMap::new();
    for (i, &h) in hashes.iter().enumerate() {
        if let Some(prev) = last_seen.insert(h, i) {
            *gap_counts.entry(i - prev).or_default() += 1;
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
    scored
        .into_iter()
        .find(|s| s.1 >= best - SCORE_MARGIN)
        .unwrap_or((0, 0.0))
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
        let occ = &positions[&h];
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
        // The tail after the last anchor is an iteration if it is long enough to be one; ops
        // beyond a period's worth (plus slack) are an epilogue, not part of it.
        let typical = median_len(&spans).unwrap_or(period);
        let tail = n - last;
        if tail * 4 >= typical * 3 {
            spans.push(last..n.min(last + typical + typical / 4));
        }
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
