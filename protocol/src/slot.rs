//! A job slot: one job's fixed-layout row in the segment, and the rules for owning it.
//!
//! Ownership is one word, `owner = pid << 32 | state`, changed only by compare-and-swap:
//! - `FREE -> CLAIMING(pid)`: a joining job takes a free slot;
//! - `LIVE(dead) / CLAIMING(dead) -> CLAIMING(pid)`: a joining job takes a dead job's slot;
//! - `CLAIMING(pid) -> LIVE(pid)`: the job has written its identity and reset its fields
//!   (a plain `Release` store, only the claimer writes it);
//! - `LIVE(pid) -> FREE`: the job leaves, or the coordinator's sweep finds it dead.
//!
//! A job is dead when its pid is gone or belongs to a process with another start time. Each
//! claim bumps `incarnation`, so the coordinator tells a new job in a reused slot from the old
//! one even if it never saw the slot free. Counters are written by their one writer with
//! `Relaxed` stores: a reader may see a mix of two updates, never a torn value.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::process::{monotonic_ns, ProcessIdentity};

/// Bytes of one slot.
pub const SLOT_BYTES: usize = 1024;

/// Bytes of the command line a slot keeps (truncated, NUL-padded).
pub const COMMAND_LINE_BYTES: usize = 256;

pub(crate) const STATE_FREE: u64 = 0;
pub(crate) const STATE_CLAIMING: u64 = 1;
pub(crate) const STATE_LIVE: u64 = 2;

pub(crate) fn owner_word(pid: u32, state: u64) -> u64 {
    (u64::from(pid) << 32) | state
}

fn split_owner(word: u64) -> (u32, u64) {
    ((word >> 32) as u32, word & 0xffff_ffff)
}

/// Whether a job executes a plan, and which kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanState {
    /// On-demand swapping while the planner learns the iteration.
    Learning,
    /// Executing a plan.
    Planned,
    /// A plan was dropped (the launches stopped matching) and the job swaps on demand until
    /// the next.
    Fallback,
}

impl PlanState {
    fn to_word(self) -> u32 {
        match self {
            PlanState::Learning => 0,
            PlanState::Planned => 1,
            PlanState::Fallback => 2,
        }
    }

    fn from_word(w: u32) -> Option<PlanState> {
        match w {
            0 => Some(PlanState::Learning),
            1 => Some(PlanState::Planned),
            2 => Some(PlanState::Fallback),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PlanState::Learning => "learning",
            PlanState::Planned => "planned",
            PlanState::Fallback => "fallback",
        }
    }
}

/// How much a job's memory and copy time matter against other jobs' on the same GPU
/// (`TENSILE_PRIORITY`). A high job keeps its working set; low jobs absorb a squeeze first,
/// down to the floor their largest launch needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    High,
    #[default]
    Normal,
    Low,
}

impl Priority {
    /// Every priority, most important first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    fn to_word(self) -> u32 {
        match self {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::Low => 2,
        }
    }

    fn from_word(w: u32) -> Option<Priority> {
        match w {
            0 => Some(Priority::High),
            1 => Some(Priority::Normal),
            2 => Some(Priority::Low),
            _ => None,
        }
    }

    /// The setting's word: `high`, `normal` or `low`.
    pub fn name(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// Reads a setting's word (case and surrounding blanks ignored).
    pub fn parse(text: &str) -> Option<Priority> {
        Priority::ALL
            .into_iter()
            .find(|p| text.trim().eq_ignore_ascii_case(p.name()))
    }
}

/// Whether the coordinator can give a job the memory its largest launch needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// Its floor fits (or is not known yet).
    #[default]
    Admitted,
    /// The job's largest launch does not fit beside the floors of the jobs that rank before
    /// it (higher priority, or joined earlier): its grant is below its floor until memory is
    /// freed.
    Short,
}

impl Admission {
    fn to_word(self) -> u32 {
        match self {
            Admission::Admitted => 0,
            Admission::Short => 1,
        }
    }

    fn from_word(w: u32) -> Admission {
        if w == 1 {
            Admission::Short
        } else {
            Admission::Admitted
        }
    }
}

