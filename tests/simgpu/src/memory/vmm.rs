//! Virtual memory management on host memory: reservations, physical allocations (`memfd`s),
//! mappings and access rights, with the CUDA driver's rules for each.
//!
//! A physical allocation's bytes live in its `memfd`, so unmapping a range and mapping the same
//! handle elsewhere (or mapping a host-located handle where a device one was) keeps the data,
//! as on the GPU. Map and unmap happen when called, not in stream order.
//!
//! Stricter than the driver in one documented way: `cuMemAddressFree` of a reservation that
//! still has mappings is refused (`CUDA_ERROR_INVALID_VALUE`) rather than unmapping them.

use tensile_driver_abi::*;

use crate::config::granularity;

use super::{find, os_err, Access, AddressSpace, Inner, Physical, Region, RegionKind};
use crate::os::{self, MemFd};

fn aligned(v: u64) -> bool {
    v.is_multiple_of(granularity())
}

/// Index into [`VmmCosts`]' pairs: 0 for device memory, 1 for host memory.
fn side(location: &CUmemLocation) -> usize {
    usize::from(location.type_ != CU_MEM_LOCATION_TYPE_DEVICE)
}

/// Holds the calling thread until a VMM call made at `start` has taken its modelled cost
/// (`cost.ns` at factor 1, see `TENSILE_SIM_VMM_TIME`), after the call's locks are released:
/// the card's driver does this work on the caller's CPU. The simulator's own work for the
/// call (its lock, the host mappings behind it) counts toward that time, as the driver's does
/// toward the card's: held from the end of that work instead, the MLP's planned swap-outs
/// took 59 µs a page against the 43 µs of calls modelled (docs/rerun.md, "Session 27"). It
/// sleeps what is left less how late sleeps wake here, and spins the rest
/// ([`crate::card::wait_out`]). `call` names it for the call counts (`crate::calls::vmm_held`,
/// which counts the whole call).
fn hold(cost: Held, call: &'static str, start: std::time::Instant) {
    let d = crate::config::vmm_duration(cost.ns);
    if d.is_zero() {
        return;
    }
    crate::card::wait_out(|| left_to_hold(start, d, std::time::Instant::now()));
    let held = start.elapsed().as_nanos() as u64;
    crate::calls::vmm_held(
        call,
        cost.host,
        cost.mappings,
        cost.pages,
        d.as_nanos() as u64,
        held,
    );
}

/// How much longer a call made at `start` whose modelled cost is `d` holds its caller at
/// `now`: what is left of `d`, nothing once the call's own work took longer.
fn left_to_hold(
    start: std::time::Instant,
    d: std::time::Duration,
    now: std::time::Instant,
) -> std::time::Duration {
    (start + d).saturating_duration_since(now)
}

/// What an access or unmap call over `regions` costs and covers ([`Held`]): per distinct
/// mapping, `per` plus `per_page` for each page of its allocation (by the allocation's side).
fn per_mapping(inner: &Inner, regions: &[Region], per: [u64; 2], per_page: [u64; 2]) -> Held {
    let mut last: Option<(u64, u64)> = None;
    let mut held = Held::default();
    for r in regions {
        if let RegionKind::Mapped { handle, offset } = r.kind {
            // A mapping split by `cuMemSetAccess` shows as several regions of one mapping:
            // consecutive regions of one handle at consecutive offsets count once.
            let continues = last.is_some_and(|(h, end)| h == handle && end == offset);
            last = Some((handle, offset + r.len));
            if continues {
                continue;
            }
            let (s, pages) = inner
                .physical
                .get(&handle)
                .map_or((0, 0), |p| (side(&p.location), p.size / granularity()));
            held.ns += per[s] + per_page[s] * pages;
            held.host |= s == 1 && held.mappings == 0;
            held.mappings += 1;
            held.pages += pages;
        }
    }
    held
}

/// A VMM call's modelled cost (`ns` at factor 1), and what it covers for the call counts: the
/// mappings (or allocations) and their pages, and whether the first is of host memory.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    ns: u64,
    mappings: u64,
    pages: u64,
    host: bool,
}

impl Held {
    /// One allocation of `bytes` on `side` costing `ns`.
    fn one(ns: u64, side: usize, bytes: u64) -> Self {
        Held {
            ns,
            mappings: 1,
            pages: bytes / granularity(),
            host: side == 1,
        }
    }
}

