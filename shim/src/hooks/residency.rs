//! Making arena memory device-resident around a launch, copy or memset.
//!
//! [`pin`] asks the memory manager to bring every touched range onto the device (swapping
//! in, evicting others) and ordered before the work on its stream; [`Pinned::done`] reports
//! the work queued, so the pages stay until it completes. Without a manager, or when nothing
//! touched lies in the arena, both are free. [`forward_pinned`] wraps a call in the two.
//! This module does not decide what is touched: the hooks resolve that.
//!
//! Work queued on a capturing stream ([`super::capture`]) runs whenever the graph is
//! launched, where the manager can neither order a swap-in before it nor see it complete.
//! Its arena allocations are therefore made resident at once (the host waits for the copies,
//! made on the manager's own streams) and pinned until they are freed
//! ([`MemoryManager::pin_for_capture`](crate::memory::MemoryManager::pin_for_capture)); nothing
//! is queued on, recorded on, or waited for by the capturing stream. `cuGraphLaunch` needs
//! nothing more: what its graph touches cannot move.
//!
//! A process using several devices has a manager per device, each owning its arena's
//! addresses. Work touches its own device's memory through that device's manager, ordered on
//! the work's stream as above. Memory of another device (peer access, a copy between devices)
//! is made resident at once and pinned until freed in the manager that owns it, as for a
//! capture: the manager's events belong to its own device's context, and cannot be recorded
//! on, nor order, another device's stream. Which device the work runs on is the current
//! context's. A process with one manager takes none of this: its path is the one above.

use std::sync::atomic::{AtomicBool, Ordering};

use tensile_driver_abi::{CUresult, CUDA_ERROR_OUT_OF_MEMORY};

use super::capture::CallStream;
use crate::managed::Managed;
use crate::memory::{AccessTicket, Stream};
use crate::runtime::Runtime;

