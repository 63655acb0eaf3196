//! How much of the budget learned plans leave free, raised when the run shows too little.
//!
//! A plan counts on the frames it leaves free; the run also needs frames the plan cannot
//! place (freed pages still busy on the device or sharing a unit with live ones, pages small
//! tensors share, what comes in on demand, launches that touch other allocations than in the
//! step the plan was learned from). When there are none, the manager evicts pages the plan
//! keeps, of its own choice, and those come back on demand and evict others in turn:
//! ResNet-50's rerun at 30% of its peak, learning from recorded steps that differed from the
//! played one, moved a third more than its plan with 20% of the budget left free, and ran at
//! 1.48 times its prediction; with 40% free, at 1.02. So the room starts at [`DEFAULT_PLAN_ROOM`] and is raised as soon as an iteration shows the
//! manager evicting beside the plan; each raise is a new plan at the next poll, judged once
//! it is in force.
//!
//! It is never lowered. Lowering it while the manager evicted nothing beside the plan was
//! tried: BERT at 30% went from 20% to 10% with no faster step, and the iteration in which
//! the new plan took effect took 12 s on the host against 7; the MLP at 50%, from 20% to 0%,
//! ran no faster either (its prediction, made for the budget less the room, came closer).
//!
//! Policy only: the planning thread feeds it the counters and tells the learner.

use tensile_analyzer::online::DEFAULT_PLAN_ROOM;

/// How much a raise adds to the room (a share of the budget).
pub const ROOM_STEP: f64 = 0.1;
/// The most room the run's evictions raise it to.
pub const MAX_ADAPTED_ROOM: f64 = 0.5;
/// Pages the manager evicted of its own choice, as a share of the pages the plan moved out,
/// above which the room is too little.
pub const TOO_LITTLE_ABOVE: f64 = 0.15;
/// Windows in a row over the line that raise the room. One is not enough: the iteration after
/// a plan's first still carries what came before it (the MLP's rerun at 50% of its peak: the
/// manager chose 14% to 22% as many pages as the plan moved there, and none in the iterations
/// after), and a raise for it was a second plan learned mid-run, at 1.6 times the step.
pub const OVER_THE_LINE_WINDOWS: u32 = 2;

/// A change of the room, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoomChange {
    /// The room from now on.
    pub room: f64,
    /// The manager's own evictions over the plan's moves in the last window.
    pub unplanned_share: f64,
}

/// Counters at the start of a window.
#[derive(Debug, Clone, Copy)]
struct Mark {
    planned: u64,
    unplanned: u64,
}

/// The room's state across the plans of a run.
#[derive(Debug)]
pub struct RoomControl {
    room: f64,
    /// Pages the plan in force moves out per iteration: a window's length (0: no plan, or
    /// the room was raised and the plan for it is not in force yet).
    window_pages: u64,
    start: Option<Mark>,
    /// Whether the window under way is the plan's first (the iteration it came into force in,
    /// which still carries what came before): not judged.
    first_window: bool,
    /// Judged windows in a row over the line, up to the last.
    over_the_line: u32,
}

impl Default for RoomControl {
    fn default() -> Self {
        Self::new(DEFAULT_PLAN_ROOM)
    }
}

impl RoomControl {
    pub fn new(room: f64) -> RoomControl {
        RoomControl {
            room,
            window_pages: 0,
            start: None,
            first_window: true,
            over_the_line: 0,
        }
    }

    /// The room plans leave now.
    pub fn room(&self) -> f64 {
        self.room
    }

    /// A plan came into force that moves `pages_out_per_iteration` pages out per iteration;
    /// windows are counted from the next [`Self::observe`].
    pub fn plan_installed(&mut self, pages_out_per_iteration: u64) {
        self.window_pages = pages_out_per_iteration;
        self.start = None;
        self.first_window = true;
        self.over_the_line = 0;
    }

