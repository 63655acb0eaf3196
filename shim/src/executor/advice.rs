//! When the plan needs each allocation next: the executor's answer to the memory manager's
//! question of which page to evict ([`EvictionAdvice`]).
//!
//! Whatever the plan did not foresee (a page fetched on demand, a prefetch that found no room)
//! makes the manager evict a page the plan did not move. Least recently used, in a repeating
//! iteration, is the page needed next: its fetch evicts another, and the run never returns to
//! the plan's residency. The plan knows every launch's allocations ([`ExecPlan::uses`]), so
//! the executor can name the page needed last instead (Belady's choice), whose absence costs
//! the least and is the likeliest to be absorbed by room the plan leaves before it is needed.

use std::collections::HashMap;

use tensile_protocol::plan::{ExecPlan, Iteration, Role};

use crate::memory::advice::NextUse;

/// The plan's uses, by allocation role, for next-use questions.
#[derive(Debug, Default)]
pub struct UseTable {
    period: u32,
    /// Persistent allocation id → the positions using it, sorted.
    persistent: HashMap<u64, Vec<u32>>,
    /// Transient role `(ordinal, bytes)` → `(position, iterations after the allocation's
    /// own)`, sorted.
    transient: HashMap<(u32, u64), Vec<(u32, u32)>>,
}

impl UseTable {
    /// The table of `plan`'s uses.
    pub fn new(plan: &ExecPlan) -> UseTable {
        let mut table = UseTable {
            period: plan.period.max(1),
            ..UseTable::default()
        };
        for u in &plan.uses {
            match u.role {
                Role::Persistent { alloc_id } => {
                    table
                        .persistent
                        .entry(alloc_id)
                        .or_default()
                        .push(u.position);
                }
                Role::Transient {
                    ordinal,
                    bytes,
                    iteration,
                } => {
                    let later = match iteration {
                        Iteration::Current => 0,
                        Iteration::Previous => 1,
                    };
                    table
                        .transient
                        .entry((ordinal, bytes))
                        .or_default()
                        .push((u.position, later));
                }
            }
        }
        for v in table.persistent.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        for v in table.transient.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        table
    }

    /// Launches from `position` (the next launch's) until persistent allocation `id` is used,
    /// counting into later iterations; `None` if no launch uses it.
    pub fn next_persistent(&self, id: u64, position: u32) -> Option<u32> {
        let uses = self.persistent.get(&id)?;
        let at = uses.partition_point(|&q| q < position);
        match uses.get(at) {
            Some(&q) => Some(q - position),
            None => uses.first().map(|&q| self.period - position + q),
        }
    }

    /// When the transient allocation `(ordinal, bytes)` of iteration `home` is used next, from
    /// `position` of iteration `now`: in so many launches, or never (it is freed first);
    /// `None` if no launch uses that role.
    pub fn next_transient(
        &self,
        ordinal: u32,
        bytes: u64,
        home: i64,
        now: i64,
        position: u32,
    ) -> Option<NextUse> {
        let uses = self.transient.get(&(ordinal, bytes))?;
        let period = i64::from(self.period);
        let from = now * period + i64::from(position);
        let next = uses
            .iter()
            .map(|&(q, later)| (home + i64::from(later)) * period + i64::from(q) - from)
            .filter(|&d| d >= 0)
            .min()
            .and_then(|d| u32::try_from(d).ok());
        Some(next.map_or(NextUse::Never, NextUse::In))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_protocol::plan::Use;

    fn plan(uses: Vec<Use>) -> ExecPlan {
        ExecPlan {
            version: 1,
            period: 10,
            kernels: vec![1; 10],
            anchor_seq: 0,
            steps: vec![],
            uses,
            host_resident: vec![],
            budget_bytes: 0,
            predicted_step_ns: 0,
            compute_ns: 0,
        }
    }

    fn transient(position: u32, ordinal: u32, iteration: Iteration) -> Use {
        Use {
            position,
            role: Role::Transient {
                ordinal,
                bytes: 4 << 20,
                iteration,
            },
        }
    }

    #[test]
    fn a_persistent_allocation_is_next_used_at_its_next_position_wrapping_around() {
        let persistent = |position| Use {
            position,
            role: Role::Persistent { alloc_id: 7 },
        };
        let t = UseTable::new(&plan(vec![persistent(2), persistent(6)]));
        assert_eq!(t.next_persistent(7, 0), Some(2));
        assert_eq!(t.next_persistent(7, 2), Some(0), "used by the next launch");
        assert_eq!(t.next_persistent(7, 3), Some(3));
        assert_eq!(
            t.next_persistent(7, 7),
            Some(5),
            "next iteration's position 2"
        );
        assert_eq!(t.next_persistent(8, 0), None, "no launch uses allocation 8");
    }

    #[test]
    fn a_transient_allocation_is_next_used_within_its_life_only() {
        // Ordinal 0: used at positions 3 and 8 of its own iteration and at 1 of the next
        // (its lifetime wraps).
        let t = UseTable::new(&plan(vec![
            transient(1, 0, Iteration::Previous),
            transient(3, 0, Iteration::Current),
            transient(8, 0, Iteration::Current),
        ]));
        // Made in iteration 5; now at position 4 of iteration 5.
        let next = |bytes, now, position| t.next_transient(0, bytes, 5, now, position);
        assert_eq!(next(4 << 20, 5, 4), Some(NextUse::In(4)));
        assert_eq!(next(4 << 20, 5, 9), Some(NextUse::In(2)));
        // In iteration 6, before and after its last use.
        assert_eq!(next(4 << 20, 6, 0), Some(NextUse::In(1)));
        assert_eq!(next(4 << 20, 6, 2), Some(NextUse::Never));
        // Another size at that ordinal is another role, which no launch uses.
        assert_eq!(next(8 << 20, 5, 0), None);
    }
}
