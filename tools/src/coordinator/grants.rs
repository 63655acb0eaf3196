//! How one GPU's memory is divided among the jobs on it: what each job is granted.
//!
//! Pure functions over numbers, so the policy can be tested without a segment. Two steps:
//!
//! 1. [`divide`] decides the targets. Every job first gets its *floor* (the bytes its largest
//!    launch needs resident at once; a job below it cannot run a step), high-priority jobs
//!    before normal ones before low ones, and within a priority the earliest joined first.
//!    What remains goes to each priority in turn, up to each job's *need* (the bytes it would
//!    keep resident if it could, its footprint). Within a priority, where every job's planner
//!    has predicted its step at several budgets (its *curve*), memory goes where it shortens
//!    the steps most: chunk by chunk to the job whose slowdown (its step over its step at its
//!    need) drops most per byte, so a job that hides its copies behind long kernels gives way
//!    to one that stalls on them (the sum of the slowdowns is what is made small). Without
//!    curves, and for what no curve says helps, the priority's jobs share max-min fairly. What
//!    is still left after every need is met is shared the same way up to each job's *limit*
//!    (its own budget, `TENSILE_DEVICE_MEMORY`, or the card), so that a job that grows has
//!    room at once and a job alone has the whole card. So a high job keeps its working set,
//!    low jobs absorb a squeeze down to their floors, and a job that is alone gets what it
//!    needs.
//! 2. [`settle`] moves from the current grants to the targets without ever promising memory
//!    that another job still holds: a grant shrinks at once (the job evicts to meet it), but
//!    one grows only into memory that no other job holds or is granted. A job that shrinks
//!    reports what it holds, and the grants that wait for that memory grow at a later tick.
//!
//! Memory counted here is the card's less the coordinator's reserve (what libraries allocate
//! around the jobs' arenas: cuBLAS and cuDNN workspaces, NCCL buffers, contexts).

use tensile_protocol::Priority;

/// What the coordinator knows of one job's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The most it may be granted (its own budget; the card when it set none).
    pub limit: u64,
    /// What its largest launch needs resident at once (0: not known yet).
    pub floor: u64,
    /// What it would keep resident if it could (its footprint).
    pub need: u64,
    /// Whether `need` is known: the job's planner has found its iteration, or the job has run
    /// long enough for its footprint to show its peak. A job still learning grows as it
    /// allocates, up to its limit, so [`turns`] lets one without a limit below the card in
    /// beside others only into [`UNKNOWN_NEED_ROOM`] of the card or more, and no job in beside
    /// it.
    pub known: bool,
    pub priority: Priority,
    /// The job's predicted step (ns) at budgets (bytes), ascending by budget, the last at or
    /// near its need; empty while not known.
    pub curve: Vec<(u64, u64)>,
    /// It takes its turns on another coordinator (a further GPU of a process that uses
    /// several): it always runs here, as a high-priority job does, while its priority still
    /// ranks its memory.
    pub turns_elsewhere: bool,
}

impl Claim {
    /// Whether it runs whoever else must wait: a high-priority job, or one that takes its
    /// turns on another coordinator (pausing it here would hold its launches there too).
    pub fn always_runs(&self) -> bool {
        self.priority == Priority::High || self.turns_elsewhere
    }

    /// The most the job may come to hold while it runs on a card of `available` bytes: its
    /// need (at least its floor) where known, else its own limit where that is below the card;
    /// `None` where it may grow to the card.
    pub fn bound(&self, available: u64) -> Option<u64> {
        if self.known {
            Some(self.need.max(self.floor).min(self.limit))
        } else if self.limit < available {
            Some(self.limit)
        } else {
            None
        }
    }
}

/// The targets [`divide`] decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Division {
    /// Per job, in the claims' order.
    pub targets: Vec<u64>,
    /// Per job: the most it could be granted with every other job at its floor. A job whose
    /// floor is above it cannot run its largest launch however the others are squeezed.
    pub grantable: Vec<u64>,
}

