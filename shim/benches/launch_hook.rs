//! The launch hook's added cost with tracing off: what a launch pays before it is
//! forwarded (kernel lookup in the per-thread cache, scan of every candidate word of its
//! parameters against the allocation index, the per-thread buffer of accesses and of the
//! byte ranges the memory manager is given). The manager's own `prepare_access` is
//! measured in `shim/src/memory/bench.rs`.
//!
//! Setup: 1,000 (and 10,000) live allocations spread over a realistic device address
//! range, 64 distinct kernels of 10 parameters each (7 device pointers, 3 scalars), and
//! launches cycling through the kernels. Target: median under 1 µs per launch.
//! Also measured: an allocation + free pair at 1,000 and 10,000 live allocations (the
//! index's write path).
//!
//! The whole hook around the forward (`launch_path/...`): the scan, the plan executor's
//! calls before and after, and numbering the launch; with no plan and nothing recorded, with
//! a plan loaded whose positions have no steps (the position check on every launch), and
//! with the record tap on (a `Launch` record built and queued per launch, drained by another
//! thread as the planner would).
//!
//! Run: `cargo bench -p tensile-shim --bench launch_hook`.

use std::ffi::c_void;
use std::hint::black_box;

mod common;

use common::{Idle, SHAPE};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::sync::Arc;

use tensile_protocol::plan::ExecPlan;
use tensile_shim::executor::Executor;
use tensile_shim::hooks::launch::with_scratch;
use tensile_shim::kernels::{Description, Introspection};
use tensile_shim::params::{ParamInfo, ParamLayout};
use tensile_shim::recorder::RecordSink;
use tensile_shim::tracker::Tracker;
use tensile_trace::AllocKind;

const KERNELS: usize = 64;
const PARAMS: usize = 10;

/// A xorshift generator: deterministic inputs without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

struct Setup {
    tracker: Tracker,
    /// Per launch: the parameter values (the pointers in `kernel_params` point into these).
    values: Vec<[u64; PARAMS]>,
    ptrs: Vec<u64>,
}

fn setup(live: usize) -> Setup {
    let tracker = Tracker::new(Introspection::default());
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let base = 0x7f3a_0000_0000u64;
    let mut ptrs = Vec::with_capacity(live);
    let mut at = base;
    for _ in 0..live {
        let bytes = 512 + rng.next() % (4 << 20);
        tracker.allocated(None, 0, 0, at, bytes, AllocKind::Async);
        ptrs.push(at);
        at += bytes.next_multiple_of(512) + 512 * (rng.next() % 4);
    }
    let values = (0..KERNELS)
        .map(|_| {
            let mut v = [0u64; PARAMS];
            for (i, slot) in v.iter_mut().enumerate() {
                *slot = if i % 3 == 2 {
                    rng.next() % 100_000 // a size or a count
                } else {
                    ptrs[(rng.next() % live as u64) as usize] + 16 * (rng.next() % 8)
                };
            }
            v
        })
        .collect();
    Setup {
        tracker,
        values,
        ptrs,
    }
}

fn ten_pointer_sized_params() -> Description {
    Description {
        name: Some("bench_kernel".into()),
        layout: ParamLayout::new(
            (0..PARAMS as u32)
                .map(|i| ParamInfo {
                    offset: 8 * i,
                    size: 8,
                })
                .collect(),
        ),
    }
}

/// Everything the launch hook does before forwarding, with tracing off: the hook's own
/// scratch buffer and scan, with the kernel described by a fixed layout instead of the
/// driver.
#[inline(never)]
fn hook_path(t: &Tracker, f: usize, kernel_params: &[*const c_void; PARAMS]) -> usize {
    with_scratch(|resolved| {
        // SAFETY: every entry of `kernel_params` points to an 8-byte value, as the layout says.
        let kernel = unsafe {
            t.resolve_launch_with(
                None,
                f as *mut c_void,
                kernel_params.as_ptr(),
                std::ptr::null(),
                resolved,
                ten_pointer_sized_params,
            )
        };
        resolved.accesses.len() + resolved.ranges.len() + kernel.id as usize
    })
}

