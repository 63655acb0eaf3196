//! Swap-ins remapped without the lock: bringing pages back costs VMM calls (their host
//! mappings removed, the device units mapped at their addresses, the access call) of 40 to
//! 360 µs each on the H100, and every launch takes the manager's lock. So, as for completing
//! swap-outs (`completion.rs`), a swap-in is decided under the lock
//! ([`Inner::begin_arrival`]: the pages, the device frames already taken for them, the copy
//! event), made without it ([`Arrival::run`]: the remap, the copies in and the event record)
//! and committed under it again ([`Inner::commit_arrival`]: the pages become `ToDevice`).
//!
//! Meanwhile the pages are *arriving*: still `Host` in the table, their data in their host
//! frames, but nothing may remap them, drop them or re-host them (their address may be
//! unmapped, or mapped to the device frame, at any moment). An access to one waits for the
//! commit (`remap_stall`); dropping dead host pages, re-mapping host pages after a failure
//! and re-cutting host units leave them alone. Eviction never meets them (it takes device
//! pages), and a free meanwhile only lowers their live count: the commit then brings in a
//! dead page, which `poll` notes dead once it has landed, as for any page freed while
//! coming in.
//!
//! The operation that wanted the pages (an access, a prefetch, a capture pin) returns with
//! the arrival in [`Inner::arrival`]; the facade runs it, commits it and starts the
//! operation over with the lock still held from the commit, so the pages are `ToDevice` (or
//! landed) when it looks again and it waits for their copy on its stream like for any page
//! coming in.

use std::time::Instant;

use tensile_driver_abi::{CUdeviceptr, CUresult};

use crate::memory::driver::{Driver, Event, PhysHandle, Stream};
use crate::memory::frames::DevFrame;
use crate::memory::journal::{BusyKind, SwapCause, SwapDir};
use crate::memory::page::ResidencyState;
use crate::memory::stats::Demand;

use super::backing::map_and_give_access;
use super::{coalesce, runs, Inner};

/// A swap-in whose driver calls are made without the lock (see the module docs).
#[derive(Debug)]
pub(super) struct Arrival {
    /// The pages coming in (all `Host`, sorted) and their device frames, in the same order.
    pages: Vec<usize>,
    frames: Vec<DevFrame>,
    /// The event recorded after the copies in.
    event: Event,
    /// Copy-out events the copies in wait for on the device: of the units among `frames`
    /// handed over while still leaving (`handover.rs`). Each holds a reference until the
    /// commit, so that it is not recorded again for another copy meanwhile.
    waits: Vec<Event>,
    /// Pages coming into frames handed over.
    handed_pages: usize,
    /// Host mappings to remove first, as `(first page, pages)`: a host unit's goes whole.
    host_unmaps: Vec<(usize, usize)>,
    /// The device units to map (address, bytes, allocation) and the ranges to give access.
    device_maps: Vec<(CUdeviceptr, usize, PhysHandle)>,
    access: Vec<(CUdeviceptr, usize)>,
    /// The copies in: `(arena address, host window address, bytes)`.
    copies: Vec<(CUdeviceptr, CUdeviceptr, usize)>,
    base: CUdeviceptr,
    page: usize,
    device: i32,
    stream: Stream,
    /// Whether an access waits for it (a stall).
    on_demand: bool,
    /// Page runs (inclusive) the operation that decided it keeps pinned until the commit.
    pinned: Vec<(usize, usize)>,
}

/// What [`Arrival::run`] managed.
#[derive(Debug, Clone, Copy)]
pub(super) struct ArrivalOutcome {
    /// The first `host_unmapped` host mappings were removed.
    host_unmapped: usize,
    /// Everything was done: mapped, copies and event queued.
    queued: bool,
    error: Option<CUresult>,
    /// When the driver calls started and ended (for the journal).
    ran: (Instant, Instant),
}

impl ArrivalOutcome {
    /// The driver error that stopped the swap-in, if one did.
    pub(super) fn error(&self) -> Option<CUresult> {
        self.error.filter(|_| !self.queued)
    }
}

