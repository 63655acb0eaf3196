//! The script the player plays: a recorded trace turned into driver-level steps.
//!
//! [`build`] reads the trace once, as the analyzer sees it: the prologue (everything recorded
//! before the steady-state iteration) is played as recorded, then the steady-state iteration
//! (the analyzer's [`Cycle`]) is played N times. Allocations live in *slots*: slot `t < tensors`
//! is cycle tensor `t` (persistent tensors keep one allocation, transient ones get a fresh one
//! each iteration), further slots are prologue allocations that play no part in the steady
//! state (they are freed when the prologue ends). Sizes are divided by the scale, durations
//! multiplied by the time scale, here, so the player only executes.
//!
//! Not here: any driver call (see [`super::player`]).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tensile_analyzer::cycle::{Cycle, Identity};
use tensile_analyzer::model::{AllocIdx, CopyDir, OpKind, SyncScope, Trace};
use tensile_analyzer::{Analysis, CostModel};
use tensile_kernels::rerun::MAX_SLOTS;

/// The piece size of the stamps (and of libtensile's pages) before scaling.
pub const PIECE_BYTES: u64 = 2 << 20;

/// The smallest allocation the player makes: one stamp.
const MIN_ALLOC_BYTES: u64 = 16;

/// A stream, by index: 0 is the legacy default stream, `i > 0` the player's `i`-th stream.
pub type StreamIdx = u32;

/// A slot: one allocation at a time (see the module doc).
pub type SlotIdx = u32;

/// One thing the player does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Step {
    /// Allocate `slot` (stream-ordered on `stream` when the script says so).
    Alloc {
        slot: SlotIdx,
        bytes: u64,
        stream: StreamIdx,
    },
    /// Free `slot`'s allocation.
    Free { slot: SlotIdx, stream: StreamIdx },
    /// One stand-in launch: `op` is the recorded op it replays, `kernel` the recorded kernel
    /// (or [`MEMSET_KERNEL`], [`DEVICE_COPY_KERNEL`] for the ops a kernel stands in for).
    Kernel {
        op: u32,
        kernel: u32,
        stream: StreamIdx,
        duration_ns: u64,
        slots: Vec<SlotIdx>,
    },
    /// A copy of `bytes` from a pinned host buffer into `slot`.
    CopyIn {
        op: u32,
        slot: SlotIdx,
        bytes: u64,
        stream: StreamIdx,
    },
    /// A copy of `bytes` from `slot` into a pinned host buffer.
    CopyOut {
        op: u32,
        slot: SlotIdx,
        bytes: u64,
        stream: StreamIdx,
    },
    /// The host waits for one stream.
    SyncStream(StreamIdx),
    /// The host waits for the whole device.
    SyncDevice,
}

/// Everything the player needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Script {
    /// Distance between stamps (2 MiB divided by the scale).
    pub piece_bytes: u64,
    /// Streams the player creates (indices 1..=streams).
    pub streams: u32,
    /// Allocate with `cuMemAllocAsync`/`cuMemFreeAsync` (else `cuMemAlloc`/`cuMemFree`).
    pub stream_ordered: bool,
    /// The recorded allocation id each slot stands for (for messages).
    pub slot_names: Vec<u64>,
    /// Played once.
    pub prologue: Vec<Step>,
    /// Played `warmup` times, then `iterations` times.
    pub iteration: Vec<Step>,
    /// Iterations played before the measured ones, in place of the recorded steps between
    /// the first and the steady state (see [`build`]): not measured.
    #[serde(default)]
    pub warmup: u32,
    pub iterations: u32,
}

impl Script {
    /// The recorded kernels the script launches stand-ins for, each once, in order.
    pub fn kernels(&self) -> Vec<u32> {
        let mut k: Vec<u32> = self
            .prologue
            .iter()
            .chain(&self.iteration)
            .filter_map(|s| match s {
                Step::Kernel { kernel, .. } => Some(*kernel),
                _ => None,
            })
            .collect();
        k.sort_unstable();
        k.dedup();
        k
    }

    /// One more than the largest recorded kernel the script launches (0 if none): kernels
    /// from there on are free for another script's ([`Script::offset_kernels`]).
    pub fn kernel_bound(&self) -> u32 {
        self.kernels()
            .into_iter()
            .filter(|&k| is_recorded_kernel(k))
            .max()
            .map_or(0, |k| k + 1)
    }

