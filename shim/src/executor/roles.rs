//! Resolving a plan's roles to the allocations of this run.
//!
//! The protocol's definition (`tensile_protocol::plan`): an allocation belongs to the
//! iteration of the first launch made after it, and its ordinal counts the earlier
//! allocations of that iteration from 0. The shim knows, when an allocation is made, the
//! number the next launch will get; with the plan's anchor and period that is the
//! iteration. Two tables are kept, the current iteration's and the previous one's (a
//! `Previous` role names a tensor whose lifetime wraps past the iteration's end), plus the
//! persistent allocations the plan names by id.
//!
//! A role resolves to an allocation (id, address, size) or says why not; whether that
//! allocation is still live is checked by the caller against the allocation index. Nothing
//! here is guessed: a missing ordinal, another size or an incomplete table is "unresolved".

use std::collections::HashMap;

use tensile_protocol::plan::{ExecPlan, Iteration, PieceRef, Role};

/// One allocation as the tables know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub id: u64,
    pub ptr: u64,
    pub bytes: u64,
}

/// Why a role names no allocation of this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    /// No allocation has that id, or the iteration had fewer allocations, or the table of
    /// that iteration is not known (before the plan took effect).
    Missing,
    /// The allocation at that ordinal has another size.
    WrongSize { found: u64, expected: u64 },
    /// The piece does not fit in the allocation.
    OutOfBounds { end: u64, bytes: u64 },
    /// The allocation was freed.
    Freed,
}

/// The iteration of the launch numbered `seq` (floor division: launches before the anchor
/// are in negative iterations).
#[inline]
pub fn iteration_of(anchor: u64, period: u32, seq: u64) -> i64 {
    let period = i128::from(period.max(1));
    let d = i128::from(seq) - i128::from(anchor);
    d.div_euclid(period) as i64
}

#[derive(Debug, Default)]
struct Table {
    iteration: i64,
    slots: Vec<Slot>,
    /// Allocation id to ordinal (index in `slots`), for the eviction advice's look-ups.
    ordinals: HashMap<u64, u32>,
}

impl Table {
    fn new(iteration: i64) -> Table {
        Table {
            iteration,
            ..Table::default()
        }
    }

    fn push(&mut self, slot: Slot) {
        self.ordinals.insert(slot.id, self.slots.len() as u32);
        self.slots.push(slot);
    }
}

/// The allocations of the current and the previous iteration, and the plan's persistent
/// ones.
#[derive(Debug)]
pub struct RoleTables {
    anchor: u64,
    period: u32,
    /// Allocations of iterations before this one are not counted: their tables would miss
    /// what was allocated before the plan arrived.
    first_iteration: i64,
    persistent: HashMap<u64, Option<Slot>>,
    current: Option<Table>,
    previous: Option<Table>,
}

impl RoleTables {
    /// Empty tables for `plan`, counting allocations from `first_iteration` on.
    pub fn new(plan: &ExecPlan, first_iteration: i64) -> RoleTables {
        let persistent = plan
            .steps
            .iter()
            .map(|s| &s.piece)
            .chain(&plan.host_resident)
            .filter_map(|p| match p.role {
                Role::Persistent { alloc_id } => Some((alloc_id, None)),
                Role::Transient { .. } => None,
            })
            .collect();
        RoleTables {
            anchor: plan.anchor_seq,
            period: plan.period,
            first_iteration,
            persistent,
            current: None,
            previous: None,
        }
    }

    /// Whether the plan names allocation `id` as persistent.
    pub fn wants_persistent(&self, id: u64) -> bool {
        self.persistent.contains_key(&id)
    }

    /// A live allocation the plan may name as persistent (those made before the plan).
    pub fn note_persistent(&mut self, slot: Slot) {
        if let Some(entry) = self.persistent.get_mut(&slot.id) {
            *entry = Some(slot);
        }
    }

    /// An allocation made while the next launch is numbered `next_seq`.
    pub fn allocated(&mut self, next_seq: u64, slot: Slot) {
        if let Some(entry) = self.persistent.get_mut(&slot.id) {
            *entry = Some(slot);
        }
        let iteration = iteration_of(self.anchor, self.period, next_seq);
        if iteration < self.first_iteration {
            return;
        }
        match &mut self.current {
            Some(t) if t.iteration == iteration => t.push(slot),
            // Another thread numbered a launch meanwhile: an allocation never moves back.
            Some(t) if t.iteration > iteration => {}
            _ => {
                let done = self.current.take();
                self.previous = done.filter(|t| t.iteration == iteration - 1);
                let mut table = Table::new(iteration);
                table.push(slot);
                self.current = Some(table);
            }
        }
    }

