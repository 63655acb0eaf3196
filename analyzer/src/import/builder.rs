//! Incremental construction of a [`Trace`] from records in recording order.
//!
//! Shared by both importers so they agree on what is consistent: allocation ids are unique,
//! frees and accesses name live (known) allocations, durations name known launches. It does
//! not parse anything.

use std::collections::HashMap;

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
}

impl TraceBuilder {
    pub(crate) fn new(format: SourceFormat) -> Self {
        TraceBuilder {
            trace: Trace::new(format),
            by_id: HashMap::new(),
            op_by_seq: HashMap::new(),
        }
    }

    fn next_op(&self) -> u32 {
        self.trace.ops.len() as u32
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
        let idx = self.trace.allocations.len() as AllocIdx;
        if let Some(prev) = self.by_id.insert(id, idx) {
            let prev = &self.trace.allocations[prev as usize];
            if prev.free.is_none() {
                return Err(ModelError(format!("allocation id {id} is allocated twice")));
            }
        }
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
                touches.push(self.lookup(id)?);
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
        if self.op_by_seq.insert(seq, op).is_some() {
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
