//! Completing swap-outs without the lock: the VMM calls that end a swap-out (the device
//! unit's unmap, its pages' host frames mapped at their addresses, the access call) cost 40
//! to 360 µs each on the H100, and every launch takes the manager's lock. So they are decided
//! under the lock ([`Inner::begin_completions`]: which units have landed, what to map), made
//! without it ([`Completions::run`]) and their outcome committed under it again
//! ([`Inner::commit_completions`]). Meanwhile the units' pages are *completing*: still
//! `ToHost` in the table (in `outgoing`), but nothing may remap them or cancel their
//! swap-out (their address may be unmapped at any moment), so an access to one waits for the
//! commit (`remap_stall`) and eviction, polling and the other completions leave them alone.
//! Pages of a leaving unit that no allocation holds are not mapped to their host frames:
//! the commit leaves them unbacked (an allocation landing on a completing page waits for the
//! commit, so none is held by one before then).

use std::time::Instant;

use tensile_driver_abi::{CUdeviceptr, CUresult};

use crate::memory::driver::{Driver, Event, PhysHandle};
use crate::memory::journal::BusyKind;
use crate::memory::page::ResidencyState;

use super::backing::map_and_give_access;
use super::{runs, Inner};

/// Units completed in one batch at most. An access to a page being completed waits for the
/// whole batch's commit: at about 2 ms a unit on the simulated card at `--time-scale 16` (the
/// H100's 40 to 360 µs per call, scaled), a shrink of a job waiting its turn completed 2,000
/// units in one batch, and an access of that job already past its launch hook waited 10 s for
/// it and failed. Thirty-two units keep such a wait to tens of milliseconds.
const COMPLETION_BATCH_UNITS: usize = 32;

/// One device unit whose swap-out copies have landed, to be completed.
#[derive(Debug)]
struct UnitCompletion {
    /// First page and pages.
    first: usize,
    pages: usize,
    /// Host allocations to map once the unit is unmapped: address, bytes, allocation (a host
    /// unit once, whole, or a single frame).
    host_maps: Vec<(CUdeviceptr, usize, PhysHandle)>,
    /// Pages of the unit no allocation holds (sorted): their host frames are not mapped, and
    /// the commit leaves them unbacked.
    dead: Vec<usize>,
}

/// Swap-outs being completed without the lock (see the module docs).
#[derive(Debug)]
pub(super) struct Completions {
    units: Vec<UnitCompletion>,
    base: CUdeviceptr,
    page: usize,
    device: i32,
    host_mapped: bool,
}

/// What [`Completions::run`] managed: the first `unmapped` units lost their device mapping;
/// `mapped` is whether their host frames were mapped at their addresses (if not, their pages
/// are left unmapped, their data safe in the host frames, and mapped again later).
#[derive(Debug, Clone, Copy)]
pub(super) struct CompletionOutcome {
    unmapped: usize,
    mapped: bool,
    error: Option<CUresult>,
    /// When the driver calls started and ended (for the journal).
    ran: (Instant, Instant),
}

impl CompletionOutcome {
    /// The first driver error the calls met, if any.
    pub(super) fn error(&self) -> Option<CUresult> {
        self.error
    }
}

impl Completions {
    pub(super) fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    fn va(&self, page: usize) -> CUdeviceptr {
        self.base + (page * self.page) as u64
    }

    /// Makes the driver calls, in the order that keeps the pages consistent at every failure:
    /// each unit unmapped whole (a failure stops there: that unit and the rest stay `ToHost`),
    /// then the host frames of the units unmapped mapped and given access (a failure undoes
    /// its own maps). Called without the manager's lock.
    pub(super) fn run(&self, driver: &dyn Driver) -> CompletionOutcome {
        let started = Instant::now();
        let mut outcome = CompletionOutcome {
            unmapped: 0,
            mapped: true,
            error: None,
            ran: (started, started),
        };
        self.run_calls(driver, &mut outcome);
        outcome.ran.1 = Instant::now();
        outcome
    }

