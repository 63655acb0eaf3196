//! Verbs for a planned policy: swap these pages out now, swap them out after their last
//! recorded use, bring them in ahead of use, and change the budget. The executor drives
//! them (docs/executor.md); on-demand LRU needs none of them.

use tensile_driver_abi::{CUdeviceptr, CUresult, CUDA_ERROR_OUT_OF_MEMORY};

use crate::memory::driver::Event;
use crate::memory::journal::{SwapCause, SwapDir};
use crate::memory::page::ResidencyState;
use crate::memory::stats::Demand;

use super::{coalesce, runs, AccessTicket, Inner, PinStall, SwapOrder};

impl Inner {
    // ---- verbs for a planned policy ----

    /// Pages of `ranges` (inclusive runs), deduplicated.
    pub(super) fn pages_in(&self, ranges: &[(CUdeviceptr, usize)]) -> Vec<usize> {
        let mut pages: Vec<usize> = ranges
            .iter()
            .filter_map(|&(a, len)| self.pages_of(a, len as u64))
            .flat_map(|(a, b)| a..=b)
            .collect();
        pages.sort_unstable();
        pages.dedup();
        pages
    }

    pub(super) fn start_swap_out(
        &mut self,
        ranges: &[(CUdeviceptr, usize)],
    ) -> Result<usize, CUresult> {
        self.fences.poll_all(&*self.driver)?;
        let completed = self.fences.completed();
        let victims = self.whole_units(self.pages_in(ranges), |e| {
            matches!(e.state, ResidencyState::Device(_)) && e.is_idle(completed)
        });
        let before = self.outgoing.len();
        self.swap_out_pages(victims, 0, SwapOrder::Idle, SwapCause::Plan)?;
        Ok(self.outgoing.len() - before)
    }

    pub(super) fn swap_out_after_use(
        &mut self,
        ranges: &[(CUdeviceptr, usize)],
    ) -> Result<usize, CUresult> {
        self.fences.poll_all(&*self.driver)?;
        // Pinned pages belong to a call in flight (it may still add uses), and a unit leaves
        // whole; dead units that are still busy are left for the next eviction to drop (a
        // drop needs them idle: `swap_out_pages`), and dead units arriving stay.
        let pages = self.pages_in(ranges);
        let victims = self.whole_units(pages.clone(), |e| {
            e.pins == 0 && matches!(e.state, ResidencyState::Device(_))
        });
        let mut arriving = self.whole_units(pages.clone(), |e| {
            e.pins == 0 && matches!(e.state, ResidencyState::ToDevice { .. })
        });
        let dead: Vec<(usize, usize)> = self
            .spans(&arriving)
            .into_iter()
            .filter(|&span| self.span_all(span, |e| e.live == 0))
            .collect();
        arriving.retain(|&p| !dead.iter().any(|&(a, n)| (a..a + n).contains(&p)));
        let named: Vec<usize> = pages
            .iter()
            .copied()
            .filter(|&p| {
                self.pages
                    .get(p)
                    .is_some_and(|e| matches!(e.state, ResidencyState::Device(_)))
            })
            .collect();
        // (Counted once per verb: a rerun after pinning host memory sees the same ranges.)
        if !self.op.rerun {
            self.stats.planned_out_named += named.len() as u64;
            for &p in &victims {
                if named.binary_search(&p).is_err() {
                    match self.pages.get(p).map(|e| e.live) {
                        Some(0) => self.stats.planned_out_unnamed_dead += 1,
                        _ => self.stats.planned_out_unnamed_live += 1,
                    }
                }
            }
        }
        let before = self.outgoing.len();
        if !victims.is_empty() {
            // The copy stream waits (on the device, not here) for the last use of each page.
            self.order_swap_out_after_uses(&victims)?;
            self.swap_out_pages(victims, 0, SwapOrder::AfterUses, SwapCause::Plan)?;
        }
        if !arriving.is_empty() {
            self.swap_out_arriving(arriving)?;
        }
        Ok(self.outgoing.len() - before)
    }

