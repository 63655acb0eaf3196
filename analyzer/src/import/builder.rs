//! Incremental construction of a [`Trace`] from records in recording order.
//!
//! Shared by both importers so they agree on what is consistent: allocation ids are unique,
//! frees and accesses name live (known) allocations, durations name known launches. It does
//! not parse anything.

use std::collections::HashMap;

use tensile_trace::{CopyKind, Record};

use super::error::ModelError;
use crate::model::{
    AllocIdx, Allocation, CopyDir, FreeEvent, Kernel, Op, OpKind, SourceFormat, Sync, SyncScope,
    Trace,
};

/// Builds a [`Trace`] one event at a time.
pub(crate) struct TraceBuilder {
    trace: Trace,
    by_id: HashMap<u64, AllocIdx>,
    op_by_seq: HashMap<u64, u32>,
    /// Accesses to unknown allocations are left out instead of refused, and a launch number
    /// seen again replaces the old one: for a live stream that may have lost records or
    /// started mid-run (the online learner), where an importer would reject the file.
    lenient: bool,
}

impl TraceBuilder {
    pub(crate) fn new(format: SourceFormat) -> Self {
        TraceBuilder {
            trace: Trace::new(format),
            by_id: HashMap::new(),
            op_by_seq: HashMap::new(),
            lenient: false,
        }
    }

    /// A builder for a live stream (see `lenient`).
    pub(crate) fn lenient(format: SourceFormat) -> Self {
        TraceBuilder {
            lenient: true,
            ..TraceBuilder::new(format)
        }
    }

    /// The trace so far.
    pub(crate) fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Forgets the ops before op `cut` and what only they needed: allocations freed before it
    /// and host waits before it. Allocations still live at `cut` are kept, as if made just
    /// before the first op kept; everything is renumbered from there.
    pub(crate) fn drop_ops_before(&mut self, cut: usize) {
        let cut = cut.min(self.trace.ops.len());
        let cut32 = cut as u32;
        let mut new_index: Vec<Option<AllocIdx>> = Vec::with_capacity(self.trace.allocations.len());
        let mut kept = Vec::new();
        // Recording order: those made before the cut come first.
        let mut predating = 0;
        for a in self.trace.allocations.drain(..) {
            if a.free.is_some_and(|f| f.before_op <= cut32) {
                new_index.push(None);
                continue;
            }
            predating += usize::from(a.before_op < cut32);
            new_index.push(Some(kept.len() as AllocIdx));
            kept.push(Allocation {
                before_op: a.before_op.saturating_sub(cut32),
                free: a.free.map(|f| FreeEvent {
                    t_ns: f.t_ns,
                    before_op: f.before_op - cut32,
                }),
                ..a
            });
        }
        self.trace.predating_allocations = predating;
        self.trace.allocations = kept;
        self.trace.ops.drain(..cut);
        for op in &mut self.trace.ops {
            op.touches = op
                .touches
                .iter()
                .filter_map(|&t| new_index.get(t as usize).copied().flatten())
                .collect();
        }
        self.trace.syncs.retain(|s| s.before_op >= cut32);
        for s in &mut self.trace.syncs {
            s.before_op -= cut32;
        }
        self.by_id = self
            .trace
            .allocations
            .iter()
            .enumerate()
            .map(|(i, a)| (a.trace_id, i as AllocIdx))
            .collect();
        self.op_by_seq = self
            .trace
            .ops
            .iter()
            .enumerate()
            .filter(|(_, op)| matches!(op.kind, OpKind::Launch { .. }))
            .map(|(i, op)| (op.seq, i as u32))
            .collect();
    }

    fn next_op(&self) -> u32 {
        self.trace.ops.len() as u32
    }

