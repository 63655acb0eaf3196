//! Allocation and free: carving a new allocation out of the arena and backing its pages
//! (device frames when room can be made at once, host frames otherwise), and giving its
//! range back on free (stream-ordered). A freed page keeps its frame, dead, until something
//! needs the frame: dropping it without a copy is in `backing.rs`.

use tensile_driver_abi::{
    CUdeviceptr, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
};

use crate::memory::driver::Stream;
use crate::memory::failures::{human_bytes, FailureCause};
use crate::memory::frames::DevFrame;
use crate::memory::page::{Frame, PageEntry, ResidencyState};
use crate::memory::stats::Demand;
use crate::memory::suballoc::SubAllocError;

use super::first_backing::FirstBacking;
use super::Inner;

impl Inner {
    // ---- allocation ----

    /// Places an allocation of `size` bytes and decides its first backing, which the caller
    /// makes without the lock (`first_backing.rs`) before returning the allocation.
    pub(super) fn alloc(&mut self, size: usize, stream: Stream) -> Result<FirstBacking, CUresult> {
        self.defer_dead_unmaps = true;
        let r = self.place_and_back(size, stream);
        self.defer_dead_unmaps = false;
        if r.is_err() {
            self.unmap_dead_now();
        }
        r
    }

    fn place_and_back(&mut self, size: usize, stream: Stream) -> Result<FirstBacking, CUresult> {
        let slot = self.fences.slot_of(stream);
        if self.sub.has_pending_besides(slot) {
            // Other streams' frees are this stream's only once their fences completed: record
            // the fences they were promised, and learn which have completed (one event query
            // per stream). A stream's own frees it reuses at once, with no driver call.
            self.fences.flush(&*self.driver)?;
            self.fences.poll_all(&*self.driver)?;
        }
        let placed = match self.sub.alloc(size as u64, slot, self.fences.completed()) {
            Ok(p) => p,
            Err(SubAllocError::ZeroSize) => return Err(CUDA_ERROR_INVALID_VALUE),
            Err(_) => {
                let f = self.sub.fragmentation();
                return Err(self.failures.record(
                    FailureCause::Fragmentation,
                    format_args!(
                        "the {} arena has no room for {size} bytes ({}): {} free in {} holes, \
                         the largest {}",
                        human_bytes(self.cfg.arena_bytes),
                        human_bytes(size),
                        human_bytes(f.free_bytes as usize),
                        f.hole_count,
                        human_bytes(f.largest_hole as usize)
                    ),
                ));
            }
        };
        let a = placed.alloc;
        let Some((first, last)) = self.pages_of(a.ptr, a.span) else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        if self.mapping.range(first..=last).next().is_some()
            || self.completing.range(first..=last).next().is_some()
        {
            // Another thread maps or unmaps some of these pages without the lock (it backs an
            // allocation sharing them, drops a dead unit there, or completes a swap-out that
            // leaves dead pages unmapped): wait for its commit.
            if let Ok(a) = self.sub.remove(a.ptr) {
                self.sub.release_now(a);
            }
            self.remap_stall = true;
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.pages.ensure_len(last + 1);
        self.drop_stale_host_pages(first, last);
        if self.pages_may_move() {
            self.drop_units_reaching_past(first, last);
        }
        self.clock += 1;
        for p in first..=last {
            if let Some(e) = self.pages.entry_mut(p) {
                e.live += 1;
                e.last_access = self.clock;
            }
            self.dead_device.remove(&p);
        }
        // Back the allocation; pre-back the rest of a fresh batch while device frames last.
        let mut want: Vec<usize> = Vec::new();
        let mut optional: Vec<usize> = Vec::new();
        for p in first..=last {
            if self
                .pages
                .get(p)
                .is_some_and(|e| e.state == ResidencyState::Unbacked)
            {
                want.push(p);
            }
        }
        if let Some((gs, ge)) = placed.grown {
            let page = self.page as u64;
            for p in (gs / page) as usize..(ge / page) as usize {
                if !(first..=last).contains(&p) {
                    optional.push(p);
                }
            }
            self.pages.ensure_len((ge / page) as usize);
            for &p in &optional {
                self.dead_device.remove(&p);
            }
        }
        let ready = match self.device_frames_for_new(&want) {
            Ok(frames) => frames,
            Err(e) => {
                // Copies out are in flight: the caller waits for them without the lock and
                // starts the allocation over.
                self.undo_alloc(a.ptr);
                return Err(e);
            }
        };
        match self.back_pages(&want, ready, &optional) {
            Ok(plan) => Ok(self.begin_first_backing(a.ptr, plan)),
            Err(e) => {
                self.undo_alloc(a.ptr);
                Err(e)
            }
        }
    }

    /// Device frames for `n` pages of a new allocation, evicting to make room when none is
    /// free. A new page backed by host memory instead would be copied in at its first use,
    /// though its content is undefined, and that copy cannot be skipped: an access the shim
    /// did not see may have written the page through its host mapping. The eviction would
    /// happen at that first use anyway; made now, it saves the copy in (ResNet-50's rerun
    /// under a plan: 40% of the pages fetched on demand were such pages).
    ///
    /// Gives none, and the pages are backed by host memory as before, when the allocation is
    /// over half the budget or room cannot be made without waiting for other threads' pins.
    /// `Err` only when copies out are in flight or landed and the caller should wait for them
    /// or complete them ([`Self::acquire_device_frames`]).
    pub(super) fn device_frames_for_new(
        &mut self,
        pages: &[usize],
    ) -> Result<Vec<DevFrame>, CUresult> {
        let n = pages.len();
        if n == 0 || n > self.dev.budget_frames() / 2 {
            return Ok(Vec::new());
        }
        match self.for_demand(Demand::Allocation, |s| s.acquire_device_frames(pages)) {
            Ok(frames) => Ok(frames),
            // Frames are on their way: the caller waits for them (or completes the swap-outs
            // that free them) without the lock and tries again.
            Err(e) if self.wants_unlocked_round() => Err(e),
            Err(e) => {
                tracing::debug!(code = e, "no device room for a new allocation: host-backed");
                self.pin_stall = None;
                Ok(Vec::new())
            }
        }
    }

    /// Device units over pages `first..=last` (about to hold a new allocation) that reach past
    /// them, made for tensors since freed: a unit moves whole, so the new tensor would leave
    /// and come back with whatever later lands on the unit's other pages (and a plan's
    /// swap-out of it would take them). Where every page of such a unit is dead and idle, the
    /// unit goes (no copy: nothing on it can be read again) and the allocation's pages are
    /// backed afresh in units of their own. Units still in use stay as they are. In a steady
    /// state the same tensors land on the same pages every iteration, so this is rare.
    pub(super) fn drop_units_reaching_past(&mut self, first: usize, last: usize) {
        // The dead units reaching past the allocation.
        let mut dead: Vec<usize> = Vec::new();
        let mut p = first;
        while p <= last {
            let Some((a, n)) = self.unit_span(p) else {
                p += 1;
                continue;
            };
            if (a < first || a + n > last + 1) && self.span_all((a, n), |e| e.live == 0) {
                dead.push(a);
            }
            p = a + n;
        }
        if dead.is_empty() {
            return;
        }
        // Whether their last uses are done: ask the driver once if what is known says no.
        let idle = |s: &Self, a: usize| {
            let completed = s.fences.completed();
            s.unit_span(a)
                .is_some_and(|span| s.span_all(span, |e| e.is_idle(completed)))
        };
        if !dead.iter().all(|&a| idle(self, a)) {
            if let Err(code) = self.fences.poll_all(&*self.driver) {
                tracing::debug!(code, "polling fences for a new allocation failed");
            }
        }
        let completed = self.fences.completed().to_vec();
        for a in dead {
            if idle(self, a) {
                if let Err(code) = self.unback(a, &completed) {
                    // The unit keeps its frames and stays consistent: only less tidy.
                    tracing::debug!(code, "dropping a dead unit for a new allocation failed");
                }
            }
        }
    }

    /// Pages `first..=last`, about to hold a new allocation, that are on the host with no
    /// live allocation hold bytes nobody can ask for: copying them back at the new
    /// allocation's first use would be wasted bandwidth. The idle ones give their host frame
    /// back and are backed afresh like any unbacked page (on the device when there is room).
    pub(super) fn drop_stale_host_pages(&mut self, first: usize, last: usize) {
        let completed = self.fences.completed().to_vec();
        let dead_idle = |e: &PageEntry| {
            e.live == 0 && matches!(e.state, ResidencyState::Host(_)) && e.is_idle(&completed)
        };
        let stale: Vec<usize> = (first..=last)
            .filter(|&p| self.pages.get(p).is_some_and(dead_idle) && !self.arriving.contains(&p))
            .collect();
        // Whole host units only (their pages beyond the allocation too): a unit is unmapped
        // whole.
        let stale = self.whole_host_units(stale, dead_idle);
        if stale.is_empty() {
            return;
        }
        let r = self.unback_host_pages(&stale, &completed);
        self.remap_host();
        if let Err(code) = r {
            // Whatever was not unbacked is still mapped to its host frame: correct, and
            // copied back at its first use like any page on the host.
            tracing::debug!(code, "dropping dead host pages for a new allocation failed");
        }
    }

    pub(super) fn undo_alloc(&mut self, ptr: CUdeviceptr) {
        if let Ok(a) = self.sub.remove(ptr) {
            self.drop_live(a.ptr, a.span);
            self.sub.release_now(a);
        }
    }

    pub(super) fn drop_live(&mut self, ptr: CUdeviceptr, span: u64) {
        if let Some((first, last)) = self.pages_of(ptr, span) {
            for p in first..=last {
                if let Some(e) = self.pages.entry_mut(p) {
                    e.live = e.live.saturating_sub(1);
                    if e.live == 0 && matches!(e.state, ResidencyState::Device(_)) {
                        self.dead_device.insert(p);
                    }
                }
            }
        }
    }

    /// Frames for the pages of a new allocation: every page in `want` gets one (one of
    /// `ready` while they last, then device if any is free or reclaimable without a copy, else
    /// host), and `optional` pages device frames while free ones last. On failure every
    /// frame taken goes back.
    pub(super) fn back_pages(
        &mut self,
        want: &[usize],
        ready: Vec<DevFrame>,
        optional: &[usize],
    ) -> Result<Vec<(usize, Frame)>, CUresult> {
        let mut plan: Vec<(usize, Frame)> = Vec::with_capacity(want.len() + optional.len());
        let mut result = Ok(());
        let mut ready = ready.into_iter();
        for &p in want {
            if let Some(d) = ready.next() {
                plan.push((p, Frame::Device(d)));
                continue;
            }
            let f = match self.take_device_cheap() {
                Ok(Some(d)) => Frame::Device(d),
                Ok(None) => match self.take_host(false) {
                    Ok(h) => Frame::Host(h),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                },
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            plan.push((p, f));
        }
        // Frames made ready for pages a failure left without one go back.
        for d in ready {
            self.dev.give(d);
        }
        if let Err(e) = result {
            for (_, f) in plan {
                self.give_frame(f);
            }
            return Err(e);
        }
        for &p in optional {
            match self.dev.take(&*self.driver) {
                Ok(Some(d)) => plan.push((p, Frame::Device(d))),
                _ => break,
            }
        }
        Ok(plan)
    }

    // ---- free ----

    pub(super) fn free(
        &mut self,
        ptr: CUdeviceptr,
        stream: Option<Stream>,
    ) -> Result<(), CUresult> {
        let a = self.sub.remove(ptr).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if let Some(run) = self.capture_pinned.remove(&a.ptr) {
            // The pages stay until the fence below (or, for a synchronous free, the caller's
            // synchronization) covers the graph's last use.
            self.unpin_or_pin(run, false);
        }
        match stream {
            None => {
                self.drop_live(a.ptr, a.span);
                self.sub.release_now(a);
            }
            Some(s) => {
                let slot = self.fences.slot_of(s);
                // Where only this stream allocates, nothing else wants the memory before the
                // stream reuses it: the fence comes with the stream's next recorded one (every
                // `fence_every` launches, or when an eviction needs it: `Fences::wait`,
                // `event_after`, `flush`). Otherwise the free counts as a use towards it.
                let seq = if self.sub.others_allocate(slot) {
                    match self.fences.note(&*self.driver, slot, self.cfg.fence_every) {
                        Ok(seq) => seq,
                        Err(e) => {
                            // Keep the allocation: the free did not happen.
                            self.sub_reinsert(a);
                            return Err(e);
                        }
                    }
                } else {
                    self.fences.promise(slot)
                };
                // The free's fence also covers work the manager did not see on that stream.
                if let Some((first, last)) = self.pages_of(a.ptr, a.span) {
                    self.add_fence_use(first..=last, slot, seq);
                }
                self.drop_live(a.ptr, a.span);
                self.sub.release_after(a, slot, seq);
            }
        }
        Ok(())
    }

    pub(super) fn sub_reinsert(&mut self, a: crate::memory::suballoc::Allocation) {
        // Removing and re-adding keeps the allocation map the single source of truth.
        self.sub.reinsert(a);
    }
}
