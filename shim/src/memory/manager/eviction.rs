//! Eviction: finding device frames for pages that need them. Cheap frames first (free,
//! new within the budget, dead pages' units), then swap-outs of the least recently used
//! unpinned pages (or those the eviction advice names), and the free reserve kept ahead of
//! demand. The copies themselves are started in `swap.rs`.

use tensile_driver_abi::{CUdeviceptr, CUresult, CUDA_ERROR_OUT_OF_MEMORY};

use tensile_analyzer::sim::free_reserve_pages_for;

use crate::memory::advice::NextUse;
use crate::memory::driver::Event;
use crate::memory::frames::{DevFrame, DevicePool};
use crate::memory::journal::eviction_cause;
use crate::memory::page::{PageEntry, ResidencyState, Use};
use crate::memory::stats::Demand;

use super::{Inner, PinStall, SwapOrder};

impl Inner {
    /// A unit of `pages` device frames without copying anything: free, new within budget, or
    /// made from the units of dead idle pages. Its first frame and size.
    ///
    /// At the budget, a dead unit of the size asked for is taken before units are re-cut: a
    /// re-cut is a `cuMemRelease` of a free unit of another size and a `cuMemCreate`, made
    /// with the manager's lock held (40 and 32 µs on the H100), and in a training step each
    /// tensor is the size of its last iteration's, whose unit is dead by then. Below the
    /// budget a new unit is made instead: dead pages are left for an allocation at their
    /// address to take back without a driver call.
    pub(super) fn take_unit_cheap(
        &mut self,
        pages: usize,
    ) -> Result<Option<(DevFrame, usize)>, CUresult> {
        if let Some(u) = self.dev.take_free_unit(pages) {
            return Ok(Some(u));
        }
        if self.dev.can_create(pages) {
            if let Some(u) = self.dev.take_unit(&*self.driver, pages)? {
                return Ok(Some(u));
            }
        }
        self.fences.poll_all(&*self.driver)?;
        let completed = self.fences.completed().to_vec();
        let mut dead = self.dead_idle_units(&completed);
        if let Some(i) = dead.iter().position(|&(_, n)| n == pages) {
            let (a, _) = dead.remove(i);
            // An allocation makes the unmap with its own maps, without the lock.
            self.unback_for_reuse(a, &completed)?;
            if let Some(u) = self.dev.take_free_unit(pages) {
                return Ok(Some(u));
            }
        }
        // Units are re-cut: free ones of other sizes released, dead ones dropped in page
        // order until there is room.
        if let Some(u) = self.dev.take_unit(&*self.driver, pages)? {
            return Ok(Some(u));
        }
        for (a, _) in dead {
            if self.dev.available() >= pages {
                break;
            }
            self.unback(a, &completed)?;
        }
        self.dev.take_unit(&*self.driver, pages)
    }

    /// The device units that only dead idle pages hold (all `Device`), as (first page,
    /// pages), in page order. Not those handed over whose victims are still leaving: their
    /// frames would only be parked until then (`handover.rs`), and the unit would not be free
    /// for a failed allocation to give back to its pages.
    fn dead_idle_units(&self, completed: &[u64]) -> Vec<(usize, usize)> {
        let mut units = Vec::new();
        let mut seen_to = 0;
        for &p in &self.dead_device {
            if p < seen_to {
                continue;
            }
            let Some((a, n)) = self.unit_span(p) else {
                continue;
            };
            seen_to = a + n;
            let handed = self
                .pages
                .get(a)
                .and_then(|e| e.state.device_frame())
                .is_some_and(|d| self.handed.contains_key(&d.unit));
            if !handed
                && self.span_all((a, n), |e| {
                    e.live == 0
                        && e.is_idle(completed)
                        && matches!(e.state, ResidencyState::Device(_))
                })
            {
                units.push((a, n));
            }
        }
        units
    }

    /// A one-page device frame without copying anything ([`Self::take_unit_cheap`]).
    pub(super) fn take_device_cheap(&mut self) -> Result<Option<DevFrame>, CUresult> {
        Ok(self.take_unit_cheap(1)?.map(|(f, _)| f))
    }

    /// Completes finished swaps (swap-outs too only if `complete_outgoing`: see
    /// [`Self::poll_with`]) and, once the budget is used up, starts swap-outs of idle least
    /// recently used pages until `free_reserve_pages` frames are free or on their way. Never
    /// waits for anything.
    pub(super) fn keep_reserve(&mut self, complete_outgoing: bool) -> Result<(), CUresult> {
        self.poll_with(complete_outgoing)?;
        let ready = self.dev.available() + self.leaving_frames();
        let reserve = self.reserve_pages();
        if ready < reserve {
            self.for_demand(Demand::Reserve, |s| s.evict(reserve - ready, 0))?;
        }
        Ok(())
    }

