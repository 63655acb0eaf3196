//! A new allocation's first backing, mapped without the lock. Backing a new allocation costs
//! VMM calls: its device units (or host frames) mapped at its pages and the access call, and,
//! at the budget, the unmap of the dead unit whose frames it takes (85 to 200 µs together on
//! the H100). ResNet-50 makes 846 allocations a step; made with the manager's lock held, those
//! calls kept every launch and the swap threads waiting (docs/rerun.md, "Session 25"). So, as
//! for swap-ins (`arrival.rs`), the backing is decided under the lock ([`Inner::alloc`]: the
//! frames taken, the dead units dropped for them), made without it ([`FirstBacking::run`])
//! and committed under it again ([`Inner::commit_first_backing`]: the pages hold their frames
//! in the table).
//!
//! Meanwhile the pages whose addresses are being mapped or unmapped are in `Inner::mapping`:
//! `Unbacked` in the table (the allocation's, and those of the dead units its frames come
//! from), but not yet as the table will say. Nothing else looks at unbacked pages except an
//! allocation landing on them, which waits for the commit (`remap_stall`) and starts over:
//! small allocations share pages, and two threads may allocate at once. The allocation is
//! not returned before the commit, so no application work can touch its pages before they
//! are mapped (invariant 2 holds for every allocation the application holds).

use std::collections::HashSet;
use std::sync::Arc;

use tensile_driver_abi::{CUdeviceptr, CUresult};

use crate::memory::driver::Driver;
use crate::memory::frames::DevFrame;
use crate::memory::page::Frame;

use super::backing::{map_and_give_access, Mapping};
use super::Inner;

/// A dead device unit dropped for its frames, whose unmap is left to the operation that
/// took them ([`Inner::unback_for_reuse`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct DeadUnmap {
    /// Its first page and size in pages.
    pub(super) page: usize,
    pub(super) pages: usize,
    /// Its first frame (the unit).
    pub(super) first: DevFrame,
}

impl DeadUnmap {
    /// The unit's pages.
    fn span(&self) -> std::ops::Range<usize> {
        self.page..self.page + self.pages
    }
}

/// A new allocation's backing whose driver calls are made without the lock (see the module
/// docs).
#[must_use = "run and commit it, or the allocation's pages stay unmapped"]
pub(super) struct FirstBacking {
    /// The allocation, returned once committed (undone if the calls failed).
    ptr: CUdeviceptr,
    /// The pages mapped and their frames (device frames of whole units in page order).
    plan: Vec<(usize, Frame)>,
    /// Dead units whose frames are in `plan`: unmapped first.
    unmaps: Vec<DeadUnmap>,
    maps: Vec<Mapping>,
    access: Vec<(CUdeviceptr, usize)>,
    driver: Arc<dyn Driver>,
    base: CUdeviceptr,
    page: usize,
    device: i32,
}

/// What [`FirstBacking::run`] managed.
#[derive(Debug, Clone, Copy)]
pub(super) struct FirstBackingOutcome {
    /// The first `unmapped` dead units were unmapped.
    unmapped: usize,
    /// The driver error that stopped it, if one did (the maps made are undone by then).
    error: Option<CUresult>,
}

impl FirstBacking {
    /// The allocation, for a backing with nothing to do.
    pub(super) fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Whether there is no driver call to make (every page was backed already).
    pub(super) fn is_empty(&self) -> bool {
        self.plan.is_empty() && self.unmaps.is_empty()
    }

    /// Unmaps the dead units, then maps the frames and gives access (a failure undoes its
    /// own maps). Called without the manager's lock.
    pub(super) fn run(&self) -> FirstBackingOutcome {
        let driver = &*self.driver;
        let mut outcome = FirstBackingOutcome {
            unmapped: 0,
            error: None,
        };
        for u in &self.unmaps {
            let va = self.base + (u.page * self.page) as u64;
            if let Err(e) = driver.mem_unmap(va, u.pages * self.page) {
                outcome.error = Some(e);
                return outcome;
            }
            outcome.unmapped += 1;
        }
        outcome.error = map_and_give_access(driver, &self.maps, &self.access, self.device).err();
        outcome
    }
}

