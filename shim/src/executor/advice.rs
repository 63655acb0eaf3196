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

    /// Whether a launch uses persistent allocation `id`.
    pub fn is_persistent(&self, id: u64) -> bool {
        self.persistent.contains_key(&id)
    }

    /// Whether a launch uses the transient role `(ordinal, bytes)`.
    pub fn is_transient(&self, ordinal: u32, bytes: u64) -> bool {
        self.transient.contains_key(&(ordinal, bytes))
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

    /// Launches until the transient allocation `(ordinal, bytes)` of iteration `home` is used,
    /// from `position` of iteration `now`; `None` if it is not used again (it is freed first).
    pub fn next_transient(
        &self,
        ordinal: u32,
        bytes: u64,
        home: i64,
        now: i64,
        position: u32,
    ) -> Option<u32> {
        let uses = self.transient.get(&(ordinal, bytes))?;
        let period = i64::from(self.period);
        let from = now * period + i64::from(position);
        uses.iter()
            .map(|&(q, later)| (home + i64::from(later)) * period + i64::from(q) - from)
            .filter(|&d| d >= 0)
            .min()
            .and_then(|d| u32::try_from(d).ok())
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
        assert_eq!(t.next_transient(0, 4 << 20, 5, 5, 4), Some(4));
        assert_eq!(t.next_transient(0, 4 << 20, 5, 5, 9), Some(2));
        // In iteration 6, before and after its last use.
        assert_eq!(t.next_transient(0, 4 << 20, 5, 6, 0), Some(1));
        assert_eq!(t.next_transient(0, 4 << 20, 5, 6, 2), None);
        // Another size at that ordinal is another role.
        assert_eq!(t.next_transient(0, 8 << 20, 5, 5, 0), None);
    }
}
