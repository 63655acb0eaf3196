//! The executable plan: what the shim does at which launch of the iteration.
//!
//! The planner (`tensile-analyzer`) thinks in ops of a cycle and tensors of a trace. The shim
//! at run time sees neither: it sees launches, numbered as they happen, and allocations whose
//! addresses change from step to step (`cudaMallocAsync` gives a role a new address every
//! iteration). An [`ExecPlan`] is the plan restated in the shim's terms:
//!
//! - **When**: a launch *position* in the iteration, `(seq - anchor_seq) mod period` for the
//!   launch numbered `seq` (the trace's `Launch::seq`). The kernel expected at each position is
//!   part of the plan, so the shim checks every launch against it in O(1) and drops the plan at
//!   the first mismatch.
//! - **What**: a byte range of an allocation named by [`Role`]: a persistent allocation by its
//!   id (the trace's `Alloc::id`), a transient one by its ordinal among the allocations of the
//!   iteration and its size.
//!
//! An allocation belongs to the iteration of the first launch made after it, and its ordinal
//! counts the allocations before it in that iteration from 0. Both sides use this definition:
//! the planner when it names roles, the shim when it resolves them.
//!
//! A plan only ever moves data between the device and the host pool; it cannot lose any. A step
//! the shim cannot carry out (a role that did not appear, a size that differs) is skipped, and
//! whatever the plan did not foresee is served on demand.

use serde::{Deserialize, Serialize};

/// The first eight bytes of an encoded plan.
pub const PLAN_MAGIC: [u8; 8] = *b"TNSLPLN\0";

/// The plan encoding this crate writes and reads; bumped on any incompatible change.
pub const PLAN_FORMAT_VERSION: u16 = 2;

/// The largest encoded plan accepted; anything bigger is corruption, not a plan.
pub const MAX_PLAN_BYTES: usize = 64 << 20;

/// Which iteration's allocation a transient role names, seen from the launch of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Iteration {
    /// The iteration the step's launch is in.
    Current,
    /// The one before it: the tensor's lifetime wraps past the iteration's end (a gradient
    /// freed by the next step's `zero_grad`).
    Previous,
}

/// How the shim finds an allocation in every iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// The same allocation in every iteration (parameters, optimizer state).
    Persistent {
        /// The allocation's id, as the shim numbers allocations (`Alloc::id` in its trace).
        alloc_id: u64,
    },
    /// The `ordinal`-th allocation of an iteration, of exactly `bytes`.
    Transient {
        /// Position among the allocations of the iteration, from 0.
        ordinal: u32,
        /// Its size; an allocation of another size at that ordinal does not match.
        bytes: u64,
        /// Which iteration's allocation.
        iteration: Iteration,
    },
}

/// A byte range of an allocation named by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PieceRef {
    /// The allocation.
    pub role: Role,
    /// Offset of the range in the allocation.
    pub offset: u64,
    /// Length of the range; never 0.
    pub bytes: u64,
}

/// When a step runs, relative to the launch at its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum When {
    /// Before the launch is forwarded to the driver.
    BeforeLaunch,
    /// Once the launch has been forwarded (the copy is ordered after it on the device).
    AfterLaunch,
}

/// What a step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    /// Write the piece to the host pool and free its device frames, once the work queued so far
    /// that uses it is done. Never waits on the launch path.
    SwapOut,
    /// Start reading the piece back to the device; the first launch that needs it waits for
    /// the copy on its own stream, not on the host.
    Prefetch,
}

/// One planned move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Step {
    /// Launch position in the iteration, `< period`.
    pub position: u32,
    /// Before or after that launch.
    pub when: When,
    /// Out or in.
    pub action: Action,
    /// What moves.
    pub piece: PieceRef,
}