/// One job's row. Field comments say who writes each.
#[repr(C, align(64))]
pub(crate) struct JobSlot {
    /// Both (compare-and-swap): `pid << 32 | state`.
    pub owner: AtomicU64,
    /// Job, while claiming: its process start time.
    pub start_time: AtomicU64,
    /// Job, while claiming: bumped by every claim.
    pub incarnation: AtomicU64,
    /// Job: `CLOCK_MONOTONIC` ns of its last heartbeat.
    pub heartbeat_ns: AtomicU64,
    /// Job: the device budget it asks for.
    pub budget_bytes: AtomicU64,
    /// Coordinator: the budget granted.
    pub grant_bytes: AtomicU64,
    /// Job: bytes resident on the device.
    pub resident_bytes: AtomicU64,
    /// Job: bytes it would keep resident if it could (its working set).
    pub demand_bytes: AtomicU64,
    /// Job: the version of the plan it executes (0: none yet).
    pub plan_version: AtomicU32,
    /// Job: [`PlanState`].
    pub plan_state: AtomicU32,
    /// Job: launches seen.
    pub launches: AtomicU64,
    /// Job: records written to the ring.
    pub records_pushed: AtomicU64,
    /// Job: records dropped because the ring was full.
    pub records_dropped: AtomicU64,
    /// Job, per step (the last step measured): launches that waited for a swap-in.
    pub stalls_per_step: AtomicU64,
    /// Job, per step: bytes written to the host.
    pub bytes_to_host_per_step: AtomicU64,
    /// Job, per step: bytes read back to the device.
    pub bytes_to_device_per_step: AtomicU64,
    /// Job: the step time its plan predicts, ns.
    pub predicted_step_ns: AtomicU64,
    /// Job: the step time measured, ns.
    pub measured_step_ns: AtomicU64,
    /// Job: commands it could not decode.
    pub commands_rejected: AtomicU64,
    /// Coordinator: times it found the ring corrupt and reset it.
    pub ring_resets: AtomicU64,
    _pad0: [AtomicU64; 5],
    /// Job (producer): bytes ever written to the ring. Offset 192.
    pub ring_head: AtomicU64,
    _pad1: [AtomicU64; 7],
    /// Coordinator (consumer): bytes ever read from the ring. Offset 256.
    pub ring_tail: AtomicU64,
    _pad2: [AtomicU64; 7],
    /// Coordinator: the command seqlock, odd while it writes. Offset 320.
    pub command_generation: AtomicU64,
    /// Coordinator, under the seqlock: the command's kind.
    pub command_kind: AtomicU32,
    /// Coordinator, under the seqlock: the payload's length in bytes.
    pub command_len: AtomicU32,
    /// Job: the last generation it read (and applied or rejected).
    pub command_acked: AtomicU64,
    _pad3: [AtomicU64; 5],
    /// Job, while claiming: its command line, NUL-padded. Offset 384.
    pub command_line: [AtomicU64; COMMAND_LINE_BYTES / 8],
    /// Job, while claiming: its [`Priority`]. Offset 640.
    pub priority: AtomicU32,
    /// Coordinator: [`Admission`].
    pub admission: AtomicU32,
    /// Job: the card's total memory as its driver reports it (0: not known yet).
    pub card_bytes: AtomicU64,
    /// Coordinator: the bytes the job's largest launch needs resident at once, as it saw
    /// them in the job's stream (0: no launch seen yet).
    pub floor_bytes: AtomicU64,
    /// Coordinator: the most it could grant the job with every other job at its own floor
    /// (what [`Admission::Short`] compares the floor with).
    pub grantable_bytes: AtomicU64,
    /// Coordinator: 1 while the job is to hold its launches (its turn on the card will come),
    /// 0 to run. Offset 672.
    pub paused: AtomicU32,
    /// Job, while claiming: 1 when it takes its turns on another coordinator, so this one
    /// never pauses it ([`crate::JobOptions::turns_elsewhere`]); 0 otherwise, as jobs before
    /// this field write. Offset 676.
    pub turns_elsewhere: AtomicU32,
    /// Job, while claiming: its memory manager's page, the unit its plans must move (0: not
    /// said, as by jobs before this field: the H100's 2 MiB). Offset 680.
    pub page_bytes: AtomicU64,
    /// Job, while claiming: the pid of the dead job whose slot it took (0: the slot was
    /// free), so the coordinator logs that job as dead rather than as gone. Offset 688.
    pub took_from: AtomicU64,
    /// Job: the room it asks its plans to leave, a [`SlotRoom`] word: written while claiming
    /// (its `TENSILE_PLAN_ROOM`, if set; else not said) and again when the run raises it
    /// (0: not said, as by jobs before this field: the coordinator's own room). Offset 696.
    pub room_asked: AtomicU64,
    /// Coordinator: the room its planner leaves in this job's plans now, a [`SlotRoom`] word
    /// (0: not said, as by coordinators before this field). Reset by the job while claiming.
    /// Offset 704.
    pub room_in_force: AtomicU64,
    _reserved: [AtomicU64; (SLOT_BYTES - 712) / 8],
}