    /// Renames every recorded kernel `k` to `k + by`, so that a script played after another
    /// launches other kernels than it (another program's); the stand-ins for memsets and
    /// copies, and the final check, stay what they are.
    pub fn offset_kernels(&mut self, by: u32) {
        for step in self.prologue.iter_mut().chain(&mut self.iteration) {
            if let Step::Kernel { kernel, .. } = step {
                if is_recorded_kernel(*kernel) {
                    *kernel += by;
                }
            }
        }
    }

    /// Launches of stand-in kernels in one iteration.
    pub fn kernels_per_iteration(&self) -> usize {
        self.iteration
            .iter()
            .filter(|s| matches!(s, Step::Kernel { .. }))
            .count()
    }
}

/// How sizes and times are transformed.
#[derive(Debug, Clone, Copy)]
pub struct Scaling {
    /// Sizes are divided by this.
    pub size_divisor: u64,
    /// Durations are multiplied by this.
    pub time_scale: f64,
    /// Most allocations one stand-in launch touches (at most [`MAX_SLOTS`]).
    pub max_slots: usize,
}

impl Scaling {
    /// How many allocations one stand-in launch may touch under a device budget of `budget`
    /// bytes (after scaling): a scaled trace's small allocations each still take a 2 MiB page,
    /// so a launch touching many of them needs more pages than the budget holds. Such a
    /// launch is split into launches touching at most a quarter of the budget's pages each.
    pub fn slots_for_budget(budget: Option<u64>) -> usize {
        match budget {
            Some(b) => ((b / PIECE_BYTES / 4) as usize).clamp(4, MAX_SLOTS),
            None => MAX_SLOTS,
        }
    }
}

impl Scaling {
    fn bytes(&self, b: u64) -> u64 {
        b.div_ceil(self.size_divisor.max(1))
    }

    fn alloc_bytes(&self, b: u64) -> u64 {
        self.bytes(b).max(MIN_ALLOC_BYTES)
    }

    fn duration(&self, ns: u64) -> u64 {
        (ns as f64 * self.time_scale).round() as u64
    }

    /// The stamp distance: the 2 MiB page, not scaled, because the pages libtensile swaps
    /// are the driver's granularity, which the simulated GPU does not scale either (a scaled
    /// trace has fewer pages, each still stamped).
    pub fn piece_bytes(&self) -> u64 {
        PIECE_BYTES
    }
}

/// Maps recorded stream handles to player streams, in order of first use.
#[derive(Default)]
struct Streams {
    index: HashMap<u64, StreamIdx>,
}

impl Streams {
    fn of(&mut self, handle: u64) -> StreamIdx {
        if handle == 0 {
            return 0;
        }
        let next = self.index.len() as StreamIdx + 1;
        *self.index.entry(handle).or_insert(next)
    }
}

