//! One iteration as a periodic unit: ops with durations, tensors with stable identities.
//!
//! A [`Cycle`] is what the planner, the bound and the simulator work on. It is built from the
//! representative instance of [`Iterations`]: its ops (with measured GPU durations, or a
//! documented estimate), and every tensor that occupies memory in the steady state:
//! - **persistent** tensors (parameters, optimizer state): allocated before the iteration and
//!   freed after it; identity = the allocation itself;
//! - **transient** tensors (activations, gradients, workspaces): allocated inside the iteration;
//!   identity = (position among the iteration's allocations, size). A transient tensor may live
//!   past the end of the iteration (a gradient freed by the next step's `zero_grad`); its
//!   accesses in the next instance are folded back modulo the period, which is exactly the
//!   steady state in which every iteration allocates it at the same point.
//!
//! What occupies memory is decided here too ("need" semantics): a tensor holds data from its
//! first access to its last access in each lifetime (contents before the first access are
//! garbage, contents after the last are never read), and between two accesses it may live on
//! the host. Accesses are not known to be reads or writes, so every access may dirty a tensor.

use std::collections::BTreeSet;
use std::ops::Range;

use serde::Serialize;

use crate::cost::{Budget, CostModel};
use crate::iteration::Iterations;
use crate::model::{AllocIdx, CopyDir, OpKind, Trace};

/// Index of a tensor in [`Cycle::tensors`].
pub type TensorId = u32;

/// Where an op's duration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum DurationSource {
    /// Measured for this very launch.
    Measured,
    /// Median of the measured launches of the same kernel.
    KernelMedian,
    /// Nothing measured: [`CostModel::default_launch_ns`].
    Default,
    /// An application copy or memset, priced by the cost model.
    Modeled,
}

/// One op of the cycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CycleOp {
    /// What it is.
    pub kind: OpKind,
    /// GPU time in ns.
    pub duration_ns: u64,
    /// Where the duration came from.
    pub source: DurationSource,
    /// Tensors it touches, sorted.
    pub tensors: Vec<TensorId>,
    /// The host waited for the device before it issued this op (a recorded stream or device
    /// synchronization, such as PyTorch's `loss.item()`): a host running ahead stops here
    /// until the compute stream has run every op before it.
    pub host_waits: bool,
}

/// How a tensor is recognised in every iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Identity {
    /// The same allocation in every iteration (trace id).
    Persistent {
        /// The allocation's id in the trace.
        trace_id: u64,
    },
    /// The `ordinal`-th allocation made in each iteration, of `bytes`.
    Transient {
        /// Position among the allocations made in the iteration.
        ordinal: u32,
        /// Size in bytes.
        bytes: u64,
    },
}

/// One tensor of the cycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tensor {
    /// Stable identity across iterations.
    pub identity: Identity,
    /// Size in bytes.
    pub bytes: u64,
    /// Op positions touching it, in lifetime order (a wrapped lifetime lists the positions after
    /// the allocation first, then those folded from the next iteration). Never empty for a
    /// transient tensor that holds data; may be empty for a persistent one.
    pub accesses: Vec<u32>,
    /// Position before which it is allocated (`None`: persistent).
    pub alloc_at: Option<u32>,
    /// Position before which it is freed, modulo the period (`None`: persistent).
    pub free_at: Option<u32>,
    /// The allocation in the trace this tensor was built from.
    pub source: AllocIdx,
}

impl Tensor {
    /// Whether the tensor is the same allocation in every iteration.
    pub fn is_persistent(&self) -> bool {
        self.alloc_at.is_none()
    }
}

/// A persistent tensor for unit tests: trace id and source from `i`.
#[cfg(test)]
pub(crate) fn persistent_tensor(i: u32, bytes: u64, accesses: Vec<u32>) -> Tensor {
    Tensor {
        identity: Identity::Persistent {
            trace_id: u64::from(i) + 1,
        },
        bytes,
        accesses,
        alloc_at: None,
        free_at: None,
        source: i,
    }
}

/// The shim's unit of residency: a page of device memory.
pub const PAGE_BYTES: u64 = 2 << 20;