    /// Frames [`Self::keep_reserve`] keeps free or on their way out: the configured
    /// [`super::ManagerConfig::free_reserve_pages`] at least, more under heavy pressure
    /// ([`free_reserve_pages_for`]: an eighth of what must turn over, up to a quarter of the
    /// budget), and no more than a quarter of the host pool's cap; none while the configured
    /// one is 0 (a plan in force moves the pages itself).
    ///
    /// Why more under pressure: the application's thread that lacks frames waits for its
    /// victims' copies out and remaps them itself, the copy engine idle meanwhile; the frames
    /// the maintenance thread empties ahead of need come without either.
    pub(super) fn reserve_pages(&self) -> usize {
        let floor = self.cfg.free_reserve_pages;
        if floor == 0 {
            return 0;
        }
        let budget = self.dev.budget_frames();
        let peak = self.sub.peak_live_bytes().div_ceil(self.page as u64);
        let rule = free_reserve_pages_for(floor as u64, budget as u64, peak) as usize;
        rule.min((self.cfg.host_cap / self.page / 4).max(floor))
    }

    /// Device frames for `pages` (sorted), one unit per run of consecutive pages (at most
    /// [`MAX_UNIT_PAGES`] each), in page order, evicting least recently used pages if it must
    /// (and waiting for their copies: this is the on-demand stall). All or nothing.
    pub(super) fn acquire_device_frames(
        &mut self,
        pages: &[usize],
    ) -> Result<Vec<DevFrame>, CUresult> {
        let sizes = self.unit_sizes(pages);
        self.acquire_units(&sizes)
    }

    /// Units of the given sizes, their frames in order ([`Self::acquire_device_frames`]).
    pub(super) fn acquire_units(&mut self, sizes: &[usize]) -> Result<Vec<DevFrame>, CUresult> {
        let mut got = Vec::with_capacity(sizes.len());
        let r = self.acquire_into(sizes, &mut got);
        let frames = got
            .into_iter()
            .flat_map(|(first, n)| DevicePool::frames(first, n));
        if r.is_err() {
            // Whatever went wrong, the units taken so far go back (a unit handed over is
            // parked until its victim completes: `handover.rs`).
            for d in frames {
                self.dev.give(d);
            }
            return r.map(|()| Vec::new());
        }
        Ok(frames.collect())
    }

    /// [`Self::acquire_device_frames`] for pages read back: these may also take the frames
    /// of units still on their way out, their copies in then ordered after those units'
    /// copies out ([`Self::handover_waits`]; `handover.rs`).
    pub(super) fn acquire_frames_to_read_back(
        &mut self,
        pages: &[usize],
    ) -> Result<Vec<DevFrame>, CUresult> {
        self.hand_over_ok = self.cfg.hand_over;
        let r = self.acquire_device_frames(pages);
        self.hand_over_ok = false;
        r
    }