const _: () = assert!(std::mem::size_of::<JobSlot>() == SLOT_BYTES);
const _: () = assert!(std::mem::offset_of!(JobSlot, ring_head) == 192);
const _: () = assert!(std::mem::offset_of!(JobSlot, ring_tail) == 256);
const _: () = assert!(std::mem::offset_of!(JobSlot, command_generation) == 320);
const _: () = assert!(std::mem::offset_of!(JobSlot, command_line) == 384);
const _: () = assert!(std::mem::offset_of!(JobSlot, priority) == 640);
const _: () = assert!(std::mem::offset_of!(JobSlot, paused) == 672);
const _: () = assert!(std::mem::offset_of!(JobSlot, turns_elsewhere) == 676);
const _: () = assert!(std::mem::offset_of!(JobSlot, page_bytes) == 680);
const _: () = assert!(std::mem::offset_of!(JobSlot, took_from) == 688);
const _: () = assert!(std::mem::offset_of!(JobSlot, room_asked) == 696);
const _: () = assert!(std::mem::offset_of!(JobSlot, room_in_force) == 704);

/// The most room a slot may say, in thousandths of the budget: 90%, the most the analyzer's
/// planner leaves (`tensile_analyzer::online::MAX_PLAN_ROOM`; a plan with more would plan for
/// almost nothing). A word over it is [`SlotRoom::Invalid`].
pub const MAX_ROOM_PERMILLE: u16 = 900;

/// Set in a room word that says a room (so that 0% said differs from nothing said).
const ROOM_SAID: u64 = 1 << 31;
/// The bits of a room word that hold the share.
const ROOM_PERMILLE_MASK: u64 = 0xffff;

/// A room (the share of a budget plans leave free) as a slot's `room_asked` or
/// `room_in_force` word says it.
///
/// The word: bits 0 to 15 the share in thousandths (0 to [`MAX_ROOM_PERMILLE`]; shares are
/// rounded to the nearest thousandth, exact for whole and tenth percents), bit 31 set ("said":
/// 0% is a room too), bits 16 to 30 zero, and bits 32 to 63 the low 32 bits of the slot's
/// incarnation it was written for. 0 is "not said", what a peer of the layout before these
/// fields leaves there. The incarnation tells a word written for this job from one left by the
/// slot's previous job: a job of the previous layout does not reset the job's word when it
/// claims, and a coordinator may write its word for a job that has just left as a new one
/// claims the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlotRoom {
    /// Nothing said (0, or a word written for another incarnation of the slot).
    #[default]
    NotSaid,
    /// A share of the budget in thousandths, at most [`MAX_ROOM_PERMILLE`].
    Permille(u16),
    /// A word for this job that no version writes (over 90%, or bits that must be zero set):
    /// never planned with; the reader keeps what it had and says so.
    Invalid(u64),
}

impl SlotRoom {
    /// The room for `share` of the budget (clamped to 0 to 90%; not a number: not said).
    pub fn from_share(share: f64) -> SlotRoom {
        if share.is_nan() {
            return SlotRoom::NotSaid;
        }
        let max = f64::from(MAX_ROOM_PERMILLE);
        SlotRoom::Permille((share * 1000.0).round().clamp(0.0, max) as u16)
    }

    /// The share of the budget, if a usable room is said.
    pub fn share(self) -> Option<f64> {
        match self {
            SlotRoom::Permille(p) => Some(f64::from(p) / 1000.0),
            SlotRoom::NotSaid | SlotRoom::Invalid(_) => None,
        }
    }