    /// Allocation `id` if it is tabled as a transient: `(iteration, ordinal, bytes)`.
    pub fn transient_of(&self, id: u64) -> Option<(i64, u32, u64)> {
        [&self.current, &self.previous]
            .into_iter()
            .flatten()
            .find_map(|t| {
                let &ordinal = t.ordinals.get(&id)?;
                Some((t.iteration, ordinal, t.slots[ordinal as usize].bytes))
            })
    }

    /// The allocation of `role` for a step at a launch of iteration `launch_iteration`.
    pub fn resolve(&self, role: Role, launch_iteration: i64) -> Result<Slot, Unresolved> {
        match role {
            Role::Persistent { alloc_id } => self
                .persistent
                .get(&alloc_id)
                .copied()
                .flatten()
                .ok_or(Unresolved::Missing),
            Role::Transient {
                ordinal,
                bytes,
                iteration,
            } => {
                let wanted = match iteration {
                    Iteration::Current => launch_iteration,
                    Iteration::Previous => launch_iteration - 1,
                };
                let table = [&self.current, &self.previous]
                    .into_iter()
                    .flatten()
                    .find(|t| t.iteration == wanted)
                    .ok_or(Unresolved::Missing)?;
                let slot = *table
                    .slots
                    .get(ordinal as usize)
                    .ok_or(Unresolved::Missing)?;
                if slot.bytes != bytes {
                    return Err(Unresolved::WrongSize {
                        found: slot.bytes,
                        expected: bytes,
                    });
                }
                Ok(slot)
            }
        }
    }

    /// The byte range `(start, len)` of `piece` for a launch of `launch_iteration`, checked
    /// with `is_live` (the allocation index: still the same allocation at that address).
    pub fn piece_range(
        &self,
        piece: &PieceRef,
        launch_iteration: i64,
        is_live: impl Fn(&Slot) -> bool,
    ) -> Result<(u64, u64), Unresolved> {
        let slot = self.resolve(piece.role, launch_iteration)?;
        let end = piece.offset.saturating_add(piece.bytes);
        if end > slot.bytes {
            return Err(Unresolved::OutOfBounds {
                end,
                bytes: slot.bytes,
            });
        }
        if !is_live(&slot) {
            return Err(Unresolved::Freed);
        }
        Ok((slot.ptr + piece.offset, piece.bytes))
    }
}

