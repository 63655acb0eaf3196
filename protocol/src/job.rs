//! The job's side of a segment: join (claim a slot), push records, report counters, read
//! commands, leave.
//!
//! Nothing here waits on the coordinator. Records are encoded into a reusable batch and
//! written to the ring as one frame when the batch is full or on [`JobClient::flush`]; a frame
//! that does not fit is dropped and counted (in the slot, and in the next frame's header so the
//! planner knows where the gap is). The shim drives a `JobClient` from a background thread,
//! so it is `Send` but not shared.

use std::sync::atomic::Ordering;

use tensile_trace::Record;

use crate::command::{CommandArea, CommandRead};
use crate::process::{monotonic_ns, ProcessIdentity};
use crate::ring::{Producer, PushError, Ring};
use crate::segment::{shm_name, Segment, SegmentError};
use crate::shm::Access;
use crate::slot::{Admission, Claimant, JobSlot, PlanState, Priority, SlotRoom, StepCounters};

/// How a job joins.
#[derive(Debug, Clone)]
pub struct JobOptions {
    /// The device budget the job asks for: the most it may be granted (0: no limit of its
    /// own).
    pub budget_bytes: u64,
    /// How it ranks against other jobs on the GPU.
    pub priority: Priority,
    /// Its command line, for `tensile status` (truncated to 255 bytes).
    pub command_line: String,
    /// A batch is written as a frame once it holds this many bytes (capped at the largest
    /// frame the ring takes).
    pub batch_bytes: usize,
    /// Its memory manager's page, which its plans must move in (0: not said; the coordinator
    /// then plans in the H100's 2 MiB pages).
    pub page_bytes: u64,
    /// The share of its budget the job asks its plans to leave free (`None`: not said; the
    /// coordinator plans with its own room). Rounded to a thousandth, clamped to 0 to 90%.
    pub room: Option<f64>,
    /// The job takes its turns on another coordinator (the one of the first GPU of a process
    /// that uses several), so this one must never pause it: pausing holds all the process's
    /// launches, and two coordinators pausing crosswise would stop it for good. Its priority
    /// still ranks its memory here.
    pub turns_elsewhere: bool,
}

impl Default for JobOptions {
    fn default() -> JobOptions {
        JobOptions {
            budget_bytes: 0,
            priority: Priority::Normal,
            command_line: String::new(),
            batch_bytes: 16 << 10,
            page_bytes: 0,
            room: None,
            turns_elsewhere: false,
        }
    }
}

/// A job's membership in a coordinator's segment.
#[derive(Debug)]
pub struct JobClient {
    segment: Segment,
    slot: u32,
    me: ProcessIdentity,
    incarnation: u64,
    producer: Producer,
    /// The frame being built: `batch[..batch_len]`, `batch_records` records; as long as the
    /// largest frame the ring takes.
    batch: Box<[u8]>,
    batch_len: usize,
    batch_records: u64,
    batch_limit: usize,
    /// Records lost since the last frame written (dropped here or reported by the caller).
    lost_pending: u64,
    /// Records this client dropped because the ring was full.
    ring_full_records: u64,
    command_seen: u64,
    command_buf: Vec<u8>,
    left: bool,
}

impl JobClient {
    /// Opens the segment of coordinator `name` and claims a slot: a free one, or one whose
    /// job is dead.
    pub fn join(name: &str, options: &JobOptions) -> Result<JobClient, SegmentError> {
        let shm = shm_name(name)?;
        let segment = Segment::open(&shm, Access::ReadWrite)?;
        // A dead coordinator's segment serves nobody: the caller should start a new
        // coordinator (which replaces it) rather than join.
        let coordinator = segment.coordinator();
        if !coordinator.is_running() {
            return Err(SegmentError::CoordinatorGone {
                path: segment.path(),
                pid: coordinator.pid,
            });
        }
        let me = ProcessIdentity::current().map_err(|source| SegmentError::Os {
            path: "/proc/self/stat".into(),
            op: "reading this process's start time",
            source,
        })?;
        let slots = segment.geometry().slot_count;
        let (slot, took_from) = (0..slots)
            .find_map(|i| segment.slot(i).try_claim(me.pid).map(|from| (i, from)))
            .ok_or_else(|| SegmentError::NoFreeSlot {
                path: segment.path(),
                slots,
            })?;
        let (incarnation, head) = segment.slot(slot).finish_claim(&Claimant {
            me,
            budget_bytes: options.budget_bytes,
            priority: options.priority,
            command_line: &options.command_line,
            page_bytes: options.page_bytes,
            took_from,
            room: options.room.map_or(SlotRoom::NotSaid, SlotRoom::from_share),
            turns_elsewhere: options.turns_elsewhere,
        });
        let command_seen = segment.slot(slot).command_acked.load(Ordering::Relaxed);
        let max_payload = (segment.geometry().ring_bytes / 2 - 8) as usize;
        let batch_limit = options.batch_bytes.clamp(64, max_payload);
        Ok(JobClient {
            slot,
            me,
            incarnation,
            producer: Producer::new(head),
            batch: vec![0; max_payload].into_boxed_slice(),
            batch_len: 0,
            batch_records: 0,
            batch_limit,
            lost_pending: 0,
            ring_full_records: 0,
            command_seen,
            command_buf: Vec::new(),
            left: false,
            segment,
        })
    }

