//! Frames handed over in stream order: a page read back when no device frame is free takes the
//! frames of a unit still on its way out, instead of waiting on the host for that unit's copy
//! to land and completing its swap-out first.
//!
//! Without it, the thread reading back (the application's, for an access) waits for a victim's
//! copy out, then unmaps the victim's unit, maps its host frames and gives them access (about
//! a millisecond of VMM calls for a unit on the H100), and only then maps the frame at its own
//! pages and queues its copy in; it queues nothing else meanwhile. Under a plan at 30% of the
//! MLP's peak that was 88% of the application thread's stall time, the card idle 144 ms a step
//! waiting for it (docs/rerun.md, "Session 33").
//!
//! With it, the device orders the reuse: the reader maps the victim's physical allocation at
//! its own address too (the driver accepts one allocation mapped at several addresses) and
//! queues its copy in on the swap-in stream after the victim's copy-out event, so the copy in
//! cannot overwrite the frame before the copy out has read it. The host goes on at once. The
//! victim stays `ToHost` in the table, its unit *handed over* ([`Inner::handed`]), until its
//! completion (whoever makes it) unmaps the victim's address and maps its host frames there,
//! without giving the frames back to the pool: the reader owns them.
//!
//! While a unit is handed over:
//! - its swap-out cannot be cancelled (its frame is the reader's), so an access to the victim
//!   waits for the copy out and the completion, then reads it back like any page on the host;
//!   a prefetch leaves it for its access;
//! - its frames are not on their way to the pool: eviction counts only the rest of `outgoing`
//!   ([`Inner::leaving_frames`]), and a thread short of frames does not wait for its copy;
//! - its completion may run with its pages pinned (an access waiting for it pins them);
//! - a read-back that fails after taking it gives its frames back to the pool as usual, and
//!   the pool *parks* them until the victim completes: the hand-over is not undone, since
//!   the failed read-back's copies may have written the frames already (the victim's bytes
//!   are safe in its host frames by then, but cancelling its swap-out would bring back the
//!   device frames as they are now);
//! - its pages and the reader's hold the same device frames (the audit allows it).
//!
//! What it costs a stray access (one the shim did not see) to the victim's address between
//! the hand-over and the completion: a write lands in the reader's page (without it, a write
//! to a page being swapped out was lost with the swap-out's copy all the same), and a read
//! reads the reader's data where it read the victim's stale data before.

use std::collections::HashMap;

use crate::memory::driver::Event;
use crate::memory::frames::DevFrame;
use crate::memory::page::ResidencyState;

use super::Inner;

/// A unit whose frames a read-back took while its victim's swap-out is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HandedUnit {
    /// The victim's first page and pages (still `ToHost`).
    pub(super) first: usize,
    pub(super) pages: usize,
    /// The victim's copy-out event: the reader's copy in waits for it on the device.
    pub(super) event: Event,
}

impl Inner {
    /// Frames on their way back to the pool: the pages leaving the device, less those of
    /// units handed over (their frames stay with the pages read back into them).
    pub(super) fn leaving_frames(&self) -> usize {
        let handed: usize = self.handed.values().map(|u| u.pages).sum();
        self.outgoing.len().saturating_sub(handed)
    }

    /// Whether page `p` is `ToHost` in a unit whose frames were handed over: the victim's,
    /// not the pages read back into it (which may leave too, before the victim completes).
    pub(super) fn is_handed(&self, p: usize) -> bool {
        self.handed_unit_of(p).is_some()
    }

    /// The hand-over whose victim page `p` is, if it is one.
    fn handed_unit_of(&self, p: usize) -> Option<&HandedUnit> {
        match self.pages.get(p)?.state {
            ResidencyState::ToHost { dev, .. } => self
                .handed
                .get(&dev.unit)
                .filter(|u| p.checked_sub(dev.offset as usize) == Some(u.first)),
            _ => None,
        }
    }

    /// Pages of `completing` whose frames will come back to the pool (not handed over).
    pub(super) fn completing_for_frames(&self) -> usize {
        if self.handed.is_empty() {
            return self.completing.len();
        }
        self.completing
            .iter()
            .filter(|&&p| !self.is_handed(p))
            .count()
    }

    /// Takes the frames of a unit of `pages` pages on its way out for a read-back, if one is:
    /// every page `ToHost` behind one copy event, unpinned, not handed over already. The one
    /// whose copy was queued first, which lands first. Its first frame and size, as
    /// [`Inner::take_unit_cheap`] gives them.
    ///
    /// A unit another thread is completing without the lock may be taken too: its copy out
    /// has landed, its completion touches only the victim's address, and its commit keeps
    /// the frames for the reader. (Leaving those out had the application's thread wait for
    /// such commits instead, most of the time under a plan: all the units of the size it
    /// needed were being completed by the maintenance thread.)
    pub(super) fn take_leaving_unit(&mut self, pages: usize) -> Option<(DevFrame, usize)> {
        let mut best: Option<(u64, usize, DevFrame, Event)> = None;
        let mut seen_to = 0;
        for &p in &self.outgoing {
            if p < seen_to {
                continue;
            }
            let Some((a, n)) = self.unit_span(p) else {
                continue;
            };
            seen_to = a + n;
            if n != pages || a != p {
                continue;
            }
            let Some(ResidencyState::ToHost { dev, event, .. }) =
                self.pages.get(a).map(|e| e.state)
            else {
                continue;
            };
            if self.handed.contains_key(&dev.unit) {
                continue;
            }
            let whole = self.span_all((a, n), |e| {
                e.pins == 0
                    && matches!(e.state, ResidencyState::ToHost { event: ev, .. } if ev == event)
            });
            if !whole {
                continue;
            }
            let order = self.copy_event_order.get(&event).copied().unwrap_or(0);
            if best.is_none_or(|(o, ..)| order < o) {
                best = Some((order, a, dev, event));
            }
        }
        let (_, first, dev, event) = best?;
        self.dev.hand_over(dev);
        self.handed.insert(
            dev.unit,
            HandedUnit {
                first,
                pages,
                event,
            },
        );
        Some((
            DevFrame {
                unit: dev.unit,
                offset: 0,
            },
            pages,
        ))
    }

    /// The copy-out events the copies into `frames` must wait for: those of the units among
    /// them handed over, each once.
    pub(super) fn handover_waits(&self, frames: &[DevFrame]) -> Vec<Event> {
        if self.handed.is_empty() {
            return Vec::new();
        }
        let mut waits: Vec<Event> = frames
            .iter()
            .filter(|d| d.offset == 0)
            .filter_map(|d| self.handed.get(&d.unit).map(|u| u.event))
            .collect();
        waits.sort_unstable();
        waits.dedup();
        waits
    }

    /// The units handed over whose victims `pages` touch: their first pages and copy-out
    /// events.
    pub(super) fn handed_among(
        &self,
        pages: impl IntoIterator<Item = usize>,
    ) -> Vec<(usize, Event)> {
        if self.handed.is_empty() {
            return Vec::new();
        }
        let mut found: HashMap<usize, Event> = HashMap::new();
        for p in pages {
            if let Some(u) = self.handed_unit_of(p) {
                found.insert(u.first, u.event);
            }
        }
        let mut out: Vec<(usize, Event)> = found.into_iter().collect();
        out.sort_unstable();
        out
    }
}
