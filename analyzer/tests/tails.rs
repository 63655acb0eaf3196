//! Tails in shim pages: a transient tensor holds its memory from its last access to its free
//! (the shim keeps its pages until the application frees it), and a plan may write that tail
//! out, a copy to the host that is never read back. In bytes (`tensile replay`'s default
//! model) nothing changes: the tensor is released at its last access.

use tensile_analyzer::cost::{Budget, CostModel};
use tensile_analyzer::cycle::{Cycle, Identity, MoveUnits, Tensor};
use tensile_analyzer::plan::{plan, SwapPlan};
use tensile_analyzer::search::{improve, SearchOptions};
use tensile_analyzer::sim::{simulate, Policy, SimError, SimOptions, SimReport};

const MIB: u64 = 1 << 20;

fn transient(ordinal: u32, accesses: Vec<u32>, alloc: u32, free: u32) -> Tensor {
    Tensor {
        identity: Identity::Transient {
            ordinal,
            bytes: 64 * MIB,
        },
        bytes: 64 * MIB,
        accesses,
        alloc_at: Some(alloc),
        free_at: Some(free),
        source: ordinal,
    }
}

/// `a` (64 MiB) is touched by op 0 alone and freed before op 5; `b` (64 MiB) lives over ops 2
/// and 3. Op 1 lasts 0.1 ms, the others 1 ms. In bytes at most 64 MiB hold data at once; in
/// shim pages `a` holds its memory through ops 1 to 4, so ops 2 and 3 hold 128 MiB.
fn early_last_access_late_free() -> Cycle {
    Cycle::from_parts(
        &[
            1_000_000, 100_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000,
        ],
        vec![transient(0, vec![0], 0, 5), transient(1, vec![2, 3], 2, 4)],
    )
    .unwrap()
}

fn run(cycle: &Cycle, plan: &SwapPlan, budget: Budget) -> Result<SimReport, SimError> {
    simulate(
        cycle,
        Policy::Plan(plan),
        budget,
        &CostModel::default(),
        SimOptions::default(),
    )
}

/// Bytes of the pieces `plan` writes out as tails, checking that they are all `tensor`'s.
fn tail_bytes(plan: &SwapPlan, tensor: u32) -> u64 {
    plan.tail_outs
        .iter()
        .map(|t| {
            let piece = plan.pieces[t.piece as usize];
            assert_eq!(piece.tensor, tensor, "{t:?}");
            piece.bytes
        })
        .sum()
}

#[test]
fn a_tail_that_does_not_fit_is_written_out_and_never_read_back() {
    let cost = CostModel::default();
    let budget = Budget::new(100 * MIB);

    // In bytes `a` is gone after op 0: nothing moves.
    let bytes = early_last_access_late_free();
    let in_bytes = plan(&bytes, &budget, &cost).unwrap();
    assert!(in_bytes.evictions.is_empty() && in_bytes.tail_outs.is_empty());
    let r = run(&bytes, &in_bytes, budget).unwrap();
    assert_eq!((r.step_ns, r.bytes_d2h), (bytes.compute_ns(), 0));
    assert_eq!(r.peak_resident_bytes, 64 * MIB);

    // In shim pages 28 MiB of `a`'s tail must leave before op 2.
    let pages = early_last_access_late_free().with_units(MoveUnits::ShimPages);
    let planned = plan(&pages, &budget, &cost).unwrap();
    assert!(planned.evictions.is_empty(), "nothing is read back");
    let written = tail_bytes(&planned, 0);
    assert!(written >= 28 * MIB, "{planned:?}");
    for t in &planned.tail_outs {
        assert_eq!((t.out_after, t.tail_from, t.freed_at), (0, 0, 5));
    }
    let r = run(&pages, &planned, budget).unwrap();
    assert!(r.settled);
    assert_eq!(r.demand_fetches, 0);
    assert_eq!(r.bytes_h2d, 0);
    assert_eq!(r.bytes_d2h, written);
    assert!(r.peak_resident_bytes <= budget.bytes);
    // The memory is free when the copies end, not when they are issued: op 2 (which needs
    // `b`'s 64 MiB) waits until the first 14 pieces of 2 MiB are on the host, 0.534 ms after
    // op 0 ends, of which op 1 covers 0.1 ms.
    let copied = cost.d2h_ns(28 * MIB);
    let expected = copied - 100_000;
    assert!(
        r.stall_ns.abs_diff(expected) <= expected / 100,
        "stall {} ns, expected {expected}",
        r.stall_ns
    );
    assert_eq!(r.step_ns, pages.compute_ns() + r.stall_ns);

    // Kept on the device, the tail holds its memory until the free: op 2 waits for room that
    // nothing will make.
    let mut kept = planned.clone();
    kept.tail_outs.clear();
    assert_eq!(
        run(&pages, &kept, budget),
        Err(SimError::Deadlock { op: 2 })
    );
}