fn bench_launch(c: &mut Criterion) {
    let mut group = c.benchmark_group("launch_hook");
    for live in [1_000usize, 10_000] {
        let s = setup(live);
        let params: Vec<[*const c_void; PARAMS]> = s
            .values
            .iter()
            .map(|v| std::array::from_fn(|i| (&v[i] as *const u64).cast()))
            .collect();
        // Warm the kernel cache the way a training loop does.
        for (k, p) in params.iter().enumerate() {
            hook_path(&s.tracker, 0x5000_0000 + 0x100 * k, p);
        }
        let mut k = 0usize;
        group.bench_function(BenchmarkId::new("resolve_10_params", live), |b| {
            b.iter(|| {
                k = (k + 1) % KERNELS;
                black_box(hook_path(
                    &s.tracker,
                    0x5000_0000 + 0x100 * k,
                    black_box(&params[k]),
                ))
            })
        });
    }

    for live in [1_000usize, 10_000] {
        let s = setup(live);
        let mut rng = Rng(7);
        group.bench_function(BenchmarkId::new("alloc_free_pair", live), |b| {
            b.iter(|| {
                // A fresh range above all live ones, inserted and removed again.
                let at = 0x7fff_0000_0000 + (rng.next() % 1024) * 4096;
                s.tracker.allocated(None, 0, 0, at, 4096, AllocKind::Async);
                black_box(s.tracker.begin_free(at))
            })
        });
        black_box(&s.ptrs);
    }
    group.finish();
}

/// The launch hook's own work around the forward, as `hooks::launch` does it.
#[inline(never)]
fn launch_path(
    t: &Tracker,
    exec: &Executor,
    sink: Option<&RecordSink>,
    f: usize,
    kernel_params: &[*const c_void; PARAMS],
) -> u64 {
    with_scratch(|resolved| {
        // SAFETY: every entry of `kernel_params` points to an 8-byte value, as the layout says.
        let kernel = unsafe {
            t.resolve_launch_with(
                sink,
                f as *mut c_void,
                kernel_params.as_ptr(),
                std::ptr::null(),
                resolved,
                ten_pointer_sized_params,
            )
        };
        exec.before_launch(t, kernel, || false);
        let seq = t.launched(sink, 0, kernel, SHAPE, &resolved.accesses);
        exec.after_launch(t, kernel, seq, || false);
        seq
    })
}

fn bench_launch_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("launch_path");
    let s = setup(10_000);
    let params: Vec<[*const c_void; PARAMS]> = s
        .values
        .iter()
        .map(|v| std::array::from_fn(|i| (&v[i] as *const u64).cast()))
        .collect();
    let handle = |k: usize| 0x5000_0000 + 0x100 * k;
    for (k, p) in params.iter().enumerate() {
        launch_path(
            &s.tracker,
            &Executor::new(Arc::new(Idle)),
            None,
            handle(k),
            p,
        );
    }
    // Kernel ids are 1.. in the order of first launch above.
    let id_of = |k: usize| k as u32 + 1;

    let no_plan = Executor::new(Arc::new(Idle));
    let mut k = 0usize;
    group.bench_function("no_plan", |b| {
        b.iter(|| {
            k = (k + 1) % KERNELS;
            black_box(launch_path(
                &s.tracker,
                &no_plan,
                None,
                handle(k),
                black_box(&params[k]),
            ))
        })
    });

    // A plan of the bench's own launch order, anchored at the next launch, without steps.
    let planned = Executor::new(Arc::new(Idle));
    let anchor = s.tracker.next_launch_seq();
    let plan = ExecPlan {
        version: 1,
        period: KERNELS as u32,
        kernels: (0..KERNELS).map(|p| id_of((k + 1 + p) % KERNELS)).collect(),
        anchor_seq: anchor,
        steps: vec![],
        uses: vec![],
        host_resident: vec![],
        budget_bytes: 0,
        predicted_step_ns: 0,
        compute_ns: 0,
    };
    assert!(planned.install(plan, &s.tracker));
    group.bench_function("plan_loaded_no_steps", |b| {
        b.iter(|| {
            k = (k + 1) % KERNELS;
            black_box(launch_path(
                &s.tracker,
                &planned,
                None,
                handle(k),
                black_box(&params[k]),
            ))
        })
    });
    let stats = planned.stats();
    assert_eq!(
        (stats.plans_loaded, stats.mismatches),
        (1, 0),
        "the plan followed the launches"
    );

    let sink = RecordSink::new(None, true).expect("a tap");
    let tap = sink.take_tap().expect("the tap's receiver");
    let drain = std::thread::spawn(move || tap.iter().count());
    group.bench_function("record_tap", |b| {
        b.iter(|| {
            k = (k + 1) % KERNELS;
            black_box(launch_path(
                &s.tracker,
                &no_plan,
                Some(&sink),
                handle(k),
                black_box(&params[k]),
            ))
        })
    });
    println!("record tap: {} records dropped (full)", sink.tap_dropped());
    drop(sink);
    let _ = drain.join();
    group.finish();
}

criterion_group!(benches, bench_launch, bench_launch_path);
criterion_main!(benches);