    /// Adds one record of the project's own format (a file being read, or the online
    /// learner's live stream). `Header`, `Stats` and `End` describe the stream, not the run,
    /// and `Swap`, `Busy` and `Plan` what the library did, not the program: nothing to add
    /// (the caller decides what they mean).
    pub(crate) fn record(&mut self, record: &Record) -> Result<(), ModelError> {
        match record {
            Record::Kernel(k) => {
                self.kernel(k.id, k.nparams, k.name.clone());
                Ok(())
            }
            Record::Alloc(a) => self.alloc(a.t_ns, a.stream, a.id, a.ptr, a.bytes),
            Record::Free(f) => self.free(f.t_ns, f.id),
            Record::Launch(l) => self.launch(
                l.t_ns,
                l.stream,
                l.seq,
                l.kernel,
                l.accesses.iter().map(|a| a.alloc),
            ),
            Record::LaunchTime(t) => self.duration(t.seq, t.gpu_ns),
            Record::Copy(c) => {
                let dir = match c.kind {
                    CopyKind::HostToDevice => CopyDir::HostToDevice,
                    CopyKind::DeviceToHost => CopyDir::DeviceToHost,
                    CopyKind::DeviceToDevice => CopyDir::DeviceToDevice,
                    CopyKind::Any => CopyDir::Any,
                };
                self.copy(c.t_ns, c.stream, dir, c.dst, c.src, c.bytes)
            }
            Record::Memset(m) => self.memset(m.t_ns, m.stream, m.dst, m.bytes),
            Record::Sync(s) => {
                let scope = match s.scope {
                    tensile_trace::SyncScope::Stream(h) => SyncScope::Stream(h),
                    tensile_trace::SyncScope::Event(h) => SyncScope::Event(h),
                    tensile_trace::SyncScope::Context => SyncScope::Device,
                };
                self.sync(s.t_ns, scope);
                Ok(())
            }
            Record::Header(_)
            | Record::Stats(_)
            | Record::End(_)
            | Record::Swap(_)
            | Record::Busy(_)
            | Record::Plan(_) => Ok(()),
        }
    }

    pub(crate) fn kernel(&mut self, id: u32, nparams: u32, name: String) {
        match self.trace.kernels.iter_mut().find(|k| k.id == id) {
            // A handle can be reused after a module unload; the newest name wins.
            Some(k) => {
                k.name = name;
                k.nparams = nparams;
            }
            None => self.trace.kernels.push(Kernel { id, name, nparams }),
        }
    }

    pub(crate) fn alloc(
        &mut self,
        t_ns: u64,
        stream: u64,
        id: u64,
        ptr: u64,
        bytes: u64,
    ) -> Result<(), ModelError> {
        if id == 0 {
            return Err(ModelError(
                "allocation id 0 is reserved for host memory".into(),
            ));
        }
        // Refused before anything changes: a live stream repeats an allocation it re-announces
        // (a coordinator joined mid-run is told the live allocations while some of their
        // records are still on their way), and the first one must stay the one its id names.
        if let Some(&prev) = self.by_id.get(&id) {
            if self.trace.allocations[prev as usize].free.is_none() {
                return Err(ModelError(format!("allocation id {id} is allocated twice")));
            }
        }
        let idx = self.trace.allocations.len() as AllocIdx;
        self.by_id.insert(id, idx);
        let before_op = self.next_op();
        self.trace.allocations.push(Allocation {
            trace_id: id,
            ptr,
            bytes,
            stream,
            t_ns,
            before_op,
            free: None,
        });
        Ok(())
    }

    fn lookup(&self, id: u64) -> Result<AllocIdx, ModelError> {
        self.by_id
            .get(&id)
            .copied()
            .ok_or_else(|| ModelError(format!("allocation id {id} was never allocated")))
    }

    pub(crate) fn free(&mut self, t_ns: u64, id: u64) -> Result<(), ModelError> {
        let idx = self.lookup(id)?;
        let before_op = self.next_op();
        let alloc = &mut self.trace.allocations[idx as usize];
        if alloc.free.is_some() {
            return Err(ModelError(format!("allocation id {id} is freed twice")));
        }
        alloc.free = Some(FreeEvent { t_ns, before_op });
        Ok(())
    }

    /// Maps trace ids to dense indices, sorted and deduplicated; id 0 (host) is skipped.
    fn touches(&self, ids: impl IntoIterator<Item = u64>) -> Result<Vec<AllocIdx>, ModelError> {
        let mut touches = Vec::new();
        for id in ids {
            if id != 0 {
                match self.lookup(id) {
                    Ok(idx) => touches.push(idx),
                    Err(_) if self.lenient => {}
                    Err(e) => return Err(e),
                }
            }
        }
        touches.sort_unstable();
        touches.dedup();
        Ok(touches)
    }

    pub(crate) fn launch(
        &mut self,
        t_ns: u64,
        stream: u64,
        seq: u64,
        kernel: u32,
        ids: impl IntoIterator<Item = u64>,
    ) -> Result<(), ModelError> {
        let touches = self.touches(ids)?;
        let op = self.next_op();
        if self.op_by_seq.insert(seq, op).is_some() && !self.lenient {
            return Err(ModelError(format!("launch number {seq} appears twice")));
        }
        self.trace.ops.push(Op {
            kind: OpKind::Launch { kernel },
            t_ns,
            stream,
            seq,
            bytes: 0,
            touches,
            gpu_ns: None,
        });
        Ok(())
    }

