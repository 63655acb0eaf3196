//! The work a stream executes: kernels, copies, memsets, event records, host functions and
//! stream-ordered frees, and what executing each means on the simulated device.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use tensile_driver_abi::*;
use tensile_kernels::twins::TwinFn;
use tensile_kernels::{Dim3, Fault, Launch, TwinError};

use crate::card::{self, Direction};
use crate::config;
use crate::engine_log;
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
        /// The GPU time this launch stands for, from its parameters (`None`: the setting).
        modelled: Option<Duration>,
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
    /// What the engine log calls this item, and its bytes (`None`: not logged).
    pub fn log_kind(&self, space: &AddressSpace) -> Option<(engine_log::Kind, u64)> {
        let copy = |dst: Side, src: Side, bytes: u64| {
            let kind = match classify(space, dst, src) {
                Path::Bus(Direction::ToDevice, _) => engine_log::Kind::ToDevice,
                Path::Bus(Direction::ToHost, _) => engine_log::Kind::ToHost,
                Path::Device => engine_log::Kind::OnCard,
                Path::Host => return None,
            };
            Some((kind, bytes))
        };
        match self {
            Op::Kernel { .. } => Some((engine_log::Kind::Kernel, 0)),
            Op::Copy { dst, src, len } => copy(*dst, *src, *len),
            Op::Copy2D(c) => copy(c.dst, c.src, c.width * c.height),
            _ => None,
        }
    }

    /// Runs the operation on `device`'s engines, ready at `ready` on the card's clock (see
    /// `card.rs`); returns when it ended on that clock. `broken`: the context already has a
    /// sticky error, so only the bookkeeping that keeps waiters from hanging (event records,
    /// frees) is done.
    pub fn execute(
        self,
        space: &AddressSpace,
        device: usize,
        broken: bool,
        ready: u64,
    ) -> Result<u64, OpFailure> {
        let mut end = ready;
        match self {
            Op::Record(ev, generation) => ev.complete_at(generation, ready),
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
                modelled,
            } => {
                // The modelled duration passes (on the compute engine, shared by all streams)
                // before the twin runs, so a kernel's reads and writes happen at its end: work
                // that races ahead of it sees stale data, which is how ordering bugs become
                // visible.
                let d = modelled.unwrap_or_else(config::kernel_duration);
                if !d.is_zero() {
                    end = card::reserve_kernel(device, d, end);
                    card::sleep_until(end);
                }
                let launch = Launch {
                    grid,
                    block,
                    params: &params,
                };
                let (result, host_bytes) = space.counting_host_access(|| run(&launch, space));
                if host_bytes > 0 {
                    // Host-located memory is read over the bus: the kernel lasts that much
                    // longer (its effects are already visible; the bytes are only known once
                    // it ran).
                    let over_bus = card::host_access(host_bytes);
                    if !over_bus.is_zero() {
                        end = card::reserve_kernel(device, over_bus, end);
                        card::sleep_until(end);
                    }
                }
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
                end = model_transfer(space, device, dst, src, len, ready);
                // SAFETY: host pointers were given by the application for this copy.
                unsafe { copy(space, dst, src, len)? };
            }
            Op::Upload { dst, data } => {
                // Staged from pageable memory when it was queued: the staging buffer is
                // pageable too, so the copy runs at pageable speed.
                let src = Side::Host(HostPtr(data.as_ptr() as usize));
                end = model_transfer(space, device, dst, src, data.len() as u64, ready);
                // SAFETY: `src` is our own staging buffer of `data.len()` bytes.
                unsafe { copy(space, dst, src, data.len() as u64)? };
            }
            Op::Copy2D(c) => {
                end = model_transfer(space, device, c.dst, c.src, c.width * c.height, ready);
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
                end = card::device_transfer_end(count * pattern.len() as u64, ready);
                card::sleep_until(end);
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
                end = card::device_transfer_end(width * height * pattern.len() as u64, ready);
                card::sleep_until(end);
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
                // It ran on the host: the stream goes on from when it returned.
                end = end.max(card::now_ns());
            }
        }
        Ok(end)
    }
}

/// Which way a copy goes: over the bus (and whether its host side is pageable), within the
/// device, or host to host.
enum Path {
    Bus(Direction, bool),
    Device,
    Host,
}

fn classify(space: &AddressSpace, dst: Side, src: Side) -> Path {
    // A `Side::Device` address may still be host memory (pinned memory through its device
    // pointer, a range mapped to a host allocation): where the bytes live decides.
    let on_device = |side: Side| match side {
        Side::Device(a) => space.is_device_memory(a),
        Side::Host(_) => false,
    };
    let pageable = |side: Side| match side {
        Side::Host(HostPtr(p)) => space.region_of(p as u64).is_none(),
        Side::Device(_) => false,
    };
    match (on_device(dst), on_device(src)) {
        (true, true) => Path::Device,
        (true, false) => Path::Bus(Direction::ToDevice, pageable(src)),
        (false, true) => Path::Bus(Direction::ToHost, pageable(dst)),
        (false, false) => Path::Host,
    }
}

/// Like kernels, transfers take effect at their end (see `Op::Kernel`): waits until the copy's
/// interval on its engine (of `device`) has passed; returns its end.
fn model_transfer(
    space: &AddressSpace,
    device: usize,
    dst: Side,
    src: Side,
    bytes: u64,
    ready: u64,
) -> u64 {
    let end = match classify(space, dst, src) {
        Path::Bus(direction, pageable) => {
            card::reserve_copy(device, direction, bytes, pageable, ready)
        }
        Path::Device => card::device_transfer_end(bytes, ready),
        Path::Host => return ready,
    };
    card::sleep_until(end);
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn nothing(_: &Launch<'_>, _: &dyn tensile_kernels::DeviceMemory) -> Result<(), TwinError> {
        Ok(())
    }

    /// The unit tests share the process's card: one at a time.
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn kernel(modelled: Option<Duration>) -> Op {
        Op::Kernel {
            name: "nothing".into(),
            run: nothing,
            grid: Dim3::new(1, 1, 1),
            block: Dim3::new(1, 1, 1),
            params: Vec::new(),
            modelled,
        }
    }

    #[test]
    fn a_launch_with_its_own_modelled_duration_takes_it_instead_of_the_setting() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        card::reset();
        let space = AddressSpace::single(1 << 20);
        // The setting is 0 (never set in this binary's unit tests).
        assert_eq!(config::kernel_duration(), Duration::ZERO);
        let ready = card::now_ns();
        let end = kernel(None).execute(&space, 0, false, ready).ok().unwrap();
        assert_eq!(end, ready);
        let d = Duration::from_millis(60);
        let (ready, start) = (card::now_ns(), Instant::now());
        let end = kernel(Some(d))
            .execute(&space, 0, false, ready)
            .ok()
            .unwrap();
        assert!(start.elapsed() >= d, "{:?}", start.elapsed());
        assert!(end >= ready + 60_000_000, "{end} {ready}");
    }

    #[test]
    fn a_kernel_runs_from_when_it_was_ready_not_from_when_its_worker_got_to_it() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        card::reset();
        let space = AddressSpace::single(1 << 20);
        let d = Duration::from_millis(80);
        // Ready 80 ms ago (its worker was busy with the simulator's own work): it ends at once.
        let ready = card::now_ns() - 80_000_000;
        let start = Instant::now();
        let end = kernel(Some(d))
            .execute(&space, 0, false, ready)
            .ok()
            .unwrap();
        assert!(start.elapsed() < d / 2, "{:?}", start.elapsed());
        assert!(end >= ready + 80_000_000);
    }
}