/// What a plan may move of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum MoveUnits {
    /// Any byte range (the planner's own model, `tensile replay`'s default).
    #[default]
    Bytes,
    /// Only whole shim pages ([`Cycle::page_bytes`]): what the shim can carry out. Allocations larger
    /// than half a page start on a page boundary, smaller ones share pages; a swap-out moves
    /// only the pages entirely inside its range, so it never evicts a neighbour. A tensor (or
    /// piece) is then movable only if its size is a whole number of pages: tensors of at most
    /// half a page are never moved, and the partial last page of a larger one stays on the
    /// device (see [`crate::pieces::cut`], which cuts it off as a piece of its own).
    ShimPages,
}

/// A steady-state iteration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cycle {
    /// Ops in order.
    pub ops: Vec<CycleOp>,
    /// Tensors (see [`TensorId`]).
    pub tensors: Vec<Tensor>,
    /// The trace ops this cycle was built from.
    pub span: Range<usize>,
    /// Launches whose duration was not measured (estimated from the kernel's median or default).
    pub estimated_launches: usize,
    /// What a plan may move of the tensors.
    pub units: MoveUnits,
    /// The shim's page under [`MoveUnits::ShimPages`]: [`PAGE_BYTES`] on the H100, smaller
    /// on a simulated GPU set up for a scaled trace ([`Self::with_page_bytes`]).
    pub page_bytes: u64,
    /// Trace allocations whose tensors a plan may not move, whatever the units: those the
    /// shim cannot name from a plan ([`crate::exec_plan::unnameable`]). Pieces cut from such
    /// a tensor keep its allocation, so they stay too.
    pub immovable: BTreeSet<AllocIdx>,
}

impl Cycle {
    /// Pages per device unit the shim's manager makes for this cycle's tensors, over the
    /// pages they cover (so by bytes): a tensor's whole pages go in units of up to
    /// `max_unit_pages` ([`crate::SHIM_MAX_UNIT_PAGES`], or [`crate::SHIM_PLAN_UNIT_PAGES`]
    /// under a plan), its partial last page (shared with the small tensors packed after it)
    /// in a unit of its own, and a tensor smaller than a page shares its page's unit. What
    /// the remap calls' per-mapping costs are shared by ([`crate::RemapModel::per_page`]).
    pub fn pages_per_unit(&self, page_bytes: u64, max_unit_pages: u64) -> f64 {
        self.pages_per_unit_weighted(page_bytes, max_unit_pages, |_| 1.0)
    }

    /// [`Self::pages_per_unit`] with each tensor counted `weight(t)` times: by how often it
    /// moves, the units of the pages that move rather than of every page. LRU moves ResNet-50's
    /// small activations far more than its large tensors (8.6 pages per unit moved against
    /// 13.3 over all), the MLP's large ones (31.1 against 17.9).
    pub fn pages_per_unit_weighted(
        &self,
        page_bytes: u64,
        max_unit_pages: u64,
        weight: impl Fn(TensorId) -> f64,
    ) -> f64 {
        let page = page_bytes.max(1);
        let (mut pages, mut units) = (0.0, 0.0);
        for (i, t) in self.tensors.iter().enumerate() {
            let w = weight(i as TensorId);
            if w <= 0.0 {
                continue;
            }
            let full = t.bytes / page;
            let tail = (t.bytes % page) as f64 / page as f64;
            pages += w * (full as f64 + tail);
            units += w * (full.div_ceil(max_unit_pages.max(1)) as f64 + tail);
        }
        if units > 0.0 {
            pages / units
        } else {
            1.0
        }
    }

    /// Number of ops (the period).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are no ops.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Whether a plan may move tensor `t` (see [`MoveUnits`] and [`Self::immovable`]).
    pub fn is_movable(&self, t: TensorId) -> bool {
        let Some(tensor) = self.tensors.get(t as usize) else {
            return false;
        };
        if self.immovable.contains(&tensor.source) {
            return false;
        }
        match self.units {
            MoveUnits::Bytes => true,
            MoveUnits::ShimPages => tensor.bytes.is_multiple_of(self.page_bytes),
        }
    }

    /// The same cycle, its plans leaving the tensors of `allocations` where they are.
    pub fn with_immovable(mut self, allocations: BTreeSet<AllocIdx>) -> Cycle {
        self.immovable = allocations;
        self
    }

