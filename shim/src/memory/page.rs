//! The residency state machine of arena pages, and the table holding one entry per page.
//!
//! Every page of the arena (2 MiB by default) is in exactly one [`ResidencyState`]. The
//! transitions are the only way to change it, and each checks its preconditions, so the rules
//! below hold by construction rather than by the manager's good behaviour:
//!
//! ```text
//!             back_device                 start_swap_out(idle)
//!  Unbacked ─────────────▶ Device ─────────────────────────────▶ ToHost(ev)
//!     │  ▲                 ▲   ▲ ◀──────── cancel_swap_out ───────┘  │
//!     │  │ unback(dead,    │   │                                     │ finish_swap_out(ev done)
//!     │  │  idle)          │   └── finish_swap_in(ev done) ──┐       ▼
//!     └──┼──────────────── │ ───────────── back_host ─────▶  │     Host
//!        └─────────────────┴──────────────────────────────── │ ────  │
//!                                                 ToDevice(ev) ◀─────┘ start_swap_in
//! ```
//! - A page is remapped (leaves `Device` for good, or is unbacked) only when it is *idle*: no
//!   `prepare_access` holds it (pins) and every use recorded on it has completed.
//! - `ToHost`/`ToDevice` end only once their copy's event has completed.
//! - Frames are moved, never copied: each transition hands the frame it frees back to the
//!   caller, so a frame cannot be owned by two pages.
//!
//! The table does not talk to the driver; it is pure bookkeeping, tested against a model.

use super::driver::Event;
use super::frames::{DevFrame, HostFrame};

/// Where a page's data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResidencyState {
    /// No physical memory behind the page; its virtual range is unmapped.
    Unbacked,
    /// Mapped to a device frame.
    Device(DevFrame),
    /// Mapped to a host frame (stray accesses still work, over PCIe).
    Host(HostFrame),
    /// Still mapped to `dev`; a copy to `host` is in flight until `event`.
    ToHost {
        dev: DevFrame,
        host: HostFrame,
        event: Event,
    },
    /// Mapped to `dev`; a copy from `host` is in flight until `event`.
    ToDevice {
        dev: DevFrame,
        host: HostFrame,
        event: Event,
    },
}

impl ResidencyState {
    fn name(&self) -> &'static str {
        match self {
            ResidencyState::Unbacked => "Unbacked",
            ResidencyState::Device(_) => "Device",
            ResidencyState::Host(_) => "Host",
            ResidencyState::ToHost { .. } => "ToHost",
            ResidencyState::ToDevice { .. } => "ToDevice",
        }
    }

    /// The device frame the page holds, if any.
    pub fn device_frame(&self) -> Option<DevFrame> {
        match *self {
            ResidencyState::Device(d)
            | ResidencyState::ToHost { dev: d, .. }
            | ResidencyState::ToDevice { dev: d, .. } => Some(d),
            _ => None,
        }
    }
}

/// A frame given back by a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Frame {
    Device(DevFrame),
    Host(HostFrame),
}

/// A use of a page by work queued on an application stream: the stream's slot in the
/// manager's fence table and the fence sequence number recorded after the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    pub stream_slot: u32,
    pub seq: u64,
}

/// One page's bookkeeping.
#[derive(Debug, Clone)]
pub struct PageEntry {
    pub state: ResidencyState,
    /// Live allocations overlapping the page. A page with none holds no data anyone wants.
    pub live: u32,
    /// `prepare_access` calls that made the page resident and whose work is not yet reported.
    pub pins: u32,
    /// The manager's access clock at the last access (for LRU).
    pub last_access: u64,
    /// The latest use per stream; completed uses are pruned lazily.
    pub uses: Vec<Use>,
}

impl Default for PageEntry {
    fn default() -> Self {
        Self {
            state: ResidencyState::Unbacked,
            live: 0,
            pins: 0,
            last_access: 0,
            uses: Vec::new(),
        }
    }
}

impl PageEntry {
    /// No pins and every recorded use completed; `completed[slot]` is the highest completed
    /// fence sequence of each stream slot.
    pub fn is_idle(&self, completed: &[u64]) -> bool {
        self.pins == 0
            && self.uses.iter().all(|u| {
                completed
                    .get(u.stream_slot as usize)
                    .is_some_and(|&c| c >= u.seq)
            })
    }

    /// Records a use, replacing an older one of the same stream (stream order covers it).
    pub fn add_use(&mut self, u: Use, completed: &[u64]) {
        self.uses.retain(|old| {
            old.stream_slot != u.stream_slot
                && completed
                    .get(old.stream_slot as usize)
                    .is_none_or(|&c| c < old.seq)
        });
        self.uses.push(u);
    }
}

