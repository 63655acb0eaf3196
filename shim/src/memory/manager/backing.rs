//! Backing and mapping: giving pages frames and mapping them at their addresses, dropping
//! dead pages' frames without a copy, mapping `Host` pages back after a failed driver call,
//! and releasing everything at shutdown. Mechanism only: which frames to take is decided
//! by the callers (allocation, eviction, swapping).

use tensile_driver_abi::{
    CUdeviceptr, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
};

use crate::memory::driver::{Driver, PhysHandle};
use crate::memory::failures::{human_bytes, FailureCause};
use crate::memory::frames::{DevFrame, HostFrame, HostPoolError};
use crate::memory::page::{Frame, PageEntry, ResidencyState};
use crate::memory::stats::Demand;

use super::first_backing::DeadUnmap;
use super::{runs, HostWant, Inner};

/// What [`Inner::take_host_unit`] found.
pub(super) enum HostUnit {
    /// A unit: its first frame.
    Got(HostFrame),
    /// None to be had: take single frames.
    Singles,
    /// None now: stop the eviction there (it is being made).
    Stop,
}

impl Inner {
    pub(super) fn give_frame(&mut self, f: Frame) {
        match f {
            Frame::Device(d) => self.dev.give(d),
            Frame::Host(h) => self.host.give(h),
        }
    }

    /// Maps each `(page, frame)` at the page's address: a device unit once, whole, at the page
    /// of its first frame (every frame of it must be in `plan`, at consecutive pages, in
    /// order), a host frame on its own (a host frame is an allocation of its own); then sets
    /// access in contiguous runs (one call may span several mappings). Undoes its own maps
    /// on failure.
    pub(super) fn map_batch(&mut self, plan: &[(usize, Frame)]) -> Result<(), CUresult> {
        let (maps, access) = self.map_calls(plan);
        map_and_give_access(&*self.driver, &maps, &access, self.cfg.device)
    }

    /// The calls [`Self::map_batch`] makes for `plan`: the mappings (address, bytes,
    /// allocation) and the ranges given access.
    pub(super) fn map_calls(
        &self,
        plan: &[(usize, Frame)],
    ) -> (Vec<Mapping>, Vec<(CUdeviceptr, usize)>) {
        let page = self.page;
        let mut pages: Vec<usize> = plan.iter().map(|&(p, _)| p).collect();
        pages.sort_unstable();
        let mut maps: Vec<Mapping> = Vec::new();
        for &(p, f) in plan {
            let (h, bytes) = match f {
                Frame::Device(d) if d.offset != 0 => continue,
                Frame::Device(d) => {
                    let (h, n) = self.dev.unit(d);
                    debug_assert!(
                        (1..n).all(|i| plan.iter().any(|&(q, g)| q == p + i
                            && g == Frame::Device(DevFrame {
                                unit: d.unit,
                                offset: i as u32
                            }))),
                        "unit {d:?} not whole in a map batch"
                    );
                    (h, n * page)
                }
                Frame::Host(hf) => {
                    let (first, n) = self.host.unit_of(hf);
                    if hf != first {
                        continue;
                    }
                    debug_assert!(
                        (1..n)
                            .all(|i| plan.iter().any(|&(q, g)| q == p + i
                                && g == Frame::Host(HostFrame(first.0 + i as u32)))),
                        "host unit {first:?} not whole in a map batch"
                    );
                    (self.host.location(hf).0, n * page)
                }
            };
            maps.push((self.va(p), bytes, h));
        }
        let access: Vec<(CUdeviceptr, usize)> = runs(&pages)
            .into_iter()
            .map(|(a, b)| (self.va(a), (b - a + 1) * page))
            .collect();
        (maps, access)
    }

    /// Removes the host mappings of `pages` (all `Host`). Every page whose mapping this
    /// removed is in `unmapped_host` afterwards, also when it fails part way.
    /// A host unit's mapping goes whole: its other pages are unmapped (and noted) with it.
    pub(super) fn unmap_host_pages(&mut self, pages: &[usize]) -> Result<(), CUresult> {
        for &p in pages {
            if self.unmapped_host.contains(&p) {
                continue;
            }
            let (a, n) = self.host_unit_span(p).unwrap_or((p, 1));
            self.driver.mem_unmap(self.va(a), n * self.page)?;
            self.unmapped_host.extend(a..a + n);
        }
        Ok(())
    }

    pub(super) fn note_resident(&mut self) {
        let resident = (self.dev.created_frames() - self.dev.free_frames()) * self.page;
        self.stats.peak_resident_bytes = self.stats.peak_resident_bytes.max(resident as u64);
    }

