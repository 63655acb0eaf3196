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
}

impl Pinned {
    /// The work was queued (or its forward failed): the pages may go once it completes.
    pub fn done(self) {
        if let Err(code) = self.managed.mm.note_access_done(self.ticket) {
            tracing::warn!("tensile: recording an access failed with error {code}");
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
        Ok(ticket) => Ok(Some(Pinned { managed, ticket })),
        Err(code) => {
            let bytes = arena_bytes(managed, ranges);
            let budget = managed.mm.budget() as u64;
            if code == CUDA_ERROR_OUT_OF_MEMORY && bytes > budget {
                tracing::error!(
                    "tensile: {} needs {} bytes ({} MiB) of managed memory at once, more than \
                     the device budget of {} MiB: CUDA_ERROR_OUT_OF_MEMORY",
                    what(),
                    bytes,
                    bytes >> 20,
                    budget >> 20
                );
            } else {
                // Any other cause (host pool, pins, fragmentation) the manager has logged,
                // once per cause; a line per failed call here would be a flood.
                tracing::debug!(
                    "tensile: {} touching {bytes} bytes of managed memory failed with error \
                     {code}",
                    what()
                );
            }
            Err(code)
        }
    }
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