fn prot(access: Access) -> i32 {
    match access {
        Access::None => libc::PROT_NONE,
        Access::Read => libc::PROT_READ,
        Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
    }
}

/// Checks a location a physical allocation may live at; returns whether it is a device.
pub fn check_location(loc: &CUmemLocation) -> Result<bool, CUresult> {
    match loc.type_ {
        CU_MEM_LOCATION_TYPE_DEVICE
            if loc.id >= 0 && (loc.id as usize) < crate::config::device_count() =>
        {
            Ok(true)
        }
        CU_MEM_LOCATION_TYPE_DEVICE => Err(CUDA_ERROR_INVALID_DEVICE),
        CU_MEM_LOCATION_TYPE_HOST_NUMA if loc.id == 0 => Ok(false),
        CU_MEM_LOCATION_TYPE_HOST => Ok(false),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

impl Inner {
    /// The reservation holding all of `[addr, addr + len)`.
    fn reservation_of(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        let (&start, &rlen) = self.reservations.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        (end <= start + rlen).then_some((start, rlen))
    }

    /// Regions intersecting `[addr, end)`, in address order.
    fn regions_in(&self, addr: u64, end: u64) -> Vec<Region> {
        let first = find(self, addr).map_or(addr, |r| r.start);
        self.regions.range(first..end).map(|(_, r)| *r).collect()
    }

    /// Drops one mapping or reference of `handle`; frees it (and uncharges it) when none remain.
    fn unref(&mut self, handle: u64, mapping: bool) {
        let Some(p) = self.physical.get_mut(&handle) else {
            return;
        };
        if mapping {
            p.maps -= 1;
        } else {
            p.refs -= 1;
        }
        if p.maps == 0 && p.refs == 0 {
            let (device, charged) = (p.location.id as usize, p.charged);
            self.physical.remove(&handle);
            self.uncharge(device, charged);
        }
    }

    /// Splits the mapping containing `at` so that a region starts at `at`.
    fn split_at(&mut self, at: u64) {
        let Some(r) = find(self, at).copied() else {
            return;
        };
        let RegionKind::Mapped { handle, offset } = r.kind else {
            return;
        };
        if r.start == at {
            return;
        }
        let head = Region {
            len: at - r.start,
            ..r
        };
        let tail = Region {
            start: at,
            len: r.end() - at,
            kind: RegionKind::Mapped {
                handle,
                offset: offset + (at - r.start),
            },
            ..r
        };
        self.regions.insert(head.start, head);
        self.regions.insert(tail.start, tail);
        if let Some(p) = self.physical.get_mut(&handle) {
            p.maps += 1;
        }
    }
}

impl AddressSpace {
    /// `cuMemAddressReserve`.
    pub fn reserve(&self, size: u64, align: u64, hint: u64) -> Result<u64, CUresult> {
        if size == 0 || !aligned(size) || (align != 0 && !align.is_power_of_two()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = align.max(granularity());
        let hint = if hint.is_multiple_of(align) { hint } else { 0 };
        let mut inner = self.write_lock();
        let start = os::reserve(size, align, hint).map_err(os_err)?;
        inner.reservations.insert(start, size);
        Ok(start)
    }

    /// `cuMemAddressFree`: the whole reservation, with nothing mapped in it.
    pub fn address_free(&self, ptr: u64, size: u64) -> Result<(), CUresult> {
        let _os = self.vmm_os_lock();
        let mut inner = self.write_lock();
        if inner.reservations.get(&ptr) != Some(&size)
            || !inner.regions_in(ptr, ptr + size).is_empty()
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        inner.reservations.remove(&ptr);
        os::unmap(ptr, size);
        Ok(())
    }

    /// `cuMemCreate`: a physical allocation at `location`, exportable as `handle_types`;
    /// device memory counts against capacity.
    pub fn create(
        &self,
        size: u64,
        location: CUmemLocation,
        handle_types: u32,
    ) -> Result<u64, CUresult> {
        let start = std::time::Instant::now();
        let on_device = check_location(&location)?;
        if size == 0 || !aligned(size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut inner = self.write_lock();
        let charged = if on_device { size } else { 0 };
        let device = if on_device { location.id as usize } else { 0 };
        self.charge(&mut inner, device, charged)?;
        let fd = match MemFd::create(size) {
            Ok(fd) => fd,
            Err(e) => {
                inner.uncharge(device, charged);
                return Err(os_err(e));
            }
        };
        let handle = inner.next_handle;
        inner.next_handle += 1;
        let costs = crate::config::VmmCosts::SIMULATED;
        let cost = if on_device {
            costs.create_ns[0]
        } else {
            costs.create_ns[1] * (size / granularity())
        };
        inner.physical.insert(
            handle,
            Physical {
                fd,
                size,
                location,
                charged,
                refs: 1,
                maps: 0,
                handle_types,
            },
        );
        drop(inner);
        hold(
            Held::one(cost, usize::from(!on_device), size),
            "cuMemCreate",
            start,
        );
        Ok(handle)
    }

    /// `cuMemExportToShareableHandle` as a POSIX file descriptor: a new descriptor of the
    /// allocation's memfd, owned by the caller. Refused (`CUDA_ERROR_INVALID_VALUE`, as the
    /// driver does) unless the allocation was created with that handle type requested.
    pub fn export_fd(&self, handle: u64) -> Result<std::os::fd::OwnedFd, CUresult> {
        let inner = self.read_lock();
        match inner.physical.get(&handle) {
            Some(p)
                if p.refs > 0 && p.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR != 0 =>
            {
                p.fd.duplicate().map_err(os_err)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemImportFromShareableHandle` of a POSIX file descriptor exported by
    /// [`Self::export_fd`] (in this process or another): a new physical allocation of the
    /// same memory, on device `device`. The caller keeps its descriptor (the driver does
    /// not take it over). Charged nothing: the exporter's allocation already holds the
    /// memory, on a shared card as on one of the process's own (an allocation the exporter
    /// released while it is still imported is then held uncharged).
    pub fn import_fd(&self, fd: std::os::fd::BorrowedFd<'_>, device: i32) -> Result<u64, CUresult> {
        let fd = MemFd::duplicate_of(fd).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let size = fd.size().map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if size == 0 || !aligned(size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut inner = self.write_lock();
        let handle = inner.next_handle;
        inner.next_handle += 1;
        inner.physical.insert(
            handle,
            Physical {
                fd,
                size,
                location: CUmemLocation {
                    type_: CU_MEM_LOCATION_TYPE_DEVICE,
                    id: device,
                },
                charged: 0,
                refs: 1,
                maps: 0,
                handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            },
        );
        Ok(handle)
    }

    /// `cuMemRelease`: the memory goes when it is also unmapped everywhere.
    pub fn release(&self, handle: u64) -> Result<(), CUresult> {
        let start = std::time::Instant::now();
        let mut inner = self.write_lock();
        let cost = match inner.physical.get(&handle) {
            Some(p) if p.refs > 0 => {
                let s = side(&p.location);
                Held::one(crate::config::VmmCosts::SIMULATED.release_ns[s], s, p.size)
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        inner.unref(handle, false);
        drop(inner);
        hold(cost, "cuMemRelease", start);
        Ok(())
    }

    /// `cuMemMap`: maps all of `handle` at `ptr`, inaccessible until `cuMemSetAccess`.
    ///
    /// Only a whole allocation, from offset 0, as the CUDA 13.0 driver does: on the H200
    /// (driver 580.159.04) a `cuMemMap` of 2 MiB of a 64 MiB allocation failed with
    /// `CUDA_ERROR_NOT_SUPPORTED`, which the shim then returned from PyTorch's first
    /// allocations (docs/gpu-results.md). The documented `offset` "must be zero".
    pub fn map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> Result<(), CUresult> {
        let start = std::time::Instant::now();
        if size == 0 || !aligned(ptr) || !aligned(size) || !aligned(offset) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let _os = self.vmm_os_lock();
        let mut inner = self.write_lock();
        let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let phys = match inner.physical.get(&handle) {
            Some(p) if p.refs > 0 => p,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        if offset.checked_add(size).is_none_or(|e| e > phys.size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if inner.reservation_of(ptr, size).is_none() || !inner.regions_in(ptr, end).is_empty() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if offset != 0 || size != phys.size {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let s = side(&phys.location);
        let cost = Held::one(crate::config::VmmCosts::SIMULATED.map_ns[s], s, size);
        os::map_fd_fixed(ptr, size, &phys.fd, offset).map_err(os_err)?;
        let kind = RegionKind::Mapped { handle, offset };
        inner.regions.insert(
            ptr,
            Region {
                start: ptr,
                len: size,
                kind,
                access: Access::None,
                ctx: 0,
            },
        );
        if let Some(p) = inner.physical.get_mut(&handle) {
            p.maps += 1;
        }
        drop(inner);
        hold(cost, "cuMemMap", start);
        Ok(())
    }

    /// `cuMemUnmap`: the range must consist of whole mappings, back to back.
    pub fn unmap(&self, ptr: u64, size: u64) -> Result<(), CUresult> {
        let start = std::time::Instant::now();
        if size == 0 || !aligned(ptr) || !aligned(size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let os = self.vmm_os_lock();
        let mut inner = self.write_lock();
        let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if inner.reservation_of(ptr, size).is_none() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let regions = inner.regions_in(ptr, end);
        let mut cursor = ptr;
        for r in &regions {
            if r.start != cursor || !matches!(r.kind, RegionKind::Mapped { .. }) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            cursor = r.end();
        }
        if cursor != end {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = crate::config::VmmCosts::SIMULATED;
        let cost = per_mapping(&inner, &regions, c.unmap_ns, c.unmap_page_ns);
        for r in &regions {
            inner.regions.remove(&r.start);
            if let RegionKind::Mapped { handle, .. } = r.kind {
                inner.unref(handle, true);
            }
        }
        drop(inner);
        // The range has left the table, so no copy or kernel reaches its pages any more, and
        // `os` keeps it from being mapped again until its pages are gone.
        let reset = os::reset_to_reserved(ptr, size).map_err(os_err);
        drop(os);
        reset?;
        hold(cost, "cuMemUnmap", start);
        Ok(())
    }

    /// `cuMemSetAccess`: the range must be fully mapped; `access` is what the device gets.
    pub fn set_access(&self, ptr: u64, size: u64, access: Access) -> Result<(), CUresult> {
        let start = std::time::Instant::now();
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut inner = self.write_lock();
        let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut cursor = ptr;
        let regions = inner.regions_in(ptr, end);
        for r in &regions {
            if r.start > cursor || !matches!(r.kind, RegionKind::Mapped { .. }) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            cursor = r.end();
        }
        if cursor < end {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = crate::config::VmmCosts::SIMULATED;
        let cost = per_mapping(&inner, &regions, c.access_ns, c.access_page_ns);
        inner.split_at(ptr);
        inner.split_at(end);
        let starts: Vec<u64> = inner.regions.range(ptr..end).map(|(s, _)| *s).collect();
        for s in starts {
            if let Some(r) = inner.regions.get_mut(&s) {
                os::protect(r.start, r.len, prot(access)).map_err(os_err)?;
                r.access = access;
            }
        }
        drop(inner);
        hold(cost, "cuMemSetAccess", start);
        Ok(())
    }

    /// `cuMemGetAccess` for the device: the access of the mapping containing `ptr`.
    pub fn get_access(&self, ptr: u64) -> Result<Access, CUresult> {
        let inner = self.read_lock();
        match find(&inner, ptr) {
            Some(r) if matches!(r.kind, RegionKind::Mapped { .. }) => Ok(r.access),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// (location, size, requested handle types) of a live physical allocation.
    pub fn properties(&self, handle: u64) -> Result<(CUmemLocation, u64, u32), CUresult> {
        let inner = self.read_lock();
        match inner.physical.get(&handle) {
            Some(p) if p.refs > 0 => Ok((p.location, p.size, p.handle_types)),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemRetainAllocationHandle`: the handle mapped at `addr`, with one more reference.
    pub fn retain_handle(&self, addr: u64) -> Result<u64, CUresult> {
        let mut inner = self.write_lock();
        let handle = match find(&inner, addr) {
            Some(Region {
                kind: RegionKind::Mapped { handle, .. },
                ..
            }) => *handle,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        if let Some(p) = inner.physical.get_mut(&handle) {
            p.refs += 1;
        }
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::left_to_hold;

    #[test]
    fn a_call_is_held_for_its_modelled_time_from_when_it_was_made() {
        let start = Instant::now();
        let modelled = Duration::from_micros(500);
        // The simulator's own work took 200 µs of the 500: 300 are left to hold.
        assert_eq!(
            left_to_hold(start, modelled, start + Duration::from_micros(200)),
            Duration::from_micros(300)
        );
        // Work longer than the modelled time is not held on top of.
        assert_eq!(
            left_to_hold(start, modelled, start + Duration::from_micros(900)),
            Duration::ZERO
        );
        assert_eq!(left_to_hold(start, modelled, start), modelled);
    }
}