    pub(crate) fn duration(&mut self, seq: u64, gpu_ns: u64) -> Result<(), ModelError> {
        let op = self.op_by_seq.get(&seq).copied().ok_or_else(|| {
            ModelError(format!("duration for launch {seq}, which was never seen"))
        })?;
        self.trace.ops[op as usize].gpu_ns = Some(gpu_ns);
        Ok(())
    }

    pub(crate) fn copy(
        &mut self,
        t_ns: u64,
        stream: u64,
        dir: CopyDir,
        dst: u64,
        src: u64,
        bytes: u64,
    ) -> Result<(), ModelError> {
        let touches = self.touches([dst, src])?;
        self.trace.ops.push(Op {
            kind: OpKind::Copy { dir },
            t_ns,
            stream,
            seq: 0,
            bytes,
            touches,
            gpu_ns: None,
        });
        Ok(())
    }

    pub(crate) fn memset(
        &mut self,
        t_ns: u64,
        stream: u64,
        dst: u64,
        bytes: u64,
    ) -> Result<(), ModelError> {
        let touches = self.touches([dst])?;
        self.trace.ops.push(Op {
            kind: OpKind::Memset,
            t_ns,
            stream,
            seq: 0,
            bytes,
            touches,
            gpu_ns: None,
        });
        Ok(())
    }

    pub(crate) fn sync(&mut self, t_ns: u64, scope: SyncScope) {
        let before_op = self.next_op();
        self.trace.syncs.push(Sync {
            t_ns,
            scope,
            before_op,
        });
    }

    pub(crate) fn finish(mut self, complete: bool) -> Trace {
        self.trace.complete = complete;
        self.trace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_the_oldest_ops_keeps_live_allocations_and_renumbers_the_rest() {
        let mut b = TraceBuilder::lenient(SourceFormat::Tensile);
        b.alloc(0, 0, 1, 0x1000, 64).unwrap(); // lives throughout
        b.alloc(0, 0, 2, 0x2000, 32).unwrap(); // freed before the cut
        b.launch(1, 0, 10, 7, [1, 2]).unwrap();
        b.free(2, 2).unwrap();
        b.launch(3, 0, 11, 8, [1]).unwrap();
        b.alloc(4, 0, 3, 0x3000, 16).unwrap(); // made after the cut
        b.launch(5, 0, 12, 9, [1, 3]).unwrap();
        b.sync(6, SyncScope::Device);
        b.free(7, 3).unwrap();
        b.drop_ops_before(2);
        let t = b.trace();
        assert_eq!(t.ops.len(), 1);
        assert_eq!(t.ops[0].seq, 12);
        let ids: Vec<u64> = t.allocations.iter().map(|a| a.trace_id).collect();
        assert_eq!(ids, vec![1, 3]);
        // Allocation 1 now looks made before the first op kept; 3 keeps its place.
        assert_eq!(
            t.predating_allocations, 1,
            "1 was made before the cut, 3 after"
        );
        assert_eq!(t.allocations[0].before_op, 0);
        assert_eq!(t.allocations[1].before_op, 0);
        assert_eq!(t.allocations[1].free.map(|f| f.before_op), Some(1));
        assert_eq!(t.ops[0].touches, vec![0, 1]);
        assert_eq!(t.syncs.len(), 1);
        assert_eq!(t.syncs[0].before_op, 1);
        // Launches and allocations are still found by number and id after the cut; those
        // dropped are not.
        assert!(b.duration(12, 500).is_ok());
        assert!(b.duration(10, 500).is_err());
        assert!(b.launch(8, 0, 13, 9, [1, 2]).is_ok());
        assert_eq!(b.trace().ops[1].touches, vec![0]);
        assert_eq!(b.trace().ops[0].gpu_ns, Some(500));
    }

    #[test]
    fn a_strict_builder_refuses_what_a_lenient_one_leaves_out() {
        let mut strict = TraceBuilder::new(SourceFormat::Tensile);
        assert!(strict.launch(0, 0, 1, 1, [5]).is_err());
        strict.launch(0, 0, 2, 1, []).unwrap();
        assert!(strict.launch(0, 0, 2, 1, []).is_err());
        let mut lenient = TraceBuilder::lenient(SourceFormat::Tensile);
        lenient.launch(0, 0, 1, 1, [5]).unwrap();
        lenient.launch(0, 0, 1, 1, []).unwrap();
        assert_eq!(lenient.trace().ops.len(), 2);
    }
}