    fn run_calls(&self, driver: &dyn Driver, outcome: &mut CompletionOutcome) {
        for u in &self.units {
            if let Err(e) = driver.mem_unmap(self.va(u.first), u.pages * self.page) {
                outcome.error = Some(e);
                break;
            }
            outcome.unmapped += 1;
        }
        if !self.host_mapped || outcome.unmapped == 0 {
            return;
        }
        let done = &self.units[..outcome.unmapped];
        let maps: Vec<(CUdeviceptr, usize, PhysHandle)> = done
            .iter()
            .flat_map(|u| u.host_maps.iter().copied())
            .collect();
        let pages: Vec<usize> = done
            .iter()
            .flat_map(|u| (u.first..u.first + u.pages).filter(|q| u.dead.binary_search(q).is_err()))
            .collect();
        let access: Vec<(CUdeviceptr, usize)> = runs(&pages)
            .into_iter()
            .map(|(a, b)| (self.va(a), (b - a + 1) * self.page))
            .collect();
        if let Err(e) = map_and_give_access(driver, &maps, &access, self.device) {
            outcome.mapped = false;
            outcome.error = outcome.error.or(Some(e));
        }
    }
}

impl Inner {
    /// Finds the swap-outs whose copies have landed (every page of the unit `ToHost`, its
    /// copy's event complete, unpinned, not completing already), marks their pages
    /// completing and says what completing them takes.
    pub(super) fn begin_completions(&mut self) -> Result<Completions, CUresult> {
        let mut done: std::collections::HashMap<Event, bool> = std::collections::HashMap::new();
        // Units an access waits for first (handed over: `handover.rs`), then in page order.
        let urgent = std::mem::take(&mut self.urgent_completions);
        let urgent: Vec<usize> = urgent
            .into_iter()
            .filter(|p| self.outgoing.contains(p))
            .collect();
        let n_urgent = urgent.len();
        let outgoing: Vec<usize> = urgent
            .into_iter()
            .chain(self.outgoing.iter().copied())
            .collect();
        let mut units: Vec<UnitCompletion> = Vec::new();
        let mut done_to = 0;
        let mut failed = None;
        for (i, p) in outgoing.into_iter().enumerate() {
            if units.len() == COMPLETION_BATCH_UNITS {
                break;
            }
            let in_order = i >= n_urgent;
            if (in_order && p < done_to) || self.completing.contains(&p) {
                continue;
            }
            let Some((a, n)) = self.unit_span(p) else {
                continue;
            };
            if units.iter().any(|u| u.first == a) {
                continue; // taken first, as urgent
            }
            if in_order {
                done_to = a + n;
            }
            // A pinned page's swap-out is about to be cancelled by the access that pinned it,
            // unless its frames were handed over: then that access waits for this completion.
            let handed = self.is_handed(a);
            let mut landed = true;
            for q in a..a + n {
                let event = match self
                    .pages
                    .get(q)
                    .filter(|e| e.pins == 0 || handed)
                    .map(|e| e.state)
                {
                    Some(ResidencyState::ToHost { event, .. }) if !self.completing.contains(&q) => {
                        event
                    }
                    _ => {
                        landed = false;
                        break;
                    }
                };
                let d = match done.get(&event) {
                    Some(&d) => d,
                    None => match self.driver.event_query(event) {
                        Ok(d) => {
                            done.insert(event, d);
                            d
                        }
                        Err(e) => {
                            failed = Some(e);
                            false
                        }
                    },
                };
                if !d {
                    landed = false;
                    break;
                }
            }
            if failed.is_some() {
                break;
            }
            if !landed {
                continue;
            }
            // A host frame (or host unit) whose pages no allocation holds is not mapped: the
            // pages go unbacked at the commit, which saves a mapping and an access call now
            // and an unmap later. A unit leaves whole, freed tensors' pages with it: 47% of
            // the host mappings of ResNet-50's LRU rerun were such pages (docs/rerun.md).
            let mut host_maps = Vec::new();
            let mut dead = Vec::new();
            for q in a..a + n {
                let Some(ResidencyState::ToHost { host, .. }) = self.pages.get(q).map(|e| e.state)
                else {
                    continue;
                };
                let (first, k) = self.host.unit_of(host);
                if host != first {
                    continue;
                }
                if self.span_all((q, k), |e| e.live == 0) {
                    dead.extend(q..q + k);
                } else {
                    host_maps.push((self.va(q), k * self.page, self.host.location(host).0));
                }
            }
            self.completing.extend(a..a + n);
            units.push(UnitCompletion {
                first: a,
                pages: n,
                host_maps,
                dead,
            });
        }
        let completions = Completions {
            units,
            base: self.base,
            page: self.page,
            device: self.cfg.device,
            host_mapped: self.cfg.host_mapped,
        };
        match failed {
            // What was marked is still completed by the caller; the error is seen again.
            Some(e) if completions.is_empty() => Err(e),
            _ => Ok(completions),
        }
    }

