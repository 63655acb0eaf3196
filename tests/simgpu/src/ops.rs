//! The work a stream executes: kernels, copies, memsets, event records, host functions and
//! stream-ordered frees, and what executing each means on the simulated device.

use std::ffi::c_void;
use std::sync::Arc;

use tensile_driver_abi::*;
use tensile_kernels::twins::TwinFn;
use tensile_kernels::{Dim3, Fault, Launch, TwinError};

use crate::config;
use crate::event::Event;
use crate::memory::{AddressSpace, HostPtr};
use crate::pool::Pool;

/// A 2D copy with both sides resolved to device addresses or host pointers.
#[derive(Debug, Clone, Copy)]
pub struct Copy2D {
    pub src: Side,
    pub src_pitch: u64,
    pub dst: Side,
    pub dst_pitch: u64,
    pub width: u64,
    pub height: u64,
}

/// One end of a copy.
#[derive(Debug, Clone, Copy)]
pub enum Side {
    Device(u64),
    Host(HostPtr),
}

impl Side {
    fn offset(self, by: u64) -> Side {
        match self {
            Side::Device(a) => Side::Device(a + by),
            Side::Host(HostPtr(p)) => Side::Host(HostPtr(p + by as usize)),
        }
    }
}

#[derive(Clone)]
pub enum Op {
    Kernel {
        name: Arc<str>,
        run: TwinFn,
        grid: Dim3,
        block: Dim3,
        params: Vec<u8>,
    },
    Copy {
        dst: Side,
        src: Side,
        len: u64,
    },
    Copy2D(Copy2D),
    /// A copy from pageable host memory, staged into `data` when it was queued (as the
    /// driver does, so the caller may reuse its buffer at once).
    Upload {
        dst: Side,
        data: Vec<u8>,
    },
    Memset {
        dst: u64,
        pattern: Vec<u8>,
        count: u64,
    },
    /// `height` rows of `width` elements, rows `pitch` bytes apart.
    Memset2D {
        dst: u64,
        pitch: u64,
        pattern: Vec<u8>,
        width: u64,
        height: u64,
    },
    Record(Arc<Event>, u64),
    HostFn {
        f: unsafe extern "C" fn(*mut c_void),
        data: usize,
    },
    /// A `cuMemFreeAsync` reaching its place in the stream.
    Free {
        addr: u64,
        pool: Option<Arc<Pool>>,
    },
    /// Nothing: carries the dependencies of a `cuStreamWaitEvent`.
    Nop,
    /// Nothing, but holds a graph's memory until a launch of it has run this far.
    Keep(Arc<crate::capture::GraphMemory>),
}

/// Why an operation broke the context: the sticky error and a line for the log.
pub struct OpFailure {
    pub code: CUresult,
    pub message: String,
}

fn fault(space: &AddressSpace, what: &str, f: Fault) -> OpFailure {
    let why = space.explain(&f);
    OpFailure {
        code: CUDA_ERROR_ILLEGAL_ADDRESS,
        message: format!("{what}: {f} ({why})"),
    }
}

/// # Safety
/// Host pointers in `dst`/`src` must be valid for `len` bytes (the application's contract).
unsafe fn copy(space: &AddressSpace, dst: Side, src: Side, len: u64) -> Result<(), OpFailure> {
    let n = len as usize;
    let r = match (dst, src) {
        // SAFETY: the caller vouches for the host pointers.
        (Side::Device(d), Side::Host(HostPtr(s))) => unsafe {
            space.write_from_host(d, s as *const u8, n)
        },
        // SAFETY: as above.
        (Side::Host(HostPtr(d)), Side::Device(s)) => unsafe {
            space.read_to_host(s, d as *mut u8, n)
        },
        (Side::Device(d), Side::Device(s)) => space.copy_device(d, s, len),
        (Side::Host(HostPtr(d)), Side::Host(HostPtr(s))) => {
            // SAFETY: as above.
            unsafe { std::ptr::copy(s as *const u8, d as *mut u8, n) };
            Ok(())
        }
    };
    r.map_err(|f| fault(space, "copy", f))
}

impl Op {
    /// Runs the operation. `broken`: the context already has a sticky error, so only the
    /// bookkeeping that keeps waiters from hanging (event records, frees) is done.
    pub fn execute(self, space: &AddressSpace, broken: bool) -> Result<(), OpFailure> {
        match self {
            Op::Record(ev, generation) => ev.complete(generation),
            Op::Free { addr, pool } => {
                if let Ok((bytes, _)) = space.free_linear(addr, true) {
                    if let Some(p) = pool {
                        p.freed(bytes);
                    }
                }
            }
            Op::Nop | Op::Keep(_) => {}
            _ if broken => {}
            Op::Kernel {
                name,
                run,
                grid,
                block,
                params,
            } => {
                // The modelled duration passes before the twin runs, so a kernel's reads and
                // writes happen at its end: work that races ahead of it sees stale data, which
                // is how ordering bugs become visible.
                let d = config::kernel_duration();
                if !d.is_zero() {
                    std::thread::sleep(d);
                }
                let launch = Launch {
                    grid,
                    block,
                    params: &params,
                };
                let result = run(&launch, space);
                match result {
                    Ok(()) => {}
                    Err(TwinError::Fault(f)) => {
                        return Err(fault(space, &format!("kernel {name}"), f))
                    }
                    Err(e @ TwinError::Params(_)) => {
                        return Err(OpFailure {
                            code: CUDA_ERROR_LAUNCH_FAILED,
                            message: format!("kernel {name}: {e}"),
                        })
                    }
                }
            }
            Op::Copy { dst, src, len } => {
                model_transfer(len);
                // SAFETY: host pointers were given by the application for this copy.
                unsafe { copy(space, dst, src, len)? };
            }
            Op::Upload { dst, data } => {
                model_transfer(data.len() as u64);
                let src = Side::Host(HostPtr(data.as_ptr() as usize));
                // SAFETY: `src` is our own staging buffer of `data.len()` bytes.
                unsafe { copy(space, dst, src, data.len() as u64)? };
            }
            Op::Copy2D(c) => {
                model_transfer(c.width * c.height);
                for row in 0..c.height {
                    let (d, s) = (
                        c.dst.offset(row * c.dst_pitch),
                        c.src.offset(row * c.src_pitch),
                    );
                    // SAFETY: as for `Op::Copy`, row by row.
                    unsafe { copy(space, d, s, c.width)? };
                }
            }
            Op::Memset {
                dst,
                pattern,
                count,
            } => {
                model_transfer(count * pattern.len() as u64);
                space
                    .fill(dst, &pattern, count)
                    .map_err(|f| fault(space, "memset", f))?;
            }
            Op::Memset2D {
                dst,
                pitch,
                pattern,
                width,
                height,
            } => {
                model_transfer(width * height * pattern.len() as u64);
                for row in 0..height {
                    space
                        .fill(dst + row * pitch, &pattern, width)
                        .map_err(|f| fault(space, "memset", f))?;
                }
            }
            Op::HostFn { f, data } => {
                // SAFETY: the application gave this function and its argument to be called
                // exactly so, once, in stream order.
                unsafe { f(data as *mut c_void) };
            }
        }
        Ok(())
    }
}

/// Like kernels, transfers take effect at their end (see `Op::Kernel`).
fn model_transfer(bytes: u64) {
    let d = config::copy_duration(bytes);
    if !d.is_zero() {
        std::thread::sleep(d);
    }
}