    /// The word for the job of `incarnation`.
    pub(crate) fn to_word(self, incarnation: u64) -> u64 {
        match self {
            SlotRoom::NotSaid => 0,
            SlotRoom::Permille(p) => {
                ((incarnation & 0xffff_ffff) << 32)
                    | ROOM_SAID
                    | u64::from(p.min(MAX_ROOM_PERMILLE))
            }
            SlotRoom::Invalid(word) => word,
        }
    }

    /// Reads a word as the job of `incarnation` sees it.
    pub(crate) fn from_word(word: u64, incarnation: u64) -> SlotRoom {
        if word == 0 || word >> 32 != incarnation & 0xffff_ffff {
            return SlotRoom::NotSaid;
        }
        let low = word & 0xffff_ffff;
        let permille = low & ROOM_PERMILLE_MASK;
        if low & !ROOM_PERMILLE_MASK != ROOM_SAID || permille > u64::from(MAX_ROOM_PERMILLE) {
            return SlotRoom::Invalid(word);
        }
        SlotRoom::Permille(permille as u16)
    }
}

/// A slot as read at one moment (fields may come from neighbouring updates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSnapshot {
    /// Index of the slot.
    pub slot: u32,
    /// Bumped by every claim of the slot.
    pub incarnation: u64,
    /// The job's process.
    pub process: ProcessIdentity,
    /// Claimed and initialized (`false`: still claiming).
    pub live: bool,
    /// Nanoseconds since its last heartbeat (`CLOCK_MONOTONIC`).
    pub heartbeat_age_ns: u64,
    pub budget_bytes: u64,
    pub grant_bytes: u64,
    pub resident_bytes: u64,
    pub demand_bytes: u64,
    pub plan_version: u32,
    /// `None`: a value no version writes.
    pub plan_state: Option<PlanState>,
    pub launches: u64,
    pub records_pushed: u64,
    pub records_dropped: u64,
    pub stalls_per_step: u64,
    pub bytes_to_host_per_step: u64,
    pub bytes_to_device_per_step: u64,
    pub predicted_step_ns: u64,
    pub measured_step_ns: u64,
    pub commands_rejected: u64,
    pub ring_resets: u64,
    /// The command line as the job wrote it (lossy UTF-8, truncated).
    pub command_line: String,
    /// `None`: a value no version writes.
    pub priority: Option<Priority>,
    pub admission: Admission,
    pub card_bytes: u64,
    pub floor_bytes: u64,
    pub grantable_bytes: u64,
    /// The coordinator holds the job's launches (time-sharing the card).
    pub paused: bool,
    /// The job takes its turns on another coordinator: this one never pauses it.
    pub turns_elsewhere: bool,
    /// The job's page (0: not said).
    pub page_bytes: u64,
    /// The pid of the dead job whose slot this job took when it joined (0: it was free).
    pub took_from: u32,
    /// The room the job asks its plans to leave.
    pub room_asked: SlotRoom,
    /// The room the coordinator's planner leaves in the job's plans now.
    pub room_in_force: SlotRoom,
}

/// The page a job that does not say its own moves in: the H100's 2 MiB.
pub const DEFAULT_PAGE_BYTES: u64 = 2 << 20;

impl JobSnapshot {
    /// The job's page: what it said, or [`DEFAULT_PAGE_BYTES`] where it said nothing usable
    /// (0, as jobs before the field write, or not a power of two).
    pub fn page(&self) -> u64 {
        if self.page_bytes.is_power_of_two() {
            self.page_bytes
        } else {
            DEFAULT_PAGE_BYTES
        }
    }
}

/// What a job writes into its slot while claiming it ([`JobSlot::finish_claim`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claimant<'a> {
    pub me: ProcessIdentity,
    /// The device budget it asks for.
    pub budget_bytes: u64,
    pub priority: Priority,
    pub command_line: &'a str,
    /// Its memory manager's page (0: not said).
    pub page_bytes: u64,
    /// The dead job whose slot it took (0: the slot was free).
    pub took_from: u32,
    /// The room it asks its plans to leave.
    pub room: SlotRoom,
    /// It takes its turns on another coordinator.
    pub turns_elsewhere: bool,
}