    fn slot_ref(&self) -> &JobSlot {
        self.segment.slot(self.slot)
    }

    /// The slot this job holds.
    pub fn slot_index(&self) -> u32 {
        self.slot
    }

    /// Path of the segment.
    pub fn segment_path(&self) -> String {
        self.segment.path()
    }

    /// Adds a record to the batch; writes the batch when it is full. Encodes in place into
    /// a buffer allocated once, so the push path allocates nothing.
    pub fn push(&mut self, record: &Record) {
        let used = match postcard::to_slice(record, &mut self.batch[self.batch_len..]) {
            Ok(encoded) => encoded.len(),
            Err(_) => {
                // Not enough room left in this frame: send it, start the next with the record.
                self.flush();
                match postcard::to_slice(record, &mut self.batch[..]) {
                    Ok(encoded) => encoded.len(),
                    Err(_) => {
                        // Larger than any frame: lost.
                        self.note_lost(1);
                        return;
                    }
                }
            }
        };
        self.batch_len += used;
        self.batch_records += 1;
        if self.batch_len >= self.batch_limit {
            self.flush();
        }
    }

    /// Counts records the caller lost before they reached [`JobClient::push`].
    pub fn note_lost(&mut self, records: u64) {
        self.lost_pending = self.lost_pending.saturating_add(records);
        self.slot_ref()
            .records_dropped
            .fetch_add(records, Ordering::Relaxed);
    }

    /// Writes the batch as one frame, or drops and counts it when the ring is full.
    pub fn flush(&mut self) {
        if self.batch_records == 0 {
            return;
        }
        let slot = self.segment.slot(self.slot);
        let ring = Ring {
            head: &slot.ring_head,
            tail: &slot.ring_tail,
            words: self.segment.ring_words(self.slot),
        };
        match self
            .producer
            .push(ring, &self.batch[..self.batch_len], self.lost_pending)
        {
            Ok(()) => {
                slot.records_pushed
                    .fetch_add(self.batch_records, Ordering::Relaxed);
                self.lost_pending = 0;
            }
            Err(PushError::Full | PushError::TooLarge) => {
                slot.records_dropped
                    .fetch_add(self.batch_records, Ordering::Relaxed);
                self.lost_pending = self.lost_pending.saturating_add(self.batch_records);
                self.ring_full_records = self.ring_full_records.saturating_add(self.batch_records);
            }
        }
        self.batch_len = 0;
        self.batch_records = 0;
    }

    /// Records this client dropped because its ring was full (the coordinator did not read
    /// them in time); they are in the slot's `records_dropped` too, with those the caller
    /// lost before pushing.
    pub fn ring_full_records(&self) -> u64 {
        self.ring_full_records
    }

    /// Stamps the heartbeat.
    pub fn heartbeat(&self) {
        self.slot_ref()
            .heartbeat_ns
            .store(monotonic_ns(), Ordering::Relaxed);
    }

    /// The budget the job asks for.
    pub fn set_budget(&self, bytes: u64) {
        self.slot_ref().budget_bytes.store(bytes, Ordering::Relaxed);
    }

    /// The budget the coordinator granted (0 until it has).
    pub fn grant(&self) -> u64 {
        self.slot_ref().grant_bytes.load(Ordering::Relaxed)
    }