/// Divides `available` bytes among `claims` (in the order the jobs joined); see the module
/// comment. The targets never add up to more than `available`.
pub fn divide(available: u64, claims: &[Claim]) -> Division {
    let limits: Vec<u64> = claims.iter().map(|c| c.limit.min(available)).collect();
    let floors: Vec<u64> = claims
        .iter()
        .zip(&limits)
        .map(|(c, &l)| c.floor.min(l))
        .collect();
    let needs: Vec<u64> = claims
        .iter()
        .zip(&limits)
        .zip(&floors)
        .map(|((c, &l), &f)| c.need.clamp(f, l))
        .collect();
    let all_floors: u64 = floors.iter().sum();
    let grantable = limits
        .iter()
        .zip(&floors)
        .map(|(&l, &f)| l.min(available.saturating_sub(all_floors - f)))
        .collect();

    let by_priority = |p: Priority| (0..claims.len()).filter(move |&j| claims[j].priority == p);
    let mut targets = vec![0u64; claims.len()];
    let mut left = available;
    // Floors, most important first; a floor that does not fit whole gets what is left.
    for p in Priority::ALL {
        for j in by_priority(p) {
            let give = floors[j].min(left);
            targets[j] = give;
            left -= give;
        }
    }
    // Needs, one priority at a time: by the curves where every job has one, then max-min.
    for p in Priority::ALL {
        let members: Vec<usize> = by_priority(p).collect();
        if members.len() > 1 && members.iter().all(|&j| claims[j].curve.len() >= 2) {
            left -= fill_by_curves(&mut targets, &members, &needs, claims, left);
        }
        left -= fill(&mut targets, &members, &needs, left);
    }
    // Room to grow, for everyone alike.
    let everyone: Vec<usize> = (0..claims.len()).collect();
    fill(&mut targets, &everyone, &limits, left);
    Division { targets, grantable }
}

/// Raises `targets[j]` for `j` in `members` towards `caps[j]`, max-min fairly, spending at
/// most `budget`; returns what it spent. Max-min fair: the smallest grants rise first, so no
/// job ends below another unless it reached its cap.
fn fill(targets: &mut [u64], members: &[usize], caps: &[u64], budget: u64) -> u64 {
    let mut spent = 0u64;
    let mut open: Vec<usize> = members
        .iter()
        .copied()
        .filter(|&j| targets[j] < caps[j])
        .collect();
    while !open.is_empty() && spent < budget {
        let left = budget - spent;
        // Raise the lowest grants to the next level: the second-lowest grant, the lowest
        // cap, or what the budget allows spread over the lowest ones.
        let low = open.iter().map(|&j| targets[j]).min().unwrap_or(0);
        let lowest: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&j| targets[j] == low)
            .collect();
        let next_grant = open
            .iter()
            .map(|&j| targets[j])
            .filter(|&t| t > low)
            .min()
            .unwrap_or(u64::MAX);
        let next_cap = lowest.iter().map(|&j| caps[j]).min().unwrap_or(u64::MAX);
        let n = lowest.len() as u64;
        let even = left / n;
        let step = (next_grant.min(next_cap) - low).min(even);
        if step == 0 {
            // Fewer bytes left than jobs to share them: one each to the first ones.
            for &j in lowest.iter().take(left as usize) {
                targets[j] += 1;
                spent += 1;
            }
            break;
        }
        for &j in &lowest {
            targets[j] += step;
        }
        spent += step * n;
        open.retain(|&j| targets[j] < caps[j]);
    }
    spent
}

/// Which jobs run when the card cannot hold every job's need at once: the others take turns.
///
/// Dividing such a card among all the jobs makes every one of them swap most of its working
/// set every iteration, and their kernels still take turns on the one compute engine: all of
/// them run many times slower than alone, and together slower than one after another
/// (docs/sharing.md, measured). So the jobs whose needs fit run, with their needs granted, and
/// the others hold their launches and keep only their floors until their turn: high-priority
/// jobs always run; then the others by priority and, within one, the one that has run least
/// first (`ran`, in any unit), while they are [`admitted`]. At least one job runs. Every job
/// runs when all fit.
pub fn turns(available: u64, claims: &[Claim], ran: &[u64]) -> Vec<bool> {
    if claims.len() <= 1 {
        return vec![true; claims.len()];
    }
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_by_key(|&j| (claims[j].priority, ran[j], j));
    let mut running = vec![false; claims.len()];
    for j in order {
        let first = !running.iter().any(|&r| r);
        if claims[j].always_runs() || first || admitted(available, claims, &running, j) {
            running[j] = true;
        }
    }
    running
}

