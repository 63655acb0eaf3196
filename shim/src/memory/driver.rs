//! The driver operations the memory manager needs, as a trait.
//!
//! The manager never calls the CUDA driver directly: it talks to a [`Driver`], so that the
//! same code runs on the real driver (the interposition layer implements the trait over the
//! real function pointers), on the simulated GPU ([`super::cuda::DlDriver`]) and on the
//! in-memory `super::fake::FakeDriver` used by the unit and property tests.
//!
//! This is deliberately the *smallest* set of operations the manager uses, not a general
//! driver binding. Every method returns the driver's own result code on failure, so the
//! manager can hand it back to the application unchanged.

use std::os::fd::{BorrowedFd, OwnedFd};

use tensile_driver_abi::{CUdeviceptr, CUresult, CUDA_ERROR_NOT_SUPPORTED};

/// A stream handle (`CUstream` as an integer, so it is `Send`). `Stream(0)` is the legacy
/// default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stream(pub usize);

/// An event handle (`CUevent` as an integer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Event(pub usize);

/// A physical allocation (`CUmemGenericAllocationHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PhysHandle(pub u64);

/// Where a physical allocation lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhysLocation {
    /// Device memory of this ordinal.
    Device(i32),
    /// Pinned host memory on this NUMA node (`CU_MEM_LOCATION_TYPE_HOST_NUMA`).
    HostNuma(i32),
}

/// The driver operations the memory manager uses.
///
/// Implementations must be callable from any thread. Copies and event records are
/// stream-ordered (asynchronous); the VMM calls (`mem_*`) are host operations that take
/// effect at once, exactly as on the real driver.
pub trait Driver: Send + Sync {
    /// `cuMemAddressReserve`: a virtual range of `size` bytes aligned to `alignment`.
    fn mem_address_reserve(&self, size: usize, alignment: usize) -> Result<CUdeviceptr, CUresult>;
    /// `cuMemAddressFree`.
    fn mem_address_free(&self, ptr: CUdeviceptr, size: usize) -> Result<(), CUresult>;
    /// `cuMemCreate` of pinned memory at `location`. Device memory is created exportable as a
    /// POSIX file descriptor ([`Self::mem_export_fd`]), for memory shared with other
    /// processes (`crate::ipc`).
    fn mem_create(&self, size: usize, location: PhysLocation) -> Result<PhysHandle, CUresult>;
    /// `cuMemRelease`.
    fn mem_release(&self, handle: PhysHandle) -> Result<(), CUresult>;
    /// `cuMemMap` of `size` bytes of `handle`, starting at `offset`, at `ptr`.
    fn mem_map(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: PhysHandle,
    ) -> Result<(), CUresult>;
    /// `cuMemUnmap`: `ptr..ptr+size` must cover whole mappings.
    fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> Result<(), CUresult>;
    /// `cuMemSetAccess`: read-write access for `device` on `ptr..ptr+size`.
    fn mem_set_access(&self, ptr: CUdeviceptr, size: usize, device: i32) -> Result<(), CUresult>;
    /// `cuMemcpyAsync` (or `cuMemcpyDtoDAsync_v2`) between two device virtual addresses.
    fn memcpy_dtod_async(
        &self,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), CUresult>;
    /// `cuMemcpyHtoDAsync_v2`.
    ///
    /// # Safety
    /// `src..src+bytes` must stay valid and unchanged until the copy has executed (until an
    /// event recorded after it on `stream` has completed).
    unsafe fn memcpy_htod_async(
        &self,
        dst: CUdeviceptr,
        src: *const u8,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), CUresult>;
    /// `cuMemcpyDtoHAsync_v2`.
    ///
    /// # Safety
    /// `dst..dst+bytes` must stay valid, and must not be read or written by the caller,
    /// until the copy has executed.
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: CUdeviceptr,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), CUresult>;
    /// `cuStreamCreate` with `CU_STREAM_NON_BLOCKING`.
    fn stream_create(&self) -> Result<Stream, CUresult>;
    /// `cuStreamDestroy_v2`.
    fn stream_destroy(&self, stream: Stream) -> Result<(), CUresult>;
    /// `cuStreamSynchronize`.
    fn stream_synchronize(&self, stream: Stream) -> Result<(), CUresult>;
    /// `cuStreamWaitEvent`: work queued on `stream` after this waits for the event's
    /// most recent record (as of this call).
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<(), CUresult>;
    /// `cuEventCreate` with `CU_EVENT_DISABLE_TIMING`.
    fn event_create(&self) -> Result<Event, CUresult>;
    /// `cuEventDestroy_v2`.
    fn event_destroy(&self, event: Event) -> Result<(), CUresult>;
    /// `cuEventRecord`.
    fn event_record(&self, event: Event, stream: Stream) -> Result<(), CUresult>;
    /// `cuEventQuery`: `Ok(true)` when complete, `Ok(false)` for `CUDA_ERROR_NOT_READY`.
    fn event_query(&self, event: Event) -> Result<bool, CUresult>;
    /// `cuEventSynchronize`.
    fn event_synchronize(&self, event: Event) -> Result<(), CUresult>;
    /// `cuMemGetInfo_v2`: `(free, total)` bytes of the device, as the driver sees them.
    fn mem_get_info(&self) -> Result<(usize, usize), CUresult>;
    /// `cuMemGetAllocationGranularity` (the minimum) for pinned memory at `loc`: the page
    /// of physical allocations and mappings there.
    fn mem_granularity(&self, loc: PhysLocation) -> Result<usize, CUresult>;
    /// `cuMemExportToShareableHandle` of a physical allocation as a POSIX file descriptor,
    /// which the caller then owns. Drivers without it refuse (`CUDA_ERROR_NOT_SUPPORTED`).
    fn mem_export_fd(&self, handle: PhysHandle) -> Result<OwnedFd, CUresult> {
        let _ = handle;
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    /// `cuMemImportFromShareableHandle` of a POSIX file descriptor another process exported
    /// (the caller keeps `fd`): a physical allocation of the same memory.
    fn mem_import_fd(&self, fd: BorrowedFd<'_>) -> Result<PhysHandle, CUresult> {
        let _ = fd;
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
}