    /// The same cycle, with plans limited to `units`.
    pub fn with_units(mut self, units: MoveUnits) -> Cycle {
        self.units = units;
        self
    }

    /// The same cycle, with the shim's page `bytes` (a power of two) for
    /// [`MoveUnits::ShimPages`].
    pub fn with_page_bytes(mut self, bytes: u64) -> Cycle {
        self.page_bytes = bytes.max(1);
        self
    }

    /// Under [`MoveUnits::ShimPages`], the most device memory, at any op, that the partial
    /// last pages of the tensors holding memory there (live data, or a tail before its free)
    /// leave empty. Such a tensor (larger
    /// than half a page) starts on a page boundary and its last page stays on the device
    /// whole, while the planner counts only its bytes: on a scaled ResNet-50 that is 11% of
    /// the peak, which a plan that fills its budget to the byte then lacks. An upper bound: the
    /// shim packs small allocations into such tails. 0 under [`MoveUnits::Bytes`].
    pub fn page_tail_waste(&self) -> u64 {
        if self.units != MoveUnits::ShimPages {
            return 0;
        }
        let page = self.page_bytes;
        let padded_bytes = |b: u64| {
            if b > page / 2 {
                b.next_multiple_of(page)
            } else {
                b
            }
        };
        let mut padded = self.clone();
        for t in &mut padded.tensors {
            t.bytes = padded_bytes(t.bytes);
        }
        // Held, not needed: a tensor's last page stays on the device through its tail too.
        let counted = crate::timeline::held_bytes(self, &crate::timeline::Liveness::of(self));
        let held = crate::timeline::held_bytes(&padded, &crate::timeline::Liveness::of(&padded));
        held.iter()
            .zip(&counted)
            .map(|(h, c)| h.saturating_sub(*c))
            .max()
            .unwrap_or(0)
    }

    /// The budget a plan of this cycle may fill when the device holds `device_bytes`: all of
    /// it under [`MoveUnits::Bytes`], less [`Self::page_tail_waste`] under
    /// [`MoveUnits::ShimPages`].
    pub fn plan_budget(&self, device_bytes: u64) -> Budget {
        Budget::new(device_bytes.saturating_sub(self.page_tail_waste()))
    }

    /// The budgets to plan for, in order, when the device holds `device_bytes`: the
    /// [`Self::plan_budget`], then, if it is smaller, the whole budget. Where no plan fits the
    /// first (the tails, which never move, may fill it), a plan for the whole budget is still
    /// better than none: the shim's eviction, advised by the plan, makes the rest of the room.
    pub fn plan_budgets(&self, device_bytes: u64) -> Vec<Budget> {
        let within = self.plan_budget(device_bytes);
        let whole = Budget::new(device_bytes);
        if within == whole {
            vec![whole]
        } else {
            vec![within, whole]
        }
    }

    /// Total GPU time of the ops, without any swapping.
    pub fn compute_ns(&self) -> u64 {
        self.ops.iter().map(|o| o.duration_ns).sum()
    }

    /// Builds the cycle of the representative iteration of `iters`.
    pub fn from_trace(trace: &Trace, iters: &Iterations, cost: &CostModel) -> Cycle {
        let k = iters.representative;
        let span = iters.spans[k].clone();
        let next_start = iters.spans.get(k + 1).map(|s| s.start).unwrap_or(span.end);
        build(trace, span, next_start, cost)
    }

    /// Builds a cycle from an explicit op range; `next_start` is where the following instance
    /// starts (accesses after it are folded back onto the cycle).
    pub fn from_span(
        trace: &Trace,
        span: Range<usize>,
        next_start: usize,
        cost: &CostModel,
    ) -> Result<Cycle, String> {
        let n = trace.ops.len();
        if span.is_empty() || span.end > n || next_start < span.end || next_start > n {
            return Err(format!(
                "ops {}..{} (next iteration at {next_start}) is not an iteration of a trace of {n} ops",
                span.start, span.end
            ));
        }
        Ok(build(trace, span, next_start, cost))
    }