/// Pages held device-resident for one call until its work is queued.
#[must_use = "call done() after forwarding, or the pages stay pinned"]
pub struct Pinned {
    managed: &'static Managed,
    ticket: AccessTicket,
    /// Tickets of other devices' managers (none unless several run: no allocation).
    more: Vec<(&'static Managed, AccessTicket)>,
}

impl Pinned {
    /// The work was queued (or its forward failed): the pages may go once it completes.
    pub fn done(self) {
        let first = std::iter::once((self.managed, self.ticket));
        for (managed, ticket) in first.chain(self.more) {
            if let Err(code) = managed.mm.note_access_done(ticket) {
                tracing::warn!("tensile: recording an access failed with error {code}");
            }
        }
    }
}

/// Brings `ranges` (`(start, bytes)`, arena or not) onto the device for work about to be
/// queued on `stream` (whose handle is `CU_STREAM_PER_THREAD` for a per-thread default
/// stream). `Ok(None)`: nothing to do. On error the call must not be forwarded: the code is
/// what the application gets. `what` names the call for the one log line an access larger
/// than the whole budget gets (other causes the manager logs itself).
#[inline]
pub fn pin(
    rt: &'static Runtime,
    stream: &CallStream,
    ranges: &[(u64, usize)],
    what: impl FnOnce() -> String,
) -> Result<Option<Pinned>, CUresult> {
    if rt.memory.count() > 1 {
        return pin_on_several(rt, stream, ranges, what);
    }
    let Some(managed) = rt.memory() else {
        return Ok(None);
    };
    if !ranges.iter().any(|&(p, n)| n > 0 && managed.mm.owns(p)) {
        return Ok(None);
    }
    if stream.is_capturing() {
        return pin_for_capture(managed, ranges, what).map(|()| None);
    }
    match managed
        .mm
        .prepare_access(Stream(stream.handle() as usize), ranges)
    {
        Ok(ticket) => Ok(Some(Pinned {
            managed,
            ticket,
            more: Vec::new(),
        })),
        Err(code) => Err(access_failed(managed, ranges, what, code)),
    }
}

/// Logs why an access failed (`code`), in one line for an access larger than the budget;
/// returns the code.
fn access_failed(
    managed: &Managed,
    ranges: &[(u64, usize)],
    what: impl FnOnce() -> String,
    code: CUresult,
) -> CUresult {
    let bytes = arena_bytes(managed, ranges);
    let budget = managed.mm.budget() as u64;
    if code == CUDA_ERROR_OUT_OF_MEMORY && bytes > budget {
        tracing::error!(
            "tensile: {} needs {} bytes ({} MiB) of managed memory at once, more than the \
             device budget of {} MiB{}: CUDA_ERROR_OUT_OF_MEMORY",
            what(),
            bytes,
            bytes >> 20,
            budget >> 20,
            on_device(managed),
        );
    } else {
        // Any other cause (host pool, pins, fragmentation) the manager has logged, once per
        // cause; a line per failed call here would be a flood.
        tracing::debug!(
            "tensile: {} touching {bytes} bytes of managed memory failed with error {code}",
            what()
        );
    }
    code
}

/// " on device N" when the process manages several devices (else nothing: a process using
/// one device says what it always said).
fn on_device(managed: &Managed) -> String {
    match crate::runtime::existing() {
        Some(rt) if rt.memory.count() > 1 => format!(" on device {}", managed.driver.device()),
        _ => String::new(),
    }
}

/// [`pin`] in a process with several managers: each owner of a range pins it, the current
/// context's on the work's stream, the others at once until freed (see the module docs). On
/// an error the tickets taken are given back and nothing is forwarded.
#[cold]
fn pin_on_several(
    rt: &'static Runtime,
    stream: &CallStream,
    ranges: &[(u64, usize)],
    what: impl FnOnce() -> String,
) -> Result<Option<Pinned>, CUresult> {
    let mut what = Some(what);
    let mut what = move || what.take().map_or_else(String::new, |f| f());
    let local = rt.memory.of_current_context();
    let mut tickets: Vec<(&'static Managed, AccessTicket)> = Vec::new();
    let give_back = |tickets: Vec<(&'static Managed, AccessTicket)>| {
        for (managed, ticket) in tickets {
            let _ = managed.mm.note_access_done(ticket);
        }
    };
    for managed in rt.memory.running() {
        if !ranges.iter().any(|&(p, n)| n > 0 && managed.mm.owns(p)) {
            continue;
        }
        let is_local = local.is_some_and(|l| std::ptr::eq(l, managed));
        if stream.is_capturing() || !is_local {
            if !is_local {
                say_peer_pinned(managed, local);
            }
            if let Err(code) = pin_for_capture(managed, ranges, &mut what) {
                give_back(tickets);
                return Err(code);
            }
            continue;
        }
        match managed
            .mm
            .prepare_access(Stream(stream.handle() as usize), ranges)
        {
            Ok(ticket) => tickets.push((managed, ticket)),
            Err(code) => {
                give_back(tickets);
                return Err(access_failed(managed, ranges, &mut what, code));
            }
        }
    }
    let mut tickets = tickets.into_iter();
    Ok(tickets.next().map(|(managed, ticket)| Pinned {
        managed,
        ticket,
        more: tickets.collect(),
    }))
}

/// Says once that memory of one device was used by work on another, and what that costs.
fn say_peer_pinned(owner: &Managed, local: Option<&Managed>) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let from = local.map_or_else(
        || "a context without a memory manager".to_string(),
        |l| format!("device {}", l.driver.device()),
    );
    tracing::info!(
        "tensile: work on {from} uses memory of device {} (peer access or a copy between \
         devices): such allocations are pinned on device {} until freed, never swapped",
        owner.driver.device(),
        owner.driver.device()
    );
}

/// The captured-work path of [`pin`].
fn pin_for_capture(
    managed: &Managed,
    ranges: &[(u64, usize)],
    what: impl FnOnce() -> String,
) -> Result<(), CUresult> {
    managed.mm.pin_for_capture(ranges).inspect_err(|&code| {
        tracing::error!(
            "tensile: {} is captured into a graph; pinning the {} bytes of managed memory it \
             touches failed with error {code}",
            what(),
            arena_bytes(managed, ranges)
        );
    })
}

/// [`pin`], then `forward` (the call itself), then [`Pinned::done`]: the call's result, or
/// the pin's error code (then the call was not forwarded).
#[inline]
pub fn forward_pinned(
    rt: &'static Runtime,
    stream: u64,
    ranges: &[(u64, usize)],
    what: impl FnOnce() -> String,
    forward: impl FnOnce() -> CUresult,
) -> CUresult {
    let pinned = match pin(rt, &CallStream::new(rt, stream), ranges, what) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let r = forward();
    if let Some(p) = pinned {
        p.done();
    }
    r
}

/// Bytes of the arena the ranges cover (overlaps counted once).
fn arena_bytes(managed: &Managed, ranges: &[(u64, usize)]) -> u64 {
    let mut rs: Vec<(u64, u64)> = ranges
        .iter()
        .filter(|&&(p, n)| n > 0 && managed.mm.owns(p))
        .map(|&(p, n)| (p, p.saturating_add(n as u64)))
        .collect();
    rs.sort_unstable();
    let mut total = 0;
    let mut covered_to = 0;
    for (start, end) in rs {
        let start = start.max(covered_to);
        if end > start {
            total += end - start;
            covered_to = end;
        }
    }
    total
}