/// Median recorded duration per kernel, for launches the trace did not time.
fn kernel_medians(trace: &Trace) -> HashMap<u32, u64> {
    let mut by_kernel: HashMap<u32, Vec<u64>> = HashMap::new();
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

/// The kernel a recorded memset is replayed as.
pub const MEMSET_KERNEL: u32 = u32::MAX - 1;
/// The kernel a recorded device-to-device copy is replayed as.
pub const DEVICE_COPY_KERNEL: u32 = u32::MAX - 2;
/// The kernel of the player's final check of every stamp (no recorded op).
pub const FINAL_CHECK_KERNEL: u32 = u32::MAX - 3;

/// Whether `kernel` is a recorded kernel's (not a stand-in for a memset, a copy or the final
/// check).
fn is_recorded_kernel(kernel: u32) -> bool {
    kernel
        < FINAL_CHECK_KERNEL
            .min(MEMSET_KERNEL)
            .min(DEVICE_COPY_KERNEL)
}

/// Appends the steps of one op touching `slots` (already deduplicated).
#[allow(clippy::too_many_arguments)]
fn op_steps(
    out: &mut Vec<Step>,
    op: u32,
    kind: OpKind,
    stream: StreamIdx,
    duration_ns: u64,
    bytes: u64,
    slots: &[SlotIdx],
    slot_bytes: &dyn Fn(SlotIdx) -> u64,
    max_slots: usize,
) {
    match (kind, slots) {
        (
            OpKind::Copy {
                dir: CopyDir::HostToDevice,
            },
            [slot],
        ) => out.push(Step::CopyIn {
            op,
            slot: *slot,
            bytes: bytes.min(slot_bytes(*slot)),
            stream,
        }),
        // A copy the driver directed with one device side: played as device-to-host, which
        // moves the same bytes over the bus and leaves the stamps as they are.
        (
            OpKind::Copy {
                dir: CopyDir::DeviceToHost | CopyDir::Any,
            },
            [slot],
        ) => out.push(Step::CopyOut {
            op,
            slot: *slot,
            bytes: bytes.min(slot_bytes(*slot)),
            stream,
        }),
        // A copy with no tracked device side touches nothing the shim manages.
        (OpKind::Copy { .. }, []) => {}
        // Launches, memsets, device-to-device copies: a stand-in kernel touching every slot for
        // the op's time; more slots than one launch holds go to several launches that share it.
        _ => {
            let kernel = match kind {
                OpKind::Launch { kernel } => kernel,
                OpKind::Memset => MEMSET_KERNEL,
                OpKind::Copy { .. } => DEVICE_COPY_KERNEL,
            };
            if slots.is_empty() {
                out.push(Step::Kernel {
                    op,
                    kernel,
                    stream,
                    duration_ns,
                    slots: Vec::new(),
                });
                return;
            }
            let max_slots = max_slots.clamp(1, MAX_SLOTS);
            let parts = slots.len().div_ceil(max_slots) as u64;
            for (i, chunk) in slots.chunks(max_slots).enumerate() {
                let share = duration_ns / parts + u64::from((i as u64) < duration_ns % parts);
                out.push(Step::Kernel {
                    op,
                    kernel,
                    stream,
                    duration_ns: share,
                    slots: chunk.to_vec(),
                });
            }
        }
    }
}

/// An event of the recorded program between ops, in recording order.
enum Between {
    Alloc(AllocIdx),
    Free(AllocIdx),
    Sync(SyncScope),
}

/// Builds the script for `iterations` steady-state iterations.
pub fn build(
    trace: &Trace,
    analysis: &Analysis,
    cost: &CostModel,
    scaling: Scaling,
    iterations: u32,
) -> Script {
    let cycle = &analysis.cycle;
    let span = cycle.span.clone();
    let rep = analysis.iterations.representative;
    // The recorded steps after the first are played as the steady-state iteration, to warm
    // up, rather than as recorded: a program's steps differ in what some launches touch (in
    // the shared ResNet-50 capture, 78 to 130 of 802 launches from one step to the next, by
    // allocation role), and the library learns its plan from the first steps it sees. Played
    // as recorded, they taught it a plan for other steps than the measured ones. The first
    // step (longer: optimizer state is made there) stays as recorded.
    let spans = &analysis.iterations.spans;
    let recorded = rep.min(1);
    let cut = spans[recorded].start;
    let warmup = (rep - recorded) as u32;
    let mut streams = Streams::default();
    let medians = kernel_medians(trace);

    // Slots: cycle tensors first.
    let tensors = cycle.tensors.len();
    let mut slot_names: Vec<u64> = cycle
        .tensors
        .iter()
        .map(|t| trace.allocations[t.source as usize].trace_id)
        .collect();
    let mut slot_bytes: Vec<u64> = cycle
        .tensors
        .iter()
        .map(|t| scaling.alloc_bytes(t.bytes))
        .collect();

    // Which prologue allocation plays each tensor's part when the steady state begins.
    let live_at_start = |a: AllocIdx| {
        let a = &trace.allocations[a as usize];
        (a.before_op as usize) < cut && a.free.is_none_or(|f| f.before_op as usize >= cut)
    };
    // The tensors' previous incarnations, in the last recorded step.
    let previous = match recorded.checked_sub(1) {
        Some(last) => cycle.resolve(trace, spans[last].clone()),
        None => vec![None; tensors],
    };
    let mut slot_of: HashMap<AllocIdx, SlotIdx> = HashMap::new();
    for (t, tensor) in cycle.tensors.iter().enumerate() {
        let candidate = match tensor.identity {
            Identity::Persistent { .. } => Some(tensor.source),
            // Only a tensor the iteration finds live (its previous incarnation outlives the
            // step): the first step may keep others longer than the steady state does, and
            // those are the prologue's own, freed as the steady state begins.
            Identity::Transient { .. } => {
                previous[t].filter(|_| wraps(&trace.allocations[tensor.source as usize], &span))
            }
        };
        if let Some(a) = candidate.filter(|&a| live_at_start(a)) {
            slot_of.entry(a).or_insert(t as SlotIdx);
        }
    }

    // The prologue, as recorded.
    let mut between: Vec<(u32, u64, Between)> = Vec::new();
    for (i, a) in trace.allocations.iter().enumerate() {
        if (a.before_op as usize) < cut {
            between.push((a.before_op, a.t_ns, Between::Alloc(i as AllocIdx)));
            if let Some(f) = a.free.filter(|f| (f.before_op as usize) < cut) {
                between.push((f.before_op, f.t_ns, Between::Free(i as AllocIdx)));
            }
        }
    }
    for s in &trace.syncs {
        if (s.before_op as usize) < cut {
            between.push((s.before_op, s.t_ns, Between::Sync(s.scope)));
        }
    }
    between.sort_by_key(|(before, t, _)| (*before, *t));
    let mut prologue = Vec::new();
    let mut events = between.into_iter().peekable();
    let mut alloc_stream: HashMap<AllocIdx, StreamIdx> = HashMap::new();
    for op_index in 0..=cut {
        while let Some((_, _, event)) = events.next_if(|(b, _, _)| *b as usize <= op_index) {
            match event {
                Between::Alloc(a) => {
                    let alloc = &trace.allocations[a as usize];
                    let slot = *slot_of.entry(a).or_insert_with(|| {
                        slot_names.push(alloc.trace_id);
                        slot_bytes.push(scaling.alloc_bytes(alloc.bytes));
                        (slot_names.len() - 1) as SlotIdx
                    });
                    let stream = streams.of(alloc.stream);
                    alloc_stream.insert(a, stream);
                    prologue.push(Step::Alloc {
                        slot,
                        bytes: slot_bytes[slot as usize],
                        stream,
                    });
                }
                Between::Free(a) => {
                    if let Some(&slot) = slot_of.get(&a) {
                        let stream = alloc_stream.get(&a).copied().unwrap_or(0);
                        prologue.push(Step::Free { slot, stream });
                    }
                }
                Between::Sync(scope) => prologue.push(sync_step(scope, &mut streams)),
            }
        }
        if op_index == cut {
            break;
        }
        let op = &trace.ops[op_index];
        let mut slots: Vec<SlotIdx> = op
            .touches
            .iter()
            .filter_map(|a| slot_of.get(a).copied())
            .collect();
        slots.sort_unstable();
        slots.dedup();
        let duration = match (op.kind, op.gpu_ns) {
            (OpKind::Launch { .. }, Some(ns)) => ns,
            (OpKind::Launch { kernel }, None) => medians
                .get(&kernel)
                .copied()
                .unwrap_or(cost.default_launch_ns),
            (OpKind::Memset, _) => CostModel::ns_at(op.bytes, cost.memset_gbps),
            (OpKind::Copy { .. }, _) => CostModel::ns_at(op.bytes, cost.d2d_gbps),
        };
        let stream = streams.of(op.stream);
        let sb = |s: SlotIdx| slot_bytes[s as usize];
        op_steps(
            &mut prologue,
            op_index as u32,
            op.kind,
            stream,
            scaling.duration(duration),
            scaling.bytes(op.bytes),
            &slots,
            &sb,
            scaling.max_slots,
        );
    }
    // Prologue allocations with no part in the steady state are freed as it begins; tensors
    // live when it begins that the prologue did not provide are allocated (unstamped).
    let mut leftovers: Vec<(AllocIdx, SlotIdx)> = slot_of
        .iter()
        .filter(|(&a, &slot)| slot as usize >= tensors && live_at_start(a))
        .map(|(&a, &slot)| (a, slot))
        .collect();
    leftovers.sort_unstable();
    for (a, slot) in leftovers {
        let stream = alloc_stream.get(&a).copied().unwrap_or(0);
        prologue.push(Step::Free { slot, stream });
    }
    let provided: std::collections::HashSet<SlotIdx> = slot_of
        .iter()
        .filter(|(&a, &slot)| (slot as usize) < tensors && live_at_start(a))
        .map(|(_, &slot)| slot)
        .collect();
    let mut unprovided = Vec::new();
    for (t, tensor) in cycle.tensors.iter().enumerate() {
        let source = &trace.allocations[tensor.source as usize];
        let live_when_cycle_starts = tensor.is_persistent() || wraps(source, &span);
        if live_when_cycle_starts && !provided.contains(&(t as SlotIdx)) {
            unprovided.push(Step::Alloc {
                slot: t as SlotIdx,
                bytes: slot_bytes[t],
                stream: streams.of(source.stream),
            });
        }
    }
    // Made before the prologue's last launch, so that they are the prologue's allocations as
    // the library numbers them (an allocation belongs to the iteration of the next launch):
    // after it, they would be the first played iteration's, and its allocations would not be
    // numbered as the next ones' are, which is what a plan learned from it names.
    let last_launch = prologue
        .iter()
        .rposition(|s| matches!(s, Step::Kernel { .. }))
        .unwrap_or(prologue.len());
    prologue.splice(last_launch..last_launch, unprovided);
    prologue.push(Step::SyncDevice);

    let iteration = iteration_steps(trace, cycle, &mut streams, scaling, &slot_bytes);
    Script {
        piece_bytes: scaling.piece_bytes(),
        streams: streams.index.len() as u32,
        // The shared captures were made with PyTorch's cudaMallocAsync backend; the native
        // format records each allocation's stream.
        stream_ordered: true,
        slot_names,
        prologue,
        iteration,
        warmup,
        iterations,
    }
}

/// Whether a transient allocation made in `span` is freed only in a later iteration.
fn wraps(a: &tensile_analyzer::model::Allocation, span: &std::ops::Range<usize>) -> bool {
    a.free.is_none_or(|f| f.before_op as usize >= span.end)
}

fn sync_step(scope: SyncScope, streams: &mut Streams) -> Step {
    match scope {
        SyncScope::Stream(s) => Step::SyncStream(streams.of(s)),
        // The trace does not say where an event was recorded: wait for everything, which is
        // what the event covered at most.
        SyncScope::Event(_) | SyncScope::Device => Step::SyncDevice,
    }
}

/// One steady-state iteration: at each position, frees, then allocations, then host waits,
/// then the op.
fn iteration_steps(
    trace: &Trace,
    cycle: &Cycle,
    streams: &mut Streams,
    scaling: Scaling,
    slot_bytes: &[u64],
) -> Vec<Step> {
    let span = cycle.span.clone();
    let period = cycle.len();
    let mut frees: Vec<Vec<Step>> = vec![Vec::new(); period];
    let mut allocs: Vec<Vec<Step>> = vec![Vec::new(); period];
    let mut after_alloc_frees: Vec<Vec<Step>> = vec![Vec::new(); period];
    for (t, tensor) in cycle.tensors.iter().enumerate() {
        let (Some(alloc_at), Some(free_at)) = (tensor.alloc_at, tensor.free_at) else {
            continue;
        };
        let source = &trace.allocations[tensor.source as usize];
        let stream = streams.of(source.stream);
        let slot = t as SlotIdx;
        allocs[alloc_at as usize].push(Step::Alloc {
            slot,
            bytes: slot_bytes[t],
            stream,
        });
        let wrapped = wraps(source, &span);
        let free = Step::Free { slot, stream };
        if !wrapped && free_at == alloc_at {
            // Allocated and freed between the same two ops.
            after_alloc_frees[alloc_at as usize].push(free);
        } else if (free_at as usize) < period {
            frees[free_at as usize].push(free);
        }
    }
    let mut syncs: Vec<Vec<Step>> = vec![Vec::new(); period];
    for s in &trace.syncs {
        let at = s.before_op as usize;
        if span.contains(&at) {
            syncs[at - span.start].push(sync_step(s.scope, streams));
        }
    }
    let mut out = Vec::new();
    for (pos, op) in cycle.ops.iter().enumerate() {
        out.append(&mut frees[pos]);
        out.append(&mut allocs[pos]);
        out.append(&mut after_alloc_frees[pos]);
        out.append(&mut syncs[pos]);
        let recorded = &trace.ops[span.start + pos];
        let stream = streams.of(recorded.stream);
        let slots: Vec<SlotIdx> = op.tensors.iter().map(|&t| t as SlotIdx).collect();
        let sb = |s: SlotIdx| slot_bytes[s as usize];
        op_steps(
            &mut out,
            (span.start + pos) as u32,
            op.kind,
            stream,
            scaling.duration(op.duration_ns),
            scaling.bytes(recorded.bytes),
            &slots,
            &sb,
            scaling.max_slots,
        );
    }
    out
}

/// The most bytes the recorded program held at once over its whole run (not only the steady
/// state), with each allocation divided by `divisor` and then rounded up to `granule` (the
/// driver's allocation granularity; 1 for none).
pub fn peak_live_bytes(trace: &Trace, divisor: u64, granule: u64) -> u64 {
    let size = |b: u64| b.div_ceil(divisor.max(1)).next_multiple_of(granule.max(1));
    let mut deltas: Vec<(u32, u64, i128)> = Vec::new();
    for a in &trace.allocations {
        deltas.push((a.before_op, a.t_ns, i128::from(size(a.bytes))));
        if let Some(f) = a.free {
            deltas.push((f.before_op, f.t_ns, -i128::from(size(a.bytes))));
        }
    }
    deltas.sort_by_key(|(b, t, d)| (*b, *t, *d));
    let (mut live, mut peak) = (0i128, 0i128);
    for (_, _, d) in deltas {
        live += d;
        peak = peak.max(live);
    }
    peak.max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_analyzer::import::{load, LoadOptions};
    use tensile_analyzer::{analyze, CostModel};

    fn mlp() -> Trace {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../analyzer/tests/data/mlp.trace.gz");
        load(&path, LoadOptions::default()).expect("the MLP trace loads")
    }

    /// Plays a script on paper: every slot is allocated before use and freed at most once
    /// while live, and the iteration leaves the same slots live as it found.
    #[test]
    fn the_mlp_script_is_balanced_and_uses_only_live_slots() {
        let trace = mlp();
        let cost = CostModel::default();
        let analysis = analyze(&trace, &cost).unwrap();
        let scaling = Scaling {
            size_divisor: 64,
            time_scale: 0.5,
            max_slots: 7,
        };
        let script = build(&trace, &analysis, &cost, scaling, 3);
        assert_eq!(script.piece_bytes, 2 << 20);
        let mut live = vec![false; script.slot_names.len()];
        let mut on_demand = 0;
        let mut play = |steps: &[Step], live: &mut Vec<bool>| {
            for s in steps {
                match s {
                    Step::Alloc { slot, .. } => {
                        assert!(!live[*slot as usize], "slot {slot} allocated twice");
                        live[*slot as usize] = true;
                    }
                    Step::Free { slot, .. } => {
                        assert!(live[*slot as usize], "slot {slot} freed while not live");
                        live[*slot as usize] = false;
                    }
                    Step::Kernel { slots, .. } => {
                        for s in slots {
                            if !live[*s as usize] {
                                on_demand += 1;
                                live[*s as usize] = true;
                            }
                        }
                    }
                    Step::CopyIn { slot, .. } | Step::CopyOut { slot, .. } => {
                        assert!(live[*slot as usize], "copy into dead slot {slot}");
                    }
                    _ => {}
                }
            }
        };
        play(&script.prologue, &mut live);
        let at_start = live.clone();
        play(&script.iteration, &mut live);
        assert_eq!(live, at_start, "an iteration leaves what it found");
        play(&script.iteration, &mut live);
        assert_eq!(live, at_start);
        assert_eq!(on_demand, 0, "every slot is allocated before its first use");
        // Every launch of the cycle is replayed, with its duration scaled.
        let launches = analysis
            .cycle
            .ops
            .iter()
            .filter(|o| matches!(o.kind, OpKind::Launch { .. }))
            .count();
        assert!(script.kernels_per_iteration() >= launches);
        let replayed: u64 = script
            .iteration
            .iter()
            .map(|s| match s {
                Step::Kernel { duration_ns, .. } => *duration_ns,
                _ => 0,
            })
            .sum();
        let recorded: u64 = analysis
            .cycle
            .ops
            .iter()
            .filter(|o| {
                !matches!(
                    o.kind,
                    OpKind::Copy {
                        dir: CopyDir::HostToDevice | CopyDir::DeviceToHost
                    }
                )
            })
            .map(|o| o.duration_ns)
            .sum();
        let want = recorded as f64 * 0.5;
        assert!(
            (replayed as f64 - want).abs() <= analysis.cycle.len() as f64,
            "{replayed} vs {want}"
        );
        let peak = peak_live_bytes(&trace, 1, 1);
        assert!(peak >= analysis.footprint.peak_allocated);
        assert!(peak_live_bytes(&trace, 64, 1) >= peak / 64);
        assert!(peak_live_bytes(&trace, 64, 2 << 20) > peak / 64);
    }
}
