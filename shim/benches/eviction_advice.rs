//! What the plan executor's eviction advice costs the memory manager: one
//! `Executor::next_uses` call over every resident page, which the manager makes with its lock
//! held each time it chooses pages to evict (`memory::advice`).
//!
//! Setup: a plan of 800 launches per iteration, each touching 24 allocations; half of the
//! allocations persistent (made before the plan), half transient (made in the iteration, as
//! activations are); one 2 MiB allocation per page, so asking about N pages touches N
//! allocations. N = 1,000 pages (a 2 GiB budget) and 20,000 (40 GiB, an H100 under a
//! large budget). Reported per call; divide by N for the cost per page. `sample_of/N`: the
//! call the manager makes, about an evenly spread sample of 1,024 of the N pages.
//!
//! Run: `cargo bench -p tensile-shim --bench eviction_advice`.

use std::hint::black_box;
use std::sync::Arc;

mod common;

use common::{Idle, SHAPE};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tensile_protocol::plan::{ExecPlan, Iteration, Role, Use};
use tensile_shim::executor::Executor;
use tensile_shim::kernels::Introspection;
use tensile_shim::kernels::KernelMeta;
use tensile_shim::memory::advice::NextUse;
use tensile_shim::params::ParamLayout;
use tensile_shim::tracker::Tracker;
use tensile_trace::AllocKind;

const PAGE: u64 = 2 << 20;
const PERIOD: u32 = 800;
const USES_PER_LAUNCH: u64 = 24;
const BASE: u64 = 0x7f00_0000_0000;

/// An executor in the second iteration of its plan, with `pages` one-page allocations live.
fn setup(pages: u64) -> (Executor, Tracker, Vec<u64>) {
    let executor = Executor::new(Arc::new(Idle));
    let tracker = Tracker::new(Introspection::default());
    let kernel: &'static KernelMeta = Box::leak(Box::new(KernelMeta {
        id: 1,
        name: "k".into(),
        layout: ParamLayout::new(vec![]),
    }));
    let persistent = pages / 2;
    let mut ids = Vec::new();
    for i in 0..persistent {
        let ptr = BASE + i * PAGE;
        let id = tracker.allocated(None, 0, 0, ptr, PAGE, AllocKind::Async);
        executor.allocated(&tracker, id, ptr, PAGE);
        ids.push(id);
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut uses = Vec::new();
    for position in 0..PERIOD {
        for _ in 0..USES_PER_LAUNCH {
            let k = next() % pages;
            let role = if k < persistent {
                Role::Persistent {
                    alloc_id: ids[k as usize],
                }
            } else {
                Role::Transient {
                    ordinal: (k - persistent) as u32,
                    bytes: PAGE,
                    iteration: Iteration::Current,
                }
            };
            uses.push(Use { position, role });
        }
    }
    uses.sort_by_key(|u| u.position);
    let plan = ExecPlan {
        version: 1,
        period: PERIOD,
        kernels: vec![1; PERIOD as usize],
        anchor_seq: tracker.next_launch_seq(),
        steps: vec![],
        uses,
        host_resident: vec![],
        budget_bytes: 0,
        predicted_step_ns: 0,
        compute_ns: 0,
    };
    assert!(executor.install(plan, &tracker));
    let launch = |tracker: &Tracker| {
        executor.before_launch(tracker, kernel, || false);
        let seq = tracker.launched(None, 0, kernel, SHAPE, &[]);
        executor.after_launch(tracker, kernel, seq, || false);
    };
    // The plan applies from the next iteration boundary; the transients of that iteration
    // are made at its start, then a third of it runs.
    for _ in 0..PERIOD {
        launch(&tracker);
    }
    for i in persistent..pages {
        let ptr = BASE + i * PAGE;
        let id = tracker.allocated(None, 0, 0, ptr, PAGE, AllocKind::Async);
        executor.allocated(&tracker, id, ptr, PAGE);
    }
    for _ in 0..PERIOD / 3 {
        launch(&tracker);
    }
    let asked: Vec<u64> = (0..pages).map(|i| BASE + i * PAGE).collect();
    (executor, tracker, asked)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("next_uses");
    for pages in [1_000u64, 20_000] {
        let (executor, tracker, asked) = setup(pages);
        let mut out = Vec::with_capacity(asked.len());
        assert!(executor.next_uses(&tracker, &asked, PAGE, &mut out));
        let placed = out.iter().filter(|n| matches!(n, NextUse::In(_))).count();
        assert!(
            placed > asked.len() / 2,
            "{placed} of {} pages placed",
            asked.len()
        );
        group.bench_with_input(BenchmarkId::from_parameter(pages), &asked, |b, asked| {
            b.iter(|| black_box(executor.next_uses(&tracker, asked, PAGE, &mut out)))
        });
        // The manager asks about a sample of at most `ADVICE_SAMPLE` (1,024) pages.
        let stride = asked.len().div_ceil(1024).max(1);
        let sample: Vec<u64> = asked.iter().step_by(stride).copied().collect();
        group.bench_with_input(
            BenchmarkId::new("sample_of", pages),
            &sample,
            |b, sample| b.iter(|| black_box(executor.next_uses(&tracker, sample, PAGE, &mut out))),
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