    /// Builds a cycle directly from op durations and tensors (for synthetic workloads and tests):
    /// each op touches the tensors whose `accesses` name it. Access positions must be below
    /// `durations.len()`; they are taken in lifetime order as given.
    pub fn from_parts(durations: &[u64], tensors: Vec<Tensor>) -> Result<Cycle, String> {
        let p = durations.len();
        let mut ops: Vec<CycleOp> = durations
            .iter()
            .map(|&d| CycleOp {
                kind: OpKind::Launch { kernel: 0 },
                duration_ns: d,
                source: DurationSource::Measured,
                tensors: Vec::new(),
                host_waits: false,
            })
            .collect();
        for (tid, t) in tensors.iter().enumerate() {
            for &a in &t.accesses {
                let op = ops
                    .get_mut(a as usize)
                    .ok_or_else(|| format!("tensor {tid} accessed at {a}, beyond {p} ops"))?;
                op.tensors.push(tid as TensorId);
            }
            let valid = |x: Option<u32>| x.is_none_or(|x| (x as usize) < p);
            if !valid(t.alloc_at) || !valid(t.free_at) {
                return Err(format!("tensor {tid} is allocated or freed beyond {p} ops"));
            }
        }
        for op in &mut ops {
            op.tensors.sort_unstable();
            op.tensors.dedup();
        }
        Ok(Cycle {
            ops,
            tensors,
            span: 0..p,
            estimated_launches: 0,
            units: MoveUnits::Bytes,
            page_bytes: PAGE_BYTES,
            immovable: BTreeSet::new(),
        })
    }

    /// Finds, for each tensor of the cycle, the allocation that plays its part in the trace's
    /// op range `span` (another instance of the iteration). `None` where no allocation matches.
    pub fn resolve(&self, trace: &Trace, span: Range<usize>) -> Vec<Option<AllocIdx>> {
        let made: Vec<AllocIdx> = allocations_made_in(trace, &span);
        self.tensors
            .iter()
            .map(|t| match t.identity {
                Identity::Persistent { trace_id } => trace
                    .allocations
                    .iter()
                    .enumerate()
                    .rev()
                    .find_map(|(i, a)| {
                        let alive = a.before_op as usize <= span.start
                            && a.free.is_none_or(|f| f.before_op as usize >= span.end);
                        (a.trace_id == trace_id && alive).then_some(i as AllocIdx)
                    }),
                Identity::Transient { ordinal, bytes } => {
                    // Exact position first, then the nearest same-sized allocation (a noisy
                    // iteration can allocate a few extra tensors).
                    let ord = ordinal as usize;
                    (0..=8usize).find_map(|d| {
                        [ord.checked_sub(d), ord.checked_add(d)]
                            .into_iter()
                            .flatten()
                            .find_map(|o| {
                                let idx = *made.get(o)?;
                                (trace.allocations[idx as usize].bytes == bytes).then_some(idx)
                            })
                    })
                }
            })
            .collect()
    }
}

fn allocations_made_in(trace: &Trace, span: &Range<usize>) -> Vec<AllocIdx> {
    trace
        .allocations
        .iter()
        .enumerate()
        .filter(|(_, a)| span.contains(&(a.before_op as usize)))
        .map(|(i, _)| i as AllocIdx)
        .collect()
}

fn kernel_medians(trace: &Trace) -> std::collections::HashMap<u32, u64> {
    let mut by_kernel: std::collections::HashMap<u32, Vec<u64>> = Default::default();
    for op in &trace.ops {
        if let (OpKind::Launch { kernel }, Some(ns)) = (op.kind, op.gpu_ns) {
            by_kernel.entry(kernel).or_default().push(ns);
        }
    }
    by_kernel
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_unstable();
            (k, v[v.len() / 2])
        })
        .collect()
}

