//! The coordinator's side of a segment: create it (replacing one left behind by a dead
//! coordinator), heartbeat, sweep dead jobs, read each job's ring, grant budgets, write
//! commands. Unlinks the name when dropped, if it still names this segment.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tensile_trace::Record;

use crate::command::{Command, CommandArea, CommandError};
use crate::process::{monotonic_ns, ProcessIdentity};
use crate::ring::{self, decode_records, read_frame, Consumer, Corruption, ReadOutcome, Ring};
use crate::segment::{occupant, shm_name, Geometry, Occupant, Segment, SegmentError};
use crate::shm;
use crate::slot::JobSnapshot;

/// What draining a ring delivers, in stream order.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// The next record.
    Record(Record),
    /// The job dropped this many records here (its ring was full).
    Lost(u64),
    /// The ring held garbage and was reset; an unknown number of records is gone.
    Corrupt(Corruption),
}

/// A job that left its slot without leaving (its process died).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaimed {
    pub slot: u32,
    pub pid: u32,
}

/// The coordinator's segment.
#[derive(Debug)]
pub struct CoordinatorSegment {
    segment: Segment,
    /// Per slot: the incarnation the outbox belongs to, the last generation written, and the
    /// commands waiting for the job to acknowledge the previous one.
    outboxes: Vec<Outbox>,
    consumers: Vec<Consumer>,
    payload: Vec<u8>,
}

#[derive(Debug, Default)]
struct Outbox {
    incarnation: u64,
    generation: u64,
    queue: VecDeque<Command>,
}

impl CoordinatorSegment {
    /// Creates the segment of `name` with `O_EXCL`; fails with
    /// [`SegmentError::AlreadyExists`] if the name is taken, whatever is there.
    pub fn create(name: &str, geometry: Geometry) -> Result<CoordinatorSegment, SegmentError> {
        let shm = shm_name(name)?;
        let me = identity()?;
        Segment::create(&shm, geometry, me).map(CoordinatorSegment::wrap)
    }

