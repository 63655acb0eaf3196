//! Per-stream fences: how the manager knows that work it saw queued has finished.
//!
//! Each application stream the manager meets gets a *slot*. A fence is an event recorded on
//! that stream, numbered by a per-stream sequence; since a stream runs in order, "fence `n`
//! has completed" means every earlier piece of work on it has too. Pages remember the
//! `(slot, seq)` of their last use per stream, and stream-ordered frees remember the fence
//! promised at the free, so both questions ("may this page be remapped?", "may another stream
//! reuse this memory?") become one integer comparison against [`Fences::completed`].
//!
//! Events are recycled once their fence has completed. This module does not know about pages.

use std::collections::{HashMap, VecDeque};

use tensile_driver_abi::CUresult;

use super::driver::{Driver, Event, Stream};

struct Slot {
    stream: Stream,
    next_seq: u64,
    in_flight: VecDeque<(u64, Event)>,
    /// Launches handed the promised number `next_seq` since the last recorded fence: every
    /// `every`-th records one ([`Fences::note`]).
    unfenced: u32,
    /// Whether anything (a launch or a free) holds the promised number `next_seq`, so that
    /// [`Fences::flush`] records it.
    promised: bool,
}

/// Fence bookkeeping for every stream seen so far.
#[derive(Default)]
pub struct Fences {
    slots: Vec<Slot>,
    by_stream: HashMap<Stream, usize>,
    /// Highest completed fence per slot; fences start at 1, so 0 means "none yet".
    completed: Vec<u64>,
    spare: Vec<Event>,
}

impl Fences {
    pub fn new() -> Self {
        Self::default()
    }

    /// The slot of `stream`, creating it on first sight.
    pub fn slot_of(&mut self, stream: Stream) -> usize {
        if let Some(&s) = self.by_stream.get(&stream) {
            return s;
        }
        let s = self.slots.len();
        self.slots.push(Slot {
            stream,
            next_seq: 1,
            in_flight: VecDeque::new(),
            unfenced: 0,
            promised: false,
        });
        self.completed.push(0);
        self.by_stream.insert(stream, s);
        s
    }

    /// Highest completed fence of each slot, indexed by slot.
    pub fn completed(&self) -> &[u64] {
        &self.completed
    }

