//! Which jobs have the card, turn by turn, when their needs do not fit it together.
//!
//! [`grants::turns`] says who should run if a turn started now: high-priority jobs always, then
//! the others by priority and least run first, while they fit. This module keeps a turn once it
//! has started, because every change of turns costs the card a working set written out and
//! another brought in:
//!
//! - **A job still learning its need runs alone**, or joins others only into half the card
//!   ([`grants::admitted`]): a job's need is what its iteration holds, and until its planner
//!   has found the iteration (or it has run 8 s without growing) the job grows as it allocates,
//!   to a size nobody knows. Let in beside others, such jobs outgrew the card within seconds,
//!   and the one stopped wrote out what it had allocated. A running job that learns its need
//!   opens the room beyond it to the waiting jobs, as a job leaving does. Beside a
//!   high-priority job still learning, other learners wait at once.
//! - **A turn lasts** at least `--turn`, and [`CHANGE_SHARE`] times longer than the last changes
//!   of turns took (measured, below), so that changing turns costs the jobs at most about a
//!   tenth of the card's time, however slow the card's copies and remaps are. While every job
//!   runs, the turn of all of them restarts at every tick: a job that comes next joins it as
//!   any turn, and the incumbents are not stopped for it.
//! - **Within a turn the running jobs keep the card.** A job that joins runs at once only if no
//!   job of the turn waits and it fits beside them (a high-priority job always does); a running
//!   job whose need grows so that the turn no longer fits makes the job that joined the turn
//!   last wait, not an incumbent whose working set is in (of jobs that started the turn
//!   together, the one that has run most); a job that leaves makes room for waiting jobs that
//!   fit (and only that: needs rise and fall within an iteration, and a waiting job let in
//!   whenever they fell would swap in and out again). The turn's clock does not restart for any
//!   of these.
//! - **A change of turns is measured** from its decision until the jobs that stop have given
//!   back nine tenths of what they held beyond their floors (or hold no more than their grants)
//!   and the jobs that start hold nine tenths of what they held at the end of their last turn
//!   (or of their grant, if less): the time the card spent moving working sets instead of
//!   computing. Its running average sets the turn's length.
//!
//! Pure over numbers and instants, like [`grants`], so the policy is tested without a segment.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::grants::{self, Claim};

/// A turn lasts this many times the measured cost of a change of turns (when longer than the
/// configured turn): changes then take at most about a tenth of the card's time.
pub const CHANGE_SHARE: u32 = 10;

/// The longest a turn is made, however costly changes are: a waiting job's wait stays bounded.
pub const MAX_TURN: Duration = Duration::from_secs(300);

/// A change of turns is timed only if it moves at least this fraction (1/N) of the card.
const TIMED_SHARE: u64 = 16;

/// One job as the turns see it at a tick.
#[derive(Debug, Clone)]
pub struct Contender<'a> {
    pub slot: u32,
    pub claim: &'a Claim,
    /// How long it has run while others waited, in any unit (who goes next).
    pub ran: u64,
    /// Device memory it holds now.
    pub held: u64,
    /// Its grant now.
    pub granted: u64,
}

/// The turn in force.
#[derive(Debug)]
struct Turn {
    started: Instant,
    /// The running jobs, by slot, in the order they joined the turn.
    running: Vec<u32>,
    /// Every job there was at the last tick, by slot.
    members: Vec<u32>,
    /// The running jobs whose needs were not known at the last tick.
    learning: Vec<u32>,
}

/// A change of turns being timed.
#[derive(Debug)]
struct Change {
    started: Instant,
    /// Jobs that stopped, each with the most it may hold once settled: its floor (what a
    /// waiting job is granted) and a tenth of what it had to give back (a job may keep a few
    /// pages pinned by an access that waits for its turn).
    stopped: Vec<(u32, u64)>,
    /// Jobs that started, with what each must hold again.
    started_jobs: Vec<(u32, u64)>,
}

/// What [`Turns::decide`] has to say besides who runs.
#[derive(Debug, Default, PartialEq)]
pub struct Report {
    /// A change of turns settled: how long it took, and the turn length now.
    pub settled: Option<(Duration, Duration)>,
}