    /// Bytes resident on the device, and the bytes the job would keep resident if it could.
    pub fn set_memory(&self, resident_bytes: u64, demand_bytes: u64) {
        let s = self.slot_ref();
        s.resident_bytes.store(resident_bytes, Ordering::Relaxed);
        s.demand_bytes.store(demand_bytes, Ordering::Relaxed);
    }

    /// The card's total memory as this job's driver reports it.
    pub fn set_card_bytes(&self, bytes: u64) {
        self.slot_ref().card_bytes.store(bytes, Ordering::Relaxed);
    }

    /// The coordinator's verdict on this job's floor: the verdict, the floor it saw, and the
    /// most it could grant.
    pub fn admission(&self) -> (Admission, u64, u64) {
        let s = self.slot_ref().snapshot(self.slot);
        s.map_or((Admission::Admitted, 0, 0), |s| {
            (s.admission, s.floor_bytes, s.grantable_bytes)
        })
    }

    /// Whether the coordinator asks the job to hold its launches (another job has the card
    /// for its turn).
    pub fn paused(&self) -> bool {
        self.slot_ref().paused.load(Ordering::Relaxed) != 0
    }

    /// Asks the coordinator to plan leaving `share` of the budget free from now on (rounded
    /// to a thousandth, clamped to 0 to 90%).
    pub fn ask_room(&self, share: f64) {
        self.slot_ref().room_asked.store(
            SlotRoom::from_share(share).to_word(self.incarnation),
            Ordering::Relaxed,
        );
    }

    /// The room the coordinator's planner leaves in this job's plans now ([`SlotRoom::NotSaid`]
    /// until it has seen the job, and from a coordinator before the field).
    pub fn room_in_force(&self) -> SlotRoom {
        SlotRoom::from_word(
            self.slot_ref().room_in_force.load(Ordering::Relaxed),
            self.incarnation,
        )
    }

    /// Launches seen so far.
    pub fn set_launches(&self, launches: u64) {
        self.slot_ref().launches.store(launches, Ordering::Relaxed);
    }

    /// The plan executed and its state.
    pub fn set_plan(&self, version: u32, state: PlanState) {
        self.slot_ref().set_plan(version, state);
    }

    /// What the last step cost.
    pub fn set_step_counters(&self, counters: &StepCounters) {
        self.slot_ref().set_step_counters(counters);
    }

    /// A new command, if the coordinator wrote one since the last call. An unusable one is
    /// returned as its error (and counted in the slot), so the caller can say so once.
    pub fn poll_command(&mut self) -> CommandRead {
        let slot = self.segment.slot(self.slot);
        let area = CommandArea {
            generation: &slot.command_generation,
            kind: &slot.command_kind,
            len: &slot.command_len,
            acked: &slot.command_acked,
            words: self.segment.command_words(self.slot),
        };
        let read = area.read(&mut self.command_seen, &mut self.command_buf);
        if matches!(read, CommandRead::New(Err(_))) {
            slot.commands_rejected.fetch_add(1, Ordering::Relaxed);
        }
        read
    }

    /// Whether the job still holds its slot and the segment's coordinator runs (and the
    /// name still refers to this segment). When not, the caller goes on alone and may join
    /// again later, to a new coordinator.
    pub fn connected(&self) -> bool {
        self.slot_ref().held_by(self.me.pid, self.incarnation)
            && self.segment.coordinator().is_running()
            && self.segment.still_named()
    }

    /// Age of the coordinator's heartbeat, ns.
    pub fn coordinator_heartbeat_age_ns(&self) -> u64 {
        monotonic_ns().saturating_sub(self.segment.header().heartbeat_ns.load(Ordering::Relaxed))
    }

    /// Flushes and frees the slot.
    pub fn leave(mut self) {
        self.leave_now();
    }

    fn leave_now(&mut self) {
        if self.left {
            return;
        }
        self.left = true;
        // A forked child carries a copy of this client; the slot is its parent's.
        if std::process::id() != self.me.pid {
            return;
        }
        self.flush();
        self.slot_ref().release(self.me.pid);
    }
}

// The shim drives a client from its background thread.
const _: () = {
    const fn sendable<T: Send>() {}
    sendable::<JobClient>();
};

impl Drop for JobClient {
    fn drop(&mut self) {
        self.leave_now();
    }
}