    /// Starts the swap-out of `pages` (unpinned, live, `ToDevice`), ordered after their copy
    /// in and their uses: the host runs ahead of the device, so a page the plan brought in
    /// for one launch is often still arriving when the plan sends it back right after that
    /// launch. Skipping it would leave it on the device, where the plan counts it gone. The
    /// copy goes back into the page's own host frame (the copy in has read it by then).
    pub(super) fn swap_out_arriving(&mut self, pages: Vec<usize>) -> Result<(), CUresult> {
        let arrivals = self.swap_events(pages.iter().copied(), |state| match state {
            ResidencyState::ToDevice { event, .. } => Some(event),
            _ => None,
        });
        for &ev in &arrivals {
            self.driver.stream_wait_event(self.swap_out_stream, ev)?;
        }
        self.order_swap_out_after_uses(&pages)?;
        let ev = self.copy_event()?;
        let copies: Vec<(CUdeviceptr, CUdeviceptr)> = pages
            .iter()
            .filter_map(|&p| match self.pages.get(p).map(|e| e.state) {
                Some(ResidencyState::ToDevice { host, .. }) => {
                    Some((self.host.window_address(host), self.va(p)))
                }
                _ => None,
            })
            .collect();
        // On failure the pages stay arriving, and their host frames go back to the pool once
        // they have arrived: copies into those frames already queued must be done by then.
        let abandon = |s: &mut Self, ev: Event| {
            if let Err(e) = s.driver.stream_synchronize(s.swap_out_stream) {
                tracing::error!(code = e, "the swap-out stream failed");
            }
            s.spare_events.push(ev);
        };
        for (dst, src, len) in coalesce(&copies, self.page) {
            if let Err(e) = self
                .driver
                .memcpy_dtod_async(dst, src, len, self.swap_out_stream)
            {
                abandon(self, ev);
                return Err(e);
            }
        }
        if let Err(e) = self.driver.event_record(ev, self.swap_out_stream) {
            abandon(self, ev);
            return Err(e);
        }
        let mut started = 0u32;
        let mut moved: Vec<usize> = Vec::with_capacity(pages.len());
        let mut stayed = false;
        for &p in &pages {
            match self.pages.start_swap_out_while_arriving(p, ev) {
                Ok(arriving) => {
                    self.incoming.remove(&p);
                    self.outgoing.insert(p);
                    self.unref_event(arriving);
                    started += 1;
                    moved.push(p);
                }
                Err(_) => stayed = true,
            }
        }
        if stayed {
            // Not expected (the lock is held since the pages were chosen), but a page that
            // stayed arriving must not have its frame written after it is given back.
            if let Err(e) = self.driver.event_synchronize(ev) {
                tracing::error!(code = e, "a swap-out copy failed");
            }
        }
        // An event is either referenced by pages or spare, never both (shutdown destroys each
        // once).
        if started == 0 {
            self.spare_events.push(ev);
        } else {
            self.ref_event(ev, started);
        }
        self.stats.bytes_to_host += u64::from(started) * self.page as u64;
        self.stats.pages_evicted += u64::from(started);
        let (at, n) = (std::time::Instant::now(), started as usize);
        self.journal_swap(at, SwapDir::ToHost, SwapCause::Plan, moved, n);
        Ok(())
    }

