//! Launch hooks: resolve which live allocations a launch's arguments point into, let the
//! plan executor act before the launch, make the managed ones device-resident, forward the
//! launch, number and record it, and let the executor act after it.
//!
//! This is the hot path (hundreds of thousands of launches per second in training). With
//! tracing off it allocates nothing: the accesses go into a per-thread buffer that is
//! reused, the kernel's layout comes from a per-thread cache, and the allocation index is
//! read through a lock-free snapshot.

use std::cell::Cell;
use std::ffi::c_void;

use tensile_driver_abi::{CUfunction, CUlaunchConfig, CUresult, CUstream, CUDA_SUCCESS};
use tensile_trace::Access;

use super::capture::CallStream;
use super::{residency, Call};
use crate::alloc_index::Range;
use crate::params::AccessSink;
use crate::syms::pfn;
use crate::tracker::LaunchShape;

/// What a launch's scan resolved: the accesses for the trace, the byte ranges for the
/// memory manager.
#[derive(Default)]
pub struct Resolved {
    pub accesses: Vec<Access>,
    pub ranges: Vec<(u64, usize)>,
}

impl AccessSink for Resolved {
    #[inline]
    fn push(&mut self, access: Access, range: Range) {
        self.accesses.push(access);
        self.ranges.push((range.start, range.len as usize));
    }
}

thread_local! {
    static SCRATCH: Cell<Resolved> = const {
        Cell::new(Resolved { accesses: Vec::new(), ranges: Vec::new() })
    };
}

/// Runs `body` with this thread's reusable (emptied) [`Resolved`] buffer, so that a launch
/// allocates nothing once the buffer has grown. Public so that the launch benchmark
/// measures this very path.
#[inline]
pub fn with_scratch<T>(body: impl FnOnce(&mut Resolved) -> T) -> T {
    // Taking the buffer out of the cell (rather than borrowing it) keeps a re-entrant
    // launch from the driver safe: it would just get an empty buffer of its own. During
    // thread teardown (a launch from another library's TLS destructor) the cell may be gone
    // already: use a fresh buffer then.
    let mut resolved = SCRATCH.try_with(Cell::take).unwrap_or_default();
    resolved.accesses.clear();
    resolved.ranges.clear();
    let out = body(&mut resolved);
    let _ = SCRATCH.try_with(|s| s.set(resolved));
    out
}

/// Resolves, forwards, records. `forward` performs the real launch.
///
/// # Safety
/// `kernel_params` / `extra` are the launch's own arguments, valid as the driver requires
/// for kernel `f`.
#[inline]
unsafe fn launch_with<F>(
    call: &Call<F>,
    f: CUfunction,
    shape: LaunchShape,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    forward: impl FnOnce() -> CUresult,
) -> CUresult {
    // Another job has the card for its turn (a shared card short of memory): wait here.
    crate::turns::wait_for_turn();
    let rt = call.rt;
    let rec = rt.records();
    let t = rt.now_ns();
    with_scratch(|resolved| {
        // SAFETY: forwarded from the caller.
        let kernel = unsafe {
            rt.tracker.resolve_launch(
                rec,
                f,
                kernel_params.cast_const().cast(),
                extra.cast_const().cast(),
                resolved,
            )
        };
        let on = CallStream::new(rt, shape.stream);
        rt.executor
            .before_launch(&rt.tracker, kernel, || on.is_capturing());
        let pinned = residency::pin(rt, &on, &resolved.ranges, || {
            format!("the launch of kernel `{}`", kernel.name)
        });
        let pinned = match pinned {
            Ok(p) => p,
            Err(code) => return code,
        };
        let accesses = &resolved.accesses;
        let per_thread = call.sym.per_thread();
        // Timing records events on the launch's stream: not on a capturing one, where they
        // would become part of the graph and could never be queried.
        let timed = match (rec, rt.timing.as_ref()) {
            (Some(rec), Some(timing)) if !on.is_capturing() && rec.wants_launch_time() => {
                timing.start(stream, per_thread).map(|s| (timing, s))
            }
            _ => None,
        };
        let r = forward();
        if let Some(p) = pinned {
            p.done();
        }
        // Numbered whether or not anything is recorded: the executor's positions are
        // the trace's `seq`.
        let seq = (r == CUDA_SUCCESS).then(|| {
            let seq = rt.tracker.launched(rec, t, kernel, shape, accesses);
            rt.executor
                .after_launch(&rt.tracker, kernel, seq, || on.is_capturing());
            seq
        });
        if let (Some(rec), Some((timing, started))) = (rec, timed) {
            timing.finish(started, stream, per_thread, seq, rec);
        }
        r
    })
}

