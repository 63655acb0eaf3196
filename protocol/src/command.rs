//! A job's command area: what the coordinator tells the job (a plan, a budget, drop the plan),
//! one command at a time under a seqlock.
//!
//! The coordinator is the only writer: it makes the generation odd, writes kind, length and
//! payload words, and makes the generation even again (`Release`). The job copies the payload
//! out, checks that the generation did not move meanwhile (a torn copy is retried, never
//! used), then validates the length and decodes (`ExecPlan::decode` checks a plan whole). It
//! acknowledges the generation it read, applied or rejected; the coordinator writes the next
//! command only after that (it keeps a queue meanwhile), so none is overwritten unread.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::plan::{ExecPlan, PlanDecodeError};

/// What the coordinator tells a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Execute this plan from the next iteration boundary.
    Plan(ExecPlan),
    /// The device budget granted to the job changed.
    Budget(u64),
    /// Stop executing the plan; swap on demand.
    DropPlan,
}

const KIND_PLAN: u32 = 1;
const KIND_BUDGET: u32 = 2;
const KIND_DROP_PLAN: u32 = 3;

/// Why a command was not read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// An unknown kind.
    #[error("command of unknown kind {0}")]
    UnknownKind(u32),
    /// A length that does not fit the area or the kind.
    #[error("command of kind {kind} with a payload of {length} bytes (area of {capacity})")]
    BadLength {
        kind: u32,
        length: u64,
        capacity: u64,
    },
    /// The plan does not decode.
    #[error("plan command: {0}")]
    Plan(#[from] PlanDecodeError),
    /// The encoded command does not fit the area.
    #[error("a command of {length} bytes does not fit a command area of {capacity}")]
    TooLarge { length: u64, capacity: u64 },
}

impl Command {
    fn encode(&self) -> (u32, Vec<u8>) {
        match self {
            Command::Plan(plan) => (KIND_PLAN, plan.encode()),
            Command::Budget(bytes) => (KIND_BUDGET, bytes.to_le_bytes().to_vec()),
            Command::DropPlan => (KIND_DROP_PLAN, Vec::new()),
        }
    }

    fn decode(kind: u32, payload: &[u8]) -> Result<Command, CommandError> {
        let bad = || CommandError::BadLength {
            kind,
            length: payload.len() as u64,
            capacity: payload.len() as u64,
        };
        match kind {
            KIND_PLAN => Ok(Command::Plan(ExecPlan::decode(payload)?)),
            KIND_BUDGET => Ok(Command::Budget(u64::from_le_bytes(
                payload.try_into().map_err(|_| bad())?,
            ))),
            KIND_DROP_PLAN if payload.is_empty() => Ok(Command::DropPlan),
            KIND_DROP_PLAN => Err(bad()),
            other => Err(CommandError::UnknownKind(other)),
        }
    }
}

/// One slot's command area.
#[derive(Clone, Copy)]
pub(crate) struct CommandArea<'a> {
    pub generation: &'a AtomicU64,
    pub kind: &'a AtomicU32,
    pub len: &'a AtomicU32,
    pub acked: &'a AtomicU64,
    pub words: &'a [AtomicU64],
}

/// What the reader found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandRead {
    /// No command since the last one read.
    Nothing,
    /// The writer was busy; ask again later.
    Busy,
    /// A new command (or why it could not be used); acknowledged either way.
    New(Result<Command, CommandError>),
}

impl CommandArea<'_> {
    fn capacity(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    /// The coordinator's write. `generation` is its own count of what it wrote (the shared
    /// one is never trusted); the new generation is returned and stored there.
    pub fn write(&self, generation: &mut u64, command: &Command) -> Result<u64, CommandError> {
        let (kind, payload) = command.encode();
        let length = payload.len() as u64;
        if length > self.capacity() || length > u64::from(u32::MAX) {
            return Err(CommandError::TooLarge {
                length,
                capacity: self.capacity(),
            });
        }
        let start = *generation | 1;
        self.generation.store(start, Ordering::Relaxed);
        fence(Ordering::Release);
        self.kind.store(kind, Ordering::Relaxed);
        self.len.store(length as u32, Ordering::Relaxed);
        for (w, chunk) in self.words.iter().zip(payload.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        *generation = start + 1;
        self.generation.store(*generation, Ordering::Release);
        Ok(*generation)
    }

    /// Whether the job acknowledged `generation`.
    pub fn acked(&self, generation: u64) -> bool {
        self.acked.load(Ordering::Acquire) == generation
    }

    /// The job's read. `last` is the generation it read last; `buf` a reusable buffer.
    pub fn read(&self, last: &mut u64, buf: &mut Vec<u8>) -> CommandRead {
        let before = self.generation.load(Ordering::Acquire);
        if before == *last {
            return CommandRead::Nothing;
        }
        if before % 2 == 1 {
            return CommandRead::Busy;
        }
        let kind = self.kind.load(Ordering::Relaxed);
        let length = u64::from(self.len.load(Ordering::Relaxed));
        let fits = length <= self.capacity();
        buf.clear();
        if fits {
            buf.reserve(length as usize);
            let mut left = length as usize;
            for w in self.words {
                if left == 0 {
                    break;
                }
                let b = w.load(Ordering::Relaxed).to_le_bytes();
                let n = left.min(8);
                buf.extend_from_slice(&b[..n]);
                left -= n;
            }
        }
        fence(Ordering::Acquire);
        if self.generation.load(Ordering::Relaxed) != before {
            return CommandRead::Busy;
        }
        *last = before;
        self.acked.store(before, Ordering::Release);
        if !fits {
            return CommandRead::New(Err(CommandError::BadLength {
                kind,
                length,
                capacity: self.capacity(),
            }));
        }
        CommandRead::New(Command::decode(kind, buf))
    }
}