    /// Creates the segment of `name`, first unlinking one left behind: its coordinator is
    /// dead, or it never got its magic and its creator is dead. A running coordinator's
    /// segment, or anything that is not a segment of ours, is left alone and named in the
    /// error.
    pub fn create_replacing_stale(
        name: &str,
        geometry: Geometry,
    ) -> Result<CoordinatorSegment, SegmentError> {
        let shm = shm_name(name)?;
        let me = identity()?;
        let mut attempts = 0;
        loop {
            match Segment::create(&shm, geometry, me) {
                Ok(s) => return Ok(CoordinatorSegment::wrap(s)),
                Err(SegmentError::AlreadyExists { path }) => {
                    attempts += 1;
                    let first = occupant(&shm);
                    match first {
                        Occupant::Live { pid } => {
                            return Err(SegmentError::CoordinatorRunning { path, pid })
                        }
                        Occupant::Foreign(e) => return Err(e),
                        Occupant::Stale if attempts > 3 => {
                            return Err(SegmentError::AlreadyExists { path })
                        }
                        Occupant::Stale => {}
                    }
                    // A creator in the middle of creating looks stale for microseconds; ask
                    // again after a pause before removing anything.
                    let before = shm::identity_of(&shm).ok();
                    std::thread::sleep(Duration::from_millis(100));
                    if matches!(occupant(&shm), Occupant::Stale)
                        && shm::identity_of(&shm).ok() == before
                    {
                        let _ = shm::unlink(&shm);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn wrap(segment: Segment) -> CoordinatorSegment {
        let slots = segment.geometry().slot_count as usize;
        CoordinatorSegment {
            segment,
            outboxes: (0..slots).map(|_| Outbox::default()).collect(),
            consumers: vec![Consumer::default(); slots],
            payload: Vec::new(),
        }
    }

    pub fn path(&self) -> String {
        self.segment.path()
    }

    pub fn geometry(&self) -> Geometry {
        self.segment.geometry()
    }

    /// Stamps the header's heartbeat.
    pub fn heartbeat(&self) {
        self.segment
            .header()
            .heartbeat_ns
            .store(monotonic_ns(), Ordering::Relaxed);
    }

    /// Frees the slots of dead jobs.
    pub fn sweep(&mut self) -> Vec<Reclaimed> {
        (0..self.segment.geometry().slot_count)
            .filter_map(|slot| {
                self.segment
                    .slot(slot)
                    .reclaim_if_dead()
                    .map(|pid| Reclaimed { slot, pid })
            })
            .collect()
    }

    /// The slots held by jobs (live or still claiming).
    pub fn jobs(&self) -> Vec<JobSnapshot> {
        self.segment.jobs()
    }

    /// Delivers what slot `slot`'s ring holds, up to about `max_bytes` of frames.
    pub fn drain(&mut self, slot: u32, max_bytes: usize, mut deliver: impl FnMut(Delivery)) {
        let s = self.segment.slot(slot);
        let r = Ring {
            head: &s.ring_head,
            tail: &s.ring_tail,
            words: self.segment.ring_words(slot),
        };
        let mut read = 0usize;
        while read < max_bytes {
            let consumer = &mut self.consumers[slot as usize];
            match read_frame(r, consumer, &mut self.payload) {
                ReadOutcome::Empty => break,
                ReadOutcome::Frame { lost_before } => {
                    read += self.payload.len() + 8;
                    if lost_before > 0 {
                        deliver(Delivery::Lost(lost_before));
                    }
                    if decode_records(&self.payload, |rec| deliver(Delivery::Record(rec))).is_err()
                    {
                        ring::reset(r, &mut self.consumers[slot as usize]);
                        s.ring_resets.fetch_add(1, Ordering::Relaxed);
                        deliver(Delivery::Corrupt(Corruption::Payload));
                        break;
                    }
                }
                ReadOutcome::Reset(c) => {
                    s.ring_resets.fetch_add(1, Ordering::Relaxed);
                    deliver(Delivery::Corrupt(c));
                    break;
                }
            }
        }
    }

    /// Delivers all that the job of `incarnation`, which has left `slot`, pushed before it
    /// left (a job's last frames can land after the coordinator's last read of its ring).
    /// Nothing when a new job has had the slot since: claiming restarts the ring.
    pub fn drain_departed(&mut self, slot: u32, incarnation: u64, deliver: impl FnMut(Delivery)) {
        let me = std::process::id();
        if !self.segment.slot(slot).hold_departed(me, incarnation) {
            return;
        }
        // The producer is gone, so the ring holds at most its size: one call reads it all.
        self.drain(slot, usize::MAX, deliver);
        self.segment.slot(slot).end_hold(me);
    }

    /// Grants `bytes` to the job in `slot`.
    pub fn set_grant(&self, slot: u32, bytes: u64) {
        self.segment
            .slot(slot)
            .grant_bytes
            .store(bytes, Ordering::Relaxed);
    }

    /// Says the room its planner leaves in the plans of the job in `slot` (of `incarnation`:
    /// a job that has claimed the slot since reads nothing).
    pub fn set_room_in_force(&self, slot: u32, incarnation: u64, room: crate::SlotRoom) {
        self.segment
            .slot(slot)
            .room_in_force
            .store(room.to_word(incarnation), Ordering::Relaxed);
    }

    /// Asks the job in `slot` to hold its launches (`true`) or to run.
    pub fn set_paused(&self, slot: u32, paused: bool) {
        self.segment
            .slot(slot)
            .paused
            .store(u32::from(paused), Ordering::Relaxed);
    }

    /// Writes the verdict on the floor of the job in `slot` (see [`crate::Admission`]).
    pub fn set_admission(
        &self,
        slot: u32,
        admission: crate::Admission,
        floor_bytes: u64,
        grantable_bytes: u64,
    ) {
        self.segment
            .slot(slot)
            .set_admission(admission, floor_bytes, grantable_bytes);
    }

    /// Queues `command` for the job in `slot` (incarnation `incarnation`) and writes what the
    /// job is ready for. A plan or a drop replaces any plan or drop still queued, and a budget
    /// any budget still queued: only the latest matters.
    pub fn send(
        &mut self,
        slot: u32,
        incarnation: u64,
        command: Command,
    ) -> Result<(), CommandError> {
        let capacity = self.segment.geometry().command_bytes;
        if let Command::Plan(plan) = &command {
            let length = plan.encode().len() as u64;
            if length > capacity {
                return Err(CommandError::TooLarge { length, capacity });
            }
        }
        let outbox = self.outbox(slot, incarnation);
        if matches!(command, Command::Plan(_) | Command::DropPlan) {
            outbox
                .queue
                .retain(|c| !matches!(c, Command::Plan(_) | Command::DropPlan));
        }
        if matches!(command, Command::Budget(_)) {
            outbox.queue.retain(|c| !matches!(c, Command::Budget(_)));
        }
        outbox.queue.push_back(command);
        self.flush_commands(slot, incarnation)
    }

    /// Writes the next queued command if the job acknowledged the previous one.
    pub fn flush_commands(&mut self, slot: u32, incarnation: u64) -> Result<(), CommandError> {
        let s = self.segment.slot(slot);
        let area = CommandArea {
            generation: &s.command_generation,
            kind: &s.command_kind,
            len: &s.command_len,
            acked: &s.command_acked,
            words: self.segment.command_words(slot),
        };
        let outbox = &mut self.outboxes[slot as usize];
        if outbox.incarnation != incarnation || outbox.queue.is_empty() {
            return Ok(());
        }
        if outbox.generation != 0 && !area.acked(outbox.generation) {
            return Ok(());
        }
        if let Some(command) = outbox.queue.pop_front() {
            area.write(&mut outbox.generation, &command)?;
        }
        Ok(())
    }

    /// Commands queued for `slot` and not yet written.
    pub fn queued_commands(&self, slot: u32) -> usize {
        self.outboxes[slot as usize].queue.len()
    }

    fn outbox(&mut self, slot: u32, incarnation: u64) -> &mut Outbox {
        let shared_generation = self
            .segment
            .slot(slot)
            .command_generation
            .load(Ordering::Relaxed);
        let outbox = &mut self.outboxes[slot as usize];
        if outbox.incarnation != incarnation {
            // A new job in the slot: start from the area's generation (the job acknowledged
            // it when it claimed), with nothing queued.
            *outbox = Outbox {
                incarnation,
                generation: shared_generation & !1,
                queue: VecDeque::new(),
            };
        }
        outbox
    }
}

impl Drop for CoordinatorSegment {
    fn drop(&mut self) {
        if self.segment.still_named() {
            let _ = shm::unlink(self.segment.shm_name());
        }
    }
}

fn identity() -> Result<ProcessIdentity, SegmentError> {
    ProcessIdentity::current().map_err(|source| SegmentError::Os {
        path: "/proc/self/stat".into(),
        op: "reading this process's start time",
        source,
    })
}