    pub(super) fn acquire_into(
        &mut self,
        sizes: &[usize],
        got: &mut Vec<(DevFrame, usize)>,
    ) -> Result<(), CUresult> {
        let mut rounds = 0;
        while got.len() < sizes.len() {
            let k = sizes[got.len()];
            if let Some(u) = self.take_unit_cheap(k)? {
                got.push(u);
                continue;
            }
            // Evict enough for the rest (in flight already counts), then wait for it.
            let short: usize = sizes[got.len()..].iter().sum();
            let in_flight = self.leaving_frames();
            if short > in_flight {
                let want = (short - in_flight).max(self.cfg.evict_batch);
                self.evict(want, short - in_flight)?;
            }
            if self.dev.available() >= k {
                continue; // dead pages were dropped without a copy
            }
            if self.hand_over_ok {
                // A read-back takes a leaving unit's frames at once, ordered after its copy
                // out on the device, rather than wait for that copy here and complete it.
                if let Some(u) = self.take_leaving_unit(k) {
                    got.push(u);
                    continue;
                }
            }
            let leaving = self.leaving_frames();
            if leaving > 0 {
                // (`completing` is a part of `outgoing`; handed-over units give no frames.)
                if self.completing_for_frames() == leaving {
                    // Every frame on its way is being completed by another thread without
                    // the lock: wait for its commit.
                    self.remap_stall = true;
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                if self.unlocked_round() {
                    // Let the caller complete the swap-outs (their VMM calls) without the
                    // lock, first waiting for the copy out queued first unless some have
                    // landed, then start over. Only the first: the swap-out stream copies
                    // the next units while this thread remaps the one that landed (waiting
                    // for all of them had every copy and then every remap take turns).
                    // Only the units no other thread is completing are ours to
                    // complete: a landed copy of theirs is no reason to stop (the completion
                    // found nothing, the operation spun through its rounds in microseconds
                    // and then waited for the copies out with the lock held, every other
                    // thread waiting with it: 70 times in an MLP rerun under its plan).
                    let events = self.uncompleted_outgoing_events();
                    return Err(self.complete_without_the_lock(&events));
                }
                // Copies out that have finished give their frames now.
                self.poll()?;
                if self.dev.available() >= k {
                    continue;
                }
                if self.leaving_frames() == 0 {
                    // All of them landed and a unit of `k` is still short: evict again.
                    rounds += 1;
                    if rounds <= 4 {
                        continue;
                    }
                }
            }
            if self.leaving_frames() == 0 && !self.handed.is_empty() {
                // Every unit on its way out was handed over, and the pages read back into
                // them cannot leave before those units complete (a unit leaves whole, in one
                // state): complete them, then evict again.
                let events: Vec<Event> = self.handed.values().map(|u| u.event).collect();
                if self.unlocked_round() {
                    return Err(self.complete_without_the_lock(&events));
                }
                self.wait_outgoing()?;
                rounds += 1;
                if rounds <= 4 {
                    continue;
                }
            }
            rounds += 1;
            if self.leaving_frames() == 0 || rounds > 4 {
                // Nothing free, nothing on its way out, and nothing evictable: the resident
                // pages are pinned by calls in flight on other threads. Not an out-of-memory:
                // the caller gives back what it holds, waits for pins to drop and retries.
                self.pin_stall = Some(PinStall {
                    bytes_needed: short * self.page,
                });
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            self.wait_outgoing()?;
        }
        Ok(())
    }

    /// Has the caller complete the swap-outs of `events` without the lock, then start over:
    /// at once if one of them has landed, else after waiting for the copy queued first.
    /// Returns the out-of-memory the operation stops with.
    fn complete_without_the_lock(&mut self, events: &[Event]) -> CUresult {
        let driver = self.driver.clone();
        let landed = events
            .iter()
            .any(|&e| driver.event_query(e).unwrap_or(false));
        self.copy_waits = if landed {
            Vec::new()
        } else {
            self.first_copied(events).into_iter().collect()
        };
        self.completion_wanted = true;
        CUDA_ERROR_OUT_OF_MEMORY
    }

    /// Starts swap-outs of up to `want` least recently used unpinned pages (at least `need`,
    /// ordered after their last uses on the device if there are not enough idle ones).
    pub(super) fn evict(&mut self, want: usize, need: usize) -> Result<(), CUresult> {
        self.fences.poll_all(&*self.driver)?;
        let mut candidates = self.eviction_candidates();
        if candidates.len() < need && !self.incoming.is_empty() {
            // Pages still arriving hold frames too: let them land, then they can leave. The
            // caller waits for their copies without the lock if it may, and starts over.
            if self.unlocked_round() {
                self.copy_waits = self.incoming_events();
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            self.wait_incoming()?;
            candidates = self.eviction_candidates();
        }
        // Fences of dead units still in use, to wait for without the lock.
        let mut fence_waits: Vec<Event> = Vec::new();
        // In rank order (oldest first, or needed last first when an adviser knows the future:
        // `eviction_candidates`), idle and busy alike: a hot page that happens to be idle right
        // now stays, a colder page still used by queued work leaves once that work is done. A
        // busy page is taken only while fewer than `need` victims are found; beyond that (the
        // optional part of a batch, or eviction ahead of need) it is skipped. Its copy is
        // ordered after its uses on the device (the swap-out stream waits for their fences),
        // so nothing here waits for the application's work with the lock held.
        // A unit leaves whole: a page is taken with the rest of its unit, and only if none of
        // them is pinned; the unit ranks where its first-ranked page does.
        let mut idle_victims: Vec<usize> = Vec::with_capacity(want.max(need));
        let mut busy_victims: Vec<usize> = Vec::new();
        let mut seen: std::collections::HashSet<usize> = std::collections::HashSet::new();
        for (_, p, _) in candidates {
            let taken = idle_victims.len() + busy_victims.len();
            if taken >= want.max(need) {
                break;
            }
            let Some((a, n)) = self.unit_span(p) else {
                continue;
            };
            if !seen.insert(a) {
                continue;
            }
            let unit = a..a + n;
            let entries: Vec<&PageEntry> = unit.clone().filter_map(|q| self.pages.get(q)).collect();
            if entries.len() != n
                || !entries
                    .iter()
                    .all(|e| e.pins == 0 && matches!(e.state, ResidencyState::Device(_)))
            {
                continue;
            }
            let completed = self.fences.completed();
            if entries.iter().all(|e| e.is_idle(completed)) {
                idle_victims.extend(unit);
                continue;
            }
            if taken >= need {
                continue;
            }
            if !entries.iter().all(|e| e.live == 0) {
                busy_victims.extend(unit);
                continue;
            }
            // A dead unit is dropped, not copied, and a drop needs it idle: wait for it (on
            // the application's work), without the lock if the caller may.
            let uses: Vec<Use> = entries.iter().flat_map(|e| e.uses.clone()).collect();
            if self.op.unlocked_rounds_left > 0 {
                for u in uses {
                    let driver = self.driver.clone();
                    let slot = u.stream_slot as usize;
                    if let Some(ev) = self.fences.event_after(&*driver, slot, u.seq)? {
                        fence_waits.push(ev);
                    }
                }
                continue;
            }
            self.stats.locked_waits += 1;
            for u in uses {
                self.fences
                    .wait(&*self.driver, u.stream_slot as usize, u.seq)?;
            }
            let completed = self.fences.completed();
            if self.span_all((a, n), |e| e.is_idle(completed)) {
                idle_victims.extend(unit);
            }
        }
        if idle_victims.len() < need && !fence_waits.is_empty() {
            // Short of idle pages, and dead units would do once their work is done (dropped,
            // with no copy, where a busy unit's frames come only after its work and a copy):
            // the caller waits for that work without the lock and starts over.
            self.op.unlocked_rounds_left -= 1;
            fence_waits.sort_unstable();
            fence_waits.dedup();
            self.copy_waits = fence_waits;
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let idle_need = need.min(idle_victims.len());
        let busy_need = need - idle_need;
        if tracing::enabled!(tracing::Level::TRACE) {
            self.trace_eviction(want, need, idle_victims.len(), busy_victims.len());
        }
        let before = self.stats.pages_evicted;
        let r = self.swap_out_busy_and_idle(idle_victims, idle_need, busy_victims, busy_need);
        let evicted = self.stats.pages_evicted - before;
        self.stats.evicted_for.add(self.demand, evicted);
        r
    }

    /// One line on an eviction of the manager's own choice: what wanted the frames, the
    /// victims, and where the frames a plan counts free went (live pages an allocation covers
    /// whole or not; freed pages still holding frames, by why they are not dropped).
    fn trace_eviction(&self, want: usize, need: usize, idle_victims: usize, busy_victims: usize) {
        let (mut live_whole, mut live_shared) = (0, 0);
        for (p, e) in self.pages.iter() {
            if e.live == 0 || !matches!(e.state, ResidencyState::Device(_)) {
                continue;
            }
            if self.whole_owner(p).is_some() {
                live_whole += 1;
            } else {
                live_shared += 1;
            }
        }
        let (mut mixed, mut busy, mut whole) = (0, 0, 0);
        let completed = self.fences.completed();
        for &p in &self.dead_device {
            let Some((a, n)) = self.unit_span(p) else {
                continue;
            };
            if !self.span_all((a, n), |e| e.live == 0) {
                mixed += 1;
            } else if !self.span_all((a, n), |e| e.is_idle(completed)) {
                busy += 1;
            } else {
                whole += 1;
            }
        }
        // Where the live pages stand in the adviser's eyes: the plan's next use of each.
        let mut uses = [0usize; 5];
        if let Some(advice) = &self.advice {
            let pages: Vec<CUdeviceptr> = self
                .pages
                .iter()
                .filter(|(_, e)| e.live > 0 && matches!(e.state, ResidencyState::Device(_)))
                .map(|(p, _)| self.va(p))
                .collect();
            let mut next = Vec::with_capacity(pages.len());
            if advice.next_uses(&pages, self.page as u64, &mut next) {
                for n in next {
                    uses[match n {
                        NextUse::Never => 0,
                        NextUse::Unknown => 1,
                        NextUse::In(l) if l < 64 => 2,
                        NextUse::In(l) if l < 400 => 3,
                        NextUse::In(_) => 4,
                    }] += 1;
                }
            }
        }
        tracing::trace!(
            "evict for {:?}: next uses of live pages: never {}, unknown {}, <64 {}, <400 {}, \
             later {}; want {want} need {need}; {idle_victims} idle and {busy_victims} \
             busy victims; {} frames free of {} ({} in use; live: {live_whole} covered by one \
             allocation, {live_shared} not); freed pages on the device: {mixed} in units with \
             live pages, {busy} busy, {whole} droppable; {} leaving, {} arriving",
            self.demand,
            uses[0],
            uses[1],
            uses[2],
            uses[3],
            uses[4],
            self.dev.available(),
            self.dev.budget_frames(),
            self.dev.in_use(),
            self.outgoing.len(),
            self.incoming.len(),
        );
    }

    fn swap_out_busy_and_idle(
        &mut self,
        idle: Vec<usize>,
        idle_need: usize,
        busy: Vec<usize>,
        busy_need: usize,
    ) -> Result<(), CUresult> {
        self.swap_out_pages(
            idle,
            idle_need,
            SwapOrder::Idle,
            eviction_cause(self.demand),
        )?;
        if busy.is_empty() {
            return Ok(());
        }
        self.order_swap_out_after_uses(&busy)?;
        self.swap_out_pages(
            busy,
            busy_need,
            SwapOrder::AfterUses,
            eviction_cause(self.demand),
        )
    }

    /// Unpinned `Device` pages as (rank, page, idle), the first to evict first: least
    /// recently used first, or, when an adviser knows the future ([`EvictionAdvice`]), the
    /// pages it knows no further use of (oldest first), then the page needed last, then the
    /// pages it cannot place (oldest first), then those left out of its sample (oldest first).
    pub(super) fn eviction_candidates(&self) -> Vec<(u64, usize, bool)> {
        let completed = self.fences.completed();
        // A unit leaves whole: one with a page pinned (or not yet arrived) cannot.
        let blocked: std::collections::HashSet<u32> = self
            .pages
            .iter()
            .filter(|(_, e)| e.pins > 0 || !matches!(e.state, ResidencyState::Device(_)))
            .filter_map(|(_, e)| e.state.device_frame().map(|d| d.unit))
            .collect();
        let mut ranked: Vec<(u64, usize, bool)> = self
            .pages
            .iter()
            .filter(|(_, e)| match e.state {
                ResidencyState::Device(d) => e.pins == 0 && !blocked.contains(&d.unit),
                _ => false,
            })
            .map(|(p, e)| (e.last_access, p, e.is_idle(completed)))
            .collect();
        if let Some(advice) = &self.advice {
            // The adviser is asked about an evenly spread sample of at most `advice_sample`
            // pages (every page while there are fewer): the answer costs about 0.25 µs a page
            // with the lock held (`cargo bench -p tensile-shim --bench eviction_advice`), 6 ms
            // for the 20,000 pages of a 40 GiB budget. The furthest next use in the sample
            // stands for the furthest overall; the pages left out rank after every sampled
            // one, oldest first.
            let stride = ranked.len().div_ceil(self.cfg.advice_sample.max(1)).max(1);
            let pages: Vec<CUdeviceptr> = ranked
                .iter()
                .step_by(stride)
                .map(|&(_, p, _)| self.va(p))
                .collect();
            let mut next = Vec::with_capacity(pages.len());
            if advice.next_uses(&pages, self.page as u64, &mut next) && next.len() == pages.len() {
                // Ages are clock values far below 2^62. Pages no longer needed keep their
                // age and go first; then the pages needed again, the furthest first; the pages
                // the adviser cannot place last, oldest first (it knows nothing of their uses,
                // and evicting a hot one the plan does not see would cost a fetch per use).
                let mut next = next.into_iter();
                for (i, c) in ranked.iter_mut().enumerate() {
                    if i % stride != 0 {
                        c.0 += 3 << 62;
                        continue;
                    }
                    match next.next() {
                        Some(NextUse::Never) | None => {}
                        Some(NextUse::In(launches)) => {
                            c.0 = (1 << 62) + u64::from(u32::MAX - launches)
                        }
                        Some(NextUse::Unknown) => c.0 += 1 << 63,
                    }
                }
            }
        }
        ranked.sort_unstable();
        ranked
    }
}