/// An allocation a launch of the iteration touches: what the plan knows of the future, so
/// that the shim can tell which resident page is needed last when it must evict one the plan
/// did not foresee (Belady's choice instead of the least recently used).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Use {
    /// Launch position in the iteration, `< period` (work that is not a launch counts at the
    /// next launch).
    pub position: u32,
    /// The allocation, named as a step names it from that launch.
    pub role: Role,
}

/// A periodic plan for one job, in the shim's terms (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecPlan {
    /// The planner's number for this plan; a job's plans have increasing versions.
    pub version: u32,
    /// Launches per iteration.
    pub period: u32,
    /// The kernel id (`KernelInfo::id` in the shim's trace) of the launch at each position;
    /// `period` entries.
    pub kernels: Vec<u32>,
    /// The `Launch::seq` of a launch at position 0 (of any iteration, past or future).
    pub anchor_seq: u64,
    /// The moves, sorted by `(position, when)`.
    pub steps: Vec<Step>,
    /// Every allocation each launch of the iteration touches, sorted by position.
    pub uses: Vec<Use>,
    /// Pieces of persistent allocations that no launch of the iteration touches: written out
    /// once, kept on the host.
    pub host_resident: Vec<PieceRef>,
    /// The device budget the plan was made for.
    pub budget_bytes: u64,
    /// The step time the planner's simulator predicts for the plan, in ns.
    pub predicted_step_ns: u64,
    /// The iteration's GPU time without any swapping, in ns.
    pub compute_ns: u64,
}

/// Why bytes are not a usable plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanDecodeError {
    /// Not a plan at all.
    #[error("not a libtensile plan (bad magic)")]
    BadMagic,
    /// A plan of another format version.
    #[error("plan format version {found}, this libtensile reads version {expected}")]
    UnsupportedVersion {
        /// What the bytes say.
        found: u16,
        /// What this crate reads.
        expected: u16,
    },
    /// Larger than [`MAX_PLAN_BYTES`].
    #[error("plan of {0} bytes, more than the {MAX_PLAN_BYTES} accepted")]
    TooLarge(usize),
    /// The payload does not decode.
    #[error("plan payload does not decode: {0}")]
    Payload(String),
    /// It decodes, but breaks a rule of the format.
    #[error("invalid plan: {0}")]
    Invalid(String),
}

impl ExecPlan {
    /// Position of the launch numbered `seq` in the iteration.
    #[inline]
    pub fn position_of(&self, seq: u64) -> u32 {
        let period = u64::from(self.period.max(1));
        // Launches before the anchor wrap around like those after it.
        let p = if seq >= self.anchor_seq {
            (seq - self.anchor_seq) % period
        } else {
            (period - (self.anchor_seq - seq) % period) % period
        };
        p as u32
    }

    /// The kernel expected at `position`.
    #[inline]
    pub fn kernel_at(&self, position: u32) -> Option<u32> {
        self.kernels.get(position as usize).copied()
    }

    /// For each position `p`, `index[p]..index[p + 1]` are the steps at `p` (`period + 1`
    /// entries). Assumes a valid plan.
    pub fn step_index(&self) -> Vec<u32> {
        let mut index = Vec::with_capacity(self.period as usize + 1);
        let mut i = 0usize;
        for p in 0..=self.period {
            while i < self.steps.len() && self.steps[i].position < p {
                i += 1;
            }
            index.push(i as u32);
        }
        index
    }

    /// Bytes the steps write out per iteration.
    pub fn bytes_out_per_iteration(&self) -> u64 {
        self.steps
            .iter()
            .filter(|s| s.action == Action::SwapOut)
            .map(|s| s.piece.bytes)
            .sum()
    }