/// What a job reports about its last step, written into its slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCounters {
    pub stalls: u64,
    pub bytes_to_host: u64,
    pub bytes_to_device: u64,
    pub predicted_step_ns: u64,
    pub measured_step_ns: u64,
}

impl JobSlot {
    /// The owner's pid and whether it is claiming or live; `None` when free (or garbage).
    pub fn owner(&self) -> Option<(u32, u64)> {
        let (pid, state) = split_owner(self.owner.load(Ordering::Acquire));
        match state {
            STATE_CLAIMING | STATE_LIVE => Some((pid, state)),
            _ => None,
        }
    }

    pub fn snapshot(&self, slot: u32) -> Option<JobSnapshot> {
        let (pid, state) = self.owner()?;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let incarnation = r(&self.incarnation);
        Some(JobSnapshot {
            slot,
            incarnation,
            process: ProcessIdentity {
                pid,
                start_time: r(&self.start_time),
            },
            live: state == STATE_LIVE,
            heartbeat_age_ns: monotonic_ns().saturating_sub(r(&self.heartbeat_ns)),
            budget_bytes: r(&self.budget_bytes),
            grant_bytes: r(&self.grant_bytes),
            resident_bytes: r(&self.resident_bytes),
            demand_bytes: r(&self.demand_bytes),
            plan_version: self.plan_version.load(Ordering::Relaxed),
            plan_state: PlanState::from_word(self.plan_state.load(Ordering::Relaxed)),
            launches: r(&self.launches),
            records_pushed: r(&self.records_pushed),
            records_dropped: r(&self.records_dropped),
            stalls_per_step: r(&self.stalls_per_step),
            bytes_to_host_per_step: r(&self.bytes_to_host_per_step),
            bytes_to_device_per_step: r(&self.bytes_to_device_per_step),
            predicted_step_ns: r(&self.predicted_step_ns),
            measured_step_ns: r(&self.measured_step_ns),
            commands_rejected: r(&self.commands_rejected),
            ring_resets: r(&self.ring_resets),
            command_line: self.command_line(),
            priority: Priority::from_word(self.priority.load(Ordering::Relaxed)),
            admission: Admission::from_word(self.admission.load(Ordering::Relaxed)),
            card_bytes: r(&self.card_bytes),
            floor_bytes: r(&self.floor_bytes),
            grantable_bytes: r(&self.grantable_bytes),
            paused: self.paused.load(Ordering::Relaxed) != 0,
            turns_elsewhere: self.turns_elsewhere.load(Ordering::Relaxed) != 0,
            page_bytes: r(&self.page_bytes),
            took_from: r(&self.took_from) as u32,
            room_asked: SlotRoom::from_word(r(&self.room_asked), incarnation),
            room_in_force: SlotRoom::from_word(r(&self.room_in_force), incarnation),
        })
    }

