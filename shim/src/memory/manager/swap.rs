//! The swap engine: queuing the copies to and from the host pool on the two copy streams,
//! their events, completing finished swaps (`poll`) and waiting for those in flight.
//! Copies are ordered on the device wherever possible; the host waits are here too.

use std::collections::HashMap;
use std::time::Instant;

use tensile_driver_abi::{CUdeviceptr, CUresult, CUDA_ERROR_OUT_OF_MEMORY};

use crate::memory::driver::Event;
use crate::memory::frames::{DevFrame, HostFrame};
use crate::memory::journal::{SwapCause, SwapDir};
use crate::memory::page::{ResidencyState, Use};
use crate::memory::stats::Demand;

use super::backing::HostUnit;
use super::{coalesce, Inner, SwapOrder};

impl Inner {
    /// A cancelled swap-out's copy still reads the page: the page must not be remapped before
    /// it has run. A fence on the swap-out stream, recorded now, comes after that copy; it
    /// becomes a use of the page like any launch's.
    pub(super) fn guard_cancelled(&mut self, pages: &[usize]) {
        let slot = self.fences.slot_of(self.swap_out_stream);
        let seq = match self.fences.record(&*self.driver, slot) {
            Ok(seq) => seq,
            // Promised fence: recorded on demand before anyone waits for it.
            Err(_) => self.fences.next_seq(slot),
        };
        self.add_fence_use(pages.iter().copied(), slot, seq);
    }

    /// Makes the fence `seq` on stream `slot` a use of each of `pages`: they are not idle
    /// until it completes.
    pub(super) fn add_fence_use(
        &mut self,
        pages: impl IntoIterator<Item = usize>,
        slot: usize,
        seq: u64,
    ) {
        let completed = self.fences.completed().to_vec();
        let u = Use {
            stream_slot: slot as u32,
            seq,
        };
        for p in pages {
            if let Some(e) = self.pages.entry_mut(p) {
                e.add_use(u, &completed);
            }
        }
    }

    /// An event for a swap's copy, recorded on its stream right after the copy is queued.
    pub(super) fn copy_event(&mut self) -> Result<Event, CUresult> {
        let ev = match self.spare_events.pop() {
            Some(e) => e,
            None => self.driver.event_create()?,
        };
        self.copy_events_handed += 1;
        self.copy_event_order.insert(ev, self.copy_events_handed);
        Ok(ev)
    }

    /// Of `events`, copy events of one swap stream, the one whose copy was queued first:
    /// the stream runs its copies in order, so it completes first.
    pub(super) fn first_copied(&self, events: &[Event]) -> Option<Event> {
        events
            .iter()
            .copied()
            .min_by_key(|e| self.copy_event_order.get(e).copied().unwrap_or(0))
    }

    pub(super) fn ref_event(&mut self, ev: Event, n: u32) {
        *self.copy_event_refs.entry(ev).or_insert(0) += n;
    }

    pub(super) fn unref_event(&mut self, ev: Event) {
        if let Some(n) = self.copy_event_refs.get_mut(&ev) {
            *n -= 1;
            if *n == 0 {
                self.copy_event_refs.remove(&ev);
                self.spare_events.push(ev);
            }
        }
    }

    /// Remaps `pages` (all `Host`) to `frames` and queues the copies in, with the lock held:
    /// the same three steps as a swap-in made without it (`arrival.rs`), for an operation
    /// that has used its unlocked rounds. Returns the event the work that wants them must
    /// wait on; on failure the pages stay `Host` and the frames go back.
    pub(super) fn swap_in(
        &mut self,
        pages: &[usize],
        frames: Vec<DevFrame>,
    ) -> Result<Event, CUresult> {
        self.begin_arrival(pages, frames)?;
        let arrival = self
            .arrival
            .take()
            .expect("begin_arrival leaves an arrival");
        let event = arrival.event();
        let driver = self.driver.clone();
        let outcome = arrival.run(&*driver);
        self.commit_arrival(arrival, outcome);
        outcome.error().map_or(Ok(event), Err)
    }