    /// Records a fence on the slot's stream after the work queued so far; returns its number.
    pub fn record(&mut self, driver: &dyn Driver, slot: usize) -> Result<u64, CUresult> {
        // One query per record keeps `completed` moving without a loop on the launch path.
        self.poll_slot(driver, slot, 1)?;
        let ev = match self.spare.pop() {
            Some(e) => e,
            None => driver.event_create()?,
        };
        let s = &mut self.slots[slot];
        if let Err(e) = driver.event_record(ev, s.stream) {
            self.spare.push(ev);
            return Err(e);
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        s.unfenced = 0;
        s.promised = false;
        s.in_flight.push_back((seq, ev));
        Ok(seq)
    }

    /// The fence number for work just queued on the slot's stream, recording a fence only for
    /// every `every`-th call: the others get the promised number of the next fence, which
    /// stream order puts after their work (and [`Self::wait`] records it on demand). This
    /// trades how soon a page is seen idle for one event record per `every` launches.
    pub fn note(&mut self, driver: &dyn Driver, slot: usize, every: u32) -> Result<u64, CUresult> {
        let s = &mut self.slots[slot];
        s.unfenced += 1;
        s.promised = true;
        if s.unfenced >= every.max(1) {
            self.record(driver, slot)
        } else {
            Ok(s.next_seq)
        }
    }

    /// The fence number for a stream-ordered free just queued on the slot's stream: the next
    /// fence's, recorded by the stream's next [`Self::note`] that records one or on demand
    /// ([`Self::flush`], [`Self::wait`], [`Self::event_after`]), never here. For the manager's
    /// frees where no other stream allocates: the stream reuses the memory at once, and
    /// nothing else wants it sooner. (ResNet-50 frees as often as it launches; counting frees
    /// towards `every` doubled the manager's event records, each 4 to 12 µs on the H100.)
    pub fn promise(&mut self, slot: usize) -> u64 {
        let s = &mut self.slots[slot];
        s.promised = true;
        s.next_seq
    }

    /// Records a fence on every stream with uses or frees only promised one ([`Self::note`],
    /// [`Self::promise`]), so that they can complete without waiting for that stream's next
    /// launches.
    pub fn flush(&mut self, driver: &dyn Driver) -> Result<(), CUresult> {
        for slot in 0..self.slots.len() {
            if self.slots[slot].promised {
                self.record(driver, slot)?;
            }
        }
        Ok(())
    }

    /// Advances `completed` of one slot, querying at most `limit` fences.
    fn poll_slot(
        &mut self,
        driver: &dyn Driver,
        slot: usize,
        limit: usize,
    ) -> Result<(), CUresult> {
        for _ in 0..limit {
            let Some(&(seq, ev)) = self.slots[slot].in_flight.front() else {
                return Ok(());
            };
            if !driver.event_query(ev)? {
                return Ok(());
            }
            self.slots[slot].in_flight.pop_front();
            self.completed[slot] = seq;
            self.spare.push(ev);
        }
        Ok(())
    }

    /// Advances `completed` of every slot as far as the driver says.
    pub fn poll_all(&mut self, driver: &dyn Driver) -> Result<(), CUresult> {
        for s in 0..self.slots.len() {
            self.poll_slot(driver, s, usize::MAX)?;
        }
        Ok(())
    }

    /// The number the next fence of `slot` will get. A use that could not get a fence of its
    /// own (the record failed) is given this number: it then counts as complete only once a
    /// later fence on the same stream, which stream order puts after it, has completed.
    pub fn next_seq(&self, slot: usize) -> u64 {
        self.slots[slot].next_seq
    }

    /// An event that completes once fence `seq` of `slot` has, for another stream to wait on
    /// (`cuStreamWaitEvent`), recording the fence first if it was only promised. `None` when it
    /// has completed already. Never waits.
    pub fn event_after(
        &mut self,
        driver: &dyn Driver,
        slot: usize,
        seq: u64,
    ) -> Result<Option<Event>, CUresult> {
        if self.completed.get(slot).is_none_or(|&c| c >= seq) {
            return Ok(None);
        }
        let find = |f: &Self| {
            f.slots[slot]
                .in_flight
                .iter()
                .find(|(s, _)| *s >= seq)
                .map(|&(_, e)| e)
        };
        if let Some(ev) = find(self) {
            return Ok(Some(ev));
        }
        self.record(driver, slot)?;
        find(self)
            .map(Some)
            .ok_or(tensile_driver_abi::CUDA_ERROR_ILLEGAL_STATE)
    }

    /// Blocks until fence `seq` of `slot` has completed, recording it first if it was only
    /// promised by [`Self::next_seq`].
    pub fn wait(&mut self, driver: &dyn Driver, slot: usize, seq: u64) -> Result<(), CUresult> {
        if self.completed.get(slot).is_none_or(|&c| c >= seq) {
            return Ok(());
        }
        let find = |f: &Self| {
            f.slots[slot]
                .in_flight
                .iter()
                .find(|(s, _)| *s >= seq)
                .map(|&(_, e)| e)
        };
        let target = match find(self) {
            Some(ev) => ev,
            None => {
                self.record(driver, slot)?;
                find(self).ok_or(tensile_driver_abi::CUDA_ERROR_ILLEGAL_STATE)?
            }
        };
        driver.event_synchronize(target)?;
        self.poll_slot(driver, slot, usize::MAX)
    }

    /// Destroys every event (at shutdown).
    pub fn destroy(&mut self, driver: &dyn Driver) {
        let in_flight = self
            .slots
            .iter_mut()
            .flat_map(|s| s.in_flight.drain(..).map(|(_, e)| e));
        for ev in in_flight.chain(self.spare.drain(..)) {
            let _ = driver.event_destroy(ev);
        }
    }
}