    /// A free host frame. `ahead`: for an eviction ahead of need, which rather stops than
    /// waits for the pool's grower.
    pub(super) fn take_host(&mut self, ahead: bool) -> Result<HostFrame, CUresult> {
        let stop_if_none = ahead && self.host.grows_in_background();
        if self.op.host_rounds_left > 0 || stop_if_none {
            match self.host.try_take() {
                Ok(Some(h)) => return Ok(h),
                // None free yet: the grower was asked for more.
                Ok(None) if stop_if_none => return Err(CUDA_ERROR_OUT_OF_MEMORY),
                Ok(None) => {
                    // The caller has the pool grow without the lock.
                    self.op.host_rounds_left -= 1;
                    self.host_wanted = Some(HostWant::Frames);
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                // At the cap: dead pages' frames, below, or the failure.
                Err(_) => {}
            }
        }
        match self.host.take() {
            Ok(h) => Ok(h),
            Err(first) => {
                // Dead host pages hold nothing anyone can ask for: take theirs.
                if self.reclaim_dead_host()? {
                    if let Ok(h) = self.host.take() {
                        return Ok(h);
                    }
                }
                Err(match first {
                    HostPoolError::CapReached { cap_bytes } => self.failures.record(
                        FailureCause::HostPool,
                        format_args!(
                            "the pinned host pool is full ({}, TENSILE_HOST_MEMORY)",
                            human_bytes(cap_bytes)
                        ),
                    ),
                    HostPoolError::Driver(code) => self.failures.record(
                        FailureCause::HostPool,
                        format_args!("the driver refused pinned host memory (error {code})"),
                    ),
                })
            }
        }
    }

    /// A host unit of `pages` frames for pages leaving the device together: a free one;
    /// else, for an eviction ahead of need (`ahead`), the pool's grower is asked for one and
    /// the eviction stops there; else one pinned now, without the lock where the caller may
    /// release it (`host_wanted` set: the operation stops and its caller pins the unit and
    /// starts it over) and with it otherwise (single frames if it cannot be had).
    pub(super) fn take_host_unit(&mut self, pages: usize, ahead: bool) -> HostUnit {
        if let Some(first) = self.host.take_free_unit(pages) {
            return HostUnit::Got(first);
        }
        if ahead && self.host.request_unit(pages) {
            return HostUnit::Stop;
        }
        if self.demand == Demand::Budget && self.host.free_single_frames() >= pages {
            // A shrink takes free frames (left by earlier swaps) rather than pin a unit now
            // (about 0.4 ms a page on the card, ten times the copy); consecutive frames still
            // map as one.
            return HostUnit::Singles;
        }
        if self.host_round() {
            self.host_wanted = Some(HostWant::Unit(pages));
            return HostUnit::Stop;
        }
        match self.host.take_unit(pages) {
            Some(first) => HostUnit::Got(first),
            None => HostUnit::Singles,
        }
    }

    pub(super) fn reclaim_dead_host(&mut self) -> Result<bool, CUresult> {
        let completed = self.fences.completed().to_vec();
        let dead_idle = |e: &PageEntry| {
            e.live == 0 && matches!(e.state, ResidencyState::Host(_)) && e.is_idle(&completed)
        };
        let dead: Vec<usize> = self
            .pages
            .iter()
            .filter(|&(p, e)| dead_idle(e) && !self.arriving.contains(&p))
            .map(|(p, _)| p)
            .collect();
        // Whole host units only: a unit is unmapped whole.
        let dead = self.whole_host_units(dead, dead_idle);
        let r = self.unback_host_pages(&dead, &completed);
        self.remap_host();
        r.map(|()| !dead.is_empty())
    }

    /// Drops `pages` (`Host`, dead and idle, whole host units), unmapping them first in one
    /// go. Pages a failure leaves unmapped come back through `remap_host`.
    pub(super) fn unback_host_pages(
        &mut self,
        pages: &[usize],
        completed: &[u64],
    ) -> Result<(), CUresult> {
        self.unmap_host_pages(pages)?;
        for &p in pages {
            if matches!(
                self.pages.get(p).map(|e| e.state),
                Some(ResidencyState::Host(_))
            ) {
                self.unback(p, completed)?;
            }
        }
        Ok(())
    }

    /// Drops page `p` (no live allocation, idle) without a copy: a host page alone, a device
    /// page with the rest of its unit, which must be dead and idle too.
    pub(super) fn unback(&mut self, p: usize, completed: &[u64]) -> Result<(), CUresult> {
        self.unback_unmapping(p, completed, false)
    }

    /// [`Self::unback`] of a device unit whose frames the operation running now takes at
    /// once, its unmap left to the VMM calls that operation makes without the lock
    /// (`first_backing.rs`): the unit's pages are `Unbacked` in the table from now, and in
    /// `mapping` until that unmap is made. Unmapped now where the operation makes none.
    pub(super) fn unback_for_reuse(&mut self, p: usize, completed: &[u64]) -> Result<(), CUresult> {
        self.unback_unmapping(p, completed, self.defer_dead_unmaps)
    }

    fn unback_unmapping(
        &mut self,
        p: usize,
        completed: &[u64],
        later: bool,
    ) -> Result<(), CUresult> {
        let dead_idle = |e: &PageEntry| {
            e.live == 0
                && e.is_idle(completed)
                && matches!(e.state, ResidencyState::Device(_) | ResidencyState::Host(_))
        };
        if !self.pages.get(p).is_some_and(dead_idle) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let on_host = matches!(
            self.pages.get(p).map(|e| e.state),
            Some(ResidencyState::Host(_))
        );
        let (a, n) = if on_host {
            self.host_unit_span(p).unwrap_or((p, 1))
        } else {
            self.unit_span(p).ok_or(CUDA_ERROR_INVALID_VALUE)?
        };
        if !self.span_all((a, n), dead_idle) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Unmap first: if that fails the pages keep their frames and stay consistent.
        if on_host {
            self.unmap_host_pages(&[a])?;
            for q in a..a + n {
                self.unmapped_host.remove(&q);
            }
        } else if later {
            let first = self.pages.get(a).and_then(|e| e.state.device_frame());
            let first = first.ok_or(CUDA_ERROR_INVALID_VALUE)?;
            self.dead_unmaps.push(DeadUnmap {
                page: a,
                pages: n,
                first,
            });
            self.dev.set_still_mapped(first, true);
            self.mapping.extend(a..a + n);
        } else {
            self.driver.mem_unmap(self.va(a), n * self.page)?;
        }
        for q in a..a + n {
            match self.pages.unback(q, completed) {
                Ok(f) => {
                    self.give_frame(f);
                    self.dead_device.remove(&q);
                }
                Err(e) => debug_assert!(false, "unback after unmap refused: {e:?}"),
            }
        }
        Ok(())
    }

    /// Maps `Host` pages left unmapped by a failed driver call back to their host frames
    /// (without host mappings, [`ManagerConfig::host_mapped`], they stay unmapped).
    pub(super) fn remap_host(&mut self) {
        if self.unmapped_host.is_empty() || !self.cfg.host_mapped {
            return;
        }
        // Pages arriving are being remapped to the device by another thread (`arrival.rs`).
        let plan: Vec<(usize, Frame)> = self
            .unmapped_host
            .iter()
            .filter(|&p| !self.arriving.contains(p))
            .filter_map(|&p| match self.pages.get(p).map(|e| e.state) {
                Some(ResidencyState::Host(h)) => Some((p, Frame::Host(h))),
                _ => None,
            })
            .collect();
        match self.map_batch(&plan) {
            Ok(()) => {
                let arriving = &self.arriving;
                self.unmapped_host.retain(|p| arriving.contains(p));
            }
            Err(e) => tracing::error!(
                code = e,
                pages = plan.len(),
                "could not map swapped-out pages to host memory; retrying later"
            ),
        }
    }

    // ---- shutdown ----

    pub(super) fn shutdown(&mut self) {
        self.failures.log_summary();
        let d = self.driver.clone();
        let _ = d.stream_synchronize(self.swap_in_stream);
        let _ = d.stream_synchronize(self.swap_out_stream);
        let pages: Vec<usize> = self
            .pages
            .iter()
            .filter(|(_, e)| e.state != ResidencyState::Unbacked)
            .map(|(p, _)| p)
            .collect();
        for p in pages {
            let bytes = match self.pages.get(p).and_then(|e| e.state.device_frame()) {
                Some(f) if f.offset != 0 => continue,
                Some(f) => self.dev.unit(f).1 * self.page,
                None if self.unmapped_host.contains(&p) => continue,
                None => match self.host_unit_span(p) {
                    Some((a, _)) if a != p => continue,
                    Some((_, n)) => n * self.page,
                    None => self.page,
                },
            };
            let _ = d.mem_unmap(self.va(p), bytes);
        }
        self.dev.release_all(&*d);
        self.host.release_all();
        let _ = d.mem_address_free(self.base, self.cfg.arena_bytes / self.page * self.page);
        self.fences.destroy(&*d);
        for ev in self
            .spare_events
            .drain(..)
            .chain(self.copy_event_refs.drain().map(|(e, _)| e))
        {
            let _ = d.event_destroy(ev);
        }
        let _ = d.stream_destroy(self.swap_in_stream);
        let _ = d.stream_destroy(self.swap_out_stream);
    }
}

/// A physical allocation to map whole: (address, bytes, allocation).
pub(super) type Mapping = (CUdeviceptr, usize, PhysHandle);

/// Maps each `(address, bytes, allocation)` whole, then gives the device access to each
/// `(address, bytes)` range (one call may span several mappings); on failure undoes its own
/// maps. Touches no manager state, so it serves callers without the lock too
/// (`completion.rs`).
pub(super) fn map_and_give_access(
    driver: &dyn Driver,
    maps: &[Mapping],
    access: &[(CUdeviceptr, usize)],
    device: i32,
) -> Result<(), CUresult> {
    let mut mapped: Vec<(CUdeviceptr, usize)> = Vec::with_capacity(maps.len());
    let mut err = None;
    for &(va, bytes, handle) in maps {
        if let Err(e) = driver.mem_map(va, bytes, 0, handle) {
            err = Some(e);
            break;
        }
        mapped.push((va, bytes));
    }
    if err.is_none() {
        err = access
            .iter()
            .find_map(|&(va, bytes)| driver.mem_set_access(va, bytes, device).err());
    }
    match err {
        None => Ok(()),
        Some(e) => {
            for (va, bytes) in mapped {
                let _ = driver.mem_unmap(va, bytes);
            }
            Err(e)
        }
    }
}
