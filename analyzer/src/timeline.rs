//! Timelines of a cycle: when each tensor is allocated, accessed and freed (by op and by GPU
//! time), the intervals in which it holds data, and the memory footprint curves.
//!
//! Two footprints are computed, and the difference matters:
//! - **allocated**: bytes between allocation and free, what a native run holds (the peak reported
//!   as `peak_bytes`);
//! - **needed**: bytes of tensors holding live data (first to last access of each lifetime), the
//!   least any policy must keep somewhere (device or host); the planner and the bound work on it.
//!
//! Times assume no swapping: op `i` starts when op `i-1` ends.

use serde::Serialize;

use crate::cycle::{Cycle, Identity, TensorId};

/// A stretch during which a tensor holds data it will read again: from an access to its next
/// access. Positions are unrolled: `from` lies in `[0, period)`, `from < to`, and `to` exceeds
/// the period when the gap wraps into the next iteration. Ops strictly between `from` and `to` do not touch the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Gap {
    /// The tensor.
    pub tensor: TensorId,
    /// Position of the access that starts the gap.
    pub from: u32,
    /// Unrolled position of the next access.
    pub to: u32,
}

/// Every live gap of a cycle, plus the tensors that hold data but are never touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Liveness {
    /// Period (ops per cycle).
    pub period: u32,
    /// Live gaps, grouped by tensor, in lifetime order.
    pub gaps: Vec<Gap>,
    /// Persistent tensors with no access in the cycle: they hold data and are never needed.
    pub idle: Vec<TensorId>,
}

/// Unrolled access positions of a tensor in lifetime order (strictly increasing).
pub fn unrolled_accesses(accesses: &[u32], period: u32) -> Vec<u32> {
    let mut out = Vec::with_capacity(accesses.len());
    let mut offset = 0;
    for &a in accesses {
        if let Some(&last) = out.last() {
            if a + offset <= last {
                offset += period;
            }
        }
        out.push(a + offset);
    }
    out
}

impl Liveness {
    /// Computes the live gaps of `cycle`.
    pub fn of(cycle: &Cycle) -> Liveness {
        let period = cycle.len() as u32;
        let mut gaps = Vec::new();
        let mut idle = Vec::new();
        for (tid, t) in cycle.tensors.iter().enumerate() {
            let tid = tid as TensorId;
            if t.accesses.is_empty() {
                if t.is_persistent() {
                    idle.push(tid);
                }
                continue;
            }
            let acc = unrolled_accesses(&t.accesses, period);
            for w in acc.windows(2) {
                // Normalized so that `from` lies in the cycle: a gap between two accesses folded
                // from the next iteration is the same gap one period earlier.
                let shift = (w[0] / period) * period;
                gaps.push(Gap {
                    tensor: tid,
                    from: w[0] - shift,
                    to: w[1] - shift,
                });
            }
            if t.is_persistent() {
                // Persistent data survives into the next iteration's first access.
                let first = acc[0];
                let last = acc[acc.len() - 1];
                let next = first + period * ((last - first) / period + 1);
                gaps.push(Gap {
                    tensor: tid,
                    from: last,
                    to: next,
                });
            }
        }
        Liveness { period, gaps, idle }
    }
}

/// Adds `bytes` to `curve` at positions strictly between unrolled `from` and `to` (cyclically).
pub(crate) fn add_open_interval(curve: &mut [i128], period: u32, from: u32, to: u32, bytes: u64) {
    let p = period as usize;
    let mut pos = from as usize + 1;
    let end = to as usize;
    // Walk in at most two contiguous pieces; intervals never exceed one period.
    while pos < end {
        let start = pos % p;
        let len = (end - pos).min(p - start);
        curve[start] += i128::from(bytes);
        curve[start + len] -= i128::from(bytes);
        pos += len;
    }
}

fn integrate(delta: Vec<i128>, n: usize) -> Vec<u64> {
    let mut acc = 0i128;
    delta
        .into_iter()
        .take(n)
        .map(|d| {
            acc += d;
            acc.max(0) as u64
        })
        .collect()
}