/// An illegal transition was refused; the page is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransitionError {
    /// The page is not in a state this transition starts from.
    WrongState {
        page: usize,
        state: &'static str,
        transition: &'static str,
    },
    /// The page is pinned, in use by incomplete work, or (for `unback`) holds live data.
    Busy {
        page: usize,
        transition: &'static str,
    },
    /// The copy's event has not completed yet.
    NotReady { page: usize },
}

/// One entry per arena page, indexed by page number.
#[derive(Debug, Default)]
pub struct PageTable {
    pages: Vec<PageEntry>,
}

impl PageTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Grows the table to `n` pages (new pages are `Unbacked`).
    pub fn ensure_len(&mut self, n: usize) {
        if self.pages.len() < n {
            self.pages.resize_with(n, PageEntry::default);
        }
    }

    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    pub fn get(&self, page: usize) -> Option<&PageEntry> {
        self.pages.get(page)
    }

    /// Mutable access to the bookkeeping fields. The state itself must only change through
    /// the transitions below; this is for `live`, `pins`, `last_access` and `uses`.
    pub fn entry_mut(&mut self, page: usize) -> Option<&mut PageEntry> {
        self.pages.get_mut(page)
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, &PageEntry)> {
        self.pages.iter().enumerate()
    }

    fn at(&mut self, page: usize, t: &'static str) -> Result<&mut PageEntry, TransitionError> {
        self.pages.get_mut(page).ok_or(TransitionError::WrongState {
            page,
            state: "out of range",
            transition: t,
        })
    }

    fn wrong(page: usize, e: &PageEntry, t: &'static str) -> TransitionError {
        TransitionError::WrongState {
            page,
            state: e.state.name(),
            transition: t,
        }
    }

    /// `Unbacked → Device(dev)`.
    pub fn back_device(&mut self, page: usize, dev: DevFrame) -> Result<(), TransitionError> {
        let e = self.at(page, "back_device")?;
        match e.state {
            ResidencyState::Unbacked => {
                e.state = ResidencyState::Device(dev);
                Ok(())
            }
            _ => Err(Self::wrong(page, e, "back_device")),
        }
    }

    /// `Unbacked → Host(host)`.
    pub fn back_host(&mut self, page: usize, host: HostFrame) -> Result<(), TransitionError> {
        let e = self.at(page, "back_host")?;
        match e.state {
            ResidencyState::Unbacked => {
                e.state = ResidencyState::Host(host);
                Ok(())
            }
            _ => Err(Self::wrong(page, e, "back_host")),
        }
    }

    /// `Device | Host → Unbacked` for a page with no live data that is idle.
    pub fn unback(&mut self, page: usize, completed: &[u64]) -> Result<Frame, TransitionError> {
        let e = self.at(page, "unback")?;
        let frame = match e.state {
            ResidencyState::Device(d) => Frame::Device(d),
            ResidencyState::Host(h) => Frame::Host(h),
            _ => return Err(Self::wrong(page, e, "unback")),
        };
        if e.live != 0 || !e.is_idle(completed) {
            return Err(TransitionError::Busy {
                page,
                transition: "unback",
            });
        }
        e.state = ResidencyState::Unbacked;
        e.uses.clear();
        Ok(frame)
    }

    /// `Device → ToHost` for an idle page; the caller has queued the copy to `host`.
    pub fn start_swap_out(
        &mut self,
        page: usize,
        host: HostFrame,
        event: Event,
        completed: &[u64],
    ) -> Result<(), TransitionError> {
        let e = self.at(page, "start_swap_out")?;
        let ResidencyState::Device(dev) = e.state else {
            return Err(Self::wrong(page, e, "start_swap_out"));
        };
        if !e.is_idle(completed) {
            return Err(TransitionError::Busy {
                page,
                transition: "start_swap_out",
            });
        }
        e.state = ResidencyState::ToHost { dev, host, event };
        Ok(())
    }

    /// `Device → ToHost` for an unpinned page that queued work may still use: the caller has
    /// queued the copy to `host` on a stream that waits for every recorded use of the page
    /// (so the copy reads what that work leaves, and the copy's event completes after it).
    pub fn start_swap_out_after_uses(
        &mut self,
        page: usize,
        host: HostFrame,
        event: Event,
    ) -> Result<(), TransitionError> {
        let e = self.at(page, "start_swap_out_after_uses")?;
        let ResidencyState::Device(dev) = e.state else {
            return Err(Self::wrong(page, e, "start_swap_out_after_uses"));
        };
        if e.pins != 0 {
            return Err(TransitionError::Busy {
                page,
                transition: "start_swap_out_after_uses",
            });
        }
        e.state = ResidencyState::ToHost { dev, host, event };
        Ok(())
    }

    /// `ToDevice → ToHost` for an unpinned page still arriving: the caller has queued, on a
    /// stream that waits for the copy in and every recorded use, the copy back into the same
    /// host frame, whose completion is `event`. Returns the copy-in's event (no longer the
    /// page's).
    pub fn start_swap_out_while_arriving(
        &mut self,
        page: usize,
        event: Event,
    ) -> Result<Event, TransitionError> {
        let e = self.at(page, "start_swap_out_while_arriving")?;
        let ResidencyState::ToDevice {
            dev,
            host,
            event: arriving,
        } = e.state
        else {
            return Err(Self::wrong(page, e, "start_swap_out_while_arriving"));
        };
        if e.pins != 0 {
            return Err(TransitionError::Busy {
                page,
                transition: "start_swap_out_while_arriving",
            });
        }
        e.state = ResidencyState::ToHost { dev, host, event };
        Ok(arriving)
    }

    /// `ToHost → Device`: the page is needed again before it left. Returns the host frame
    /// and the copy's event: the frame may be reused only once that event has completed.
    pub fn cancel_swap_out(&mut self, page: usize) -> Result<(HostFrame, Event), TransitionError> {
        let e = self.at(page, "cancel_swap_out")?;
        let ResidencyState::ToHost { dev, host, event } = e.state else {
            return Err(Self::wrong(page, e, "cancel_swap_out"));
        };
        e.state = ResidencyState::Device(dev);
        Ok((host, event))
    }

    /// `Host → Host` on another frame, holding a copy of the page's bytes (a host unit split
    /// into single frames). Returns the old frame, free once the caller has remapped the page.
    pub fn rehost(&mut self, page: usize, to: HostFrame) -> Result<HostFrame, TransitionError> {
        let e = self.at(page, "rehost")?;
        let ResidencyState::Host(old) = e.state else {
            return Err(Self::wrong(page, e, "rehost"));
        };
        e.state = ResidencyState::Host(to);
        Ok(old)
    }

    /// `ToHost → Host` once the copy's event is done (`event_done` is asked about it).
    /// Returns the device frame, free once the caller has remapped the page to the host frame.
    pub fn finish_swap_out(
        &mut self,
        page: usize,
        event_done: impl FnOnce(Event) -> bool,
    ) -> Result<DevFrame, TransitionError> {
        let e = self.at(page, "finish_swap_out")?;
        let ResidencyState::ToHost { dev, host, event } = e.state else {
            return Err(Self::wrong(page, e, "finish_swap_out"));
        };
        if e.pins != 0 {
            return Err(TransitionError::Busy {
                page,
                transition: "finish_swap_out",
            });
        }
        if !event_done(event) {
            return Err(TransitionError::NotReady { page });
        }
        e.state = ResidencyState::Host(host);
        Ok(dev)
    }

    /// `Host → ToDevice`: the caller has mapped `dev` at the page and queued the copy in.
    pub fn start_swap_in(
        &mut self,
        page: usize,
        dev: DevFrame,
        event: Event,
    ) -> Result<HostFrame, TransitionError> {
        let e = self.at(page, "start_swap_in")?;
        let ResidencyState::Host(host) = e.state else {
            return Err(Self::wrong(page, e, "start_swap_in"));
        };
        e.state = ResidencyState::ToDevice { dev, host, event };
        Ok(host)
    }

    /// `ToDevice → Device` once the copy's event is done. Returns the host frame, now free.
    pub fn finish_swap_in(
        &mut self,
        page: usize,
        event_done: impl FnOnce(Event) -> bool,
    ) -> Result<HostFrame, TransitionError> {
        let e = self.at(page, "finish_swap_in")?;
        let ResidencyState::ToDevice { dev, host, event } = e.state else {
            return Err(Self::wrong(page, e, "finish_swap_in"));
        };
        if !event_done(event) {
            return Err(TransitionError::NotReady { page });
        }
        e.state = ResidencyState::Device(dev);
        Ok(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    /// The model: just the state's name, the frames and whether the copy event is done.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum M {
        Unbacked,
        Device(u32),
        Host(u32),
        ToHost(u32, u32, bool),
        ToDevice(u32, u32, bool),
    }

    #[derive(Debug, Clone)]
    enum Act {
        BackDevice,
        BackHost,
        Unback,
        StartOut,
        CancelOut,
        FinishOut,
        StartIn,
        FinishIn,
        CompleteEvent,
        SetLive(u32),
        SetPins(u32),
        Use(u64),
        Complete(u64),
    }

    fn act() -> impl Strategy<Value = (usize, Act)> {
        let a = prop_oneof![
            Just(Act::BackDevice),
            Just(Act::BackHost),
            Just(Act::Unback),
            Just(Act::StartOut),
            Just(Act::CancelOut),
            Just(Act::FinishOut),
            Just(Act::StartIn),
            Just(Act::FinishIn),
            Just(Act::CompleteEvent),
            (0u32..2).prop_map(Act::SetLive),
            (0u32..2).prop_map(Act::SetPins),
            (1u64..5).prop_map(Act::Use),
            (0u64..6).prop_map(Act::Complete),
        ];
        (0usize..4, a)
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512, failure_persistence: None, ..ProptestConfig::default()
        })]
        /// Random transition attempts on a few pages, against a model: legal ones succeed and
        /// do what the model says, illegal ones fail and change nothing, frames are never
        /// duplicated, and nothing leaves a copy state before its event is done.
        #[test]
        fn state_machine_matches_model(acts in prop::collection::vec(act(), 1..200)) {
            let mut t = PageTable::new();
            t.ensure_len(4);
            let mut model = [M::Unbacked; 4];
            let mut live = [0u32; 4];
            let mut pins = [0u32; 4];
            let mut uses = [0u64; 4];
            let mut completed = vec![0u64];
            let mut next_frame = 0u32;
            let mut last_seq = 0u64;
            let mut events_done: Vec<bool> = Vec::new();
            for (p, a) in acts {
                let idle = pins[p] == 0 && uses[p] <= completed[0];
                let before = t.get(p).unwrap().state;
                let mut fresh = || { next_frame += 1; next_frame };
                match a {
                    Act::BackDevice => {
                        let f = fresh();
                        let r = t.back_device(p, DevFrame { unit: f, offset: 0 });
                        prop_assert_eq!(r.is_ok(), model[p] == M::Unbacked);
                        if r.is_ok() { model[p] = M::Device(f); }
                    }
                    Act::BackHost => {
                        let f = fresh();
                        let r = t.back_host(p, HostFrame(f));
                        prop_assert_eq!(r.is_ok(), model[p] == M::Unbacked);
                        if r.is_ok() { model[p] = M::Host(f); }
                    }
                    Act::Unback => {
                        let r = t.unback(p, &completed);
                        let ok = matches!(model[p], M::Device(_) | M::Host(_)) && live[p] == 0 && idle;
                        prop_assert_eq!(r.is_ok(), ok);
                        if let Ok(fr) = r {
                            match model[p] {
                                M::Device(f) => prop_assert_eq!(fr, Frame::Device(DevFrame { unit: f, offset: 0 })),
                                M::Host(f) => prop_assert_eq!(fr, Frame::Host(HostFrame(f))),
                                _ => unreachable!(),
                            }
                            model[p] = M::Unbacked;
                            uses[p] = 0;
                        }
                    }
                    Act::StartOut => {
                        let f = fresh();
                        events_done.push(false);
                        let ev = Event(events_done.len() - 1);
                        let r = t.start_swap_out(p, HostFrame(f), ev, &completed);
                        let ok = matches!(model[p], M::Device(_)) && idle;
                        prop_assert_eq!(r.is_ok(), ok);
                        if let (Ok(()), M::Device(d)) = (r, model[p]) {
                            model[p] = M::ToHost(d, f, false);
                        }
                    }
                    Act::CancelOut => {
                        let r = t.cancel_swap_out(p);
                        prop_assert_eq!(r.is_ok(), matches!(model[p], M::ToHost(..)));
                        if let (Ok((h, _)), M::ToHost(d, hf, _)) = (r, model[p]) {
                            prop_assert_eq!(h, HostFrame(hf));
                            model[p] = M::Device(d);
                        }
                    }
                    Act::FinishOut => {
                        let r = t.finish_swap_out(p, |e| events_done[e.0]);
                        let ok = matches!(model[p], M::ToHost(_, _, true)) && pins[p] == 0;
                        prop_assert_eq!(r.is_ok(), ok, "{:?} {:?}", model[p], r);
                        if let (Ok(d), M::ToHost(md, h, _)) = (r, model[p]) {
                            prop_assert_eq!(d, DevFrame { unit: md, offset: 0 });
                            model[p] = M::Host(h);
                        }
                    }
                    Act::StartIn => {
                        let f = fresh();
                        events_done.push(false);
                        let ev = Event(events_done.len() - 1);
                        let r = t.start_swap_in(p, DevFrame { unit: f, offset: 0 }, ev);
                        prop_assert_eq!(r.is_ok(), matches!(model[p], M::Host(_)));
                        if let (Ok(h), M::Host(mh)) = (r, model[p]) {
                            prop_assert_eq!(h, HostFrame(mh));
                            model[p] = M::ToDevice(f, mh, false);
                        }
                    }
                    Act::FinishIn => {
                        let r = t.finish_swap_in(p, |e| events_done[e.0]);
                        prop_assert_eq!(r.is_ok(), matches!(model[p], M::ToDevice(_, _, true)));
                        if let (Ok(h), M::ToDevice(d, mh, _)) = (r, model[p]) {
                            prop_assert_eq!(h, HostFrame(mh));
                            model[p] = M::Device(d);
                        }
                    }
                    Act::CompleteEvent => {
                        let ev = match t.get(p).unwrap().state {
                            ResidencyState::ToHost { event, .. }
                            | ResidencyState::ToDevice { event, .. } => Some(event),
                            _ => None,
                        };
                        if let Some(e) = ev {
                            events_done[e.0] = true;
                            model[p] = match model[p] {
                                M::ToHost(d, h, _) => M::ToHost(d, h, true),
                                M::ToDevice(d, h, _) => M::ToDevice(d, h, true),
                                m => m,
                            };
                        }
                    }
                    Act::SetLive(n) => { live[p] = n; t.entry_mut(p).unwrap().live = n; }
                    Act::SetPins(n) => { pins[p] = n; t.entry_mut(p).unwrap().pins = n; }
                    Act::Use(s) => {
                        // Fence numbers of one stream only grow.
                        let seq = last_seq.max(completed[0]) + s;
                        last_seq = seq;
                        uses[p] = uses[p].max(seq);
                        t.entry_mut(p).unwrap().add_use(Use { stream_slot: 0, seq }, &completed);
                    }
                    Act::Complete(n) => completed[0] = completed[0].max(last_seq.saturating_sub(n)),
                }
                // A failed transition changed nothing.
                let after = t.get(p).unwrap().state;
                if after != before {
                    prop_assert!(!matches!(a, Act::SetLive(_) | Act::SetPins(_) | Act::Use(_)));
                }
                // No frame is held by two pages.
                let mut devs = HashSet::new();
                let mut hosts = HashSet::new();
                for (_, e) in t.iter() {
                    match e.state {
                        ResidencyState::Unbacked => {}
                        ResidencyState::Device(d) => prop_assert!(devs.insert(d)),
                        ResidencyState::Host(h) => prop_assert!(hosts.insert(h)),
                        ResidencyState::ToHost { dev, host, .. }
                        | ResidencyState::ToDevice { dev, host, .. } => {
                            prop_assert!(devs.insert(dev));
                            prop_assert!(hosts.insert(host));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn illegal_transitions_say_why() {
        let mut t = PageTable::new();
        t.ensure_len(1);
        assert_eq!(
            t.start_swap_in(0, DevFrame { unit: 1, offset: 0 }, Event(1)),
            Err(TransitionError::WrongState {
                page: 0,
                state: "Unbacked",
                transition: "start_swap_in"
            })
        );
        t.back_device(0, DevFrame { unit: 1, offset: 0 }).unwrap();
        t.entry_mut(0).unwrap().add_use(
            Use {
                stream_slot: 0,
                seq: 3,
            },
            &[2],
        );
        assert_eq!(
            t.start_swap_out(0, HostFrame(1), Event(1), &[2]),
            Err(TransitionError::Busy {
                page: 0,
                transition: "start_swap_out"
            })
        );
        t.start_swap_out(0, HostFrame(1), Event(1), &[3]).unwrap();
        assert_eq!(
            t.finish_swap_out(0, |_| false),
            Err(TransitionError::NotReady { page: 0 })
        );
        assert_eq!(
            t.finish_swap_out(0, |_| true),
            Ok(DevFrame { unit: 1, offset: 0 })
        );
        assert_eq!(t.get(0).unwrap().state, ResidencyState::Host(HostFrame(1)));
    }
}
