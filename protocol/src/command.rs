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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Action, Iteration, PieceRef, Role, Step, When};
    use std::sync::atomic::AtomicBool;

    struct Owned {
        generation: AtomicU64,
        kind: AtomicU32,
        len: AtomicU32,
        acked: AtomicU64,
        words: Vec<AtomicU64>,
    }

    impl Owned {
        fn new(bytes: usize) -> Owned {
            Owned {
                generation: AtomicU64::new(0),
                kind: AtomicU32::new(0),
                len: AtomicU32::new(0),
                acked: AtomicU64::new(0),
                words: (0..bytes / 8).map(|_| AtomicU64::new(0)).collect(),
            }
        }
        fn area(&self) -> CommandArea<'_> {
            CommandArea {
                generation: &self.generation,
                kind: &self.kind,
                len: &self.len,
                acked: &self.acked,
                words: &self.words,
            }
        }
    }

    /// A plan whose every field follows from its version, with a length that varies with
    /// it, so a copy mixing two plans cannot equal either.
    fn plan(version: u32) -> ExecPlan {
        let period = 50 + version % 40;
        let steps = (0..(version % 64) + 8)
            .map(|i| Step {
                position: (i * 3) % period,
                when: When::AfterLaunch,
                action: Action::SwapOut,
                piece: PieceRef {
                    role: Role::Transient {
                        ordinal: version.wrapping_mul(7).wrapping_add(i),
                        bytes: 64 << 20,
                        iteration: Iteration::Current,
                    },
                    offset: u64::from(i % 8) << 21,
                    bytes: 2 << 20,
                },
            })
            .collect::<Vec<_>>();
        let mut steps = steps;
        steps.sort_by_key(|s| s.position);
        ExecPlan {
            version,
            period,
            kernels: (0..period).map(|p| p ^ version).collect(),
            anchor_seq: u64::from(version) * 1000,
            steps,
            uses: Vec::new(),
            host_resident: Vec::new(),
            budget_bytes: u64::from(version) << 20,
            predicted_step_ns: u64::from(version) * 3,
            compute_ns: u64::from(version) * 2,
        }
    }

    #[test]
    fn a_reader_never_returns_a_torn_plan_under_a_concurrent_writer() {
        let area = Owned::new(64 << 10);
        let stop = AtomicBool::new(false);
        let (mut read_plans, mut busy) = (0u32, 0u32);
        let mut torn = None;
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut generation = 0;
                let mut version = 1;
                while !stop.load(Ordering::Relaxed) {
                    area.area()
                        .write(&mut generation, &Command::Plan(plan(version)))
                        .unwrap();
                    version += 1;
                }
            });
            let mut last = 0;
            let mut buf = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_millis(700);
            while torn.is_none() && std::time::Instant::now() < deadline {
                match area.area().read(&mut last, &mut buf) {
                    CommandRead::New(Ok(Command::Plan(p))) if p == plan(p.version) => {
                        read_plans += 1
                    }
                    CommandRead::New(other) => torn = Some(format!("{other:?}")),
                    CommandRead::Busy => busy += 1,
                    CommandRead::Nothing => {}
                }
            }
            // The writer stops whatever the reader found.
            stop.store(true, Ordering::Relaxed);
        });
        assert_eq!(torn, None, "a torn command came out");
        assert!(
            read_plans > 10,
            "only {read_plans} plans read ({busy} busy)"
        );
    }

    #[test]
    fn budget_and_drop_round_trip_and_garbage_is_refused_by_kind() {
        let owned = Owned::new(4096);
        let area = owned.area();
        let (mut written, mut seen, mut buf) = (0, 0, Vec::new());
        assert_eq!(area.read(&mut seen, &mut buf), CommandRead::Nothing);
        area.write(&mut written, &Command::Budget(7 << 30)).unwrap();
        assert!(!area.acked(written));
        assert_eq!(
            area.read(&mut seen, &mut buf),
            CommandRead::New(Ok(Command::Budget(7 << 30)))
        );
        assert!(area.acked(written));
        assert_eq!(area.read(&mut seen, &mut buf), CommandRead::Nothing);
        area.write(&mut written, &Command::DropPlan).unwrap();
        assert_eq!(
            area.read(&mut seen, &mut buf),
            CommandRead::New(Ok(Command::DropPlan))
        );
        // A length past the area, an unknown kind, a plan that does not decode.
        owned.len.store(u32::MAX, Ordering::Relaxed);
        owned.generation.store(written + 2, Ordering::Relaxed);
        assert!(matches!(
            area.read(&mut seen, &mut buf),
            CommandRead::New(Err(CommandError::BadLength { .. }))
        ));
        owned.len.store(0, Ordering::Relaxed);
        owned.kind.store(77, Ordering::Relaxed);
        owned.generation.store(written + 4, Ordering::Relaxed);
        assert_eq!(
            area.read(&mut seen, &mut buf),
            CommandRead::New(Err(CommandError::UnknownKind(77)))
        );
        owned.kind.store(KIND_PLAN, Ordering::Relaxed);
        owned.len.store(16, Ordering::Relaxed);
        owned.generation.store(written + 6, Ordering::Relaxed);
        assert_eq!(
            area.read(&mut seen, &mut buf),
            CommandRead::New(Err(CommandError::Plan(PlanDecodeError::BadMagic)))
        );
        // A writer that died mid-write leaves an odd generation: busy, never a half command.
        owned.generation.store(written + 7, Ordering::Relaxed);
        assert_eq!(area.read(&mut seen, &mut buf), CommandRead::Busy);
        // Too large for the area.
        let mut big = plan(3);
        big.kernels = vec![1; 5000];
        big.period = 5000;
        assert!(matches!(
            area.write(&mut written, &Command::Plan(big)),
            Err(CommandError::TooLarge { .. })
        ));
    }
}