/// Bytes holding live data at each op (the op's own tensors included).
pub fn needed_bytes(cycle: &Cycle, live: &Liveness) -> Vec<u64> {
    let n = cycle.len();
    let mut delta = vec![0i128; n + 1];
    for g in &live.gaps {
        add_open_interval(
            &mut delta,
            live.period,
            g.from,
            g.to,
            cycle.tensors[g.tensor as usize].bytes,
        );
    }
    let idle: u64 = live
        .idle
        .iter()
        .map(|&t| cycle.tensors[t as usize].bytes)
        .sum();
    delta[0] += i128::from(idle);
    delta[n] -= i128::from(idle);
    let mut out = integrate(delta, n);
    for (i, op) in cycle.ops.iter().enumerate() {
        out[i] += op
            .tensors
            .iter()
            .map(|&t| cycle.tensors[t as usize].bytes)
            .sum::<u64>();
    }
    out
}

/// Bytes allocated (between allocation and free) at each op.
pub fn allocated_bytes(cycle: &Cycle) -> Vec<u64> {
    let n = cycle.len();
    let mut delta = vec![0i128; n + 1];
    for t in &cycle.tensors {
        let b = i128::from(t.bytes);
        match (t.alloc_at, t.free_at) {
            (Some(a), Some(f)) => {
                let (a, f) = (a as usize, f as usize);
                if a < f {
                    delta[a] += b;
                    delta[f] -= b;
                } else if f < a || !t.accesses.is_empty() {
                    // Wraps into the next iteration (freed exactly one period later if f == a:
                    // a tensor with accesses cannot have an empty lifetime).
                    delta[a] += b;
                    delta[n] -= b;
                    delta[0] += b;
                    delta[f] -= b;
                }
            }
            _ => {
                delta[0] += b;
                delta[n] -= b;
            }
        }
    }
    integrate(delta, n)
}

/// Start time of each op without swapping, and the cycle's total GPU time as the last element.
pub fn op_start_times(cycle: &Cycle) -> Vec<u64> {
    let mut t = 0;
    let mut out = Vec::with_capacity(cycle.len() + 1);
    for op in &cycle.ops {
        out.push(t);
        t += op.duration_ns;
    }
    out.push(t);
    out
}

/// One point of a footprint curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FootprintPoint {
    /// Op position.
    pub op: u32,
    /// Start of the op on the GPU, ns from the start of the cycle (no swapping).
    pub t_ns: u64,
    /// Bytes allocated.
    pub allocated: u64,
    /// Bytes holding live data.
    pub needed: u64,
}

/// Footprint over one iteration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Footprint {
    /// One point per op.
    pub points: Vec<FootprintPoint>,
    /// Peak allocated bytes.
    pub peak_allocated: u64,
    /// Peak live-data bytes.
    pub peak_needed: u64,
    /// GPU time of the cycle without swapping.
    pub compute_ns: u64,
}

impl Footprint {
    /// Computes the footprint curves of `cycle`.
    pub fn of(cycle: &Cycle) -> Footprint {
        let live = Liveness::of(cycle);
        let needed = needed_bytes(cycle, &live);
        let allocated = allocated_bytes(cycle);
        let times = op_start_times(cycle);
        let points: Vec<FootprintPoint> = (0..cycle.len())
            .map(|i| FootprintPoint {
                op: i as u32,
                t_ns: times[i],
                allocated: allocated[i].max(needed[i]),
                needed: needed[i],
            })
            .collect();
        Footprint {
            peak_allocated: points.iter().map(|p| p.allocated).max().unwrap_or(0),
            peak_needed: points.iter().map(|p| p.needed).max().unwrap_or(0),
            compute_ns: times[cycle.len()],
            points,
        }
    }
}

/// A tensor's timeline over one iteration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorTimeline {
    /// The tensor.
    pub tensor: TensorId,
    /// Its identity.
    pub identity: Identity,
    /// Size.
    pub bytes: u64,
    /// (op position, GPU time) of the allocation, for transient tensors.
    pub alloc: Option<(u32, u64)>,
    /// (op position, GPU start time) of every access, in lifetime order.
    pub accesses: Vec<(u32, u64)>,
    /// (op position, GPU time) of the free, for transient tensors.
    pub free: Option<(u32, u64)>,
}

/// Timelines of every tensor of `cycle`.
pub fn tensor_timelines(cycle: &Cycle) -> Vec<TensorTimeline> {
    let times = op_start_times(cycle);
    let at = |pos: u32| (pos, times[pos as usize]);
    cycle
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| TensorTimeline {
            tensor: i as TensorId,
            identity: t.identity,
            bytes: t.bytes,
            alloc: t.alloc_at.map(at),
            accesses: t.accesses.iter().map(|&p| at(p)).collect(),
            free: t.free_at.map(at),
        })
        .collect()
}
