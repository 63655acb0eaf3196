//! The analyzer's own in-memory view of a recorded run.
//!
//! Both importers (the capture format v1 and the project's own `tensile-trace` format) produce a
//! [`Trace`]; everything downstream (iteration detection, timelines, planning, simulation) reads
//! only this model. It is a faithful, index-based copy of what was recorded, in recording order;
//! it does not interpret anything (no iterations, no tensor identities: see `iteration` and
//! `cycle`).
//!
//! Ordering: device work is a sequence of [`Op`]s (kernel launches, application copies and
//! memsets). Every other event (allocation, free, sync) records `before_op`, the number of ops
//! recorded before it, which places it exactly between two ops.

use serde::Serialize;

/// Dense index of an allocation in [`Trace::allocations`].
pub type AllocIdx = u32;

/// What the trace says about one kernel handle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kernel {
    /// The handle number used by launches.
    pub id: u32,
    /// Mangled name as the driver reported it.
    pub name: String,
    /// Number of parameters.
    pub nparams: u32,
}

/// One device allocation, from its creation to its free (if the trace saw one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Allocation {
    /// The id the trace gave it (unique within a file).
    pub trace_id: u64,
    /// Device address.
    pub ptr: u64,
    /// Size in bytes.
    pub bytes: u64,
    /// Stream the allocation was ordered on (0 = legacy default stream).
    pub stream: u64,
    /// Host time of the allocation call, ns since the trace started.
    pub t_ns: u64,
    /// Number of ops recorded before the allocation.
    pub before_op: u32,
    /// The free, if recorded.
    pub free: Option<FreeEvent>,
}

/// When an allocation was freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FreeEvent {
    /// Host time of the free call.
    pub t_ns: u64,
    /// Number of ops recorded before the free.
    pub before_op: u32,
}

/// Direction of an application copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum CopyDir {
    /// Host to device.
    HostToDevice,
    /// Device to host.
    DeviceToHost,
    /// Device to device.
    DeviceToDevice,
    /// Direction inferred by the driver from the pointers.
    Any,
}

/// What kind of device work an op is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum OpKind {
    /// A kernel launch of this kernel handle.
    Launch {
        /// Kernel handle number (see [`Trace::kernels`]).
        kernel: u32,
    },
    /// An application copy.
    Copy {
        /// Direction.
        dir: CopyDir,
    },
    /// An application memset.
    Memset,
}

/// One unit of device work, in recording order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Op {
    /// Launch, copy or memset.
    pub kind: OpKind,
    /// Host time of the call.
    pub t_ns: u64,
    /// Stream handle (0 = legacy default stream).
    pub stream: u64,
    /// Launch sequence number (launches only; 0 for copies and memsets).
    pub seq: u64,
    /// Bytes moved or set (copies and memsets; 0 for launches).
    pub bytes: u64,
    /// Allocations the op touches, sorted, without duplicates.
    pub touches: Vec<AllocIdx>,
    /// Measured GPU duration, when the trace has one.
    pub gpu_ns: Option<u64>,
}

/// What a host synchronization waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SyncScope {
    /// One stream.
    Stream(u64),
    /// One event.
    Event(u64),
    /// The whole device / context.
    Device,
}

/// A host wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sync {
    /// Host time of the call.
    pub t_ns: u64,
    /// What was waited for.
    pub scope: SyncScope,
    /// Number of ops recorded before the sync.
    pub before_op: u32,
}

/// Which importer produced a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SourceFormat {
    /// Capture format v1 (text).
    CaptureV1,
    /// The project's own binary format (`tensile-trace`).
    Tensile,
}

/// A whole recorded run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Trace {
    /// Where it came from.
    pub format: SourceFormat,
    /// Kernel handles and names, in order of first appearance.
    pub kernels: Vec<Kernel>,
    /// Every allocation, in recording order.
    pub allocations: Vec<Allocation>,
    /// Device work, in recording order.
    pub ops: Vec<Op>,
    /// Host waits, in recording order.
    pub syncs: Vec<Sync>,
    /// Whether the trace ended cleanly (an end marker was read).
    pub complete: bool,
    /// How many of `allocations`, at its start, were made before the trace's first op and
    /// kept because they were still live when an online learner's window dropped the ops
    /// before them (their `before_op` is 0; which iteration made them, and in what order
    /// among that iteration's allocations, is not known). 0 for a whole trace.
    #[serde(skip_serializing_if = "is_zero")]
    pub predating_allocations: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Trace {
    /// An empty trace of the given format.
    pub fn new(format: SourceFormat) -> Self {
        Trace {
            format,
            kernels: Vec::new(),
            allocations: Vec::new(),
            ops: Vec::new(),
            syncs: Vec::new(),
            complete: false,
            predating_allocations: 0,
        }
    }

    /// Number of kernel launches.
    pub fn launch_count(&self) -> usize {
        self.ops
            .iter()
            .filter(|op| matches!(op.kind, OpKind::Launch { .. }))
            .count()
    }

    /// Name of a kernel handle, if the trace named it.
    pub fn kernel_name(&self, id: u32) -> Option<&str> {
        self.kernels
            .iter()
            .find(|k| k.id == id)
            .map(|k| k.name.as_str())
    }
}