#[test]
fn with_room_the_tail_stays_and_is_charged_until_the_free() {
    let cost = CostModel::default();
    let budget = Budget::new(200 * MIB);
    let pages = early_last_access_late_free().with_units(MoveUnits::ShimPages);
    let planned = plan(&pages, &budget, &cost).unwrap();
    assert!(planned.tail_outs.is_empty() && planned.evictions.is_empty());
    let r = run(&pages, &planned, budget).unwrap();
    assert_eq!(r.step_ns, pages.compute_ns());
    // `a` until before op 5, `b` over ops 2 and 3: both at once.
    assert_eq!(r.peak_resident_bytes, 128 * MIB);
    let bytes = early_last_access_late_free();
    let r = run(&bytes, &plan(&bytes, &budget, &cost).unwrap(), budget).unwrap();
    assert_eq!(r.peak_resident_bytes, 64 * MIB);
}

#[test]
fn a_tail_across_the_iteration_boundary_is_written_out_in_the_iteration_before() {
    // `c` is touched by op 4 and freed before op 2 of the next iteration; `d` lives over ops 0
    // and 1. At ops 0 and 1 `c`'s tail and `d` hold 128 MiB.
    let cycle = Cycle::from_parts(
        &[1_000_000; 6],
        vec![transient(0, vec![4], 4, 2), transient(1, vec![0, 1], 0, 2)],
    )
    .unwrap()
    .with_units(MoveUnits::ShimPages);
    let cost = CostModel::default();
    let budget = Budget::new(100 * MIB);
    let planned = plan(&cycle, &budget, &cost).unwrap();
    assert!(planned.evictions.is_empty());
    assert!(tail_bytes(&planned, 0) >= 28 * MIB);
    for t in &planned.tail_outs {
        assert_eq!((t.out_after, t.tail_from, t.freed_at), (4, 4, 8));
    }
    // Written out before the boundary: on the host when an iteration starts.
    assert_eq!(planned.on_host_at_start().len(), planned.tail_outs.len());
    let r = run(&cycle, &planned, budget).unwrap();
    assert!(r.settled);
    assert_eq!((r.bytes_h2d, r.demand_fetches), (0, 0));
    assert!(r.peak_resident_bytes <= budget.bytes);
    // The copies (0.53 ms) hide behind op 5.
    assert_eq!(r.step_ns, cycle.compute_ns());

    // The search keeps what works and never returns a plan that reads a tail back.
    let options = SearchOptions {
        max_evaluations: 300,
        patience: None,
        ..SearchOptions::default()
    };
    let (searched, report) = improve(&cycle, &planned, budget, &cost, &options);
    assert_eq!(report.step_ns, Some(cycle.compute_ns()));
    let r = run(&cycle, &searched, budget).unwrap();
    assert_eq!((r.bytes_h2d, r.demand_fetches), (0, 0));
}
