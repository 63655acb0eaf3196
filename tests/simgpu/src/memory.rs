//! The simulated device's address space: every range a kernel, copy or memset may touch,
//! and the checks that make touching anything else a fault.
//!
//! Device pointers are host virtual addresses (unified addressing). Three kinds of range
//! are tracked in one table, keyed by start address:
//! - linear allocations (`cuMemAlloc*`): an anonymous read-write mapping per allocation,
//!   followed by an unregistered guard page, so an overrun faults instead of landing in a
//!   neighbour;
//! - pinned host allocations (`cuMemAllocHost`/`cuMemHostAlloc`), accessible to kernels;
//! - VMM mappings (`cuMemMap`): a `memfd` physical allocation mapped `MAP_SHARED|MAP_FIXED`
//!   inside a `PROT_NONE` reservation, accessible only after `cuMemSetAccess`. Copies of
//!   16 KiB and more into or between such mappings go through their files ([`file_at`]),
//!   as a card's copy engine writes memory without the CPU's page tables.
//!
//! Invariants (what makes the raw copies below sound):
//! - every byte of every registered range is backed by a live host mapping this module
//!   created, readable (and writable if the range's access allows writes) by the host;
//! - the table changes only under the write lock, and every access to device memory checks
//!   the table and copies under the read lock (a long copy in pieces, each checked under its
//!   own), so no range can be unmapped while it is being read or written;
//! - host mappings are made under the write lock, before their range enters the table, and
//!   torn down under it or after their range has left it (`cuMemUnmap`, under
//!   [`AddressSpace::vmm_os`], which keeps the range from being mapped again meanwhile);
//! - a registered range never overlaps another.
//!
//! Concurrent kernels may read and write the same bytes at once (as on a GPU, where such a
//! program has a data race); the copies use raw pointers and never form Rust references
//! to device memory, so this yields racy bytes, not references that alias.
//!
//! Not here: stream ordering (a free or remap happens when this module is called; callers
//! decide when) and handle validation of the API.

pub mod vmm;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tensile_driver_abi::*;
use tensile_kernels::{AccessKind, DeviceMemory, Fault};

use crate::os::{self, MemFd, PAGE};
use crate::shared_card::SharedCard;

/// What a kernel may do with a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    None,
    Read,
    ReadWrite,
}

impl Access {
    fn allows(self, kind: AccessKind) -> bool {
        match kind {
            AccessKind::Read => self >= Access::Read,
            AccessKind::Write => self == Access::ReadWrite,
        }
    }
}

/// Which API created a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// `cuMemAlloc*` / stream-ordered allocations. `pool` is the memory pool of a
    /// stream-ordered allocation; `free_queued` is set once `cuMemFreeAsync` has been called.
    Linear {
        /// `cuMemAllocManaged`: usable by the host as well (here it always is), not charged
        /// to the device (managed memory may exceed it).
        managed: bool,
        mapped_len: u64,
        /// The device charged (0 when nothing is).
        device: usize,
        charged: u64,
        pool: Option<usize>,
        free_queued: bool,
    },
    /// Pinned host memory from `cuMemAllocHost`/`cuMemHostAlloc`.
    HostPinned { mapped_len: u64 },
    /// Application memory registered with `cuMemHostRegister` (the application owns it).
    HostRegistered,
    /// A `cuMemMap` of physical allocation `handle` at `offset`.
    Mapped { handle: u64, offset: u64 },
}

/// One registered range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub len: u64,
    pub kind: RegionKind,
    pub access: Access,
    /// Context that allocated it (0 for VMM mappings, which belong to no context).
    pub ctx: usize,
}

impl Region {
    pub fn end(&self) -> u64 {
        self.start + self.len
    }

    pub fn is_device(&self) -> bool {
        !matches!(
            self.kind,
            RegionKind::HostPinned { .. } | RegionKind::HostRegistered
        )
    }
}

#[derive(Debug)]
struct Physical {
    fd: MemFd,
    size: u64,
    location: CUmemLocation,
    /// Device bytes charged against `location`'s capacity (0 for host-located memory).
    charged: u64,
    /// References: one from creation (dropped by `cuMemRelease`), one per
    /// `cuMemRetainAllocationHandle`; the memory is freed when these and `maps` reach 0.
    refs: u32,
    maps: u32,
    /// The shareable handle types asked for at `cuMemCreate`
    /// (`CUmemAllocationProp::requestedHandleTypes`): what `cuMemExportToShareableHandle`
    /// may export it as. An imported allocation keeps the type it came as.
    handle_types: u32,
}

