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
//! Run: `cargo bench -p tensile-shim --bench launch_hook`.

use std::ffi::c_void;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tensile_shim::hooks::launch::with_scratch;
use tensile_shim::kernels::{Description, Introspection};
use tensile_shim::params::{ParamInfo, ParamLayout};
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

criterion_group!(benches, bench_launch);
criterion_main!(benches);