/// `cuLaunchKernel[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuLaunchKernel`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_kernel(
    call: Call<pfn::LaunchKernel>,
    f: CUfunction,
    grid_x: u32,
    grid_y: u32,
    grid_z: u32,
    block_x: u32,
    block_y: u32,
    block_z: u32,
    shared_mem_bytes: u32,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let shape = LaunchShape {
        grid: [grid_x, grid_y, grid_z],
        block: [block_x, block_y, block_z],
        shared_mem_bytes,
        stream: call.stream(stream),
    };
    // SAFETY: the caller's arguments; the real launch gets them unchanged.
    unsafe {
        launch_with(&call, f, shape, stream, kernel_params, extra, || {
            (call.real)(
                f,
                grid_x,
                grid_y,
                grid_z,
                block_x,
                block_y,
                block_z,
                shared_mem_bytes,
                stream,
                kernel_params,
                extra,
            )
        })
    }
}

/// `cuLaunchKernelEx[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuLaunchKernelEx`.
pub unsafe fn launch_kernel_ex(
    call: Call<pfn::LaunchKernelEx>,
    config: *const CUlaunchConfig,
    f: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        // Nothing to track; the driver reports the error.
        // SAFETY: forwarded unchanged.
        return unsafe { (call.real)(config, f, kernel_params, extra) };
    }
    // SAFETY: a non-null config points to a CUlaunchConfig (driver contract).
    let c = unsafe { config.read() };
    let shape = LaunchShape {
        grid: [c.grid_dim_x, c.grid_dim_y, c.grid_dim_z],
        block: [c.block_dim_x, c.block_dim_y, c.block_dim_z],
        shared_mem_bytes: c.shared_mem_bytes,
        stream: call.stream(c.h_stream),
    };
    // SAFETY: the caller's arguments; the real launch gets them unchanged.
    unsafe {
        launch_with(&call, f, shape, c.h_stream, kernel_params, extra, || {
            (call.real)(config, f, kernel_params, extra)
        })
    }
}

/// `cuLaunchCooperativeKernel[_ptsz]`.
///
/// # Safety
/// The driver's contract for `cuLaunchCooperativeKernel`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_cooperative_kernel(
    call: Call<pfn::LaunchCooperativeKernel>,
    f: CUfunction,
    grid_x: u32,
    grid_y: u32,
    grid_z: u32,
    block_x: u32,
    block_y: u32,
    block_z: u32,
    shared_mem_bytes: u32,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
) -> CUresult {
    let shape = LaunchShape {
        grid: [grid_x, grid_y, grid_z],
        block: [block_x, block_y, block_z],
        shared_mem_bytes,
        stream: call.stream(stream),
    };
    // SAFETY: the caller's arguments; the real launch gets them unchanged.
    unsafe {
        launch_with(
            &call,
            f,
            shape,
            stream,
            kernel_params,
            std::ptr::null_mut(),
            || {
                (call.real)(
                    f,
                    grid_x,
                    grid_y,
                    grid_z,
                    block_x,
                    block_y,
                    block_z,
                    shared_mem_bytes,
                    stream,
                    kernel_params,
                )
            },
        )
    }
}
