//! Access: the path every launch, copy and memset on arena memory takes. `prepare_access`
//! pins the pages and makes them resident (the fast path makes no driver call),
//! `note_access_done` turns the pins into recorded uses; pins for captured graphs; the
//! out-of-memory failures an access can end in.

use std::time::Duration;

use tensile_driver_abi::{CUdeviceptr, CUresult, CUDA_ERROR_OUT_OF_MEMORY};

use crate::memory::driver::{Event, Stream};
use crate::memory::failures::{human_bytes, FailureCause};
use crate::memory::page::{ResidencyState, Use};
use crate::memory::stats::Demand;

use super::{runs, AccessTicket, Inner, PinStall};

impl Inner {
    // ---- access ----

    pub(super) fn prepare_access(
        &mut self,
        stream: Stream,
        ranges: &[(CUdeviceptr, usize)],
    ) -> Result<AccessTicket, CUresult> {
        self.clock += 1;
        let mut runs_v: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
        for &(a, len) in ranges {
            if let Some(r) = self.pages_of(a, len as u64) {
                runs_v.push(r);
            }
        }
        if runs_v.len() > 1 {
            runs_v.sort_unstable();
            let mut merged: Vec<(usize, usize)> = Vec::with_capacity(runs_v.len());
            for (a, b) in runs_v {
                match merged.last_mut() {
                    Some(last) if a <= last.1 + 1 => last.1 = last.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            runs_v = merged;
        }
        let ticket = AccessTicket {
            stream,
            runs: runs_v,
        };
        let resident = self.pin_pages(&ticket);
        if resident {
            self.open_tickets += 1;
            return Ok(ticket);
        }
        match self.make_resident(&ticket, false) {
            Ok(stalled) => {
                // Counted, with the whole call's time, when it returns
                // (`MemoryManager::waiting_for_pins`).
                self.op.stalled |= stalled;
                self.open_tickets += 1;
                Ok(ticket)
            }
            Err(e) => {
                self.unpin_unless_arriving(&ticket);
                Err(e)
            }
        }
    }

    /// Pins every page of `ticket` (and marks it used now); whether all of them are already
    /// on the device (or hold nothing yet).
    pub(super) fn pin_pages(&mut self, ticket: &AccessTicket) -> bool {
        let mut resident = true;
        for &(a, b) in &ticket.runs {
            for p in a..=b {
                if let Some(e) = self.pages.entry_mut(p) {
                    resident &= matches!(
                        e.state,
                        ResidencyState::Device(_) | ResidencyState::Unbacked
                    );
                    e.pins += 1;
                    e.last_access = self.clock;
                }
            }
        }
        resident
    }

    pub(super) fn pin_for_capture(
        &mut self,
        ranges: &[(CUdeviceptr, usize)],
    ) -> Result<(), CUresult> {
        // Whole allocations, not just the bytes touched: the pin lasts as long as the
        // allocation, and is undone by its free.
        let mut allocs: Vec<(CUdeviceptr, u64)> = Vec::new();
        for &(a, len) in ranges {
            if len == 0 {
                continue;
            }
            if let Some(al) = self.sub.find(a) {
                if !self.capture_pinned.contains_key(&al.ptr)
                    && !allocs.iter().any(|x| x.0 == al.ptr)
                {
                    allocs.push((al.ptr, al.span));
                }
            }
        }
        if allocs.is_empty() {
            return Ok(());
        }
        self.clock += 1;
        let mut runs_v: Vec<(usize, usize)> = allocs
            .iter()
            .filter_map(|&(p, span)| self.pages_of(p, span))
            .collect();
        runs_v.sort_unstable();
        let ticket = AccessTicket {
            stream: self.swap_in_stream,
            runs: runs(&runs_v.iter().flat_map(|&(a, b)| a..=b).collect::<Vec<_>>()),
        };
        let resident = self.pin_pages(&ticket);
        if !resident {
            if let Err(e) = self.make_resident(&ticket, true) {
                self.unpin_unless_arriving(&ticket);
                return Err(e);
            }
        }
        // The ticket's pins become the allocations' pins: a page shared by two pinned
        // allocations holds one pin for each.
        self.unpin(&ticket);
        for (p, span) in allocs {
            if let Some(run) = self.pages_of(p, span) {
                self.unpin_or_pin(run, true);
                self.capture_pinned.insert(p, run);
            }
        }
        Ok(())
    }

    /// Adds (`pin`) or removes one pin on each page of the inclusive run.
    pub(super) fn unpin_or_pin(&mut self, (a, b): (usize, usize), pin: bool) {
        for p in a..=b {
            if let Some(e) = self.pages.entry_mut(p) {
                e.pins = if pin {
                    e.pins + 1
                } else {
                    e.pins.saturating_sub(1)
                };
            }
        }
    }

    /// Undoes a failed access's pins; but while a swap-in it decided is pending (`arrival.rs`)
    /// they stay, handed to that swap-in, which releases them at its commit: its other pages,
    /// already on the device, are not evicted while it runs without the lock.
    pub(super) fn unpin_unless_arriving(&mut self, t: &AccessTicket) {
        match self.arrival.as_mut() {
            Some(a) => a.hold_pins(&t.runs),
            None => self.unpin(t),
        }
    }

    pub(super) fn unpin(&mut self, t: &AccessTicket) {
        for &(a, b) in &t.runs {
            for p in a..=b {
                if let Some(e) = self.pages.entry_mut(p) {
                    e.pins = e.pins.saturating_sub(1);
                }
            }
        }
    }

    /// The slow path of `prepare_access`. Returns whether the access had to wait for a copy
    /// in (a stall); cancelling swap-outs alone is not one.
    /// `host_waits`: wait for the copies in on the host instead of making `t.stream` wait
    /// for them (a capturing stream must not wait on anything recorded outside its capture).
    pub(super) fn make_resident(
        &mut self,
        t: &AccessTicket,
        host_waits: bool,
    ) -> Result<bool, CUresult> {
        if !(self.completing.is_empty() && self.arriving.is_empty())
            && t.runs
                .iter()
                .flat_map(|&(a, b)| a..=b)
                .any(|p| self.completing.contains(&p) || self.arriving.contains(&p))
        {
            // Another thread is remapping some of these pages without the lock (completing
            // their swap-out, or bringing them in): their addresses may be unmapped right
            // now. Wait for its commit, then look again.
            self.remap_stall = true;
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // What must be on the device at once: the pages touched, and the rest of their units.
        let mut touched = self.access_footprint(t);
        if touched > self.dev.budget_frames() {
            // Units reaching past the access may be what makes it too large: they go out, and
            // the pages touched come back in units of their own.
            self.split_units_around(t)?;
            touched = self.access_footprint(t);
        }
        if touched > self.dev.budget_frames() {
            let needed = touched * self.page;
            if !self.budget_wait.is_zero() {
                self.budget_stall = Some(needed);
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            return Err(self.fail_budget(needed));
        }
        // Finished swap-outs are not completed here: that is VMM work (unmap, map, set
        // access) the launch does not need unless it is short of frames (`acquire_into` then
        // completes them); `maintain` does it off the launch path, in larger batches. A page
        // of this access still `ToHost` is then simply cancelled, at no cost.
        self.poll_with(false)?;
        self.wait_for_handed_victims(t)?;
        let mut waits: Vec<Event> = Vec::new();
        let mut bring_in: Vec<usize> = Vec::new();
        let mut leaving: Vec<usize> = Vec::new();
        for p in t.runs.iter().flat_map(|&(a, b)| a..=b) {
            match self.pages.get(p).map(|e| e.state) {
                Some(ResidencyState::ToDevice { event, .. }) => waits.push(event),
                Some(ResidencyState::ToHost { .. }) => leaving.push(p),
                Some(ResidencyState::Host(_)) => bring_in.push(p),
                _ => {}
            }
        }
        // Still on the device: keep them there, with the rest of their units (a unit leaves
        // whole); the host frames are free once the copies that fill them are done.
        // (`wait_for_handed_victims` left none whose frames were handed over.)
        let mut cancelled: Vec<usize> = Vec::new();
        for p in self.whole_units(leaving, |e| {
            matches!(e.state, ResidencyState::ToHost { .. })
        }) {
            if let Ok((h, ev)) = self.pages.cancel_swap_out(p) {
                self.outgoing.remove(&p);
                self.deferred_host.push((h, ev));
                cancelled.push(p);
            }
        }
        if !cancelled.is_empty() {
            self.stats.pages_out_cancelled += cancelled.len() as u64;
            self.guard_cancelled(&cancelled);
        }
        if !bring_in.is_empty() {
            // A host unit's mapping goes whole, so its pages come in together.
            let bring_in =
                self.whole_host_units(bring_in, |e| matches!(e.state, ResidencyState::Host(_)));
            let frames = self.acquire_frames_to_read_back(&bring_in)?;
            if self.demand == Demand::Access {
                self.stats.pages_in_on_demand += bring_in.len() as u64;
            }
            if self.unlocked_round() {
                // The remap and the copies are made by the caller without the lock
                // (`arrival.rs`), which then starts this access over.
                self.begin_arrival(&bring_in, frames)?;
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            waits.push(self.swap_in(&bring_in, frames)?);
        }
        waits.sort_unstable();
        waits.dedup();
        let stalled = !waits.is_empty();
        if host_waits && stalled && self.unlocked_round() {
            // The copies in are waited for on the host without the lock, then the access
            // starts over and finds the pages landed.
            self.copy_waits = waits;
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        for ev in waits {
            if host_waits {
                self.driver.event_synchronize(ev)?;
            } else {
                self.driver.stream_wait_event(t.stream, ev)?;
            }
        }
        // Under pressure: start the next evictions now, off the next access's critical path.
        // A failure here only means less is free ahead of time; the access itself is ready.
        if let Err(e) = self.keep_reserve(false) {
            tracing::debug!(code = e, "evicting ahead of need failed");
        }
        Ok(stalled)
    }

    /// Makes sure no page of `t` is in a unit whose frames were handed over (`handover.rs`):
    /// such a swap-out cannot be cancelled, so the access waits for its copy out and its
    /// completion (those units first), then reads the pages back like any on the host. The
    /// waits are made without the lock where the operation may (the caller starts over).
    fn wait_for_handed_victims(&mut self, t: &AccessTicket) -> Result<(), CUresult> {
        let handed = self.handed_among(t.runs.iter().flat_map(|&(a, b)| a..=b));
        if handed.is_empty() {
            return Ok(());
        }
        self.urgent_completions
            .extend(handed.iter().map(|&(first, _)| first));
        let events: Vec<Event> = handed.iter().map(|&(_, ev)| ev).collect();
        if self.unlocked_round() {
            self.copy_waits = events;
            self.completion_wanted = true;
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.stats.locked_waits += 1;
        for ev in events {
            self.driver.event_synchronize(ev)?;
        }
        self.poll()?;
        if !self
            .handed_among(t.runs.iter().flat_map(|&(a, b)| a..=b))
            .is_empty()
        {
            // Their completion failed (retried by the next poll) or another thread is
            // making it: wait for a commit and look again.
            self.remap_stall = true;
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(())
    }

    /// Pages that must be on the device at once for `t`: those it touches (backed), with
    /// the rest of their units.
    pub(super) fn access_footprint(&self, t: &AccessTicket) -> usize {
        let pages = self.whole_units(t.runs.iter().flat_map(|&(a, b)| a..=b).collect(), |e| {
            e.state != ResidencyState::Unbacked
        });
        let (host, other): (Vec<usize>, Vec<usize>) = pages.into_iter().partition(|&p| {
            matches!(
                self.pages.get(p).map(|e| e.state),
                Some(ResidencyState::Host(_))
            )
        });
        other.len()
            + self
                .whole_host_units(host, |e| matches!(e.state, ResidencyState::Host(_)))
                .len()
    }

    pub(super) fn note_access_done(&mut self, t: AccessTicket) -> Result<(), CUresult> {
        self.open_tickets = self.open_tickets.saturating_sub(1);
        let slot = self.fences.slot_of(t.stream);
        // If the fence cannot be recorded, the pages still must not leave before the work:
        // they wait for the stream's next fence instead (recorded on demand by an eviction).
        let (seq, result) = match self.fences.note(&*self.driver, slot, self.cfg.fence_every) {
            Ok(s) => (s, Ok(())),
            Err(e) => (self.fences.next_seq(slot), Err(e)),
        };
        let completed = self.fences.completed();
        let u = Use {
            stream_slot: slot as u32,
            seq,
        };
        for &(a, b) in &t.runs {
            for p in a..=b {
                if let Some(e) = self.pages.entry_mut(p) {
                    e.pins = e.pins.saturating_sub(1);
                    e.add_use(u, completed);
                }
            }
        }
        result
    }

    /// Records (and logs, the first time) that one access needs `needed` bytes, more than
    /// the whole budget.
    pub(super) fn fail_budget(&mut self, needed: usize) -> CUresult {
        let budget = self.dev.budget_frames() * self.page;
        self.failures.record(
            FailureCause::Budget,
            format_args!(
                "one access needs {} of device memory at once; the budget is {}",
                human_bytes(needed),
                human_bytes(budget)
            ),
        )
    }

    /// The failure after a bounded wait for pinned pages: names the pins and who holds them.
    pub(super) fn fail_pinned(&mut self, stall: PinStall, waited: Duration) -> CUresult {
        let pinned = self
            .pages
            .iter()
            .filter(|(_, e)| e.pins > 0 && e.state.device_frame().is_some())
            .count();
        let (calls, graphs) = (self.open_tickets, self.capture_pinned.len());
        let budget = self.dev.budget_frames() * self.page;
        self.failures.record(
            FailureCause::PinnedByCalls,
            format_args!(
                "{} of device memory needed; {pinned} pages ({}) of the {} budget are pinned \
                 by {calls} in-flight calls and {graphs} captured-graph allocations, and stayed \
                 pinned for {:.1} s",
                human_bytes(stall.bytes_needed),
                human_bytes(pinned * self.page),
                human_bytes(budget),
                waited.as_secs_f64()
            ),
        )
    }
}