    fn command_line(&self) -> String {
        let mut bytes = Vec::with_capacity(COMMAND_LINE_BYTES);
        for w in &self.command_line {
            bytes.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    fn set_command_line(&self, line: &str) {
        let mut bytes = [0u8; COMMAND_LINE_BYTES];
        // Truncated on a character boundary, with room for the NUL.
        let mut end = line.len().min(COMMAND_LINE_BYTES - 1);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        bytes[..end].copy_from_slice(&line.as_bytes()[..end]);
        for (w, chunk) in self.command_line.iter().zip(bytes.chunks_exact(8)) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            w.store(u64::from_le_bytes(word), Ordering::Relaxed);
        }
    }

    /// Whether the owner recorded in `word` is gone. A claimer is judged by pid alone (it may
    /// have died before writing its start time).
    fn owner_is_dead(&self, word: u64) -> bool {
        let (pid, state) = split_owner(word);
        match state {
            STATE_FREE => false,
            STATE_CLAIMING => !crate::process::pid_exists(pid),
            STATE_LIVE => !ProcessIdentity {
                pid,
                start_time: self.start_time.load(Ordering::Relaxed),
            }
            .is_running(),
            // A state no version writes: garbage, and nobody's.
            _ => true,
        }
    }

    /// Takes the slot for `me` if it is free or its owner is dead; on success it is CLAIMING,
    /// and the result is the dead owner's pid (0: the slot was free), for
    /// [`JobSlot::finish_claim`].
    pub fn try_claim(&self, me: u32) -> Option<u32> {
        let word = self.owner.load(Ordering::Acquire);
        let (pid, state) = split_owner(word);
        if state != STATE_FREE && !self.owner_is_dead(word) {
            return None;
        }
        self.owner
            .compare_exchange(
                word,
                owner_word(me, STATE_CLAIMING),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .ok()
            .map(|_| if state == STATE_FREE { 0 } else { pid })
    }

    /// Finishes a claim: resets the job's fields, writes its identity, goes LIVE. The ring
    /// restarts where the consumer stands and old commands count as read, so nothing of the
    /// previous owner reaches the new one. Returns the incarnation.
    pub fn finish_claim(&self, claimant: &Claimant<'_>) -> (u64, u64) {
        let Claimant {
            me,
            budget_bytes,
            priority,
            command_line,
            page_bytes,
            took_from,
            room,
            turns_elsewhere,
        } = *claimant;
        let z = |a: &AtomicU64| a.store(0, Ordering::Relaxed);
        let incarnation = self.incarnation.fetch_add(1, Ordering::Relaxed) + 1;
        self.start_time.store(me.start_time, Ordering::Relaxed);
        self.heartbeat_ns.store(monotonic_ns(), Ordering::Relaxed);
        self.budget_bytes.store(budget_bytes, Ordering::Relaxed);
        self.page_bytes.store(page_bytes, Ordering::Relaxed);
        self.took_from
            .store(u64::from(took_from), Ordering::Relaxed);
        self.room_asked
            .store(room.to_word(incarnation), Ordering::Relaxed);
        for a in [
            &self.resident_bytes,
            &self.demand_bytes,
            &self.launches,
            &self.records_pushed,
            &self.records_dropped,
            &self.stalls_per_step,
            &self.bytes_to_host_per_step,
            &self.bytes_to_device_per_step,
            &self.predicted_step_ns,
            &self.measured_step_ns,
            &self.commands_rejected,
            &self.card_bytes,
            &self.floor_bytes,
            &self.grantable_bytes,
            // A new job starts with no grant: the coordinator's next tick gives it one.
            &self.grant_bytes,
            // Nor a room: the coordinator says its own once it has seen the job.
            &self.room_in_force,
        ] {
            z(a);
        }
        self.priority.store(priority.to_word(), Ordering::Relaxed);
        self.paused.store(0, Ordering::Relaxed);
        self.turns_elsewhere
            .store(u32::from(turns_elsewhere), Ordering::Relaxed);
        self.admission
            .store(Admission::Admitted.to_word(), Ordering::Relaxed);
        self.plan_version.store(0, Ordering::Relaxed);
        self.plan_state
            .store(PlanState::Learning.to_word(), Ordering::Relaxed);
        // The tail is 8-aligned unless garbled; a garbled one is reset by the consumer.
        let head = self.ring_tail.load(Ordering::Acquire) & !7;
        self.ring_head.store(head, Ordering::Release);
        self.command_acked.store(
            self.command_generation.load(Ordering::Acquire),
            Ordering::Relaxed,
        );
        self.set_command_line(command_line);
        self.owner
            .store(owner_word(me.pid, STATE_LIVE), Ordering::Release);
        (incarnation, head)
    }

    /// Frees the slot if `pid` still owns it (live); false when it had already lost it.
    pub fn release(&self, pid: u32) -> bool {
        self.owner
            .compare_exchange(
                owner_word(pid, STATE_LIVE),
                STATE_FREE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Holds a free slot for the coordinator while it reads what the slot's last job left in
    /// the ring, in `incarnation`: no job can claim the slot (and restart the ring under the
    /// reader) until [`JobSlot::end_hold`]. False when the slot is taken or a new job has had it
    /// since. A coordinator that dies holding it leaves a claim by a dead pid, which the next
    /// joiner takes over.
    pub fn hold_departed(&self, coordinator: u32, incarnation: u64) -> bool {
        let held = self
            .owner
            .compare_exchange(
                STATE_FREE,
                owner_word(coordinator, STATE_CLAIMING),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok();
        if held && self.incarnation.load(Ordering::Relaxed) != incarnation {
            self.end_hold(coordinator);
            return false;
        }
        held
    }

    /// Ends [`JobSlot::hold_departed`].
    pub fn end_hold(&self, coordinator: u32) {
        let _ = self.owner.compare_exchange(
            owner_word(coordinator, STATE_CLAIMING),
            STATE_FREE,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// The coordinator's sweep: frees the slot if its owner is dead. Returns the owner's pid.
    pub fn reclaim_if_dead(&self) -> Option<u32> {
        let word = self.owner.load(Ordering::Acquire);
        if split_owner(word).1 == STATE_FREE || !self.owner_is_dead(word) {
            return None;
        }
        self.owner
            .compare_exchange(word, STATE_FREE, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|w| split_owner(w).0)
    }

    /// Whether `pid` still owns the slot in `incarnation`.
    pub fn held_by(&self, pid: u32, incarnation: u64) -> bool {
        self.owner.load(Ordering::Acquire) == owner_word(pid, STATE_LIVE)
            && self.incarnation.load(Ordering::Relaxed) == incarnation
    }

    pub fn set_plan(&self, version: u32, state: PlanState) {
        self.plan_version.store(version, Ordering::Relaxed);
        self.plan_state.store(state.to_word(), Ordering::Relaxed);
    }

    /// The coordinator's verdict on the job's floor (see [`Admission`]).
    pub fn set_admission(&self, admission: Admission, floor_bytes: u64, grantable_bytes: u64) {
        self.floor_bytes.store(floor_bytes, Ordering::Relaxed);
        self.grantable_bytes
            .store(grantable_bytes, Ordering::Relaxed);
        self.admission.store(admission.to_word(), Ordering::Relaxed);
    }

    pub fn set_step_counters(&self, c: &StepCounters) {
        self.stalls_per_step.store(c.stalls, Ordering::Relaxed);
        self.bytes_to_host_per_step
            .store(c.bytes_to_host, Ordering::Relaxed);
        self.bytes_to_device_per_step
            .store(c.bytes_to_device, Ordering::Relaxed);
        self.predicted_step_ns
            .store(c.predicted_step_ns, Ordering::Relaxed);
        self.measured_step_ns
            .store(c.measured_step_ns, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_room_word_says_the_share_for_its_incarnation_only() {
        let n = 7;
        for (share, permille) in [(0.0, 0), (0.2, 200), (0.355, 355), (0.9, 900)] {
            let room = SlotRoom::from_share(share);
            assert_eq!(room, SlotRoom::Permille(permille));
            assert_eq!(SlotRoom::from_word(room.to_word(n), n), room);
            assert!((room.share().unwrap() - share).abs() < 1e-9);
        }
        // 0% said is a word of its own, not nothing said.
        assert_ne!(SlotRoom::Permille(0).to_word(n), 0);
        assert_eq!(SlotRoom::from_word(0, n), SlotRoom::NotSaid);
        // Out of range, clamped; not a number, not said.
        assert_eq!(
            SlotRoom::from_share(3.0),
            SlotRoom::Permille(MAX_ROOM_PERMILLE)
        );
        assert_eq!(SlotRoom::from_share(-1.0), SlotRoom::Permille(0));
        assert_eq!(SlotRoom::from_share(f64::NAN), SlotRoom::NotSaid);
        // A word for another incarnation of the slot (its previous job) says nothing; the
        // incarnation's high bits do not count.
        let word = SlotRoom::Permille(300).to_word(n);
        assert_eq!(SlotRoom::from_word(word, n + 1), SlotRoom::NotSaid);
        assert_eq!(
            SlotRoom::from_word(SlotRoom::Permille(300).to_word(n | 1 << 40), n),
            SlotRoom::Permille(300)
        );
    }

    #[test]
    fn a_room_word_no_version_writes_is_invalid_and_has_no_share() {
        let n = 3u64;
        let tag = n << 32;
        for word in [
            tag | ROOM_SAID | 901,
            tag | ROOM_SAID | 0xffff,
            tag | ROOM_SAID | 1 << 16 | 200,
            tag | 200,
            tag,
        ] {
            let room = SlotRoom::from_word(word, n);
            assert_eq!(room, SlotRoom::Invalid(word), "{word:#x}");
            assert_eq!(room.share(), None);
        }
    }
}
