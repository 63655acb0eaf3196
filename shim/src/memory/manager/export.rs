//! Allocations shared with other processes (`crate::ipc`): pinned on the device, and named
//! by the device units that back them, each exported as a file descriptor.
//!
//! Another process maps the units themselves, so what it sees is the memory at the
//! exporter's address only while the same units back it there: the allocation is pinned
//! ([`Inner::pin_for_capture`]'s pin, held until it is freed), and pinned pages are never
//! swapped, remapped or re-cut, so their units stay. The driver maps only whole units, so
//! the export names every unit that backs a page of the allocation, with the pages of
//! neighbouring allocations that share them (as the driver's own IPC of a `cuMemAlloc`
//! block exposes the whole block).
//!
//! Not here: the handle, the socket that hands the descriptors over, when an exported
//! allocation may really be freed (all `crate::ipc`).

use std::os::fd::OwnedFd;

use tensile_driver_abi::{CUdeviceptr, CUresult, CUDA_ERROR_INVALID_VALUE};

use super::MemoryManager;
use crate::memory::driver::PhysHandle;

/// One device unit backing an exported allocation: its bytes, mapped at `offset` of the
/// export's span, and its memory as a file descriptor.
#[derive(Debug)]
pub struct ExportedUnit {
    pub offset: u64,
    pub bytes: u64,
    pub fd: OwnedFd,
}

/// An allocation pinned on the device for another process, and the units behind it.
#[derive(Debug)]
pub struct ExportedAllocation {
    /// The allocation: its start and the bytes the application asked for.
    pub ptr: CUdeviceptr,
    pub size: u64,
    /// The arena range its units cover, `[span_start, span_start + span_bytes)`: whole
    /// units, consecutive (every page of the allocation is in one, and a unit's pages are
    /// consecutive).
    pub span_start: CUdeviceptr,
    pub span_bytes: u64,
    /// In address order, back to back from `span_start`.
    pub units: Vec<ExportedUnit>,
}

impl MemoryManager {
    /// Pins the allocation containing `addr` on the device until it is freed (waiting for
    /// it to come in, as [`Self::pin_for_capture`] does) and exports every device unit
    /// backing it. Errors: `CUDA_ERROR_INVALID_VALUE` for an address in no allocation; the
    /// pin's (out of memory: the allocation does not fit the budget) or the driver's (the
    /// units cannot be exported). A pin taken before a failed export stays until the free,
    /// as a captured graph's would: nothing is lost, the memory only stays on the device.
    pub fn pin_for_export(&self, addr: CUdeviceptr) -> Result<ExportedAllocation, CUresult> {
        let (ptr, size) = self
            .allocation_containing(addr)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        self.pin_for_capture(&[(ptr, 1)])?;
        // Under the lock, which units back the pages; their exports are made without it
        // (the pin keeps the units where they are).
        let (span_start, units, driver) = {
            let s = self.lock();
            let a = s.sub.find(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let (first, last) = s.pages_of(a.ptr, a.span).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let mut units: Vec<(usize, usize, PhysHandle)> = Vec::new();
            let mut p = first;
            while p <= last {
                let frame = s.pages.get(p).and_then(|e| e.state.device_frame());
                let Some(frame) = frame else {
                    // A pinned page of a live allocation is on the device (invariant 2 and
                    // the pin); anything else is a bookkeeping bug: refuse, lose nothing.
                    tracing::error!("page {p} of an exported allocation is not on the device");
                    return Err(CUDA_ERROR_INVALID_VALUE);
                };
                let (handle, n) = s.dev.unit(frame);
                let unit_first = p - frame.offset as usize;
                units.push((unit_first, n, handle));
                p = unit_first + n;
            }
            let span_start = s.base + (units[0].0 * s.page) as u64;
            (span_start, units, s.driver.clone())
        };
        let page = self.page as u64;
        let first_page = units[0].0;
        let mut exported = Vec::with_capacity(units.len());
        for (unit_first, n, handle) in units {
            exported.push(ExportedUnit {
                offset: (unit_first - first_page) as u64 * page,
                bytes: n as u64 * page,
                fd: driver.mem_export_fd(handle)?,
            });
        }
        let span_bytes = exported.iter().map(|u| u.bytes).sum();
        Ok(ExportedAllocation {
            ptr,
            size: size as u64,
            span_start,
            span_bytes,
            units: exported,
        })
    }
}