    pub(super) fn prefetch(&mut self, ranges: &[(CUdeviceptr, usize)]) -> Result<usize, CUresult> {
        let mut pages = self.pages_in(ranges);
        // A unit whose frames another read-back took cannot come back before its copy out
        // and its completion: left for its access to wait for (`handover.rs`), rather than
        // hold every later prefetch behind that wait. (Counted as leaving below.)
        let before = pages.len();
        pages.retain(|&p| !self.is_handed(p));
        let (mut coming, mut leaving) = (0usize, (before - pages.len()) as u64);
        for &p in &pages {
            match self.pages.get(p).map(|e| e.state) {
                Some(ResidencyState::Host(_)) => coming += 1,
                Some(ResidencyState::ToHost { .. }) => leaving += 1,
                _ => {}
            }
        }
        if !self.op.rerun {
            self.stats.prefetch_pages_leaving += leaving;
        }
        if coming == 0 {
            // (Or none left: those of an earlier round came in without the lock.)
            return Ok(self.op.arrived_pages);
        }
        // A ticket on the manager's own swap-in stream: the copies in are queued there and
        // the first access waits for them on its own stream, as for any page `ToDevice`.
        self.clock += 1;
        let ticket = AccessTicket {
            stream: self.swap_in_stream,
            runs: runs(&pages),
        };
        let _resident = self.pin_pages(&ticket);
        // Pages of earlier rounds (a swap-in made here with the lock held counts among
        // `coming`).
        let earlier = self.op.arrived_pages;
        let r = self.for_demand(Demand::Prefetch, |s| s.make_resident(&ticket, false));
        self.unpin_unless_arriving(&ticket);
        r.map(|_| coming + earlier)
    }

    /// One step of a shrink that never waits ([`MemoryManager::set_budget_without_waiting`]):
    /// sets the budget and starts swap-outs of idle pages over it, less those already leaving.
    /// Returns the pages it started. Pages pinned by calls in flight or still used by queued
    /// work are left for a later step (or for the application's own next access, which evicts
    /// what it must under the smaller budget): taking them would mean waiting.
    ///
    /// [`MemoryManager::set_budget_without_waiting`]: super::MemoryManager::set_budget_without_waiting
    pub(super) fn shrink_step(&mut self, frames: usize) -> Result<usize, CUresult> {
        self.dev.set_budget_frames(frames);
        self.poll_with(false)?;
        let over = self.dev.in_use().saturating_sub(frames);
        let leaving = self.leaving_frames();
        if over <= leaving {
            return Ok(0);
        }
        // Nothing needed: only idle pages are taken, so `evict` never waits.
        self.for_demand(Demand::Budget, |s| s.evict(over - leaving, 0))?;
        Ok(self.leaving_frames().saturating_sub(leaving))
    }

    pub(super) fn set_budget(&mut self, frames: usize) -> Result<(), CUresult> {
        self.dev.set_budget_frames(frames);
        // Up to 8 rounds of evicting and waiting for the copies, each checked after; a round
        // that finds nothing in flight after its eviction (what it evicted was dropped, or all
        // is pinned) is followed by the check only.
        let mut last = false;
        for round in 0..=8 {
            // Landed swap-outs are completed by the caller without the lock where it may
            // (below), else here.
            self.poll_with(self.op.unlocked_rounds_left == 0)?;
            let over = self.dev.in_use().saturating_sub(frames);
            if over == 0 {
                // Frames over the budget go back to the driver, for other jobs on the card.
                let driver = self.driver.clone();
                self.dev.release_free_frames(&*driver);
                return Ok(());
            }
            if last || round == 8 {
                break;
            }
            let out = self.leaving_frames();
            if over > out {
                self.for_demand(Demand::Budget, |s| s.evict(over - out, over - out))?;
            }
            if self.leaving_frames() == 0 {
                last = true;
                continue;
            }
            if self.unlocked_round() {
                // The caller waits for the copies out and completes them without the lock,
                // then starts over (launches of other threads go on meanwhile).
                self.copy_waits = self.outgoing_events();
                self.completion_wanted = true;
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            self.wait_outgoing()?;
        }
        // What is left over the budget is pinned by calls in flight: wait for them.
        self.pin_stall = Some(PinStall {
            bytes_needed: self.dev.in_use().saturating_sub(frames) * self.page,
        });
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    }
}