/// A job whose need is not known yet is let in beside running jobs only while at least this
/// fraction (1/N) of the card is left to it. It will grow as it allocates, to a size nobody
/// knows: let in beside others into a small room, a job that needs more than the room grows
/// past it within seconds, waits, and writes out what it allocated meanwhile (three reruns
/// started together each learned at a third of the card, and the two stopped gave back 700 MiB
/// each: docs/sharing.md). Jobs that need more than half a card cannot share it with another
/// such job anyway.
pub const UNKNOWN_NEED_ROOM: u64 = 2;

/// Whether job `j` may join the jobs marked in `running` (the others keep their floors).
///
/// - Nobody joins beside a running job that may grow to the card ([`Claim::bound`]).
/// - A job whose bound is known joins if the running jobs' bounds, the others' floors and its
///   own bound fit.
/// - A job that may grow to the card joins if what is left after the running jobs' bounds and
///   the others' floors is at least [`UNKNOWN_NEED_ROOM`] of the card.
pub fn admitted(available: u64, claims: &[Claim], running: &[bool], j: usize) -> bool {
    let mut held = 0u64;
    for (i, (c, &runs)) in claims.iter().zip(running).enumerate() {
        if i == j {
            continue;
        }
        held += if runs {
            match c.bound(available) {
                Some(b) => b,
                None => return false,
            }
        } else {
            c.floor.min(c.limit)
        };
    }
    let room = available.saturating_sub(held);
    let c = &claims[j];
    match c.bound(available) {
        Some(b) => b <= room,
        None => room >= available / UNKNOWN_NEED_ROOM && c.floor.min(c.limit) <= room,
    }
}

/// How many chunks [`fill_by_curves`] hands out the memory it has in.
const CURVE_CHUNKS: u64 = 256;

/// A job's slowdown at `bytes` by its curve: its step there (linear between the points and
/// below them, flat above them) over its step at the last point.
fn slowdown(curve: &[(u64, u64)], bytes: u64) -> f64 {
    let (Some(&(first_bytes, first_step)), Some(&(_, last_step))) = (curve.first(), curve.last())
    else {
        return 1.0;
    };
    let last = last_step.max(1) as f64;
    if bytes <= first_bytes {
        // Below the points, the first stretch's slope goes on.
        let slope = curve.get(1).map_or(0.0, |&(b1, s1)| {
            (first_step as f64 - s1 as f64) / (b1 - first_bytes).max(1) as f64
        });
        return (first_step as f64 + slope.max(0.0) * (first_bytes - bytes) as f64) / last;
    }
    let step = match curve.iter().position(|&(b, _)| b >= bytes) {
        None => last,
        Some(i) => {
            let ((b0, s0), (b1, s1)) = (curve[i - 1], curve[i]);
            let t = (bytes - b0) as f64 / (b1 - b0).max(1) as f64;
            s0 as f64 + (s1 as f64 - s0 as f64) * t
        }
    };
    step / last
}

/// Raises `targets[j]` towards `caps[j]` chunk by chunk, each chunk to the job whose slowdown
/// it shortens most, while some chunk shortens one; returns what it spent (at most
/// `budget`). The rest is the caller's to share otherwise.
fn fill_by_curves(
    targets: &mut [u64],
    members: &[usize],
    caps: &[u64],
    claims: &[Claim],
    budget: u64,
) -> u64 {
    let chunk = (budget / CURVE_CHUNKS).max(1);
    let mut spent = 0;
    while spent < budget {
        let best = members
            .iter()
            .copied()
            .filter(|&j| targets[j] < caps[j])
            .map(|j| {
                let give = chunk.min(caps[j] - targets[j]).min(budget - spent);
                let curve = &claims[j].curve;
                let gain = slowdown(curve, targets[j]) - slowdown(curve, targets[j] + give);
                (j, give, gain / give as f64)
            })
            .filter(|&(_, _, per_byte)| per_byte > 0.0)
            .max_by(|a, b| a.2.total_cmp(&b.2));
        let Some((j, give, _)) = best else { break };
        targets[j] += give;
        spent += give;
    }
    spent
}