impl Arrival {
    /// The event recorded after the copies in.
    pub(super) fn event(&self) -> Event {
        self.event
    }

    /// Keeps the pins of `runs` (inclusive page runs) until the commit.
    pub(super) fn hold_pins(&mut self, runs: &[(usize, usize)]) {
        self.pinned.extend_from_slice(runs);
    }

    fn va(&self, page: usize) -> CUdeviceptr {
        self.base + (page * self.page) as u64
    }

    /// Makes the driver calls, in an order that keeps every page's bytes reachable at every
    /// failure: the host mappings go (the data stays in the host frames), the device units
    /// are mapped and given access (a failure undoes its own maps), the copies in are queued
    /// and the event recorded after them (a failure waits for the copies already queued and
    /// unmaps the device units, so the commit can map the host frames back). Called without
    /// the manager's lock.
    pub(super) fn run(&self, driver: &dyn Driver) -> ArrivalOutcome {
        let started = Instant::now();
        let mut outcome = ArrivalOutcome {
            host_unmapped: 0,
            queued: false,
            error: None,
            ran: (started, started),
        };
        self.run_calls(driver, &mut outcome);
        outcome.ran.1 = Instant::now();
        outcome
    }

    fn run_calls(&self, driver: &dyn Driver, outcome: &mut ArrivalOutcome) {
        for &(a, n) in &self.host_unmaps {
            if let Err(e) = driver.mem_unmap(self.va(a), n * self.page) {
                outcome.error = Some(e);
                return;
            }
            outcome.host_unmapped += 1;
        }
        if let Err(e) = map_and_give_access(driver, &self.device_maps, &self.access, self.device) {
            outcome.error = Some(e);
            return;
        }
        // Frames handed over are written only once their copies out have read them.
        let queued = self
            .waits
            .iter()
            .try_for_each(|&ev| driver.stream_wait_event(self.stream, ev))
            .and_then(|()| {
                self.copies.iter().try_for_each(|&(dst, src, len)| {
                    driver.memcpy_dtod_async(dst, src, len, self.stream)
                })
            })
            .and_then(|()| driver.event_record(self.event, self.stream));
        match queued {
            Ok(()) => outcome.queued = true,
            Err(e) => {
                outcome.error = Some(e);
                // Copies already queued must not run into a range remapped to the host.
                if let Err(e) = driver.stream_synchronize(self.stream) {
                    tracing::error!(code = e, "the swap-in stream failed");
                }
                for &(va, bytes, _) in &self.device_maps {
                    let _ = driver.mem_unmap(va, bytes);
                }
            }
        }
    }
}