    /// Commits what [`Completions::run`] did: the units unmapped end their swap-outs (their
    /// device frames are free, their pages `Host`), the others stay `ToHost` to be completed
    /// later; none is completing any more.
    pub(super) fn commit_completions(&mut self, c: Completions, outcome: CompletionOutcome) {
        self.remaps_committed += 1;
        if let Some(j) = &self.journal {
            let pages = c.units[..outcome.unmapped].iter().map(|u| u.pages).sum();
            j.busy(outcome.ran.0, outcome.ran.1, BusyKind::RemapOut, pages);
        }
        let completed = self.fences.completed().to_vec();
        let mut fell_back = false;
        for (i, u) in c.units.iter().enumerate() {
            let span = u.first..u.first + u.pages;
            for q in span.clone() {
                self.completing.remove(&q);
            }
            if i >= outcome.unmapped {
                continue;
            }
            // A unit handed over keeps its frames: the pages read back into them hold them.
            let handed = match self.pages.get(u.first).and_then(|e| e.state.device_frame()) {
                Some(d) if self.is_handed(u.first) => {
                    self.handed.remove(&d.unit);
                    self.dev.end_hand_over(d);
                    true
                }
                _ => false,
            };
            for q in span {
                let event = match self.pages.get(q).map(|e| e.state) {
                    Some(ResidencyState::ToHost { event, .. }) => event,
                    _ => {
                        debug_assert!(false, "page {q} left ToHost while completing");
                        continue;
                    }
                };
                match self.pages.finish_swap_out(q, |_| true) {
                    Ok(d) => {
                        self.outgoing.remove(&q);
                        // A freed page that left with its unit holds no device frame any more.
                        self.dead_device.remove(&q);
                        if !handed {
                            self.dev.give(d);
                        }
                        self.unref_event(event);
                    }
                    Err(e) => {
                        debug_assert!(false, "completing page {q}: {e:?}");
                        continue;
                    }
                }
                // A host unit goes back to the pool whole: its dead pages are dropped only if
                // every page of it can be (a page whose uses' fences were not polled yet keeps
                // the whole unit on the host, mapped by `remap_host` below; dropping the others
                // split the unit, one frame of it given back while its neighbour held the rest).
                let dead = u.dead.binary_search(&q).is_ok();
                let droppable = dead
                    && self.host_unit_span(q).is_none_or(|span| {
                        self.span_all(span, |e| e.live == 0 && e.is_idle(&completed))
                    });
                fell_back |= dead && !droppable;
                let unbacked = droppable
                    && match self.pages.unback(q, &completed) {
                        Ok(f) => {
                            self.give_frame(f);
                            true
                        }
                        Err(_) => {
                            // Its uses completed before its copy out, but the fences that say
                            // so were not polled yet: it stays on the host, its frame mapped
                            // by `remap_host` below.
                            fell_back = true;
                            false
                        }
                    };
                if !unbacked && (dead || !outcome.mapped || !self.cfg.host_mapped) {
                    self.unmapped_host.insert(q);
                }
            }
        }
        if let Some(e) = outcome.error {
            tracing::debug!(
                code = e,
                "completing swap-outs failed part way; retried later"
            );
        }
        if !outcome.mapped || fell_back {
            self.remap_host();
        }
    }
}