impl Inner {
    /// The backing of the allocation at `ptr`: `plan`'s pages get their frames, after the
    /// unmaps of the dead units dropped for them. Marks the pages `mapping` and keeps the
    /// frames for the audit until the commit.
    pub(super) fn begin_first_backing(
        &mut self,
        ptr: CUdeviceptr,
        plan: Vec<(usize, Frame)>,
    ) -> FirstBacking {
        let (maps, access) = self.map_calls(&plan);
        // A dead unit whose frames went back (a failed eviction round gives back what it
        // took) is free in the pool, and may be mapped elsewhere once the lock is released:
        // its unmap is made now.
        let (unmaps, given_back): (Vec<DeadUnmap>, Vec<DeadUnmap>) =
            std::mem::take(&mut self.dead_unmaps)
                .into_iter()
                .partition(|u| plan.iter().any(|&(_, f)| f == Frame::Device(u.first)));
        for u in &unmaps {
            // Owned by this backing until its unmap is made (or, if that fails, by its pages
            // again): never free and mapped.
            self.dev.set_still_mapped(u.first, false);
        }
        for u in given_back {
            self.unmap_dead_unit_now(u);
        }
        self.mapping.extend(plan.iter().map(|&(p, _)| p));
        self.backing_frames.extend(plan.iter().map(|&(_, f)| f));
        FirstBacking {
            ptr,
            plan,
            unmaps,
            maps,
            access,
            driver: self.driver.clone(),
            base: self.base,
            page: self.page,
            device: self.cfg.device,
        }
    }

    /// Commits what [`FirstBacking::run`] did: the pages hold their frames and the allocation
    /// is returned; or, if a call failed, the frames go back (a dead unit not unmapped back
    /// to its pages), the allocation is undone and the driver's error returned.
    pub(super) fn commit_first_backing(
        &mut self,
        b: FirstBacking,
        outcome: FirstBackingOutcome,
    ) -> Result<CUdeviceptr, CUresult> {
        self.remaps_committed += 1;
        for &(p, _) in &b.plan {
            self.mapping.remove(&p);
        }
        for u in &b.unmaps {
            for q in u.span() {
                self.mapping.remove(&q);
            }
        }
        let held: HashSet<Frame> = b.plan.iter().map(|&(_, f)| f).collect();
        self.backing_frames.retain(|f| !held.contains(f));
        let Some(error) = outcome.error else {
            for &(p, f) in &b.plan {
                let r = match f {
                    Frame::Device(d) => self.pages.back_device(p, d),
                    Frame::Host(h) => self.pages.back_host(p, h),
                };
                debug_assert!(r.is_ok(), "{r:?}");
                let dead = self.pages.get(p).is_some_and(|e| e.live == 0);
                if matches!(f, Frame::Device(_)) && dead {
                    self.dead_device.insert(p);
                }
            }
            self.note_resident();
            return Ok(b.ptr);
        };
        tracing::debug!(
            code = error,
            pages = b.plan.len(),
            "a new allocation's map calls failed; it is undone"
        );
        for &(_, f) in &b.plan {
            self.give_frame(f);
        }
        for u in &b.unmaps[outcome.unmapped..] {
            self.restore_dead_unit(u);
        }
        self.undo_alloc(b.ptr);
        Err(error)
    }

    /// Makes the unmaps left for later now, with the lock held: the operation that took
    /// the units' frames failed and gave them back.
    pub(super) fn unmap_dead_now(&mut self) {
        for u in std::mem::take(&mut self.dead_unmaps) {
            self.unmap_dead_unit_now(u);
        }
    }

    fn unmap_dead_unit_now(&mut self, u: DeadUnmap) {
        let r = self.driver.mem_unmap(self.va(u.page), u.pages * self.page);
        // Unmapped, or (if that failed) its pages' again.
        self.dev.set_still_mapped(u.first, false);
        for q in u.span() {
            self.mapping.remove(&q);
        }
        if let Err(code) = r {
            tracing::debug!(code, "unmapping a dead unit failed; it stays where it was");
            self.restore_dead_unit(&u);
        }
    }

    /// A dead unit whose unmap was not made is still mapped at its pages: they hold it again,
    /// dead, as before it was dropped. Its frames must be free.
    fn restore_dead_unit(&mut self, u: &DeadUnmap) {
        if !self.dev.take_free_unit_at(u.first) {
            debug_assert!(false, "dead unit {u:?} not free to restore");
            return;
        }
        for (i, q) in u.span().enumerate() {
            let frame = DevFrame {
                unit: u.first.unit,
                offset: i as u32,
            };
            let r = self.pages.back_device(q, frame);
            debug_assert!(r.is_ok(), "{r:?}");
            self.dead_device.insert(q);
        }
    }
}