    /// Makes the swap-out stream wait (on the device) for every recorded, incomplete use of
    /// `pages`: one wait per stream, on its latest fence among them.
    pub(super) fn order_swap_out_after_uses(&mut self, pages: &[usize]) -> Result<(), CUresult> {
        let completed = self.fences.completed();
        let mut fences: Vec<(u32, u64)> = pages
            .iter()
            .filter_map(|&p| self.pages.get(p))
            .flat_map(|e| e.uses.iter())
            .filter(|u| {
                completed
                    .get(u.stream_slot as usize)
                    .is_none_or(|&c| c < u.seq)
            })
            .map(|u| (u.stream_slot, u.seq))
            .collect();
        fences.sort_unstable();
        // The latest fence of a stream covers its earlier ones (stream order).
        fences.reverse();
        fences.dedup_by_key(|&mut (slot, _)| slot);
        for (slot, seq) in fences {
            if let Some(ev) = self.fences.event_after(&*self.driver, slot as usize, seq)? {
                self.driver.stream_wait_event(self.swap_out_stream, ev)?;
            }
        }
        Ok(())
    }

    /// Starts the swap-out of `victims` (unpinned `Device` pages, idle unless `order` is
    /// [`SwapOrder::AfterUses`]); dead ones are dropped without a copy. Host frames are required
    /// for the first `need` copies only.
    pub(super) fn swap_out_pages(
        &mut self,
        mut victims: Vec<usize>,
        need: usize,
        order: SwapOrder,
        cause: SwapCause,
    ) -> Result<(), CUresult> {
        if victims.is_empty() {
            return Ok(());
        }
        // Callers pass whole units; this keeps it so whatever they pass.
        victims = self.whole_units(victims, |e| matches!(e.state, ResidencyState::Device(_)));
        let completed = self.fences.completed().to_vec();
        let mut copy: Vec<(usize, HostFrame)> = Vec::new();
        let mut i = 0;
        while i < victims.len() {
            let (a, n) = self.unit_span(victims[i]).unwrap_or((victims[i], 1));
            i += n;
            let unit = a..a + n;
            if self.span_all((a, n), |e| e.live == 0) {
                // A dead unit needs no copy: drop it instead (once idle; a dead unit still in
                // use is left for a later eviction).
                if self.span_all((a, n), |e| e.is_idle(&completed)) {
                    if let Err(e) = self.unback(a, &completed) {
                        for (_, h) in copy {
                            self.host.give(h);
                        }
                        return Err(e);
                    }
                }
                continue;
            }
            // A unit with live data goes whole (its dead pages too: it is unmapped whole).
            // When its pages are to be mapped to host memory, each run of them that one live
            // allocation covers goes into a host unit of its own (one mapping instead of one
            // per page), the rest into single frames. Cut by today's allocations, not the
            // unit's: a device unit outlives the tensor it was made for, and a host unit over
            // two tensors would bring both in whenever one is used.
            let by_units = n > 1 && self.cfg.host_mapped && self.cfg.host_units;
            let pieces = if by_units {
                self.unit_sizes(&unit.collect::<Vec<_>>())
            } else {
                vec![n]
            };
            let mut frames: Vec<(usize, HostFrame)> = Vec::with_capacity(n);
            // A unit past the victims needed of an eviction ahead of need (the free reserve,
            // kept by an application's thread) stops rather than wait for host memory: the
            // pool's grower is asked for it.
            // (Whole units: the check on failure below is the same.)
            let ahead = copy.len() >= need && self.demand == Demand::Reserve && !self.reserve_pins;
            let mut failed = None;
            let mut q = a;
            for k in pieces {
                let piece = q..q + k;
                q += k;
                if by_units && k > 1 {
                    match self.take_host_unit(k, ahead) {
                        HostUnit::Got(first) => {
                            frames.extend(piece.zip((first.0..).map(HostFrame)));
                            continue;
                        }
                        HostUnit::Singles => {}
                        HostUnit::Stop => {
                            failed = Some(CUDA_ERROR_OUT_OF_MEMORY);
                            break;
                        }
                    }
                }
                for r in piece {
                    match self.take_host(ahead) {
                        Ok(h) => frames.push((r, h)),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                if failed.is_some() {
                    break;
                }
            }
            if let Some(e) = failed {
                for (_, h) in frames {
                    self.host.give(h);
                }
                // The extra victims of a batch are optional.
                if copy.len() >= need {
                    break;
                }
                for (_, h) in copy {
                    self.host.give(h);
                }
                return Err(e);
            }
            copy.extend(frames);
        }
        if copy.is_empty() {
            return Ok(());
        }
        // Host frames in runs, in address order along the (sorted) pages: contiguous pages
        // then land in contiguous frames, so their copies merge and, once out, their host
        // mappings do too.
        // (Single frames only: a host unit's frames are already consecutive.)
        let singles: Vec<usize> = (0..copy.len())
            .filter(|&i| self.host.unit_of(copy[i].1).1 == 1)
            .collect();
        let mut frames: Vec<HostFrame> = singles.iter().map(|&i| copy[i].1).collect();
        self.host.regroup(&mut frames);
        for (&i, h) in singles.iter().zip(frames) {
            copy[i].1 = h;
        }
        let ev = match self.copy_event() {
            Ok(ev) => ev,
            Err(e) => {
                for (_, h) in copy {
                    self.host.give(h);
                }
                return Err(e);
            }
        };
        // Dead pages (no allocation holds them: nobody may read them again) go with their
        // unit, which is unmapped whole, but their bytes are not copied.
        let copies: Vec<(CUdeviceptr, CUdeviceptr)> = copy
            .iter()
            .filter(|&&(p, _)| self.pages.get(p).is_some_and(|e| e.live > 0))
            .map(|&(p, h)| (self.host.window_address(h), self.va(p)))
            .collect();
        let copied = copies.len();
        for (dst, src, len) in coalesce(&copies, self.page) {
            if let Err(e) = self
                .driver
                .memcpy_dtod_async(dst, src, len, self.swap_out_stream)
            {
                self.abandon_swap_out(copy, ev);
                return Err(e);
            }
        }
        if let Err(e) = self.driver.event_record(ev, self.swap_out_stream) {
            self.abandon_swap_out(copy, ev);
            return Err(e);
        }
        for &(p, h) in &copy {
            let r = match order {
                SwapOrder::Idle => self.pages.start_swap_out(p, h, ev, &completed),
                SwapOrder::AfterUses => self.pages.start_swap_out_after_uses(p, h, ev),
            };
            debug_assert!(r.is_ok(), "{r:?}");
            self.outgoing.insert(p);
        }
        self.ref_event(ev, copy.len() as u32);
        self.stats.bytes_to_host += (copied * self.page) as u64;
        self.stats.pages_evicted += copy.len() as u64;
        let moved = copy.iter().map(|&(p, _)| p);
        self.journal_swap(Instant::now(), SwapDir::ToHost, cause, moved, copied);
        Ok(())
    }

    /// Tells the journal, if there is one, of a copy queued at `at` that moves `pages` (in
    /// any order), `copied` of them with their bytes (dead pages move without a copy).
    pub(super) fn journal_swap(
        &self,
        at: Instant,
        dir: SwapDir,
        cause: SwapCause,
        pages: impl IntoIterator<Item = usize>,
        copied: usize,
    ) {
        let Some(j) = &self.journal else { return };
        let mut pages: Vec<usize> = pages.into_iter().collect();
        pages.sort_unstable();
        let mut runs: Vec<(u64, u32)> = Vec::new();
        for p in pages {
            let va = self.va(p);
            match runs.last_mut() {
                Some((first, n)) if *first + u64::from(*n) * self.page as u64 == va => *n += 1,
                _ => runs.push((va, 1)),
            }
        }
        j.swap(at, dir, cause, &runs, (copied * self.page) as u64);
    }

    /// Waits for the swap-ins in flight and completes them.
    pub(super) fn wait_incoming(&mut self) -> Result<(), CUresult> {
        for ev in self.incoming_events() {
            self.driver.event_synchronize(ev)?;
        }
        self.poll()
    }

    /// Undoes a swap-out batch that could not be queued completely: the pages stay `Device`;
    /// the host frames are reused only after the copies already queued into them have run.
    pub(super) fn abandon_swap_out(&mut self, copy: Vec<(usize, HostFrame)>, ev: Event) {
        if let Err(e) = self.driver.stream_synchronize(self.swap_out_stream) {
            tracing::error!(code = e, "the swap-out stream failed");
        }
        for (_, h) in copy {
            self.host.give(h);
        }
        self.spare_events.push(ev);
    }

    /// The events of the swap-ins in flight, each once.
    pub(super) fn incoming_events(&self) -> Vec<Event> {
        self.swap_events(self.incoming.iter().copied(), |state| match state {
            ResidencyState::ToDevice { event, .. } => Some(event),
            _ => None,
        })
    }

    /// The events of the swap-outs in flight, each once.
    pub(super) fn outgoing_events(&self) -> Vec<Event> {
        self.swap_out_events(self.outgoing.iter().copied())
    }

    /// [`Self::outgoing_events`] of the swap-outs no thread is completing yet whose frames
    /// come back to the pool (not handed over).
    pub(super) fn uncompleted_outgoing_events(&self) -> Vec<Event> {
        let pages = self.outgoing.iter().copied();
        self.swap_out_events(pages.filter(|&p| !self.completing.contains(&p) && !self.is_handed(p)))
    }

    /// The events of the swap-outs of `pages`, each once.
    fn swap_out_events(&self, pages: impl IntoIterator<Item = usize>) -> Vec<Event> {
        self.swap_events(pages, |state| match state {
            ResidencyState::ToHost { event, .. } => Some(event),
            _ => None,
        })
    }

    /// The events of `pages` still in a swap (`event` gives it for a page still in that
    /// swap), each once, in order.
    pub(super) fn swap_events(
        &self,
        pages: impl IntoIterator<Item = usize>,
        event: impl Fn(ResidencyState) -> Option<Event>,
    ) -> Vec<Event> {
        let mut evs: Vec<Event> = pages
            .into_iter()
            .filter_map(|p| self.pages.get(p).and_then(|e| event(e.state)))
            .collect();
        evs.sort_unstable();
        evs.dedup();
        evs
    }

    /// Waits for the swap-outs in flight and completes them.
    pub(super) fn wait_outgoing(&mut self) -> Result<(), CUresult> {
        for ev in self.outgoing_events() {
            self.driver.event_synchronize(ev)?;
        }
        self.poll()
    }

    /// Completes finished swaps: remaps swapped-out pages to their host frames (freeing the
    /// device frames), ends finished swap-ins, and frees deferred host frames.
    pub(super) fn poll(&mut self) -> Result<(), CUresult> {
        self.poll_with(true)
    }

    /// [`Self::poll`]; with `complete_outgoing` false only the part that makes no VMM call:
    /// finished swap-ins and deferred host frames (for the launch path).
    pub(super) fn poll_with(&mut self, complete_outgoing: bool) -> Result<(), CUresult> {
        if complete_outgoing {
            // Fences promised to frees and launches of a stream that has gone quiet: recorded
            // here, off the fast path, so that what they cover can complete.
            self.fences.flush(&*self.driver)?;
        }
        let mut done_cache: HashMap<Event, bool> = HashMap::new();
        let driver = self.driver.clone();
        let mut query = |ev: Event| -> Result<bool, CUresult> {
            if let Some(&d) = done_cache.get(&ev) {
                return Ok(d);
            }
            let d = driver.event_query(ev)?;
            done_cache.insert(ev, d);
            Ok(d)
        };
        // Swap-ins.
        let incoming: Vec<usize> = self.incoming.iter().copied().collect();
        for p in incoming {
            let Some(ResidencyState::ToDevice { event, .. }) = self.pages.get(p).map(|e| e.state)
            else {
                continue;
            };
            if query(event)? {
                if let Ok(h) = self.pages.finish_swap_in(p, |_| true) {
                    if self.pages.get(p).is_some_and(|e| e.live == 0) {
                        // Freed while it was coming in.
                        self.dead_device.insert(p);
                    }
                    self.host.give(h);
                    self.incoming.remove(&p);
                    self.unref_event(event);
                }
            }
        }
        // Deferred host frames of cancelled swap-outs.
        let deferred = std::mem::take(&mut self.deferred_host);
        let mut failed = None;
        for (h, ev) in deferred {
            // After a failed query the rest are kept as they are, never dropped.
            let done = failed.is_none() && query(ev).map_err(|e| failed = Some(e)).unwrap_or(false);
            if done {
                self.host.give(h);
                self.unref_event(ev);
            } else {
                self.deferred_host.push((h, ev));
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if !complete_outgoing {
            return Ok(());
        }
        // Swap-outs: completed here with the lock held (the callers that can release it use
        // `MemoryManager::complete`, which makes the same calls without it).
        let completions = self.begin_completions()?;
        let driver = self.driver.clone();
        let outcome = completions.run(&*driver);
        self.commit_completions(completions, outcome);
        // Pages a failed call left unmapped, here or before.
        self.remap_host();
        outcome.error().map_or(Ok(()), Err)
    }
}