fn build(trace: &Trace, span: Range<usize>, next_start: usize, cost: &CostModel) -> Cycle {
    let period = span.len();
    let medians = kernel_medians(trace);
    let mut estimated_launches = 0;
    let mut ops: Vec<CycleOp> = trace.ops[span.clone()]
        .iter()
        .map(|op| {
            let (duration_ns, source) = match (op.kind, op.gpu_ns) {
                (OpKind::Launch { .. }, Some(ns)) => (ns, DurationSource::Measured),
                (OpKind::Launch { kernel }, None) => {
                    estimated_launches += 1;
                    match medians.get(&kernel) {
                        Some(&ns) => (ns, DurationSource::KernelMedian),
                        None => (cost.default_launch_ns, DurationSource::Default),
                    }
                }
                (OpKind::Copy { dir }, _) => {
                    let gbps = match dir {
                        CopyDir::HostToDevice => cost.h2d_gbps,
                        CopyDir::DeviceToHost => cost.d2h_gbps,
                        CopyDir::DeviceToDevice => cost.d2d_gbps,
                        // The driver decides; price it as a PCIe copy (the slower case).
                        CopyDir::Any => cost.h2d_gbps.min(cost.d2h_gbps),
                    };
                    (CostModel::ns_at(op.bytes, gbps), DurationSource::Modeled)
                }
                (OpKind::Memset, _) => (
                    CostModel::ns_at(op.bytes, cost.memset_gbps),
                    DurationSource::Modeled,
                ),
            };
            CycleOp {
                kind: op.kind,
                duration_ns,
                source,
                tensors: Vec::new(),
                host_waits: false,
            }
        })
        .collect();
    for sync in &trace.syncs {
        let at = sync.before_op as usize;
        if span.contains(&at) {
            ops[at - span.start].host_waits = true;
        }
    }

    // Ops that touch each allocation, found once (ops list their allocations).
    let mut touching: std::collections::HashMap<AllocIdx, Vec<usize>> = Default::default();
    let scan_end = (next_start + period).min(trace.ops.len());
    for (i, op) in trace.ops[span.start..scan_end].iter().enumerate() {
        for &a in &op.touches {
            touching.entry(a).or_default().push(span.start + i);
        }
    }

    let mut tensors = Vec::new();
    let mut ordinal = 0u32;
    for (idx, a) in trace.allocations.iter().enumerate() {
        let idx = idx as AllocIdx;
        let alloc_op = a.before_op as usize;
        let free_op = a.free.map(|f| f.before_op as usize);
        let empty = Vec::new();
        let touches = touching.get(&idx).unwrap_or(&empty);
        let made_here = span.contains(&alloc_op);
        if made_here {
            let my_ordinal = ordinal;
            ordinal += 1;
            let alloc_pos = alloc_op - span.start;
            let lifetime_ok = free_op.is_some_and(|f| f - alloc_op <= period);
            if lifetime_ok {
                let free_op = free_op.unwrap_or(alloc_op);
                let mut accesses = Vec::new();
                for &op in touches.iter().filter(|&&op| op >= alloc_op && op < free_op) {
                    let pos = if op < span.end {
                        op - span.start
                    } else if op >= next_start && op - next_start < alloc_pos {
                        op - next_start
                    } else {
                        continue;
                    };
                    accesses.push(pos as u32);
                }
                let free_pos = if free_op < span.end {
                    free_op - span.start
                } else {
                    (free_op.saturating_sub(next_start)).min(alloc_pos)
                };
                tensors.push(Tensor {
                    identity: Identity::Transient {
                        ordinal: my_ordinal,
                        bytes: a.bytes,
                    },
                    bytes: a.bytes,
                    accesses,
                    alloc_at: Some(alloc_pos as u32),
                    free_at: Some(free_pos as u32),
                    source: idx,
                });
                continue;
            }
            // Lives longer than a period (or is never freed): in the steady state it behaves
            // like a persistent tensor; treat it as one.
        } else {
            let alive_throughout = alloc_op <= span.start && free_op.is_none_or(|f| f >= span.end);
            if !alive_throughout {
                // Freed inside the iteration after being allocated before it: the previous
                // instance of a transient tensor (counted through its successor), or a one-off.
                continue;
            }
        }
        let accesses: Vec<u32> = touches
            .iter()
            .filter(|&&op| span.contains(&op))
            .map(|&op| (op - span.start) as u32)
            .collect();
        tensors.push(Tensor {
            identity: Identity::Persistent {
                trace_id: a.trace_id,
            },
            bytes: a.bytes,
            accesses,
            alloc_at: None,
            free_at: None,
            source: idx,
        });
    }

    for (tid, t) in tensors.iter().enumerate() {
        for &pos in &t.accesses {
            ops[pos as usize].tensors.push(tid as TensorId);
        }
    }
    for op in &mut ops {
        op.tensors.sort_unstable();
        op.tensors.dedup();
    }
    Cycle {
        ops,
        tensors,
        span,
        estimated_launches,
        units: MoveUnits::Bytes,
        page_bytes: PAGE_BYTES,
        immovable: BTreeSet::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn transient(ordinal: u32, bytes: u64, accesses: Vec<u32>, alloc: u32, free: u32) -> Tensor {
        Tensor {
            identity: Identity::Transient { ordinal, bytes },
            bytes,
            accesses,
            alloc_at: Some(alloc),
            free_at: Some(free),
            source: ordinal,
        }
    }

    #[test]
    fn units_are_cut_per_tensor_and_small_tensors_share_a_pages_unit() {
        const PAGE: u64 = 2 * MIB;
        // 80 whole pages (units of 32, 32, 16 or ten of 8), a 3-page tensor and a half page
        // (its last page a unit of its own, shared), and two quarter-page tensors (sharing one
        // page, one unit between them).
        let tensors = vec![
            persistent_tensor(0, 80 * PAGE, vec![0]),
            persistent_tensor(1, 3 * PAGE + PAGE / 2, vec![0]),
            persistent_tensor(2, PAGE / 4, vec![0]),
            persistent_tensor(3, PAGE / 4, vec![0]),
        ];
        let cycle = Cycle::from_parts(&[10], tensors).unwrap();
        let pages = 80.0 + 3.5 + 0.5;
        // Manager's units: 3 + (1 + 0.5) + 0.5.
        let lru = cycle.pages_per_unit(PAGE, 32);
        assert!((lru - pages / 5.0).abs() < 1e-9, "{lru}");
        // Under a plan: 10 + (1 + 0.5) + 0.5.
        let plan = cycle.pages_per_unit(PAGE, 8);
        assert!((plan - pages / 12.0).abs() < 1e-9, "{plan}");
        let empty = Cycle::from_parts(&[10], Vec::new()).unwrap();
        assert_eq!(empty.pages_per_unit(PAGE, 32), 1.0);
        // Counted by how often each moves: only the 3.5-page tensor, twice, is its own units.
        let moved = cycle.pages_per_unit_weighted(PAGE, 32, |t| if t == 1 { 2.0 } else { 0.0 });
        assert!((moved - 3.5 / 1.5).abs() < 1e-9, "{moved}");
        // Nothing moves: as if every tensor counted once would be wrong, so 1.0 says so.
        assert_eq!(cycle.pages_per_unit_weighted(PAGE, 32, |_| 0.0), 1.0);
    }

    #[test]
    fn the_partial_last_pages_of_live_tensors_are_waste_in_shim_pages_only() {
        // A 3 MiB tensor (1 MiB of its second page empty) live over ops 0..=2, a 5.5 MiB one
        // (0.5 MiB empty) over 1..=3, a 1 MiB one (packed: no waste) and a 4 MiB one (whole
        // pages) throughout.
        let tensors = vec![
            transient(0, 3 * MIB, vec![0, 2], 0, 3),
            transient(1, 11 * MIB / 2, vec![1, 3], 1, 0),
            transient(2, MIB, vec![0, 3], 0, 0),
            persistent_tensor(3, 4 * MIB, vec![0, 1, 2, 3]),
        ];
        let cycle = Cycle::from_parts(&[10, 10, 10, 10], tensors).unwrap();
        assert_eq!(cycle.page_tail_waste(), 0);
        assert_eq!(cycle.plan_budget(100 * MIB).bytes, 100 * MIB);
        let in_pages = cycle.with_units(MoveUnits::ShimPages);
        // Both partial pages are live at ops 1 and 2.
        assert_eq!(in_pages.page_tail_waste(), 3 * MIB / 2);
        assert_eq!(
            in_pages.plan_budget(100 * MIB).bytes,
            100 * MIB - 3 * MIB / 2
        );
        assert_eq!(in_pages.plan_budget(MIB).bytes, 0);
        assert_eq!(
            in_pages.plan_budgets(100 * MIB),
            vec![Budget::new(100 * MIB - 3 * MIB / 2), Budget::new(100 * MIB)]
        );
        let bytes_only = in_pages.with_units(MoveUnits::Bytes);
        assert_eq!(
            bytes_only.plan_budgets(100 * MIB),
            vec![Budget::new(100 * MIB)]
        );
    }
}