    /// The run's counters so far: pages the plan's steps moved out (`planned`), pages the
    /// manager evicted of its own choice (`unplanned`). Returns the room to plan with from
    /// now on, when it changes.
    pub fn observe(&mut self, planned: u64, unplanned: u64) -> Option<RoomChange> {
        if self.window_pages == 0 {
            return None;
        }
        let now = Mark { planned, unplanned };
        let Some(start) = self.start else {
            self.start = Some(now);
            return None;
        };
        let moved = planned.saturating_sub(start.planned);
        if moved < self.window_pages {
            return None;
        }
        self.start = Some(now);
        if std::mem::take(&mut self.first_window) {
            return None;
        }
        let share = unplanned.saturating_sub(start.unplanned) as f64 / moved as f64;
        if share <= TOO_LITTLE_ABOVE {
            self.over_the_line = 0;
            return None;
        }
        self.over_the_line += 1;
        let room = (self.room + ROOM_STEP).min(MAX_ADAPTED_ROOM);
        if self.over_the_line < OVER_THE_LINE_WINDOWS || room <= self.room + 1e-9 {
            return None;
        }
        self.room = room;
        // Judged again once the plan for this room is in force.
        self.window_pages = 0;
        Some(RoomChange {
            room,
            unplanned_share: share,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `windows` windows of `per_window` planned pages with `share` of unplanned ones.
    fn feed(c: &mut RoomControl, at: &mut (u64, u64), windows: u32, share: f64) -> Vec<f64> {
        let mut changes = Vec::new();
        for _ in 0..windows {
            // Two polls per window, as the planning thread makes many.
            for half in [50, 50] {
                at.0 += half;
                at.1 += (half as f64 * share) as u64;
                if let Some(ch) = c.observe(at.0, at.1) {
                    changes.push(ch.room);
                }
            }
        }
        changes
    }

    /// A plan comes into force at `at`: its windows start there.
    fn installed(c: &mut RoomControl, at: (u64, u64)) {
        c.plan_installed(100);
        assert_eq!(c.observe(at.0, at.1), None);
    }

    #[test]
    fn no_plan_no_change() {
        let mut c = RoomControl::default();
        let mut at = (0, 0);
        assert!(feed(&mut c, &mut at, 10, 0.9).is_empty());
        assert_eq!(c.room(), DEFAULT_PLAN_ROOM);
    }

    #[test]
    fn the_room_grows_while_the_manager_keeps_evicting_beside_the_plan() {
        let mut c = RoomControl::new(0.2);
        let mut at = (0, 0);
        installed(&mut c, at);
        // The plan's first window is not judged, then a window over the line raises the
        // room, once: nothing more until the plan for it is in force.
        let changes = feed(&mut c, &mut at, 4, 0.3);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!((changes[0] - 0.3).abs() < 1e-9);
        // The new plan starts its own windows; it is raised again up to the cap only.
        for _ in 0..5 {
            installed(&mut c, at);
            feed(&mut c, &mut at, 4, 0.3);
        }
        assert!((c.room() - MAX_ADAPTED_ROOM).abs() < 1e-9, "{}", c.room());
    }

    #[test]
    fn a_share_under_the_line_changes_nothing_and_windows_in_a_row_over_it_raise() {
        let mut c = RoomControl::new(0.2);
        let mut at = (0, 0);
        installed(&mut c, at);
        feed(&mut c, &mut at, 1, 0.9);
        // Unused room, or a share under the line, however long, changes nothing.
        assert!(feed(&mut c, &mut at, 6, 0.0).is_empty());
        assert!(feed(&mut c, &mut at, 6, 0.12).is_empty());
        assert!((c.room() - 0.2).abs() < 1e-9);
        // Windows over the line raise it only when they come in a row.
        for _ in 0..3 {
            assert!(feed(&mut c, &mut at, OVER_THE_LINE_WINDOWS - 1, 0.5).is_empty());
            assert!(feed(&mut c, &mut at, 1, 0.0).is_empty());
        }
        assert!((c.room() - 0.2).abs() < 1e-9);
        let raised = feed(&mut c, &mut at, OVER_THE_LINE_WINDOWS, 0.5);
        assert_eq!(raised.len(), 1);
        assert!((raised[0] - 0.3).abs() < 1e-9, "{raised:?}");
    }

    #[test]
    fn the_windows_over_the_line_are_counted_again_for_each_plan() {
        let mut c = RoomControl::new(0.2);
        let mut at = (0, 0);
        installed(&mut c, at);
        feed(&mut c, &mut at, 1, 0.0);
        assert!(feed(&mut c, &mut at, OVER_THE_LINE_WINDOWS - 1, 0.5).is_empty());
        // A new plan (another budget, a relearning): what the last one saw does not count.
        installed(&mut c, at);
        feed(&mut c, &mut at, 1, 0.9);
        assert!(feed(&mut c, &mut at, OVER_THE_LINE_WINDOWS - 1, 0.5).is_empty());
        assert_eq!(feed(&mut c, &mut at, 1, 0.5).len(), 1);
    }
}
