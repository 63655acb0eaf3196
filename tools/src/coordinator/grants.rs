//! How one GPU's memory is divided among the jobs on it: what each job is granted.
//!
//! Pure functions over numbers, so the policy can be tested without a segment. Two steps:
//!
//! 1. [`divide`] decides the targets. Every job first gets its *floor* (the bytes its largest
//!    launch needs resident at once; a job below it cannot run a step), high-priority jobs
//!    before normal ones before low ones, and within a priority the earliest joined first.
//!    What remains goes to each priority in turn, up to each job's *need* (the bytes it would
//!    keep resident if it could, its footprint), shared max-min fairly within a priority. What
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The most it may be granted (its own budget; the card when it set none).
    pub limit: u64,
    /// What its largest launch needs resident at once (0: not known yet).
    pub floor: u64,
    /// What it would keep resident if it could (its footprint).
    pub need: u64,
    pub priority: Priority,
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
    // Needs, one priority at a time.
    for p in Priority::ALL {
        let members: Vec<usize> = by_priority(p).collect();
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
            priority,
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