#[derive(Debug, Default)]
struct Inner {
    regions: BTreeMap<u64, Region>,
    /// start -> length of each `cuMemAddressReserve`.
    reservations: BTreeMap<u64, u64>,
    physical: HashMap<u64, Physical>,
    next_handle: u64,
    /// Device bytes this process has charged to each device (to its own capacity, or to the
    /// shared card).
    device_used: Vec<u64>,
    /// The space's devices again, for [`Inner::uncharge`] (which runs under this lock).
    devices: Vec<Device>,
    /// Recently freed linear ranges, kept reserved (`PROT_NONE`, no memory behind them) so
    /// that their addresses are not handed out again at once: a use after free then faults
    /// deterministically instead of hitting whatever was allocated there next.
    quarantine: VecDeque<(u64, u64)>,
    quarantine_bytes: u64,
}

/// How much freed address space stays quarantined before the oldest is returned to the OS
/// (bounded in ranges too: each may be a separate kernel mapping, and a process has at most
/// `vm.max_map_count`, 65530 by default).
const QUARANTINE_BYTES: u64 = 1 << 40;
const QUARANTINE_RANGES: usize = 8192;

/// One simulated device's memory: its capacity and, on a card shared with other processes,
/// the card (whose capacity it is; charges go to it as well).
#[derive(Debug, Clone, Copy)]
pub struct Device {
    pub capacity: u64,
    pub card: Option<&'static SharedCard>,
}

impl Device {
    /// A device of `capacity` bytes of its own, or a share of `card`.
    pub fn new(capacity: u64, card: Option<&'static SharedCard>) -> Self {
        Self {
            capacity: card.map_or(capacity, |c| c.capacity()),
            card,
        }
    }
}

/// The address space. See the module docs for its invariants.
#[derive(Debug)]
pub struct AddressSpace {
    inner: RwLock<Inner>,
    /// Held by the VMM calls that map or unmap host memory behind a reservation (`cuMemMap`,
    /// `cuMemUnmap`, `cuMemAddressFree`), taken before `inner`: `cuMemUnmap` takes its
    /// ranges out of the table under the write lock and puts them back to reserved after
    /// releasing it (tearing down a mapping's pages takes about 30 µs per 512 KiB here, which
    /// copies and kernels then had to wait out), and this keeps a range from being mapped
    /// again, or its reservation freed, before that is done.
    vmm_os: Mutex<()>,
    devices: Vec<Device>,
}

/// The most bytes a copy moves under one read lock ([`AddressSpace::in_pieces`]).
const COPY_PIECE: u64 = 128 << 10;

/// The smallest piece of a copy made through the file behind a VMM mapping ([`file_at`]).
const FILE_COPY_MIN: u64 = 16 << 10;

/// A host pointer taking part in a copy (the simulator trusts the application with these,
/// as the driver does for pinned memory).
#[derive(Debug, Clone, Copy)]
pub struct HostPtr(pub usize);

fn os_err(e: i32) -> CUresult {
    if e == libc::ENOMEM {
        CUDA_ERROR_OUT_OF_MEMORY
    } else {
        CUDA_ERROR_UNKNOWN
    }
}

impl Inner {
    /// Gives back `bytes` of `device`'s memory this process charged.
    fn uncharge(&mut self, device: usize, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.device_used[device] -= bytes;
        if let Some(card) = self.devices[device].card {
            card.uncharge(bytes);
        }
    }
}

impl AddressSpace {
    /// The memory of `devices` (at least one): one address space for all (unified
    /// addressing), a capacity for each.
    pub fn new(devices: Vec<Device>) -> Self {
        assert!(!devices.is_empty(), "at least one device");
        Self {
            inner: RwLock::new(Inner {
                next_handle: 0x5100,
                device_used: vec![0; devices.len()],
                devices: devices.clone(),
                ..Inner::default()
            }),
            vmm_os: Mutex::new(()),
            devices,
        }
    }

