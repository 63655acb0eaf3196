//! How much of the budget learned plans leave free, adapted to what the run shows.
//!
//! A plan counts on the frames it leaves free; the run also needs frames the plan cannot
//! place (freed pages still busy on the device or sharing a unit with live ones, pages small
//! tensors share, what comes in on demand). When there are none, the manager evicts pages the
//! plan keeps, of its own choice, and those come back on demand and evict others in turn:
//! ResNet-50's rerun at 30% of its peak moved a third more than its plan with 20% of the
//! budget left free, and ran at 1.48 times its prediction; with 40% free, at 1.02. The MLP
//! uses little of that room, and its prediction, made for the budget less the room, is too
//! pessimistic by as much. So the room starts at [`DEFAULT_PLAN_ROOM`] and follows the run:
//! raised as soon as an iteration shows the manager evicting beside the plan, lowered after
//! two that show it not (never back to a room that proved too little). Each change is a new
//! plan at the next poll, judged once it is in force.
//!
//! Policy only: the planning thread feeds it the counters and tells the learner.

use tensile_analyzer::online::DEFAULT_PLAN_ROOM;

/// How much the room changes at a time (a share of the budget).
pub const ROOM_STEP: f64 = 0.1;
/// The most room the run's evictions raise it to.
pub const MAX_ADAPTED_ROOM: f64 = 0.5;
/// Pages the manager evicted of its own choice, as a share of the pages the plan moved out,
/// above which the room is too little.
pub const TOO_LITTLE_ABOVE: f64 = 0.15;
/// The same share below which the room is more than the run needs.
pub const TOO_MUCH_BELOW: f64 = 0.03;
/// Windows (an iteration's worth of the plan's moves each) over the line that raise the
/// room: one, since every iteration the room is short costs the run its step's excess again.
pub const WINDOWS_TO_RAISE: u32 = 1;
/// Windows in a row under the line that lower it: lowering is only worth it when the room
/// stays unused.
pub const WINDOWS_TO_LOWER: u32 = 2;

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
    /// The largest room seen to be too little: the room does not go back down to it.
    too_little: Option<f64>,
    /// Pages the plan in force moves out per iteration: a window's length (0: no plan).
    window_pages: u64,
    start: Option<Mark>,
    /// Whether the window under way is the plan's first (the iteration it came into force in,
    /// which still carries what came before): not judged.
    first_window: bool,
    over: u32,
    under: u32,
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
            too_little: None,
            window_pages: 0,
            start: None,
            first_window: true,
            over: 0,
            under: 0,
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
        self.over = 0;
        self.under = 0;
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
        if share > TOO_LITTLE_ABOVE {
            self.under = 0;
            self.over += 1;
            if self.over < WINDOWS_TO_RAISE {
                return None;
            }
            self.over = 0;
            self.too_little = Some(self.too_little.map_or(self.room, |t| t.max(self.room)));
            let room = (self.room + ROOM_STEP).min(MAX_ADAPTED_ROOM);
            return self.change(room, share);
        }
        self.over = 0;
        if share < TOO_MUCH_BELOW {
            self.under += 1;
            if self.under < WINDOWS_TO_LOWER {
                return None;
            }
            self.under = 0;
            let room = (self.room - ROOM_STEP).max(0.0);
            if self.too_little.is_some_and(|t| room <= t + 1e-9) {
                return None;
            }
            return self.change(room, share);
        }
        self.under = 0;
        None
    }

    fn change(&mut self, room: f64, share: f64) -> Option<RoomChange> {
        if (room - self.room).abs() < 1e-9 {
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
    fn the_room_shrinks_while_unused_but_not_back_to_what_proved_too_little() {
        let mut c = RoomControl::new(0.2);
        let mut at = (0, 0);
        installed(&mut c, at);
        let changes = feed(&mut c, &mut at, 4, 0.0);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!((c.room() - 0.1).abs() < 1e-9);
        // At 10% the manager evicts: back to 20%, which then holds.
        installed(&mut c, at);
        feed(&mut c, &mut at, 4, 0.5);
        assert!((c.room() - 0.2).abs() < 1e-9, "{}", c.room());
        installed(&mut c, at);
        assert!(feed(&mut c, &mut at, 8, 0.0).is_empty());
        assert!((c.room() - 0.2).abs() < 1e-9);
    }

    #[test]
    fn a_share_in_between_changes_nothing_and_one_window_over_raises() {
        let mut c = RoomControl::new(0.2);
        let mut at = (0, 0);
        installed(&mut c, at);
        feed(&mut c, &mut at, 1, 0.0);
        // Unused room alternating with a share in between never lowers it; nor does a share
        // in between, however long.
        for _ in 0..4 {
            assert!(feed(&mut c, &mut at, 1, 0.0).is_empty());
            assert!(feed(&mut c, &mut at, 1, 0.08).is_empty());
        }
        assert!(feed(&mut c, &mut at, 6, 0.08).is_empty());
        assert!((c.room() - 0.2).abs() < 1e-9);
        // One window over the line is enough to raise it.
        assert_eq!(feed(&mut c, &mut at, 1, 0.5).len(), 1);
    }
}