impl Inner {
    /// Decides the swap-in of `pages` (all `Host`, whole host units, sorted) to `frames` (in
    /// page order), marks the pages arriving and leaves it in `self.arrival` for the caller
    /// to run without the lock. On failure the frames go back.
    pub(super) fn begin_arrival(
        &mut self,
        pages: &[usize],
        frames: Vec<DevFrame>,
    ) -> Result<(), CUresult> {
        debug_assert!(self.arrival.is_none(), "one arrival per operation round");
        let event = match self.copy_event() {
            Ok(ev) => ev,
            Err(e) => {
                for d in frames {
                    self.dev.give(d);
                }
                return Err(e);
            }
        };
        let waits = self.handover_waits(&frames);
        for &ev in &waits {
            self.ref_event(ev, 1);
        }
        let handed_pages = if waits.is_empty() {
            0
        } else {
            frames
                .iter()
                .filter(|d| self.handed.contains_key(&d.unit))
                .count()
        };
        let mut host_unmaps: Vec<(usize, usize)> = Vec::new();
        for &p in pages {
            if self.unmapped_host.contains(&p)
                || host_unmaps.last().is_some_and(|&(a, n)| p < a + n)
            {
                continue;
            }
            host_unmaps.push(self.host_unit_span(p).unwrap_or((p, 1)));
        }
        let mut device_maps = Vec::new();
        for (&p, &d) in pages.iter().zip(&frames) {
            if d.offset == 0 {
                let (handle, n) = self.dev.unit(d);
                device_maps.push((self.va(p), n * self.page, handle));
            }
        }
        let access = runs(pages)
            .into_iter()
            .map(|(a, b)| (self.va(a), (b - a + 1) * self.page))
            .collect();
        let copies: Vec<(CUdeviceptr, CUdeviceptr)> = pages
            .iter()
            .filter_map(|&p| match self.pages.get(p).map(|e| e.state) {
                Some(ResidencyState::Host(h)) => Some((self.va(p), self.host.window_address(h))),
                _ => None,
            })
            .collect();
        self.arriving.extend(pages.iter().copied());
        self.arriving_frames.extend(frames.iter().copied());
        self.arrival = Some(Arrival {
            pages: pages.to_vec(),
            frames,
            event,
            waits,
            handed_pages,
            host_unmaps,
            device_maps,
            access,
            copies: coalesce(&copies, self.page),
            base: self.base,
            page: self.page,
            device: self.cfg.device,
            stream: self.swap_in_stream,
            on_demand: self.demand == Demand::Access,
            pinned: Vec::new(),
        });
        Ok(())
    }

    /// Commits what [`Arrival::run`] did: the pages become `ToDevice` behind the arrival's
    /// event, or, if it failed, stay `Host` with their host frames mapped back (through
    /// `remap_host`) and the device frames free.
    pub(super) fn commit_arrival(&mut self, a: Arrival, outcome: ArrivalOutcome) {
        self.remaps_committed += 1;
        if let Some(j) = &self.journal {
            let (start, end) = outcome.ran;
            j.busy(start, end, BusyKind::RemapIn, a.pages.len());
        }
        for p in &a.pages {
            self.arriving.remove(p);
        }
        self.arriving_frames.retain(|d| !a.frames.contains(d));
        for &run in &a.pinned {
            self.unpin_or_pin(run, false);
        }
        for &ev in &a.waits {
            self.unref_event(ev);
        }
        // Host mappings removed are noted as such: the pages coming in leave the set below,
        // whatever else shared their host units is mapped back by `remap_host`.
        for &(first, n) in &a.host_unmaps[..outcome.host_unmapped] {
            self.unmapped_host.extend(first..first + n);
        }
        if !outcome.queued {
            tracing::debug!(
                code = outcome.error,
                pages = a.pages.len(),
                "a swap-in's driver calls failed; its pages stay on the host"
            );
            // (A unit handed over is parked until its victim completes: its copies in may
            // have written it, so the victim's swap-out must not be cancelled: `handover.rs`.)
            for d in a.frames {
                self.dev.give(d);
            }
            self.spare_events.push(a.event);
            self.remap_host();
            return;
        }
        for (&p, &d) in a.pages.iter().zip(&a.frames) {
            let r = self.pages.start_swap_in(p, d, a.event);
            debug_assert!(r.is_ok(), "{r:?}");
            self.incoming.insert(p);
            self.unmapped_host.remove(&p);
        }
        self.ref_event(a.event, a.pages.len() as u32);
        self.stats.bytes_to_device += (a.pages.len() * self.page) as u64;
        let cause = if a.on_demand {
            SwapCause::Access
        } else {
            SwapCause::Plan
        };
        let n = a.pages.len();
        self.journal_swap(
            outcome.ran.1,
            SwapDir::ToDevice,
            cause,
            a.pages.iter().copied(),
            n,
        );
        self.stats.pages_swapped_in += a.pages.len() as u64;
        self.stats.pages_handed_over += a.handed_pages as u64;
        // The access that wanted the pages stalled (counted when it returns), even if they
        // have landed by the time it looks again.
        self.op.stalled |= a.on_demand;
        self.op.arrived_pages += a.pages.len();
        self.note_resident();
        self.remap_host();
    }
}