/// One job's current standing, for [`settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Its grant now (0: none yet).
    pub granted: u64,
    /// The device memory it holds now (what it reported).
    pub held: u64,
    /// The target [`divide`] gave it.
    pub target: u64,
    pub priority: Priority,
}

/// The grants to give now, on the way from the current ones to the targets: every shrink at
/// once; a raise only into memory no other job holds or is granted (each job counts for the
/// larger of its grant and what it holds), most important jobs first. A job that holds more
/// than it is granted (one that started on the card's free memory before its first grant)
/// shrinks like the others; an access it cannot fit meanwhile waits for its grant to grow. If the jobs together
/// hold no more than `available`, neither do the grants returned (with what is held).
pub fn settle(available: u64, jobs: &[Standing]) -> Vec<u64> {
    let mut grants: Vec<u64> = jobs.iter().map(|j| j.target.min(j.granted)).collect();
    let mut order: Vec<usize> = (0..jobs.len())
        .filter(|&j| jobs[j].target > jobs[j].granted)
        .collect();
    order.sort_by_key(|&j| jobs[j].priority);
    for j in order {
        let others: u64 = (0..jobs.len())
            .filter(|&k| k != j)
            .map(|k| grants[k].max(jobs[k].held))
            .sum();
        let room = available.saturating_sub(others);
        grants[j] = jobs[j].target.min(room).max(jobs[j].granted);
    }
    grants
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn claim(need: u64, floor: u64, priority: Priority) -> Claim {
        Claim {
            limit: u64::MAX,
            floor,
            need,
            known: true,
            priority,
            curve: Vec::new(),
            turns_elsewhere: false,
        }
    }

    #[test]
    fn a_job_alone_gets_the_whole_card_up_to_its_own_budget() {
        let d = divide(10 * G, &[claim(4 * G, G, Priority::Normal)]);
        assert_eq!(d.targets, vec![10 * G]);
        let capped = Claim {
            limit: 3 * G,
            ..claim(4 * G, G, Priority::Normal)
        };
        assert_eq!(divide(10 * G, &[capped]).targets, vec![3 * G]);
    }

    #[test]
    fn jobs_that_fit_together_get_their_needs_and_share_the_rest() {
        let d = divide(
            10 * G,
            &[
                claim(2 * G, G, Priority::Normal),
                claim(4 * G, G, Priority::Normal),
            ],
        );
        // 4 GiB left after both needs: the smaller grant rises to the larger, then both.
        assert_eq!(d.targets, vec![5 * G, 5 * G]);
        assert_eq!(d.targets.iter().sum::<u64>(), 10 * G);
    }

    #[test]
    fn a_second_job_shrinks_the_first_to_a_fair_share_when_both_need_more() {
        let alone = divide(10 * G, &[claim(8 * G, G, Priority::Normal)]);
        assert_eq!(alone.targets, vec![10 * G]);
        let both = divide(
            10 * G,
            &[
                claim(8 * G, G, Priority::Normal),
                claim(8 * G, 2 * G, Priority::Normal),
            ],
        );
        assert_eq!(both.targets, vec![5 * G, 5 * G]);
        // One that needs less keeps what it needs; the other gets the rest.
        let uneven = divide(
            10 * G,
            &[
                claim(8 * G, G, Priority::Normal),
                claim(3 * G, G, Priority::Normal),
            ],
        );
        assert_eq!(uneven.targets, vec![7 * G, 3 * G]);
    }

    #[test]
    fn a_high_job_keeps_its_working_set_and_low_ones_go_down_to_their_floors() {
        let d = divide(
            10 * G,
            &[
                claim(6 * G, G, Priority::Low),
                claim(7 * G, 2 * G, Priority::High),
                claim(6 * G, G, Priority::Low),
            ],
        );
        assert_eq!(d.targets[1], 7 * G, "the high job's need");
        assert_eq!(d.targets[0] + d.targets[2], 3 * G);
        assert_eq!(d.targets[0], d.targets[2], "the squeeze is shared");
        // Squeezed harder, the low jobs stop at their floors.
        let hard = divide(
            10 * G,
            &[
                claim(6 * G, G, Priority::Low),
                claim(9 * G, 2 * G, Priority::High),
                claim(6 * G, G, Priority::Low),
            ],
        );
        assert_eq!(hard.targets, vec![G, 8 * G, G]);
    }

    #[test]
    fn a_job_that_takes_its_turns_elsewhere_always_runs_but_its_memory_ranks_by_its_priority() {
        // A high job and a low one that fit the card only apart; the low one is a further GPU
        // of a process that takes its turns on its first GPU.
        let elsewhere = Claim {
            turns_elsewhere: true,
            ..claim(6 * G, G, Priority::Low)
        };
        let high = claim(7 * G, 2 * G, Priority::High);
        let low = claim(6 * G, G, Priority::Low);
        // A plain low job waits beside the high one; the one that takes its turns elsewhere
        // runs (pausing it here would hold its launches on its first GPU too).
        assert_eq!(
            turns(10 * G, &[high.clone(), low], &[0, 0]),
            vec![true, false]
        );
        assert_eq!(
            turns(10 * G, &[high.clone(), elsewhere.clone()], &[0, 0]),
            vec![true, true]
        );
        // Its memory is still a low job's: the high one keeps its working set.
        let d = divide(10 * G, &[elsewhere, high]);
        assert_eq!(d.targets, vec![3 * G, 7 * G]);
    }

    #[test]
    fn a_floor_that_cannot_fit_is_reported_and_the_earlier_jobs_keep_theirs() {
        let d = divide(
            10 * G,
            &[
                claim(8 * G, 6 * G, Priority::Normal),
                claim(8 * G, 5 * G, Priority::Normal),
            ],
        );
        assert_eq!(d.grantable, vec![5 * G, 4 * G]);
        assert_eq!(
            d.targets,
            vec![6 * G, 4 * G],
            "the first joined keeps its floor"
        );
        assert!(d.targets[1] < 5 * G, "the second is short of its floor");
        // A high job's floor goes first even if it came later.
        let d = divide(
            10 * G,
            &[
                claim(8 * G, 6 * G, Priority::Normal),
                claim(8 * G, 5 * G, Priority::High),
            ],
        );
        assert_eq!(d.targets, vec![5 * G, 5 * G]);
    }

    #[test]
    fn the_targets_never_exceed_the_card_and_fairness_holds_on_odd_numbers() {
        let claims: Vec<Claim> = (0..7)
            .map(|i| claim(1_000_003 * (i + 1), 17 * i, Priority::ALL[i as usize % 3]))
            .collect();
        for available in [0, 1, 5, 999, 1_000_000, 3_000_001, 50_000_000] {
            let d = divide(available, &claims);
            assert!(d.targets.iter().sum::<u64>() <= available, "{available}");
            for (t, c) in d.targets.iter().zip(&claims) {
                assert!(*t <= c.limit.min(available));
            }
        }
    }

    #[test]
    fn with_curves_memory_goes_where_it_shortens_the_steps_most() {
        // A hides its copies behind long kernels (10% slower at a third of its need); B
        // stalls on them (three times slower at a third). Max-min would give each 5 GiB.
        let a = Claim {
            curve: vec![(2 * G, 110), (4 * G, 104), (6 * G, 100)],
            ..claim(6 * G, G, Priority::Normal)
        };
        let b = Claim {
            curve: vec![(2 * G, 300), (4 * G, 180), (6 * G, 100)],
            ..claim(6 * G, G, Priority::Normal)
        };
        let d = divide(10 * G, &[a.clone(), b.clone()]);
        assert_eq!(d.targets[1], 6 * G, "B gets its need: {:?}", d.targets);
        assert_eq!(d.targets[0], 4 * G);
        // Without B's curve, max-min again.
        let unknown = Claim {
            curve: Vec::new(),
            ..b
        };
        assert_eq!(divide(10 * G, &[a, unknown]).targets, vec![5 * G, 5 * G]);
    }

    #[test]
    fn the_slowdown_interpolates_between_the_points_extends_below_and_is_flat_above() {
        let curve = [(2 * G, 300), (4 * G, 200), (6 * G, 100)];
        assert_eq!(slowdown(&curve, G), 3.5);
        assert_eq!(slowdown(&curve, 2 * G), 3.0);
        assert_eq!(slowdown(&curve, 3 * G), 2.5);
        assert_eq!(slowdown(&curve, 6 * G), 1.0);
        assert_eq!(slowdown(&curve, 9 * G), 1.0);
    }

    #[test]
    fn jobs_that_do_not_fit_together_take_turns_least_run_first_and_high_ones_always_run() {
        let three = [
            claim(6 * G, G, Priority::Normal),
            claim(5 * G, G, Priority::Normal),
            claim(4 * G, G, Priority::Normal),
        ];
        // All fit: all run.
        assert_eq!(turns(16 * G, &three, &[0, 0, 0]), vec![true; 3]);
        // 11 GiB: the floors of all, then the needs in turn: 6 fits, 5 does not, 4 does.
        assert_eq!(turns(11 * G, &three, &[0, 0, 0]), vec![true, false, true]);
        // The one that ran least goes first.
        assert_eq!(turns(11 * G, &three, &[5, 0, 9]), vec![false, true, true]);
        // A job alone that does not fit still runs.
        assert_eq!(turns(3 * G, &three, &[0, 0, 0]), vec![true, false, false]);
        // A high job runs whatever it has run.
        let mut high = three.clone();
        high[2].priority = Priority::High;
        assert_eq!(turns(11 * G, &high, &[0, 0, 100]), vec![true, false, true]);
    }

    #[test]
    fn a_job_still_learning_is_bounded_by_its_own_limit_where_it_set_one() {
        let learning = |need: u64, limit: u64| Claim {
            known: false,
            limit,
            ..claim(need, G / 8, Priority::Normal)
        };
        // Without a limit it may grow to the card: it runs alone, and nobody joins it.
        let free = [learning(G, u64::MAX), learning(G, u64::MAX)];
        assert_eq!(turns(10 * G, &free, &[0, 0]), vec![true, false]);
        // With limits of 4 GiB both fit: both run, though neither knows its need yet.
        let capped = [learning(G, 4 * G), learning(G, 4 * G)];
        assert_eq!(turns(10 * G, &capped, &[0, 0]), vec![true, true]);
        // A third of 4 GiB does not fit beside them.
        let three = [capped[0].clone(), capped[1].clone(), learning(0, 4 * G)];
        assert_eq!(turns(10 * G, &three, &[0, 0, 0]), vec![true, true, false]);
    }

    #[test]
    fn settle_shrinks_at_once_and_grows_only_into_memory_nobody_holds() {
        // Job 0 had the card alone and holds 9 GiB; job 1 arrives wanting 5.
        let jobs = [
            Standing {
                granted: 10 * G,
                held: 9 * G,
                target: 5 * G,
                priority: Priority::Normal,
            },
            Standing {
                granted: 0,
                held: 0,
                target: 5 * G,
                priority: Priority::Normal,
            },
        ];
        assert_eq!(settle(10 * G, &jobs), vec![5 * G, G]);
        // Job 0 evicted down to 5 GiB: job 1 gets the rest.
        let later = [
            Standing {
                granted: 5 * G,
                held: 5 * G,
                ..jobs[0]
            },
            Standing {
                granted: G,
                ..jobs[1]
            },
        ];
        assert_eq!(settle(10 * G, &later), vec![5 * G, 5 * G]);
    }

    #[test]
    fn settle_never_takes_back_more_than_the_target_says() {
        let jobs = [Standing {
            granted: 4 * G,
            held: 4 * G,
            target: 6 * G,
            priority: Priority::Low,
        }];
        assert_eq!(settle(10 * G, &jobs), vec![6 * G]);
        // Memory held beyond the card (a job still on its first budget): no raise for the
        // others until it has shrunk.
        let crowded = [
            jobs[0],
            Standing {
                granted: 0,
                held: 9 * G,
                target: 4 * G,
                priority: Priority::High,
            },
        ];
        assert_eq!(settle(10 * G, &crowded), vec![4 * G, 4 * G]);
    }
}