    /// Checks the rules a decoded plan must follow, so the shim can index with it freely.
    pub fn validate(&self) -> Result<(), PlanDecodeError> {
        let invalid = |what: String| Err(PlanDecodeError::Invalid(what));
        if self.period == 0 {
            return invalid("a period of 0 launches".into());
        }
        if self.kernels.len() != self.period as usize {
            return invalid(format!(
                "{} kernels for a period of {} launches",
                self.kernels.len(),
                self.period
            ));
        }
        let mut last = (0u32, When::BeforeLaunch);
        for (i, s) in self.steps.iter().enumerate() {
            if s.position >= self.period {
                return invalid(format!(
                    "step {i} at position {}, past the period of {}",
                    s.position, self.period
                ));
            }
            if (s.position, s.when) < last {
                return invalid(format!("step {i} is out of order"));
            }
            last = (s.position, s.when);
            check_piece(&s.piece)
                .map_err(|e| PlanDecodeError::Invalid(format!("step {i}: {e}")))?;
        }
        let mut last_use = 0u32;
        for (i, u) in self.uses.iter().enumerate() {
            if u.position >= self.period {
                return invalid(format!(
                    "use {i} at position {}, past the period of {}",
                    u.position, self.period
                ));
            }
            if u.position < last_use {
                return invalid(format!("use {i} is out of order"));
            }
            last_use = u.position;
        }
        for (i, p) in self.host_resident.iter().enumerate() {
            if !matches!(p.role, Role::Persistent { .. }) {
                return invalid(format!("host-resident piece {i} is not persistent"));
            }
            check_piece(p)
                .map_err(|e| PlanDecodeError::Invalid(format!("host-resident piece {i}: {e}")))?;
        }
        Ok(())
    }

    /// The plan as bytes: [`PLAN_MAGIC`], [`PLAN_FORMAT_VERSION`] (little-endian), then the
    /// postcard encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.steps.len() * 32);
        out.extend_from_slice(&PLAN_MAGIC);
        out.extend_from_slice(&PLAN_FORMAT_VERSION.to_le_bytes());
        // Serializing plain data into a Vec cannot fail.
        out.extend_from_slice(&postcard::to_allocvec(self).unwrap_or_default());
        out
    }

    /// Reads and validates an encoded plan.
    pub fn decode(bytes: &[u8]) -> Result<ExecPlan, PlanDecodeError> {
        if bytes.len() > MAX_PLAN_BYTES {
            return Err(PlanDecodeError::TooLarge(bytes.len()));
        }
        if bytes.len() < 10 || bytes[..8] != PLAN_MAGIC {
            return Err(PlanDecodeError::BadMagic);
        }
        let found = u16::from_le_bytes([bytes[8], bytes[9]]);
        if found != PLAN_FORMAT_VERSION {
            return Err(PlanDecodeError::UnsupportedVersion {
                found,
                expected: PLAN_FORMAT_VERSION,
            });
        }
        let plan: ExecPlan = postcard::from_bytes(&bytes[10..])
            .map_err(|e| PlanDecodeError::Payload(e.to_string()))?;
        plan.validate()?;
        Ok(plan)
    }
}