    /// One device of `capacity` bytes of its own (unit tests).
    pub fn single(capacity: u64) -> Self {
        Self::new(vec![Device::new(capacity, None)])
    }

    fn check_device(&self, device: usize) -> Result<(), CUresult> {
        if device < self.devices.len() {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_DEVICE)
        }
    }

    fn read_lock(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// See [`AddressSpace::vmm_os`]; take it before [`AddressSpace::write_lock`].
    fn vmm_os_lock(&self) -> MutexGuard<'_, ()> {
        self.vmm_os.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `device`'s capacity (0 for a device that does not exist).
    pub fn capacity(&self, device: usize) -> u64 {
        self.devices.get(device).map_or(0, |d| d.capacity)
    }

    /// Bytes of `device` this process uses (linear allocations and device-located physical
    /// allocations).
    pub fn device_used(&self, device: usize) -> u64 {
        self.read_lock()
            .device_used
            .get(device)
            .copied()
            .unwrap_or(0)
    }

    /// Bytes free on `device`: its capacity less what this process uses, or on a shared card,
    /// less what every process on it uses.
    pub fn device_free(&self, device: usize) -> u64 {
        let inner = self.read_lock();
        match self.devices.get(device) {
            Some(Device {
                card: Some(card), ..
            }) => card.free_bytes(),
            Some(d) => d.capacity.saturating_sub(inner.device_used[device]),
            None => 0,
        }
    }

    fn charge(&self, inner: &mut Inner, device: usize, bytes: u64) -> Result<(), CUresult> {
        if bytes == 0 {
            return Ok(());
        }
        self.check_device(device)?;
        let total = inner.device_used[device]
            .checked_add(bytes)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        match self.devices[device].card {
            Some(card) => card.charge(bytes)?,
            None if total > self.devices[device].capacity => return Err(CUDA_ERROR_OUT_OF_MEMORY),
            None => {}
        }
        inner.device_used[device] = total;
        Ok(())
    }

    /// `cuMemAlloc*`: `size` bytes of memory, charged to `device` (if any) rounded up to whole
    /// pages. Returns (address, bytes charged).
    pub fn alloc_linear(
        &self,
        size: u64,
        ctx: usize,
        pool: Option<usize>,
        device: Option<usize>,
    ) -> Result<(u64, u64), CUresult> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let rounded = size
            .checked_next_multiple_of(PAGE)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let charged = if device.is_some() { rounded } else { 0 };
        let device = device.unwrap_or(0);
        let mapped_len = rounded.checked_add(PAGE).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?; // + guard
        let mut inner = self.write_lock();
        self.charge(&mut inner, device, charged)?;
        let start = match os::map_anonymous(mapped_len, libc::PROT_READ | libc::PROT_WRITE, 0) {
            Ok(a) => a,
            Err(e) => {
                inner.uncharge(device, charged);
                return Err(os_err(e));
            }
        };
        // The guard page stays mapped (so nothing else lands there) but unreadable.
        let _ = os::protect(start + rounded, PAGE, libc::PROT_NONE);
        let kind = RegionKind::Linear {
            managed: false,
            mapped_len,
            device,
            charged,
            pool,
            free_queued: false,
        };
        let region = Region {
            start,
            len: size,
            kind,
            access: Access::ReadWrite,
            ctx,
        };
        inner.regions.insert(start, region);
        Ok((start, charged))
    }

    /// `cuMemAllocManaged`: linear memory the host may use too, not charged to the device.
    pub fn alloc_managed(&self, size: u64, ctx: usize) -> Result<u64, CUresult> {
        let (start, _) = self.alloc_linear(size, ctx, None, None)?;
        if let Some(Region {
            kind: RegionKind::Linear { managed, .. },
            ..
        }) = self.write_lock().regions.get_mut(&start)
        {
            *managed = true;
        }
        Ok(start)
    }

    /// Whether `cuIpcGetMemHandle` may export the allocation at `addr`: the base of device
    /// memory from `cuMemAlloc` (not managed memory, not a pool's, not a VMM mapping, which
    /// the driver shares only through `cuMemExportToShareableHandle`).
    pub fn ipc_exportable(&self, addr: u64) -> bool {
        let inner = self.read_lock();
        find(&inner, addr).is_some_and(|r| {
            r.start == addr
                && matches!(
                    r.kind,
                    RegionKind::Linear {
                        managed: false,
                        pool: None,
                        charged,
                        ..
                    } if charged > 0
                )
        })
    }

    /// Whether `[addr, addr + len)` lies inside one managed allocation.
    pub fn is_managed(&self, addr: u64, len: u64) -> bool {
        let inner = self.read_lock();
        find(&inner, addr).is_some_and(|r| {
            matches!(r.kind, RegionKind::Linear { managed: true, .. })
                && addr.checked_add(len).is_some_and(|end| end <= r.end())
        })
    }

    /// Marks a linear allocation as about to be freed by a queued `cuMemFreeAsync`, so a second
    /// free of it is refused. Returns its pool.
    pub fn queue_free(&self, addr: u64) -> Result<Option<usize>, CUresult> {
        let mut inner = self.write_lock();
        match inner.regions.get_mut(&addr) {
            Some(Region {
                kind:
                    RegionKind::Linear {
                        free_queued, pool, ..
                    },
                ..
            }) if !*free_queued => {
                *free_queued = true;
                Ok(*pool)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemFree`, or the execution of a queued `cuMemFreeAsync` (`queued`): unmaps the
    /// allocation starting at `addr`. Returns (charged bytes, pool).
    pub fn free_linear(&self, addr: u64, queued: bool) -> Result<(u64, Option<usize>), CUresult> {
        let mut inner = self.write_lock();
        let (mapped_len, device, charged, pool) = match inner.regions.get(&addr) {
            Some(Region {
                kind:
                    RegionKind::Linear {
                        mapped_len,
                        device,
                        charged,
                        pool,
                        free_queued,
                        ..
                    },
                ..
            }) if *free_queued == queued => (*mapped_len, *device, *charged, *pool),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        inner.regions.remove(&addr);
        inner.uncharge(device, charged);
        if os::reset_to_reserved(addr, mapped_len).is_err() {
            os::unmap(addr, mapped_len);
            return Ok((charged, pool));
        }
        inner.quarantine.push_back((addr, mapped_len));
        inner.quarantine_bytes += mapped_len;
        while inner.quarantine_bytes > QUARANTINE_BYTES
            || inner.quarantine.len() > QUARANTINE_RANGES
        {
            let Some((a, len)) = inner.quarantine.pop_front() else {
                break;
            };
            inner.quarantine_bytes -= len;
            os::unmap(a, len);
        }
        Ok((charged, pool))
    }

    /// `cuMemAllocHost`/`cuMemHostAlloc`: pinned host memory, not charged to the device.
    pub fn alloc_host(&self, size: u64, ctx: usize) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mapped_len = size
            .checked_next_multiple_of(PAGE)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let start =
            os::map_anonymous(mapped_len, libc::PROT_READ | libc::PROT_WRITE, 0).map_err(os_err)?;
        let kind = RegionKind::HostPinned { mapped_len };
        let region = Region {
            start,
            len: size,
            kind,
            access: Access::ReadWrite,
            ctx,
        };
        self.write_lock().regions.insert(start, region);
        Ok(start)
    }

    /// `cuMemFreeHost`.
    pub fn free_host(&self, addr: u64) -> Result<(), CUresult> {
        let mut inner = self.write_lock();
        match inner.regions.get(&addr) {
            Some(Region {
                kind: RegionKind::HostPinned { mapped_len },
                ..
            }) => {
                let len = *mapped_len;
                inner.regions.remove(&addr);
                os::unmap(addr, len);
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemHostRegister`: makes application memory visible to the device. The application
    /// must keep it mapped until `cuMemHostUnregister` (the driver's contract too).
    pub fn register_host(
        &self,
        addr: u64,
        len: u64,
        access: Access,
        ctx: usize,
    ) -> Result<(), CUresult> {
        if addr == 0 || len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let end = addr.checked_add(len).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut inner = self.write_lock();
        let overlaps =
            find(&inner, addr).is_some() || inner.regions.range(addr..end).next().is_some();
        if overlaps {
            return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        let region = Region {
            start: addr,
            len,
            kind: RegionKind::HostRegistered,
            access,
            ctx,
        };
        inner.regions.insert(addr, region);
        Ok(())
    }

    /// `cuMemHostUnregister`.
    pub fn unregister_host(&self, addr: u64) -> Result<(), CUresult> {
        let mut inner = self.write_lock();
        match inner.regions.get(&addr) {
            Some(Region {
                kind: RegionKind::HostRegistered,
                ..
            }) => {
                inner.regions.remove(&addr);
                Ok(())
            }
            _ => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    }

    /// Whether `addr` is device-located memory (a linear allocation, or a mapping of a
    /// device-located physical allocation); false for host memory of any kind and for
    /// addresses the simulator does not track.
    pub fn is_device_memory(&self, addr: u64) -> bool {
        let inner = self.read_lock();
        match find(&inner, addr).map(|r| r.kind) {
            Some(RegionKind::Linear { .. }) => true,
            Some(RegionKind::Mapped { handle, .. }) => inner
                .physical
                .get(&handle)
                .is_some_and(|p| p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE),
            _ => false,
        }
    }

    /// The device whose memory `addr` is (a linear allocation charged to it, or a mapping of
    /// memory located on it); None for host memory and untracked addresses.
    pub fn device_of(&self, addr: u64) -> Option<usize> {
        let inner = self.read_lock();
        match find(&inner, addr).map(|r| r.kind) {
            Some(RegionKind::Linear {
                device, charged, ..
            }) if charged > 0 => Some(device),
            Some(RegionKind::Mapped { handle, .. }) => inner
                .physical
                .get(&handle)
                .filter(|p| p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE)
                .map(|p| p.location.id as usize),
            _ => None,
        }
    }

    /// The registered range containing `addr`, if any.
    pub fn region_of(&self, addr: u64) -> Option<Region> {
        let inner = self.read_lock();
        find(&inner, addr).copied()
    }

    /// Checks that `[addr, addr + len)` is covered by registered ranges allowing `kind`.
    fn check(inner: &Inner, addr: u64, len: u64, kind: AccessKind) -> Result<(), Fault> {
        let fault = Fault { addr, len, kind };
        if len == 0 {
            return Ok(());
        }
        let end = addr.checked_add(len).ok_or(fault)?;
        let mut cursor = addr;
        while cursor < end {
            match find(inner, cursor) {
                Some(r) if r.access.allows(kind) => cursor = r.end(),
                _ => return Err(fault),
            }
        }
        Ok(())
    }

    /// Copies device memory at `src` to the host bytes at `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes.
    pub unsafe fn read_to_host(&self, src: u64, dst: *mut u8, len: usize) -> Result<(), Fault> {
        self.in_pieces(len as u64, &[(src, AccessKind::Read)], |_, at, n| {
            // SAFETY: the piece of the source is registered and readable and stays mapped
            // while the read lock `in_pieces` holds lasts (module invariant); the caller
            // vouches for `dst`.
            unsafe { std::ptr::copy((src + at) as *const u8, dst.add(at as usize), n as usize) };
            n
        })
    }

    /// Copies the host bytes at `src` to device memory at `dst`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes.
    pub unsafe fn write_from_host(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), Fault> {
        self.in_pieces(len as u64, &[(dst, AccessKind::Write)], |inner, at, n| {
            let from = src.wrapping_add(at as usize);
            if let Some((file, offset, left)) = file_at(inner, dst + at, n) {
                let m = n.min(left);
                // SAFETY: the caller vouches for `src`'s `len` bytes, of which these are some.
                if unsafe { file.write_at(offset, from, m as usize) }.is_ok() {
                    return m;
                }
            }
            // SAFETY: the piece of the destination is registered and writable and stays
            // mapped while the read lock `in_pieces` holds lasts (module invariant); the
            // caller vouches for `src`.
            unsafe { std::ptr::copy(from, (dst + at) as *mut u8, n as usize) };
            n
        })
    }

    /// Device-to-device copy (ranges may overlap).
    pub fn copy_device(&self, dst: u64, src: u64, len: u64) -> Result<(), Fault> {
        let overlap = dst < src.saturating_add(len) && src < dst.saturating_add(len);
        if overlap {
            // Pieces in address order would overwrite source bytes not yet copied when `dst`
            // is above `src`; such copies are rare, so they are made whole.
            let inner = self.read_lock();
            Self::check(&inner, src, len, AccessKind::Read)?;
            Self::check(&inner, dst, len, AccessKind::Write)?;
            // SAFETY: both ranges are registered with the needed access and stay mapped
            // while the read lock is held (module invariant).
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
            return Ok(());
        }
        let ranges = [(src, AccessKind::Read), (dst, AccessKind::Write)];
        self.in_pieces(len, &ranges, |inner, at, n| {
            if let (Some((from, from_offset, from_left)), Some((to, to_offset, to_left))) =
                (file_at(inner, src + at, n), file_at(inner, dst + at, n))
            {
                let m = n.min(from_left).min(to_left);
                if from.copy_to(from_offset, to, to_offset, m).is_ok() {
                    return m;
                }
            }
            // SAFETY: the pieces of both ranges are registered with the needed access and
            // stay mapped while the read lock `in_pieces` holds lasts (module invariant); they
            // do not overlap (checked above).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (src + at) as *const u8,
                    (dst + at) as *mut u8,
                    n as usize,
                )
            };
            n
        })
    }

    /// Checks `len` bytes at each of `ranges` for its access, then calls `copy(inner, offset,
    /// n)` for consecutive pieces of at most [`COPY_PIECE`] bytes, each under a read lock of
    /// its own with its pieces of `ranges` checked again under it; `copy` returns how much of
    /// its piece it copied (at least a byte), and the next piece starts there.
    ///
    /// Why pieces: a VMM call takes the write lock, and a copy holding the read lock through
    /// megabytes held it up for as long, which a card's copy engine never does to the CPU's
    /// map and unmap calls. The whole range is checked first, so a copy that cannot be made
    /// has no effect; a range unmapped while the copy is under way faults at its piece, as a
    /// card's copy would at its page.
    fn in_pieces(
        &self,
        len: u64,
        ranges: &[(u64, AccessKind)],
        mut copy: impl FnMut(&Inner, u64, u64) -> u64,
    ) -> Result<(), Fault> {
        if len > COPY_PIECE {
            let inner = self.read_lock();
            for &(addr, kind) in ranges {
                Self::check(&inner, addr, len, kind)?;
            }
        }
        let mut at = 0;
        while at < len {
            let n = (len - at).min(COPY_PIECE);
            let inner = self.read_lock();
            for &(addr, kind) in ranges {
                Self::check(&inner, addr + at, n, kind)?;
            }
            at += copy(&inner, at, n).clamp(1, n);
        }
        Ok(())
    }

    /// Fills `count` elements of `pattern.len()` bytes (1, 2 or 4) at `dst` with `pattern`.
    pub fn fill(&self, dst: u64, pattern: &[u8], count: u64) -> Result<(), Fault> {
        let fault = Fault {
            addr: dst,
            len: u64::MAX,
            kind: AccessKind::Write,
        };
        let len = count.checked_mul(pattern.len() as u64).ok_or(fault)?;
        let inner = self.read_lock();
        Self::check(&inner, dst, len, AccessKind::Write)?;
        // A chunk of repeated pattern, copied as many times as needed: no references to
        // device memory are formed.
        const CHUNK: usize = 1 << 16;
        let chunk: Vec<u8> = pattern.iter().copied().cycle().take(CHUNK).collect();
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            // SAFETY: [dst, dst + len) is registered, writable and stays mapped while the read
            // lock is held; `chunk` holds at least `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), (dst + done) as *mut u8, n) };
            done += n as u64;
        }
        Ok(())
    }
}

impl AddressSpace {
    /// Why `fault` faulted, in words: the first byte the access could not touch and what is
    /// there (for the log line of a sticky error).
    pub fn explain(&self, fault: &Fault) -> String {
        let inner = self.read_lock();
        let end = fault.addr.saturating_add(fault.len);
        let mut cursor = fault.addr;
        while cursor < end {
            match find(&inner, cursor) {
                Some(r) if r.access.allows(fault.kind) => cursor = r.end(),
                Some(r) => {
                    return format!(
                        "{cursor:#x} is mapped ({:?}, {:#x}+{:#x}) with access {:?}",
                        r.kind, r.start, r.len, r.access
                    )
                }
                None => {
                    let reserved = inner
                        .reservations
                        .range(..=cursor)
                        .next_back()
                        .filter(|(s, l)| cursor < *s + *l);
                    let freed = inner
                        .quarantine
                        .iter()
                        .find(|(s, l)| *s <= cursor && cursor < s + l);
                    return match (reserved, freed) {
                        (Some((s, l)), _) => {
                            format!("{cursor:#x} is reserved ({s:#x}+{l:#x}) but not mapped")
                        }
                        (None, Some((s, _))) => {
                            format!("{cursor:#x} is in the freed allocation at {s:#x}")
                        }
                        (None, None) => format!("{cursor:#x} is not device memory"),
                    };
                }
            }
        }
        "the range is accessible now (it was not when the access ran)".into()
    }
}

/// The file behind the VMM mapping at `addr` for a piece of a copy of `n` bytes: the file, the
/// offset of `addr` in it and the bytes of the mapping from `addr` on. None for memory of any
/// other kind, and for pieces under [`FILE_COPY_MIN`] (a kernel's stamps).
///
/// Why through the file: a mapping made anew has no page tables, and a copy through it faults
/// once per 4 KiB page. On this machine that made a copy into a fresh 512 KiB mapping take
/// about 250 µs, where the kernel copies between the files in 80 (`copy_file_range`) or from
/// the host in 65 (`pwrite`); its unmap then tore down populated page tables (about 27 µs per
/// 512 KiB, 3 unpopulated). The manager's swaps are copies between such mappings (its arena
/// and its host window), remapped for nearly every move: a card has none of this cost.
fn file_at(inner: &Inner, addr: u64, n: u64) -> Option<(&MemFd, u64, u64)> {
    if n < FILE_COPY_MIN {
        return None;
    }
    let r = find(inner, addr)?;
    let RegionKind::Mapped { handle, offset } = r.kind else {
        return None;
    };
    let physical = inner.physical.get(&handle)?;
    Some((&physical.fd, offset + (addr - r.start), r.end() - addr))
}

/// The registered range containing `addr`.
fn find(inner: &Inner, addr: u64) -> Option<&Region> {
    inner
        .regions
        .range(..=addr)
        .next_back()
        .map(|(_, r)| r)
        .filter(|r| addr < r.end())
}

thread_local! {
    /// Bytes of host-located memory a kernel on this thread touched, while counting.
    static HOST_ACCESS: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

impl AddressSpace {
    /// Runs `kernel` (a twin, accessing memory through [`DeviceMemory`]) and returns what it
    /// returned with the bytes it read or wrote in host-located memory.
    pub fn counting_host_access<R>(&self, kernel: impl FnOnce() -> R) -> (R, u64) {
        HOST_ACCESS.with(|c| c.set(Some(0)));
        let result = kernel();
        let bytes = HOST_ACCESS.with(|c| c.take()).unwrap_or(0);
        (result, bytes)
    }

    /// Adds the host-located bytes of `[addr, addr + len)` to this thread's count, if counting.
    fn note_kernel_access(&self, addr: u64, len: u64) {
        if HOST_ACCESS.with(|c| c.get()).is_none() {
            return;
        }
        let inner = self.read_lock();
        let end = addr.saturating_add(len);
        let mut cursor = addr;
        let mut host = 0;
        while cursor < end {
            let Some(r) = find(&inner, cursor) else { break };
            let upto = r.end().min(end);
            let on_host = match r.kind {
                RegionKind::HostPinned { .. } | RegionKind::HostRegistered => true,
                RegionKind::Mapped { handle, .. } => inner
                    .physical
                    .get(&handle)
                    .is_some_and(|p| p.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE),
                RegionKind::Linear { .. } => false,
            };
            if on_host {
                host += upto - cursor;
            }
            cursor = upto;
        }
        HOST_ACCESS.with(|c| c.set(c.get().map(|n| n + host)));
    }
}

impl DeviceMemory for AddressSpace {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.note_kernel_access(addr, buf.len() as u64);
        // SAFETY: `buf` is valid for writes of its length.
        unsafe { self.read_to_host(addr, buf.as_mut_ptr(), buf.len()) }
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.note_kernel_access(addr, data.len() as u64);
        // SAFETY: `data` is valid for reads of its length.
        unsafe { self.write_from_host(addr, data.as_ptr(), data.len()) }
    }
}
