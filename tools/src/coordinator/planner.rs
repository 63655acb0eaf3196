//! What the coordinator asks of a job's planner, so the loop does not depend on which planner
//! it is: the analyzer's online learner in production, a scripted double in tests.

use tensile_analyzer::online::{Learner, LearnerOptions, LearnerState};
use tensile_analyzer::CostModel;
use tensile_protocol::ExecPlan;
use tensile_trace::Record;

/// Where a job's planner stands, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlannerState {
    /// Watching the stream; no plan yet (or the last one was dropped).
    Learning,
    /// Made plan `version`.
    Planned { version: u32 },
}

/// One job's planner: fed the job's records in order, asked now and then for a plan.
pub trait JobPlanner: Send {
    /// The next record of the job's stream (cheap: called for every record).
    fn push(&mut self, record: &Record);
    /// A new plan, when there is one (may take milliseconds).
    fn poll(&mut self) -> Option<ExecPlan>;
    /// `records` records are missing from the stream at this point: relearn.
    fn lost(&mut self, records: u64);
    /// The job's grant changed: plan for it.
    fn set_budget(&mut self, bytes: u64);
    /// Where it stands.
    fn state(&self) -> PlannerState;
}

/// The analyzer's online learner as a job's planner: the same learning and planning a job runs
/// in its own process with `TENSILE_COORDINATOR=off`.
pub struct LearnerPlanner {
    learner: Learner,
}

impl LearnerPlanner {
    /// A learner for a job asking for `budget_bytes`, pricing copies with `cost`.
    pub fn new(budget_bytes: u64, cost: CostModel) -> LearnerPlanner {
        let mut options = LearnerOptions::for_budget(budget_bytes.max(1));
        options.cost = cost;
        LearnerPlanner {
            learner: Learner::new(options),
        }
    }
}

impl JobPlanner for LearnerPlanner {
    fn push(&mut self, record: &Record) {
        self.learner.push(record);
    }

    fn poll(&mut self) -> Option<ExecPlan> {
        self.learner.poll()
    }

    fn lost(&mut self, records: u64) {
        self.learner.lost_records(records);
    }

    fn set_budget(&mut self, bytes: u64) {
        if bytes > 0 {
            self.learner.set_budget(bytes);
        }
    }

    fn state(&self) -> PlannerState {
        match self.learner.state() {
            LearnerState::Planned { version, .. } => PlannerState::Planned { version },
            _ => PlannerState::Learning,
        }
    }
}