fn check_piece(p: &PieceRef) -> Result<(), String> {
    if p.bytes == 0 {
        return Err("a piece of 0 bytes".into());
    }
    let end = p
        .offset
        .checked_add(p.bytes)
        .ok_or_else(|| "a piece whose end overflows".to_string())?;
    if let Role::Transient { bytes, .. } = p.role {
        if end > bytes {
            return Err(format!(
                "a piece ending at byte {end} of a {bytes}-byte allocation"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(ordinal: u32) -> PieceRef {
        PieceRef {
            role: Role::Transient {
                ordinal,
                bytes: 4 << 20,
                iteration: Iteration::Current,
            },
            offset: 2 << 20,
            bytes: 2 << 20,
        }
    }

    fn sample() -> ExecPlan {
        ExecPlan {
            version: 3,
            period: 4,
            kernels: vec![7, 8, 9, 7],
            anchor_seq: 10,
            steps: vec![
                Step {
                    position: 0,
                    when: When::AfterLaunch,
                    action: Action::SwapOut,
                    piece: piece(0),
                },
                Step {
                    position: 2,
                    when: When::BeforeLaunch,
                    action: Action::Prefetch,
                    piece: piece(0),
                },
            ],
            uses: vec![
                Use {
                    position: 0,
                    role: piece(0).role,
                },
                Use {
                    position: 3,
                    role: Role::Persistent { alloc_id: 5 },
                },
            ],
            host_resident: vec![PieceRef {
                role: Role::Persistent { alloc_id: 5 },
                offset: 0,
                bytes: 1 << 20,
            }],
            budget_bytes: 64 << 20,
            predicted_step_ns: 1_000_000,
            compute_ns: 900_000,
        }
    }

    #[test]
    fn a_plan_round_trips_through_its_encoding() {
        let plan = sample();
        assert_eq!(ExecPlan::decode(&plan.encode()), Ok(plan));
    }

    #[test]
    fn positions_wrap_on_both_sides_of_the_anchor() {
        let plan = sample();
        assert_eq!(plan.position_of(10), 0);
        assert_eq!(plan.position_of(13), 3);
        assert_eq!(plan.position_of(14), 0);
        // Launches before the anchor: the previous iterations' positions.
        assert_eq!(plan.position_of(9), 3);
        assert_eq!(plan.position_of(6), 0);
        let odd = ExecPlan {
            period: 3,
            kernels: vec![1, 2, 3],
            ..sample()
        };
        assert_eq!(odd.position_of(9), 2);
        assert_eq!(odd.position_of(0), 2);
        assert_eq!(odd.position_of(1), 0);
    }

    #[test]
    fn the_step_index_brackets_each_positions_steps() {
        let plan = sample();
        let index = plan.step_index();
        assert_eq!(index, vec![0, 1, 1, 2, 2]);
        for p in 0..plan.period as usize {
            for s in &plan.steps[index[p] as usize..index[p + 1] as usize] {
                assert_eq!(s.position as usize, p);
            }
        }
    }

    #[test]
    fn bad_bytes_are_refused_by_kind() {
        let good = sample().encode();
        assert_eq!(
            ExecPlan::decode(b"nonsense!!!"),
            Err(PlanDecodeError::BadMagic)
        );
        let mut other = good.clone();
        other[8] = 99;
        assert!(matches!(
            ExecPlan::decode(&other),
            Err(PlanDecodeError::UnsupportedVersion { found: 99, .. })
        ));
        let cut = &good[..good.len() - 3];
        assert!(matches!(
            ExecPlan::decode(cut),
            Err(PlanDecodeError::Payload(_))
        ));
    }

    #[test]
    fn a_plan_that_breaks_the_rules_is_refused() {
        let mut late = sample();
        late.steps[1].position = 4;
        assert!(matches!(late.validate(), Err(PlanDecodeError::Invalid(_))));
        let mut unordered = sample();
        unordered.steps.swap(0, 1);
        assert!(matches!(
            unordered.validate(),
            Err(PlanDecodeError::Invalid(_))
        ));
        let mut overrun = sample();
        overrun.steps[0].piece.offset = 3 << 20;
        assert!(matches!(
            overrun.validate(),
            Err(PlanDecodeError::Invalid(_))
        ));
        let mut use_late = sample();
        use_late.uses[1].position = 4;
        assert!(matches!(
            use_late.validate(),
            Err(PlanDecodeError::Invalid(_))
        ));
        let mut uses_unordered = sample();
        uses_unordered.uses.swap(0, 1);
        assert!(matches!(
            uses_unordered.validate(),
            Err(PlanDecodeError::Invalid(_))
        ));
        let mut short = sample();
        short.kernels.pop();
        assert!(matches!(short.validate(), Err(PlanDecodeError::Invalid(_))));
        // Encoded, a broken plan is refused on decode too.
        assert!(matches!(
            ExecPlan::decode(&overrun.encode()),
            Err(PlanDecodeError::Invalid(_))
        ));
    }
}