/// The part of `[start, start + len)` made of whole pages of `page` bytes (pages are
/// aligned to their size): what a swap-out may move without evicting a neighbour's bytes.
/// `None` when no whole page lies inside.
#[inline]
pub fn whole_pages(start: u64, len: u64, page: u64) -> Option<(u64, u64)> {
    let end = start.checked_add(len)?;
    let first = start.checked_next_multiple_of(page)?;
    let last = end / page * page;
    (last > first).then(|| (first, last - first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_protocol::plan::{Action, Step, When};

    const MIB: u64 = 1 << 20;

    fn transient(ordinal: u32, bytes: u64, iteration: Iteration) -> Role {
        Role::Transient {
            ordinal,
            bytes,
            iteration,
        }
    }

    fn plan(anchor: u64, period: u32) -> ExecPlan {
        ExecPlan {
            version: 1,
            period,
            kernels: vec![1; period as usize],
            anchor_seq: anchor,
            steps: vec![Step {
                position: 0,
                when: When::AfterLaunch,
                action: Action::SwapOut,
                piece: PieceRef {
                    role: Role::Persistent { alloc_id: 3 },
                    offset: 0,
                    bytes: 4 * MIB,
                },
            }],
            uses: vec![],
            host_resident: vec![],
            budget_bytes: 0,
            predicted_step_ns: 0,
            compute_ns: 0,
        }
    }

    fn slot(id: u64, bytes: u64) -> Slot {
        Slot {
            id,
            ptr: id << 32,
            bytes,
        }
    }

    #[test]
    fn iterations_are_floor_divisions_around_the_anchor() {
        assert_eq!(iteration_of(10, 4, 10), 0);
        assert_eq!(iteration_of(10, 4, 13), 0);
        assert_eq!(iteration_of(10, 4, 14), 1);
        assert_eq!(iteration_of(10, 4, 9), -1);
        assert_eq!(iteration_of(10, 4, 6), -1);
        assert_eq!(iteration_of(10, 4, 5), -2);
    }

    #[test]
    fn an_allocation_belongs_to_the_iteration_of_the_next_launch() {
        // Period 4 from launch 0. Allocations while the next launch is 0 (before any launch)
        // and 3 belong to iteration 0; while it is 4, to iteration 1.
        let mut t = RoleTables::new(&plan(0, 4), 0);
        t.allocated(0, slot(1, MIB));
        t.allocated(3, slot(2, 2 * MIB));
        t.allocated(4, slot(3, 4 * MIB));
        t.allocated(5, slot(4, MIB));
        let cur = |o, b| transient(o, b, Iteration::Current);
        let prev = |o, b| transient(o, b, Iteration::Previous);
        assert_eq!(t.resolve(cur(0, MIB), 0), Ok(slot(1, MIB)));
        assert_eq!(t.resolve(cur(1, 2 * MIB), 0), Ok(slot(2, 2 * MIB)));
        assert_eq!(t.resolve(cur(0, 4 * MIB), 1), Ok(slot(3, 4 * MIB)));
        assert_eq!(t.resolve(cur(1, MIB), 1), Ok(slot(4, MIB)));
        assert_eq!(t.resolve(prev(1, 2 * MIB), 1), Ok(slot(2, 2 * MIB)));
        assert_eq!(t.resolve(cur(2, MIB), 1), Err(Unresolved::Missing));
        assert_eq!(
            t.resolve(cur(0, MIB), 1),
            Err(Unresolved::WrongSize {
                found: 4 * MIB,
                expected: MIB
            })
        );
        // The persistent role the plan names, by id.
        assert_eq!(
            t.resolve(Role::Persistent { alloc_id: 3 }, 7),
            Ok(slot(3, 4 * MIB))
        );
        assert_eq!(
            t.resolve(Role::Persistent { alloc_id: 4 }, 1),
            Err(Unresolved::Missing)
        );
        // Iteration 3 skips 2: iteration 1's table is no previous of it.
        t.allocated(12, slot(5, MIB));
        assert_eq!(t.resolve(cur(0, MIB), 3), Ok(slot(5, MIB)));
        assert_eq!(t.resolve(prev(0, 4 * MIB), 3), Err(Unresolved::Missing));
    }

    #[test]
    fn iterations_before_the_first_counted_are_not_tabled() {
        let mut t = RoleTables::new(&plan(0, 4), 2);
        t.allocated(7, slot(1, MIB));
        t.allocated(8, slot(2, MIB));
        let cur = transient(0, MIB, Iteration::Current);
        assert_eq!(t.resolve(cur, 1), Err(Unresolved::Missing));
        assert_eq!(t.resolve(cur, 2), Ok(slot(2, MIB)));
    }

    #[test]
    fn a_piece_resolves_to_its_bytes_only_while_live_and_in_bounds() {
        let mut t = RoleTables::new(&plan(0, 4), 0);
        t.allocated(0, slot(3, 4 * MIB));
        let piece = |offset, bytes| PieceRef {
            role: Role::Persistent { alloc_id: 3 },
            offset,
            bytes,
        };
        assert_eq!(
            t.piece_range(&piece(2 * MIB, MIB), 0, |_| true),
            Ok(((3 << 32) + 2 * MIB, MIB))
        );
        assert_eq!(
            t.piece_range(&piece(3 * MIB, 2 * MIB), 0, |_| true),
            Err(Unresolved::OutOfBounds {
                end: 5 * MIB,
                bytes: 4 * MIB
            })
        );
        assert_eq!(
            t.piece_range(&piece(0, MIB), 0, |_| false),
            Err(Unresolved::Freed)
        );
    }

    #[test]
    fn whole_pages_never_reach_past_the_range() {
        let p = 2 * MIB;
        assert_eq!(whole_pages(0, 4 * MIB, p), Some((0, 4 * MIB)));
        assert_eq!(whole_pages(MIB, 4 * MIB, p), Some((2 * MIB, 2 * MIB)));
        assert_eq!(whole_pages(MIB, 3 * MIB, p), Some((2 * MIB, 2 * MIB)));
        assert_eq!(whole_pages(MIB, 2 * MIB, p), None);
        assert_eq!(whole_pages(2 * MIB, MIB, p), None);
        assert_eq!(whole_pages(u64::MAX - 1, 1, p), None);
    }
}
