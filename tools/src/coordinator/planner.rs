//! What the coordinator asks of a job's planner, so the loop does not depend on which planner
//! it is: the analyzer's online learner in production, a scripted double in tests.

use tensile_protocol::ExecPlan;
use tensile_trace::Record;

/// Where a job's planner stands, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlannerState {
    /// Watching the stream; no plan yet (or the last one was dropped).
    Learning,
    /// Made plan `version`.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "made by the analyzer's learner once it is wired in"
        )
    )]
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

/// Until the analyzer's online learner is wired in: a planner that only watches. Jobs stay
/// on their own on-demand policy (`learning` in `tensile status`), as they do when no
/// coordinator runs.
#[derive(Debug, Default)]
pub struct WatchOnly;

impl JobPlanner for WatchOnly {
    fn push(&mut self, _record: &Record) {}

    fn poll(&mut self) -> Option<ExecPlan> {
        None
    }

    fn lost(&mut self, _records: u64) {}

    fn set_budget(&mut self, _bytes: u64) {}

    fn state(&self) -> PlannerState {
        PlannerState::Learning
    }
}
