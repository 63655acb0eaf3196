//! What the coordinator asks of a job's planner, so the loop does not depend on which planner
//! it is: the analyzer's online learner in production, a scripted double in tests.

use tensile_analyzer::online::{Learner, LearnerOptions, LearnerState};
use tensile_analyzer::{CostModel, RemapModel};
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
    /// Plans from now on leave `room` (a share, 0 to 0.9) of the grant free: the job asked
    /// for it. The next poll plans again.
    fn set_room(&mut self, room: f64);
    /// The job's swaps get `share` (0 to 1] of the card's copy engines from now on, the
    /// rest going to other jobs that swap beside it: plans price its copies at that rate.
    /// The next poll plans again.
    fn set_copy_share(&mut self, _share: f64) {}
    /// Where it stands.
    fn state(&self) -> PlannerState;
    /// How many times it failed (panicked) and started over; one job's stream must not take
    /// the coordinator, and every other job's plans, down with it.
    fn failures(&self) -> u64 {
        0
    }
    /// The job's step at a budget of `bytes`, ns, as its planner predicts it (`None`: not
    /// known yet). The coordinator divides memory by these.
    fn predict_step(&mut self, _bytes: u64) -> Option<u64> {
        None
    }
    /// Which iteration [`Self::predict_step`] answers for; a new one makes earlier answers
    /// stale.
    fn cycle_generation(&self) -> u64 {
        0
    }
    /// The most the job's iteration holds at once, as its planner counts it (`None`: no
    /// iteration known yet).
    fn cycle_peak_bytes(&self) -> Option<u64> {
        None
    }
    /// Why its last planning found no plan, once (`None`: nothing new to say).
    fn take_no_plan(&mut self) -> Option<String> {
        None
    }
}

/// The analyzer's online learner as a job's planner: the same learning and planning a job runs
/// in its own process with `TENSILE_COORDINATOR=off`.
pub struct LearnerPlanner {
    learner: Learner,
    options: LearnerOptions,
    /// The copy costs of the card to itself ([`JobPlanner::set_copy_share`] scales them).
    card_cost: CostModel,
    failures: u64,
}

impl LearnerPlanner {
    /// A learner for a job asking for `budget_bytes`, pricing copies with `cost` and the
    /// remaps of the pages moved with `remaps`, planning in the job's pages of `page_bytes`
    /// ([`tensile_protocol::JobSnapshot::page`]), its plans leaving `room` of the grant free.
    pub fn new(
        budget_bytes: u64,
        (cost, remaps): (CostModel, Option<RemapModel>),
        page_bytes: u64,
        room: f64,
    ) -> LearnerPlanner {
        let mut options = LearnerOptions::for_budget(budget_bytes.max(1));
        options.cost = cost;
        options.remaps = remaps;
        options.page_bytes = page_bytes;
        options.room = room;
        LearnerPlanner {
            learner: Learner::new(options.clone()),
            options,
            card_cost: cost,
            failures: 0,
        }
    }

    /// Runs `f` on the learner; if it panics (a bug, on some stream), starts over with a new
    /// learner for the same budget, which learns the job again from what follows.
    fn guarded<T: Default>(&mut self, f: impl FnOnce(&mut Learner) -> T) -> T {
        let learner = &mut self.learner;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(learner))) {
            Ok(v) => v,
            Err(_) => {
                self.failures += 1;
                self.learner = Learner::new(self.options.clone());
                T::default()
            }
        }
    }
}

impl JobPlanner for LearnerPlanner {
    fn push(&mut self, record: &Record) {
        self.guarded(|l| l.push(record));
    }

    fn poll(&mut self) -> Option<ExecPlan> {
        self.guarded(|l| l.poll())
    }

    fn lost(&mut self, records: u64) {
        self.guarded(|l| l.lost_records(records));
    }

    fn set_budget(&mut self, bytes: u64) {
        if bytes > 0 {
            self.options.budget_bytes = bytes;
            self.guarded(|l| l.set_budget(bytes));
        }
    }

    fn set_room(&mut self, room: f64) {
        // Kept in the options too, so a learner started over after a failure keeps it.
        self.options.room = room;
        self.guarded(|l| l.set_room(room));
    }

    fn set_copy_share(&mut self, share: f64) {
        let cost = self.card_cost.with_copy_share(share);
        self.options.cost = cost;
        self.guarded(|l| l.set_cost(cost));
    }

    fn failures(&self) -> u64 {
        self.failures
    }

    fn predict_step(&mut self, bytes: u64) -> Option<u64> {
        self.guarded(|l| l.predict_step(bytes))
    }

    fn cycle_generation(&self) -> u64 {
        self.learner.cycle_generation()
    }

    fn cycle_peak_bytes(&self) -> Option<u64> {
        self.learner.cycle_peak_bytes()
    }

    fn take_no_plan(&mut self) -> Option<String> {
        self.learner.take_no_plan()
    }

    fn state(&self) -> PlannerState {
        match self.learner.state() {
            LearnerState::Planned { version, .. } => PlannerState::Planned { version },
            _ => PlannerState::Learning,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_protocol::DEFAULT_PAGE_BYTES;
    use tensile_trace::{Alloc, AllocKind};

    #[test]
    fn a_slot_says_rooms_up_to_the_most_the_learner_leaves() {
        // A room a slot cannot say would be clamped by the protocol and planned otherwise.
        assert_eq!(
            f64::from(tensile_protocol::MAX_ROOM_PERMILLE) / 1000.0,
            tensile_analyzer::online::MAX_PLAN_ROOM
        );
        let mut p = LearnerPlanner::new(
            64 << 20,
            (CostModel::default(), None),
            DEFAULT_PAGE_BYTES,
            0.2,
        );
        p.set_room(0.4);
        assert_eq!((p.learner.room(), p.options.room), (0.4, 0.4));
    }

    #[test]
    fn a_learner_that_panics_is_replaced_and_counted_and_the_planner_goes_on() {
        let mut p = LearnerPlanner::new(
            64 << 20,
            (CostModel::default(), None),
            DEFAULT_PAGE_BYTES,
            0.0,
        );
        p.push(&Record::Alloc(Alloc {
            t_ns: 1,
            stream: 0,
            id: 1,
            ptr: 1 << 21,
            bytes: 1 << 21,
            kind: AllocKind::Sync,
        }));
        // (The default hook prints the panic: this one is meant.)
        p.guarded(|_| -> () { panic!("a bug in the learner (this test's own)") });
        assert_eq!(p.failures(), 1);
        assert_eq!(p.state(), PlannerState::Learning);
        // A fresh learner: the allocation pushed before is forgotten, so its free is one
        // the window never saw (refused, not a panic).
        p.push(&Record::Free(tensile_trace::Free {
            t_ns: 2,
            stream: 0,
            id: 1,
        }));
        assert!(p.poll().is_none());
        assert_eq!(p.failures(), 1);
    }
}
