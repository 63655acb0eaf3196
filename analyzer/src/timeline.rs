//! Timelines of a cycle: when each tensor is allocated, accessed and freed (by op and by GPU
//! time), the intervals in which it holds data, and the memory footprint curves.
//!
//! Two footprints are computed, and the difference matters:
//! - **allocated**: bytes between allocation and free, what a native run holds (the peak reported
//!   as `peak_bytes`);
//! - **needed**: bytes of tensors holding live data (first to last access of each lifetime), the
//!   least any policy must keep somewhere (device or host); the planner and the bound work on it.
//!
//! Under [`MoveUnits::ShimPages`] a transient tensor also holds memory from its last access to
//! its free (its *tail*, [`Liveness::tails`]): the shim keeps an allocation's pages until the
//! application frees it. [`held_bytes`] counts that; [`needed_bytes`] does not, since the data
//! of a tail is never read again (the bound, which prices what must come back, uses it).
//!
//! Times assume no swapping: op `i` starts when op `i-1` ends.

use serde::Serialize;

use crate::cycle::{Cycle, Identity, MoveUnits, TensorId};

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
    /// Under [`MoveUnits::ShimPages`], each transient tensor's stretch from its last access
    /// (`from`, in `[0, period)`) to its free (`to`, unrolled: the op before which it is freed),
    /// when ops lie strictly between them. The shim holds the tensor's pages there (it cannot
    /// tell that nothing reads them again) unless a plan writes them out, a copy to the host
    /// that is never read back. Empty under [`MoveUnits::Bytes`], whose model releases a
    /// tensor at its last access.
    pub tails: Vec<Gap>,
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

/// The tail of transient tensor `t` of a cycle of `period` ops (see [`Liveness::tails`]), if it
/// has one: from its last access to its free.
fn tail_of(t: &crate::cycle::Tensor, tensor: TensorId, period: u32) -> Option<Gap> {
    let (alloc, free) = (t.alloc_at?, t.free_at?);
    // Accesses counted from the allocation: those before its position were folded back from
    // the next iteration.
    let last = t
        .accesses
        .iter()
        .map(|&a| if a < alloc { a + period } else { a })
        .max()?;
    // The lifetime is at most a period long, so the free is the first position after the
    // last access that is the free's position modulo the period.
    let after = last + 1;
    let to = after + (free % period + period - after % period) % period;
    if to <= after {
        return None;
    }
    let shift = (last / period) * period;
    Some(Gap {
        tensor,
        from: last - shift,
        to: to - shift,
    })
}

impl Liveness {
    /// Computes the live gaps of `cycle` (and its tails, under [`MoveUnits::ShimPages`]).
    pub fn of(cycle: &Cycle) -> Liveness {
        let period = cycle.len() as u32;
        let mut gaps = Vec::new();
        let mut idle = Vec::new();
        let mut tails = Vec::new();
        for (tid, t) in cycle.tensors.iter().enumerate() {
            let tid = tid as TensorId;
            if t.accesses.is_empty() {
                if t.is_persistent() {
                    idle.push(tid);
                }
                continue;
            }
            if cycle.units == MoveUnits::ShimPages {
                tails.extend(tail_of(t, tid, period));
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
                // Normalized as above: accesses in lifetime order may wrap (`[3, 0]`: the last
                // is op 0 of the next iteration, and the gap runs from op 0 to op 3).
                let shift = (last / period) * period;
                gaps.push(Gap {
                    tensor: tid,
                    from: last - shift,
                    to: next - shift,
                });
            }
        }
        Liveness {
            period,
            gaps,
            idle,
            tails,
        }
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

/// The per-op changes of the bytes the tensors of `gaps` hold between their ends (to be
/// integrated).
fn interval_deltas(cycle: &Cycle, period: u32, gaps: &[Gap]) -> Vec<i128> {
    let mut delta = vec![0i128; cycle.len() + 1];
    for g in gaps {
        add_open_interval(
            &mut delta,
            period,
            g.from,
            g.to,
            cycle.tensors[g.tensor as usize].bytes,
        );
    }
    delta
}

/// Bytes holding live data at each op (the op's own tensors included).
pub fn needed_bytes(cycle: &Cycle, live: &Liveness) -> Vec<u64> {
    let n = cycle.len();
    let mut delta = interval_deltas(cycle, live.period, &live.gaps);
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

/// Bytes the device holds at each op when nothing moves, as the planner counts them:
/// [`needed_bytes`] plus the tails (under [`MoveUnits::ShimPages`]; the same as
/// [`needed_bytes`] otherwise).
pub fn held_bytes(cycle: &Cycle, live: &Liveness) -> Vec<u64> {
    let mut held = needed_bytes(cycle, live);
    if live.tails.is_empty() {
        return held;
    }
    let delta = interval_deltas(cycle, live.period, &live.tails);
    for (h, t) in held.iter_mut().zip(integrate(delta, cycle.len())) {
        *h += t;
    }
    held
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cycle::{persistent_tensor, Tensor};

    const MIB: u64 = 1 << 20;

    fn transient(ordinal: u32, accesses: Vec<u32>, alloc: u32, free: u32) -> Tensor {
        Tensor {
            identity: Identity::Transient {
                ordinal,
                bytes: 4 * MIB,
            },
            bytes: 4 * MIB,
            accesses,
            alloc_at: Some(alloc),
            free_at: Some(free),
            source: ordinal,
        }
    }

    #[test]
    fn tails_run_from_the_last_access_to_the_free_in_shim_pages_only() {
        let tensors = vec![
            // Last access at 1, freed before 5: ops 2 to 4 hold it.
            transient(0, vec![0, 1], 0, 5),
            // Allocated at 6, last access folded from the next iteration (op 1), freed before
            // op 3 of that iteration.
            transient(1, vec![6, 7, 1], 6, 3),
            // Allocated at 5, last touched at 7, freed before op 2 of the next iteration: its
            // tail wraps.
            transient(2, vec![5, 7], 5, 2),
            // Freed right after its last access: no tail.
            transient(3, vec![2], 2, 3),
            persistent_tensor(4, 4 * MIB, vec![3]),
        ];
        let cycle = Cycle::from_parts(&[10; 8], tensors).unwrap();
        let bytes = Liveness::of(&cycle);
        assert!(bytes.tails.is_empty());
        assert_eq!(held_bytes(&cycle, &bytes), needed_bytes(&cycle, &bytes));

        let pages = cycle.with_units(MoveUnits::ShimPages);
        let live = Liveness::of(&pages);
        let tail = |tensor, from, to| Gap { tensor, from, to };
        assert_eq!(
            live.tails,
            vec![tail(0, 1, 5), tail(1, 1, 3), tail(2, 7, 10)]
        );
        // The gaps are those of the bytes model.
        assert_eq!(live.gaps, bytes.gaps);
        let needed = needed_bytes(&pages, &live);
        let held = held_bytes(&pages, &live);
        let extra: Vec<u64> = held
            .iter()
            .zip(&needed)
            .map(|(h, n)| (h - n) / MIB)
            .collect();
        // Tensor 2 over ops 0 and 1, tensor 1 over op 2, tensor 0 over ops 2 to 4.
        assert_eq!(extra, vec![4, 4, 8, 4, 4, 0, 0, 0]);
    }
}
