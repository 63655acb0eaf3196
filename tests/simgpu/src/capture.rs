//! Stream capture: what a capturing stream records instead of executing, the graphs that
//! come out of it, and the capture-mode rules for "potentially unsafe" calls.
//!
//! One capture belongs to one stream (single-stream capture: forking into another stream
//! through an event is refused with `CUDA_ERROR_NOT_SUPPORTED`). While it is active, work
//! queued on the stream becomes [`Node`]s of the capture's graph; `cuGraphLaunch` later
//! queues those nodes on a stream, in order. Stream-ordered allocations made during the
//! capture (graph memory nodes) are allocated when captured and freed when the graph and
//! every executable made from it are gone ([`GraphMemory`]): their addresses are fixed for
//! the graph's lifetime, as on the driver, and a captured free frees nothing while the graph
//! lives.
//!
//! The capture-mode rules follow `cuThreadExchangeStreamCaptureMode`'s documentation: a
//! thread in GLOBAL mode may not make an unsafe call while it has a non-relaxed capture of
//! its own or any thread has a GLOBAL capture; THREAD_LOCAL only looks at its own captures;
//! RELAXED never refuses. A refused call invalidates the captures it violated.
//!
//! This module does not know the API's handles or argument rules: `api::graph` does.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use tensile_driver_abi::*;

use crate::event::Event;
use crate::ops::Op;
use crate::pool::Pool;

/// One recorded step of a graph.
#[derive(Clone)]
pub enum Node {
    /// A kernel, copy or memset: queued again at every launch.
    Op(Op),
    /// An event record: a fresh record of the event at every launch.
    Record(Arc<Event>),
    /// A wait on an event recorded outside the graph, captured with
    /// `CU_EVENT_WAIT_EXTERNAL`: waits for the event's record current at launch.
    WaitExternal(Arc<Event>),
}

/// Stream-ordered allocations owned by a graph (its memory nodes).
#[derive(Default)]
pub struct GraphMemory {
    blocks: Mutex<Vec<(u64, Option<Arc<Pool>>)>>,
}

impl GraphMemory {
    pub fn add(&self, addr: u64, pool: Option<Arc<Pool>>) {
        lock(&self.blocks).push((addr, pool));
    }

    pub fn contains(&self, addr: u64) -> bool {
        lock(&self.blocks).iter().any(|(a, _)| *a == addr)
    }
}

impl Drop for GraphMemory {
    fn drop(&mut self) {
        let Ok(state) = crate::state::get() else {
            return;
        };
        for (addr, pool) in lock(&self.blocks).drain(..) {
            // An application may have freed a graph allocation itself (outside the graph):
            // then it is gone already and there is nothing to do.
            if let Ok((bytes, _)) = state.space.free_linear(addr, false) {
                if let Some(p) = pool {
                    p.freed(bytes);
                }
            }
        }
    }
}

/// A finished capture (`CUgraph`) or an instantiation of one (`CUgraphExec`): the nodes in
/// stream order and the memory they use.
pub struct Graph {
    pub nodes: Vec<Node>,
    pub memory: Arc<GraphMemory>,
}

struct CaptureState {
    nodes: Vec<Node>,
    invalidated: bool,
}

/// An active capture sequence on one stream.
pub struct Capture {
    pub id: u64,
    pub mode: CUstreamCaptureMode,
    pub thread: ThreadId,
    pub memory: Arc<GraphMemory>,
    invalidated: AtomicBool,
    state: Mutex<CaptureState>,
}

static NEXT_CAPTURE_ID: AtomicU64 = AtomicU64::new(1);

/// Every capture not yet ended, for the mode checks of other threads.
static ACTIVE: Mutex<Vec<Arc<Capture>>> = Mutex::new(Vec::new());

thread_local! {
    static THREAD_MODE: Cell<CUstreamCaptureMode> =
        const { Cell::new(CU_STREAM_CAPTURE_MODE_GLOBAL) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Capture {
    /// Starts a capture by the calling thread and registers it as active.
    pub fn begin(mode: CUstreamCaptureMode) -> Arc<Capture> {
        let c = Arc::new(Capture {
            id: NEXT_CAPTURE_ID.fetch_add(1, Ordering::Relaxed),
            mode,
            thread: std::thread::current().id(),
            memory: Arc::new(GraphMemory::default()),
            invalidated: AtomicBool::new(false),
            state: Mutex::new(CaptureState {
                nodes: Vec::new(),
                invalidated: false,
            }),
        });
        lock(&ACTIVE).push(c.clone());
        c
    }

    /// Ends the capture: the graph, or `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
    pub fn end(&self) -> Result<Graph, CUresult> {
        lock(&ACTIVE).retain(|c| c.id != self.id);
        let mut st = lock(&self.state);
        if st.invalidated {
            return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        Ok(Graph {
            nodes: std::mem::take(&mut st.nodes),
            memory: self.memory.clone(),
        })
    }

    /// Invalidates the capture; the first time, says why on stderr (as a sticky fault does),
    /// so that a test failing with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` shows the cause.
    pub fn invalidate(&self, why: &str) {
        if !self.invalidated.swap(true, Ordering::AcqRel) {
            eprintln!("tensile-simgpu: capture {} invalidated: {why}", self.id);
        }
        lock(&self.state).invalidated = true;
    }

    pub fn is_invalidated(&self) -> bool {
        self.invalidated.load(Ordering::Acquire)
    }

    /// Appends a node; an invalidated capture refuses further work, as on the driver.
    pub fn append(&self, node: Node) -> Result<(), CUresult> {
        let mut st = lock(&self.state);
        if st.invalidated {
            return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        st.nodes.push(node);
        Ok(())
    }

    /// Nodes captured so far (`cuStreamGetCaptureInfo`'s dependency count).
    pub fn node_count(&self) -> usize {
        lock(&self.state).nodes.len()
    }
}

/// The calling thread's capture interaction mode.
pub fn thread_mode() -> CUstreamCaptureMode {
    THREAD_MODE
        .try_with(Cell::get)
        .unwrap_or(CU_STREAM_CAPTURE_MODE_GLOBAL)
}

/// `cuThreadExchangeStreamCaptureMode`: sets the mode, returns the previous one.
pub fn exchange_thread_mode(mode: CUstreamCaptureMode) -> CUstreamCaptureMode {
    THREAD_MODE
        .try_with(|m| m.replace(mode))
        .unwrap_or(CU_STREAM_CAPTURE_MODE_GLOBAL)
}

/// Gate of a potentially unsafe call (synchronous allocation, free, copy, memset, context
/// synchronization): `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` when the calling thread's mode
/// forbids it, after invalidating the captures it would have broken.
pub fn check_unsafe_call() -> Result<(), CUresult> {
    let mode = thread_mode();
    if mode == CU_STREAM_CAPTURE_MODE_RELAXED {
        return Ok(());
    }
    let me = std::thread::current().id();
    let mut refused = false;
    for c in lock(&ACTIVE).iter() {
        let own = c.thread == me && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
        let foreign_global = c.thread != me
            && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL
            && mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if own || foreign_global {
            c.invalidate("a potentially unsafe call (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)");
            refused = true;
        }
    }
    if refused {
        Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    } else {
        Ok(())
    }
}

/// Invalidates the active capture with this id, if it is still active.
pub fn invalidate_by_id(id: u64, why: &str) {
    if let Some(c) = lock(&ACTIVE).iter().find(|c| c.id == id) {
        c.invalidate(why);
    }
}