/// The turn keeper: see the module comment.
#[derive(Debug)]
pub struct Turns {
    /// The shortest a turn lasts (`--turn`).
    base: Duration,
    turn: Option<Turn>,
    change: Option<Change>,
    /// Running average of the measured changes of turns.
    change_cost: Option<Duration>,
    /// Per job: the most it held during its current or last turn.
    peaks: BTreeMap<u32, u64>,
}

impl Turns {
    pub fn new(base: Duration) -> Turns {
        Turns {
            base,
            turn: None,
            change: None,
            change_cost: None,
            peaks: BTreeMap::new(),
        }
    }

    /// How long a turn lasts now: the configured turn, or [`CHANGE_SHARE`] times the measured
    /// change, whichever is longer, at most [`MAX_TURN`] (or the configured turn if longer).
    pub fn length(&self) -> Duration {
        let by_cost = self
            .change_cost
            .map_or(Duration::ZERO, |c| c * CHANGE_SHARE);
        self.base.max(by_cost.min(MAX_TURN))
    }

    /// Decides which of `jobs` (in the order they joined) run at `now`, with `available` bytes
    /// to divide. Every job runs when all fit.
    pub fn decide(
        &mut self,
        now: Instant,
        available: u64,
        jobs: &[Contender<'_>],
    ) -> (Vec<bool>, Report) {
        for j in jobs {
            if self.is_running(j.slot) {
                let peak = self.peaks.entry(j.slot).or_insert(0);
                *peak = (*peak).max(j.held);
            }
        }
        self.peaks.retain(|s, _| jobs.iter().any(|j| j.slot == *s));
        let report = Report {
            settled: self.time_change(now, jobs),
        };

        let claims: Vec<Claim> = jobs.iter().map(|j| j.claim.clone()).collect();
        let ran: Vec<u64> = jobs.iter().map(|j| j.ran).collect();
        let fresh = grants::turns(available, &claims, &ran);
        if fresh.iter().all(|&r| r) {
            // Everyone runs: a turn of all of them starts afresh at every such tick, so that
            // a job that comes next joins it (or queues) as it would join any turn, and
            // incumbents whose working sets are in are not stopped for a newcomer whose need
            // is not known yet.
            let running: Vec<u32> = jobs.iter().map(|j| j.slot).collect();
            self.turn = Some(Turn {
                started: now,
                learning: Self::learning(&running, jobs),
                members: running.clone(),
                running,
            });
            self.change = None;
            return (fresh, report);
        }
        let length = self.length();
        let before: Option<Vec<u32>> = self.turn.as_ref().map(|t| t.running.clone());
        let kept = self
            .turn
            .take()
            .filter(|t| now.saturating_duration_since(t.started) < length)
            .and_then(|t| Self::carry_on(t, available, jobs, &claims, &fresh));
        let turn = match kept {
            Some(t) => t,
            None => {
                // Least run first, as `fresh` chose them: if the turn outgrows the card, the
                // last in waits, so of jobs that start together the one that has run most.
                // (By what they hold, the one that had just come back from waiting held least
                // and was stopped again at every change: starved.)
                let mut starting: Vec<&Contender<'_>> = jobs
                    .iter()
                    .zip(&fresh)
                    .filter(|(_, &r)| r)
                    .map(|(j, _)| j)
                    .collect();
                starting.sort_by_key(|j| j.ran);
                let running: Vec<u32> = starting.iter().map(|j| j.slot).collect();
                self.begin_change(now, available, jobs, before.as_deref(), &running);
                Turn {
                    started: now,
                    learning: Self::learning(&running, jobs),
                    running,
                    members: jobs.iter().map(|j| j.slot).collect(),
                }
            }
        };
        let running = jobs
            .iter()
            .map(|j| turn.running.contains(&j.slot))
            .collect();
        self.turn = Some(turn);
        (running, report)
    }

    fn is_running(&self, slot: u32) -> bool {
        self.turn.as_ref().is_none_or(|t| t.running.contains(&slot))
    }

    /// The turn `t` after the jobs that came, went, grew or learned their needs since the
    /// last tick, or `None` if none of its jobs is left to run.
    fn carry_on(
        mut t: Turn,
        available: u64,
        jobs: &[Contender<'_>],
        claims: &[Claim],
        fresh: &[bool],
    ) -> Option<Turn> {
        let job = |s: u32| jobs.iter().find(|j| j.slot == s);
        let someone_left = t.members.iter().any(|&s| job(s).is_none());
        // A running job that has learned its need no longer holds the rest of the card for
        // itself: that opens room as a job leaving does.
        let learned = t
            .learning
            .iter()
            .any(|&s| job(s).is_some_and(|j| j.claim.known));
        let newcomer = |s: u32| !t.members.contains(&s);
        t.running.retain(|&s| job(s).is_some());
        if t.running.is_empty() {
            return None;
        }
        // High-priority jobs always run, and so do jobs that take their turns elsewhere.
        for j in jobs {
            if j.claim.always_runs() && !t.running.contains(&j.slot) {
                t.running.push(j.slot);
            }
        }
        // Beside a job that always runs and is still learning its need, the other jobs still
        // learning theirs wait at once: either may grow to the card, and stopped now they have little
        // to write out. (A rerun let in as a high one left was stopped 1.6 s later, when the
        // high one's next run had grown, and its eviction held back the high run's memory for
        // 15 s.) Jobs whose needs are known keep running until the card is too small.
        let unbounded = |j: &Contender<'_>| j.claim.bound(available).is_none();
        let high_learning = jobs
            .iter()
            .any(|j| t.running.contains(&j.slot) && j.claim.always_runs() && unbounded(j));
        if high_learning {
            t.running
                .retain(|&s| job(s).is_some_and(|j| j.claim.always_runs() || !unbounded(j)));
        }
        let fits = |running: &[u32]| {
            let held: u64 = jobs
                .iter()
                .map(|j| {
                    let c = j.claim;
                    let keep = if running.contains(&j.slot) {
                        c.need
                    } else {
                        c.floor
                    };
                    keep.min(c.limit)
                })
                .sum();
            held <= available
        };
        // Too much for the card: the job that joined the turn last waits (never one that
        // always runs, never the last one running).
        while t.running.len() > 1 && !fits(&t.running) {
            let Some(i) = t
                .running
                .iter()
                .rposition(|&s| job(s).is_some_and(|j| !j.claim.always_runs()))
            else {
                break;
            };
            t.running.remove(i);
        }
        // Room left by a job that left or learned its need: waiting jobs that are admitted
        // join, those `fresh` would run first taking it first. Otherwise only a job that just
        // joined may (it has nothing to bring back), and only while no job of the turn waits:
        // a newcomer let in beside a queue took the room of jobs that had waited for it, and
        // wrote out what it had allocated once it outgrew it (a BERT rerun joining so spent
        // 26 s giving back 480 MiB); it waits its turn behind the queue instead. Room that
        // needs falling and rising open and close within an iteration would have a waiting job
        // swap in and out again.
        let queue = t
            .members
            .iter()
            .any(|&s| !t.running.contains(&s) && job(s).is_some());
        let mut waiting: Vec<usize> = (0..jobs.len())
            .filter(|&i| !t.running.contains(&jobs[i].slot))
            .filter(|&i| someone_left || learned || (newcomer(jobs[i].slot) && !queue))
            .collect();
        waiting.sort_by_key(|&i| (jobs[i].claim.priority, !fresh[i], jobs[i].ran, i));
        for i in waiting {
            let running: Vec<bool> = jobs.iter().map(|j| t.running.contains(&j.slot)).collect();
            if grants::admitted(available, claims, &running, i) {
                t.running.push(jobs[i].slot);
            }
        }
        t.members = jobs.iter().map(|j| j.slot).collect();
        t.learning = Self::learning(&t.running, jobs);
        Some(t)
    }

    /// The jobs of `running` whose needs are not known yet.
    fn learning(running: &[u32], jobs: &[Contender<'_>]) -> Vec<u32> {
        jobs.iter()
            .filter(|j| running.contains(&j.slot) && !j.claim.known)
            .map(|j| j.slot)
            .collect()
    }

    /// Starts timing a change of turns from `before` (the jobs of the last turn; `None`:
    /// every job ran) to `running`, if it moves at least [`TIMED_SHARE`] of the card (a job
    /// starting for the first time has no working set to bring back, and a change that moves
    /// little says nothing of what a change costs).
    fn begin_change(
        &mut self,
        now: Instant,
        available: u64,
        jobs: &[Contender<'_>],
        before: Option<&[u32]>,
        running: &[u32],
    ) {
        let before: Vec<u32> = match before {
            Some(b) => b.to_vec(),
            None => jobs.iter().map(|j| j.slot).collect(),
        };
        // What the change moves: what the stopping jobs give back beyond their floors (what a
        // waiting job keeps; one that holds no more has nothing to give back), and what the
        // starting ones bring back.
        let mut moved = 0;
        let stopped: Vec<(u32, u64)> = jobs
            .iter()
            .filter(|j| before.contains(&j.slot) && !running.contains(&j.slot))
            .filter_map(|j| {
                let floor = j.claim.floor.min(j.claim.limit);
                let excess = j.held.checked_sub(floor).filter(|&e| e > 0)?;
                moved += excess;
                Some((j.slot, floor + excess / 10))
            })
            .collect();
        let started_jobs: Vec<(u32, u64)> = running
            .iter()
            .filter(|s| !before.contains(s))
            .filter_map(|&s| {
                let peak = *self.peaks.get(&s)?;
                let j = jobs.iter().find(|j| j.slot == s)?;
                let target = peak.min(j.claim.need.min(j.claim.limit));
                (target > 0).then_some((s, target / 10 * 9))
            })
            .collect();
        for &s in running {
            if !before.contains(&s) {
                self.peaks.insert(s, 0);
            }
        }
        moved += started_jobs.iter().map(|&(_, target)| target).sum::<u64>();
        self.change = (moved >= available / TIMED_SHARE).then_some(Change {
            started: now,
            stopped,
            started_jobs,
        });
    }

    /// Whether the change of turns being timed has settled at `now`; if so, folds its time into
    /// the running average and returns it with the new turn length.
    fn time_change(
        &mut self,
        now: Instant,
        jobs: &[Contender<'_>],
    ) -> Option<(Duration, Duration)> {
        let change = self.change.as_ref()?;
        let job = |s: u32| jobs.iter().find(|j| j.slot == s);
        let out_done = change
            .stopped
            .iter()
            .all(|&(s, most)| job(s).is_none_or(|j| j.held <= most.max(j.granted)));
        let in_done = change
            .started_jobs
            .iter()
            .all(|&(s, target)| job(s).is_none_or(|j| j.held >= target.min(j.granted)));
        let took = now.saturating_duration_since(change.started);
        // A change that has not settled by the end of its turn cost at least the turn.
        let turn_over = took >= self.length();
        if !(turn_over || (out_done && in_done)) {
            return None;
        }
        self.change = None;
        self.change_cost = Some(match self.change_cost {
            None => took,
            Some(c) => (c + took) / 2,
        });
        Some((took, self.length()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_protocol::Priority;

    const G: u64 = 1 << 30;
    const MS: Duration = Duration::from_millis(1);

    fn claim(need: u64, priority: Priority) -> Claim {
        Claim {
            limit: u64::MAX,
            floor: G / 8,
            need,
            known: true,
            priority,
            curve: Vec::new(),
            turns_elsewhere: false,
        }
    }

    /// Contenders in slot order 0.., each holding `held` and granted `granted`.
    fn contenders<'a>(claims: &'a [Claim], ran: &[u64], held: &[u64]) -> Vec<Contender<'a>> {
        claims
            .iter()
            .enumerate()
            .map(|(i, c)| Contender {
                slot: i as u32,
                claim: c,
                ran: ran[i],
                held: held[i],
                granted: held[i],
            })
            .collect()
    }

    #[test]
    fn a_turn_keeps_its_jobs_when_one_grows_or_joins_and_the_newcomer_waits() {
        let t0 = Instant::now();
        let mut turns = Turns::new(Duration::from_secs(10));
        // Two jobs of 6 GiB on 10: the first (least run) has the card.
        let mut claims = vec![
            claim(6 * G, Priority::Normal),
            claim(6 * G, Priority::Normal),
        ];
        let (run, _) = turns.decide(t0, 10 * G, &contenders(&claims, &[0, 5], &[6 * G, 0]));
        assert_eq!(run, vec![true, false]);
        // A third joins needing little while the second waits: it would fit beside the first,
        // but it queues behind the second (its need is not known yet: let in, it would grow
        // and give back what it allocated).
        claims.push(claim(G, Priority::Normal));
        let (run, _) = turns.decide(
            t0 + MS,
            10 * G,
            &contenders(&claims, &[1, 5, 0], &[6 * G, G / 8, 0]),
        );
        assert_eq!(run, vec![true, false, false]);
        // The first's need falls for a moment, so that the second would fit beside it: the
        // waiting ones stay waiting (only a job that leaves makes room for them).
        claims[0].need = 7 * G / 2;
        let (run, _) = turns.decide(
            t0 + 3 * MS,
            10 * G,
            &contenders(&claims, &[3, 5, 0], &[6 * G, G / 8, G / 8]),
        );
        assert_eq!(run, vec![true, false, false]);
        claims[0].need = 6 * G;
        // The turn ends: the least run go, as many as fit.
        let (run, _) = turns.decide(
            t0 + Duration::from_secs(11),
            10 * G,
            &contenders(&claims, &[11, 5, 1], &[6 * G, G / 8, G / 8]),
        );
        assert_eq!(run, vec![false, true, true]);
        // The third grows past the card: of the two that started the turn together, the one
        // that has run more waits.
        claims[2].need = 5 * G;
        let (run, _) = turns.decide(
            t0 + Duration::from_secs(11) + MS,
            10 * G,
            &contenders(&claims, &[11, 6, 2], &[G / 8, 6 * G, G]),
        );
        assert_eq!(run, vec![false, false, true]);
    }

    #[test]
    fn of_jobs_that_start_a_turn_together_the_one_that_ran_most_waits_if_they_outgrow_the_card() {
        let t0 = Instant::now();
        let mut turns = Turns::new(Duration::from_secs(10));
        // Three on 10 GiB; the two least run start together: the second has run less, and
        // holds little yet (it has just come back from waiting).
        let mut claims = vec![
            claim(4 * G, Priority::Normal),
            claim(4 * G, Priority::Normal),
            claim(6 * G, Priority::Normal),
        ];
        let (run, _) = turns.decide(
            t0,
            10 * G,
            &contenders(&claims, &[2, 1, 9], &[4 * G, G / 8, 6 * G]),
        );
        assert_eq!(run, vec![true, true, false]);
        // The second grows past the room: the first waits (it has run more), not the second,
        // though the second holds less and is later in slot order.
        claims[1].need = 7 * G;
        let (run, _) = turns.decide(
            t0 + MS,
            10 * G,
            &contenders(&claims, &[3, 2, 9], &[4 * G, G, G / 8]),
        );
        assert_eq!(run, vec![false, true, false]);
    }

    #[test]
    fn a_newcomer_runs_at_once_beside_a_turn_in_which_no_job_waits() {
        let t0 = Instant::now();
        let mut turns = Turns::new(Duration::from_secs(10));
        // Three on 10 GiB: the two least run fit, the third waits.
        let mut claims = vec![
            claim(6 * G, Priority::Normal),
            claim(3 * G, Priority::Normal),
            claim(6 * G, Priority::Normal),
        ];
        let (run, _) = turns.decide(
            t0,
            10 * G,
            &contenders(&claims, &[0, 0, 5], &[6 * G, 3 * G, 0]),
        );
        assert_eq!(run, vec![true, true, false]);
        // The first leaves: the third takes its room; nobody waits now.
        claims.remove(0);
        let (run, _) = turns.decide(
            t0 + MS,
            10 * G,
            &contenders(&claims, &[1, 5], &[3 * G, G / 8]),
        );
        assert_eq!(run, vec![true, true]);
        // A newcomer that fits joins at once.
        claims.push(claim(G / 2, Priority::Normal));
        let (run, _) = turns.decide(
            t0 + 2 * MS,
            10 * G,
            &contenders(&claims, &[2, 6, 0], &[3 * G, 6 * G, 0]),
        );
        assert_eq!(run, vec![true, true, true]);
    }

    #[test]
    fn a_job_that_leaves_makes_room_for_a_waiting_one_without_a_new_turn() {
        let t0 = Instant::now();
        let mut turns = Turns::new(Duration::from_secs(10));
        let claims = vec![
            claim(6 * G, Priority::Normal),
            claim(6 * G, Priority::Normal),
            claim(3 * G, Priority::Normal),
        ];
        let (run, _) = turns.decide(t0, 10 * G, &contenders(&claims, &[0, 1, 2], &[0, 0, 0]));
        assert_eq!(run, vec![true, false, true]);
        // The third leaves: nothing changes for the others until the turn ends.
        let (run, _) = turns.decide(
            t0 + MS,
            10 * G,
            &contenders(&claims[..2], &[1, 1], &[6 * G, G / 8]),
        );
        assert_eq!(run, vec![true, false]);
        // The first leaves: the second is alone and runs.
        let mut alone = contenders(&claims[1..2], &[1], &[G / 8]);
        alone[0].slot = 1;
        let (run, _) = turns.decide(t0 + 2 * MS, 10 * G, &alone);
        assert_eq!(run, vec![true]);
    }

    #[test]
    fn a_high_job_that_joins_runs_at_once_and_the_last_normal_one_in_waits() {
        let t0 = Instant::now();
        let mut turns = Turns::new(Duration::from_secs(10));
        let mut claims = vec![
            claim(4 * G, Priority::Normal),
            claim(4 * G, Priority::Normal),
            claim(4 * G, Priority::Normal),
        ];
        let (run, _) = turns.decide(t0, 10 * G, &contenders(&claims, &[0, 0, 0], &[0; 3]));
        assert_eq!(run, vec![true, true, false]);
        claims.push(claim(5 * G, Priority::High));
        let (run, _) = turns.decide(
            t0 + MS,
            10 * G,
            &contenders(&claims, &[1, 1, 0, 0], &[4 * G, 4 * G, G / 8, 0]),
        );
        assert_eq!(run, vec![true, false, false, true]);
    }

    #[test]
    fn turns_last_ten_times_what_a_change_of_turns_takes() {
        let t0 = Instant::now();
        let mut turns = Turns::new(Duration::from_secs(10));
        let claims = vec![
            claim(6 * G, Priority::Normal),
            claim(6 * G, Priority::Normal),
        ];
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Turn 1: the first runs and fills its need; the second waits with its floor.
        let (run, _) = turns.decide(at(0), 10 * G, &contenders(&claims, &[0, 1], &[0, 0]));
        assert_eq!(run, vec![true, false]);
        turns.decide(
            at(5),
            10 * G,
            &contenders(&claims, &[5, 1], &[6 * G, G / 8]),
        );
        // Turn 2 at 10 s: the second starts; its first turn has nothing to bring back, but the
        // first must give its memory back: that is timed.
        let (run, r) = turns.decide(at(10), 10 * G, &contenders(&claims, &[10, 1], &[6 * G, 0]));
        assert_eq!(run, vec![false, true]);
        assert_eq!(r, Report::default());
        let mut mid = contenders(&claims, &[10, 2], &[6 * G, 4 * G]);
        mid[0].granted = G / 8;
        let (_, r) = turns.decide(at(12), 10 * G, &mid);
        assert_eq!(r.settled, None, "the first still holds more than its grant");
        // Settled with half a gigabyte still held (pages an access waiting for its turn keeps
        // pinned, say): less than a tenth of the 5.9 GiB it had to give back.
        let mut done = contenders(&claims, &[10, 5], &[G / 2, 6 * G]);
        done[0].granted = G / 8;
        let (_, r) = turns.decide(at(13), 10 * G, &done);
        assert_eq!(
            r.settled,
            Some((Duration::from_secs(3), Duration::from_secs(30)))
        );
        assert_eq!(turns.length(), Duration::from_secs(30));
        // The turn now lasts 30 s from its start at 10 s: at 35 the second still runs.
        let (run, _) = turns.decide(at(35), 10 * G, &done);
        assert_eq!(run, vec![false, true]);
        // At 40 the first comes back, and must bring back nine tenths of its 6 GiB.
        let (run, _) = turns.decide(
            at(40),
            10 * G,
            &contenders(&claims, &[10, 30], &[G / 8, 6 * G]),
        );
        assert_eq!(run, vec![true, false]);
        let mut back = contenders(&claims, &[11, 30], &[5 * G, G / 8]);
        back[0].granted = 6 * G;
        let (_, r) = turns.decide(at(45), 10 * G, &back);
        assert_eq!(r.settled, None, "5 GiB of the 5.4 it must hold");
        let back = contenders(&claims, &[12, 30], &[6 * G, G / 8]);
        let (_, r) = turns.decide(at(47), 10 * G, &back);
        // (3 + 7) / 2 = 5 s: turns of 50 s.
        assert_eq!(
            r.settled,
            Some((Duration::from_secs(7), Duration::from_secs(50)))
        );
    }

    #[test]
    fn a_change_of_turns_that_moves_little_is_not_timed() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut turns = Turns::new(Duration::from_secs(10));
        let claims = vec![
            claim(6 * G, Priority::Normal),
            claim(6 * G, Priority::Normal),
        ];
        turns.decide(at(0), 10 * G, &contenders(&claims, &[0, 1], &[0, 0]));
        // The first held a quarter of a gigabyte beyond its floor when its turn ended: less than
        // a sixteenth of the card.
        let held = G / 8 + G / 4;
        let (run, _) = turns.decide(at(10), 10 * G, &contenders(&claims, &[10, 1], &[held, 0]));
        assert_eq!(run, vec![false, true]);
        let mut later = contenders(&claims, &[10, 2], &[held, G]);
        later[0].granted = G / 8;
        later[0].held = G / 8;
        let (_, r) = turns.decide(at(11), 10 * G, &later);
        assert_eq!(r.settled, None);
        assert_eq!(turns.length(), Duration::from_secs(10));
    }

    #[test]
    fn turns_are_never_longer_than_the_cap_however_slow_a_change() {
        let mut turns = Turns::new(Duration::from_secs(10));
        turns.change_cost = Some(Duration::from_secs(3600));
        assert_eq!(turns.length(), MAX_TURN);
        let mut long = Turns::new(Duration::from_secs(600));
        long.change_cost = Some(Duration::from_secs(1));
        assert_eq!(
            long.length(),
            Duration::from_secs(600),
            "--turn above the cap is kept"
        );
    }

    #[test]
    fn when_all_fit_every_job_runs_in_a_turn_that_starts_afresh() {
        let t0 = Instant::now();
        let mut turns = Turns::new(Duration::from_secs(10));
        let claims = vec![claim(4 * G, Priority::Normal), claim(4 * G, Priority::Low)];
        let (run, _) = turns.decide(t0, 10 * G, &contenders(&claims, &[0, 0], &[0, 0]));
        assert_eq!(run, vec![true, true]);
        let at = |s: u64| t0 + Duration::from_secs(s);
        turns.decide(at(20), 10 * G, &contenders(&claims, &[20, 20], &[0, 0]));
        let turn = turns.turn.as_ref().expect("a turn of all of them");
        assert_eq!(
            (turn.running.as_slice(), turn.started),
            (&[0, 1][..], at(20))
        );
    }

    fn learning(need: u64, priority: Priority) -> Claim {
        Claim {
            known: false,
            ..claim(need, priority)
        }
    }

    #[test]
    fn a_job_still_learning_its_need_runs_alone_unless_half_the_card_is_left_to_it() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut turns = Turns::new(Duration::from_secs(10));
        // Three start together, none knowing its need yet (they have allocated little): the
        // first runs alone, for it may grow to the card.
        let mut claims = vec![
            learning(G / 2, Priority::Normal),
            learning(0, Priority::Normal),
            learning(0, Priority::Normal),
        ];
        let (run, _) = turns.decide(at(0), 10 * G, &contenders(&claims, &[0; 3], &[G / 2, 0, 0]));
        assert_eq!(run, vec![true, false, false]);
        // It grows to 6 GiB, still learning: the others still wait.
        claims[0].need = 6 * G;
        let (run, _) = turns.decide(
            at(1),
            10 * G,
            &contenders(&claims, &[1, 0, 0], &[6 * G, 0, 0]),
        );
        assert_eq!(run, vec![true, false, false]);
        // It learns its need: 6 of 10 GiB leave less than half the card, so neither of the
        // others, whose needs are not known, joins it.
        claims[0].known = true;
        let (run, _) = turns.decide(
            at(2),
            10 * G,
            &contenders(&claims, &[2, 0, 0], &[6 * G, 0, 0]),
        );
        assert_eq!(run, vec![true, false, false]);
        // Had it needed 3 GiB, the first waiting job would join the room its learning opened,
        // and hold the rest of the card for itself until it knows its own need.
        let mut turns = Turns::new(Duration::from_secs(10));
        claims[0] = learning(3 * G, Priority::Normal);
        let (run, _) = turns.decide(at(0), 10 * G, &contenders(&claims, &[0; 3], &[3 * G, 0, 0]));
        assert_eq!(run, vec![true, false, false]);
        claims[0].known = true;
        let (run, _) = turns.decide(
            at(1),
            10 * G,
            &contenders(&claims, &[1, 0, 0], &[3 * G, 0, 0]),
        );
        assert_eq!(run, vec![true, true, false]);
        // The second learns 4 GiB: the third's room is 3 GiB of 10, less than half: it waits.
        claims[1].need = 4 * G;
        claims[1].known = true;
        let (run, _) = turns.decide(
            at(2),
            10 * G,
            &contenders(&claims, &[2, 1, 0], &[3 * G, 4 * G, 0]),
        );
        assert_eq!(run, vec![true, true, false]);
        // A job whose need is known joins such room when it fits.
        claims[2] = claim(2 * G, Priority::Normal);
        claims.swap(1, 2);
        let mut turns = Turns::new(Duration::from_secs(10));
        claims[0].known = true;
        claims[2].known = true;
        let (run, _) = turns.decide(
            at(0),
            10 * G,
            &contenders(&claims, &[0; 3], &[3 * G, 0, 4 * G]),
        );
        assert_eq!(run, vec![true, true, true]);
    }

    #[test]
    fn a_job_that_runs_is_not_stopped_for_a_newcomer_whose_need_is_not_known() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut turns = Turns::new(Duration::from_secs(10));
        let mut claims = vec![claim(6 * G, Priority::Normal)];
        let (run, _) = turns.decide(at(0), 10 * G, &contenders(&claims, &[0], &[6 * G]));
        assert_eq!(run, vec![true]);
        // A high job joins, still learning: it runs at once, and so does the incumbent, while
        // their needs fit.
        claims.push(learning(G, Priority::High));
        let (run, _) = turns.decide(at(1), 10 * G, &contenders(&claims, &[1, 0], &[6 * G, 0]));
        assert_eq!(run, vec![true, true]);
        // A normal one joins: it queues (nobody joins beside a job still learning).
        claims.push(learning(0, Priority::Normal));
        let (run, _) = turns.decide(
            at(2),
            10 * G,
            &contenders(&claims, &[2, 1, 0], &[6 * G, G, 0]),
        );
        assert_eq!(run, vec![true, true, false]);
        // The high one grows past the room: the incumbent waits.
        claims[1].need = 5 * G;
        let (run, _) = turns.decide(
            at(3),
            10 * G,
            &contenders(&claims, &[3, 2, 0], &[6 * G, 4 * G, 0]),
        );
        assert_eq!(run, vec![false, true, false]);
    }

    #[test]
    fn a_job_still_learning_waits_at_once_when_a_high_one_still_learning_joins() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut turns = Turns::new(Duration::from_secs(10));
        // A normal job has just started, alone, and does not know its need yet.
        let mut claims = vec![learning(G, Priority::Normal)];
        let (run, _) = turns.decide(at(0), 10 * G, &contenders(&claims, &[0], &[G]));
        assert_eq!(run, vec![true]);
        // A high one joins, still learning too: the normal one waits now, holding a gigabyte,
        // rather than later, holding more.
        claims.push(learning(0, Priority::High));
        let (run, _) = turns.decide(at(1), 10 * G, &contenders(&claims, &[1, 0], &[G, 0]));
        assert_eq!(run, vec![false, true]);
        // The high one learns it needs 3 GiB: the room its learning opens takes the normal one
        // back (7 GiB left, more than half the card).
        claims[1].need = 3 * G;
        claims[1].known = true;
        let (run, _) = turns.decide(
            at(2),
            10 * G,
            &contenders(&claims, &[1, 1], &[G / 8, 3 * G]),
        );
        assert_eq!(run, vec![true, true]);
    }
}
