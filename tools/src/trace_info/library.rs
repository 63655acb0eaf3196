//! What the library itself did in a run, from the records it writes (format 2): the copies it
//! queued between the device and its host pool ([`Swap`]), the host time it spent
//! ([`Busy`]: stalled accesses, remaps, pinning, waits for its lock) and the plans that came
//! and went ([`PlanChange`]). Summed for the report and kept for the timeline.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tensile_trace::{Busy, BusyKind, PlanChange, PlanChangeKind, Record, Swap, SwapCause, SwapDir};

use super::{bytes, ms};

/// The library's own records of a trace, in file order.
#[derive(Debug, Default)]
pub struct LibraryWork {
    pub swaps: Vec<Swap>,
    pub busy: Vec<Busy>,
    pub plans: Vec<PlanChange>,
}

impl LibraryWork {
    /// Keeps `record` if it is one of the library's; returns whether it was.
    pub fn add(&mut self, record: &Record) -> bool {
        match record {
            Record::Swap(s) => self.swaps.push(s.clone()),
            Record::Busy(b) => self.busy.push(b.clone()),
            Record::Plan(p) => self.plans.push(p.clone()),
            _ => return false,
        }
        true
    }

    pub fn is_empty(&self) -> bool {
        self.swaps.is_empty() && self.busy.is_empty() && self.plans.is_empty()
    }

    /// The report's lines: swaps by direction and cause, host time by kind, plans. Nothing
    /// for a trace without such records (written by a library before format 2, or without
    /// a memory manager).
    pub fn report(&self) -> String {
        let mut out = String::new();
        for dir in [SwapDir::ToHost, SwapDir::ToDevice] {
            let mut by_cause: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
            let (mut copies, mut pages, mut moved) = (0u64, 0u64, 0u64);
            for s in self.swaps.iter().filter(|s| s.dir == dir) {
                copies += 1;
                pages += u64::from(s.pages);
                moved += s.bytes;
                let e = by_cause.entry(cause_name(s.dir, s.cause)).or_default();
                e.0 += u64::from(s.pages);
                e.1 += s.bytes;
            }
            if copies == 0 {
                continue;
            }
            let causes: Vec<String> = by_cause
                .iter()
                .map(|(name, (p, b))| format!("{name} {p} ({})", bytes(*b)))
                .collect();
            let _ = writeln!(
                out,
                "library swaps {}: {copies} copies, {pages} pages, {} copied; pages by cause: {}",
                match dir {
                    SwapDir::ToHost => "out",
                    SwapDir::ToDevice => "in",
                },
                bytes(moved),
                causes.join(", ")
            );
        }
        if !self.busy.is_empty() {
            let mut by_kind: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
            for b in &self.busy {
                let e = by_kind.entry(busy_name(b.kind)).or_default();
                e.0 += 1;
                e.1 += b.dur_ns;
            }
            let kinds: Vec<String> = by_kind
                .iter()
                .map(|(name, (n, ns))| format!("{name} {n} for {}", ms(*ns)))
                .collect();
            let _ = writeln!(out, "library host time: {}", kinds.join("; "));
        }
        for p in &self.plans {
            let _ = match &p.change {
                PlanChangeKind::Loaded {
                    applies_from, plan, ..
                } => writeln!(
                    out,
                    "plan {} loaded at launch {}, applying from launch {applies_from} ({} bytes)",
                    p.version,
                    p.launches,
                    plan.len()
                ),
                PlanChangeKind::Dropped { reason } => {
                    writeln!(out, "plan {} dropped {reason}", p.version)
                }
            };
        }
        out
    }
}

/// How the report and the timeline name why pages moved.
pub fn cause_name(dir: SwapDir, cause: SwapCause) -> &'static str {
    match (dir, cause) {
        (SwapDir::ToHost, SwapCause::Plan) => "planned",
        (SwapDir::ToDevice, SwapCause::Plan) => "prefetched",
        (SwapDir::ToHost, SwapCause::Access) => "for an access",
        (SwapDir::ToDevice, SwapCause::Access) => "on demand",
        (_, SwapCause::Prefetch) => "for a prefetch",
        (_, SwapCause::Allocation) => "for an allocation",
        (_, SwapCause::Reserve) => "for the free reserve",
        (_, SwapCause::Budget) => "for a smaller budget",
    }
}

/// How the report and the timeline name host time spent.
pub fn busy_name(kind: BusyKind) -> &'static str {
    match kind {
        BusyKind::Stall => "stalled accesses",
        BusyKind::RemapIn => "remaps in",
        BusyKind::RemapOut => "remaps out",
        BusyKind::HostPin => "pinning host memory",
        BusyKind::LockWait => "lock waits",
        BusyKind::Waited => "other calls that waited",
    }
}
