//! Stream capture and CUDA graphs: begin/end capture, capture queries, the thread capture
//! mode, instantiation, launch and destruction of graphs made by capture.
//!
//! Only graphs made by stream capture exist (no explicit node API). Rules taken from the
//! driver documentation: the legacy stream cannot capture
//! (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); beginning on a capturing stream or ending a
//! stream that is not capturing is `CUDA_ERROR_ILLEGAL_STATE`; a non-relaxed capture must be
//! ended by the thread that began it (`CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`); ending an
//! invalidated capture is `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` with no graph; a wait on an
//! event recorded outside the capture is `CUDA_ERROR_STREAM_CAPTURE_ISOLATION` (unless
//! `CU_EVENT_WAIT_EXTERNAL`) and invalidates it.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::Arc;

use tensile_driver_abi::*;

use super::{export, per_thread_pair, resolve_stream, st, Out};
use crate::capture::{self, Capture, Graph, Node};
use crate::event::Event;
use crate::ops::Op;
use crate::stream::{Dependency, StreamKind};

unsafe fn begin_capture(pt: bool, h: CUstream, mode: c_uint) -> Result<(), CUresult> {
    if mode > CU_STREAM_CAPTURE_MODE_RELAXED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, stream) = resolve_stream(h, pt)?;
    ctx.check()?;
    if stream.kind == StreamKind::Legacy {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    if stream.capture().is_some() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    stream.set_capture(Some(Capture::begin(mode)));
    Ok(())
}

/// The CUDA 10.0 form has no mode argument: global mode, the runtime's default.
unsafe fn begin_capture_v1(pt: bool, h: CUstream) -> Result<(), CUresult> {
    // SAFETY: same contract.
    unsafe { begin_capture(pt, h, CU_STREAM_CAPTURE_MODE_GLOBAL) }
}
per_thread_pair!(cuStreamBeginCapture, cuStreamBeginCapture_ptsz, begin_capture_v1, (h: CUstream));
per_thread_pair!(cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz, begin_capture, (h: CUstream, mode: c_uint));

unsafe fn end_capture(pt: bool, h: CUstream, graph: *mut CUgraph) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(graph) }?;
    let (_, stream) = resolve_stream(h, pt)?;
    let c = stream.capture().ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    if c.mode != CU_STREAM_CAPTURE_MODE_RELAXED && c.thread != std::thread::current().id() {
        return Err(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    }
    stream.set_capture(None);
    match c.end() {
        Ok(g) => {
            out.set(st()?.graphs.insert(Arc::new(g)) as CUgraph);
            Ok(())
        }
        Err(code) => {
            out.set(std::ptr::null_mut());
            Err(code)
        }
    }
}
per_thread_pair!(cuStreamEndCapture, cuStreamEndCapture_ptsz, end_capture, (h: CUstream, graph: *mut CUgraph));

fn capture_status(pt: bool, h: CUstream) -> Result<(CUstreamCaptureStatus, u64, usize), CUresult> {
    let (_, stream) = resolve_stream(h, pt)?;
    Ok(match stream.capture() {
        None => (CU_STREAM_CAPTURE_STATUS_NONE, 0, 0),
        Some(c) if c.is_invalidated() => (CU_STREAM_CAPTURE_STATUS_INVALIDATED, c.id, 0),
        Some(c) => (CU_STREAM_CAPTURE_STATUS_ACTIVE, c.id, c.node_count()),
    })
}

unsafe fn is_capturing(pt: bool, h: CUstream, status: *mut c_uint) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(status) }?;
    out.set(capture_status(pt, h)?.0);
    Ok(())
}
per_thread_pair!(cuStreamIsCapturing, cuStreamIsCapturing_ptsz, is_capturing, (h: CUstream, status: *mut c_uint));

/// Writes the optional outputs of the `cuStreamGetCaptureInfo` family. The simulator has no
/// node handles, so the dependency set is reported empty (NULL, 0).
///
/// # Safety
/// Each non-NULL pointer must be valid for a write of its type.
#[allow(clippy::too_many_arguments)]
unsafe fn capture_info(
    pt: bool,
    h: CUstream,
    status: *mut c_uint,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let status_out = unsafe { Out::new(status) }?;
    let (s, capture_id, _) = capture_status(pt, h)?;
    status_out.set(s);
    let active = s != CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: each optional output is NULL or valid for a write (API contract).
    unsafe {
        if !id.is_null() && active {
            id.write_unaligned(capture_id);
        }
        if !graph.is_null() && active {
            // No CUgraph handle exists before the capture ends.
            graph.write_unaligned(std::ptr::null_mut());
        }
        if !deps.is_null() && active {
            deps.write_unaligned(std::ptr::null());
        }
        if !edges.is_null() && active {
            edges.write_unaligned(std::ptr::null());
        }
        if !num_deps.is_null() && active {
            num_deps.write_unaligned(0);
        }
    }
    Ok(())
}

unsafe fn get_capture_info_v1(
    pt: bool,
    h: CUstream,
    status: *mut c_uint,
    id: *mut u64,
) -> Result<(), CUresult> {
    let n = std::ptr::null_mut::<c_void>();
    // SAFETY: forwarded under the same contract; the rest are NULL.
    unsafe { capture_info(pt, h, status, id, n.cast(), n.cast(), n.cast(), n.cast()) }
}
per_thread_pair!(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_ptsz, get_capture_info_v1, (h: CUstream, status: *mut c_uint, id: *mut u64));

unsafe fn get_capture_info_v2(
    pt: bool,
    h: CUstream,
    status: *mut c_uint,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> Result<(), CUresult> {
    let n = std::ptr::null_mut::<*const c_void>();
    // SAFETY: forwarded under the same contract.
    unsafe { capture_info(pt, h, status, id, graph, deps, n, num_deps) }
}
per_thread_pair!(cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz, get_capture_info_v2, (h: CUstream, status: *mut c_uint, id: *mut u64, graph: *mut CUgraph, deps: *mut *const CUgraphNode, num_deps: *mut usize));

#[allow(clippy::too_many_arguments)]
unsafe fn get_capture_info_v3(
    pt: bool,
    h: CUstream,
    status: *mut c_uint,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> Result<(), CUresult> {
    // SAFETY: forwarded under the same contract.
    unsafe { capture_info(pt, h, status, id, graph, deps, edges, num_deps) }
}
per_thread_pair!(cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz, get_capture_info_v3, (h: CUstream, status: *mut c_uint, id: *mut u64, graph: *mut CUgraph, deps: *mut *const CUgraphNode, edges: *mut *const c_void, num_deps: *mut usize));

unsafe fn thread_exchange_mode(mode: *mut c_uint) -> Result<(), CUresult> {
    if mode.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, valid for reads and writes (API contract).
    let wanted = unsafe { mode.read_unaligned() };
    if wanted > CU_STREAM_CAPTURE_MODE_RELAXED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let previous = capture::exchange_thread_mode(wanted);
    // SAFETY: as above.
    unsafe { mode.write_unaligned(previous) };
    Ok(())
}
export!(cuThreadExchangeStreamCaptureMode, thread_exchange_mode, (mode: *mut c_uint));

/// `cuStreamWaitEvent` on a capturing stream (called from the stream module).
pub fn capture_wait(capture: &Capture, event: Arc<Event>, flags: c_uint) -> Result<(), CUresult> {
    if capture.is_invalidated() {
        return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    if flags & CU_EVENT_WAIT_EXTERNAL != 0 {
        return capture.append(Node::WaitExternal(event));
    }
    match event.captured_in() {
        // Recorded earlier into this very capture, on this very stream: stream order already
        // covers it.
        Some(id) if id == capture.id => Ok(()),
        // A join with another capturing stream: multi-stream capture is not simulated.
        Some(_) => Err(CUDA_ERROR_NOT_SUPPORTED),
        // Never recorded: an empty set of work, nothing to depend on.
        None if event.current_generation() == 0 => Ok(()),
        None => {
            capture.invalidate("a wait on an event recorded outside the capture (isolation)");
            Err(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
        }
    }
}

fn instantiate(graph: CUgraph) -> Result<CUgraphExec, CUresult> {
    let s = st()?;
    let g = s
        .graphs
        .get(graph as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let exec = Graph {
        nodes: g.nodes.clone(),
        memory: g.memory.clone(),
    };
    Ok(s.graph_execs.insert(Arc::new(exec)) as CUgraphExec)
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_*`.
const AUTO_FREE_ON_LAUNCH: u64 = 1;
const UPLOAD: u64 = 2;
const DEVICE_LAUNCH: u64 = 4;
const USE_NODE_PRIORITY: u64 = 8;

/// Refuses instantiation flags as the driver does: unknown bits, `UPLOAD` outside
/// `cuGraphInstantiateWithParams` (it needs the params' upload stream), and `DEVICE_LAUNCH`
/// together with `AUTO_FREE_ON_LAUNCH`. The accepted flags change nothing here (no device-side
/// launches, priorities or graph memory freed on relaunch are simulated).
fn check_instantiate_flags(flags: u64, with_params: bool) -> Result<(), CUresult> {
    let known = AUTO_FREE_ON_LAUNCH | DEVICE_LAUNCH | USE_NODE_PRIORITY | UPLOAD;
    if flags & !known != 0 || (flags & UPLOAD != 0 && !with_params) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if flags & DEVICE_LAUNCH != 0 && flags & AUTO_FREE_ON_LAUNCH != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

unsafe fn graph_instantiate_with_flags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(exec) }?;
    check_instantiate_flags(flags, false)?;
    out.set(instantiate(graph)?);
    Ok(())
}
export!(cuGraphInstantiateWithFlags, graph_instantiate_with_flags, (exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong));

/// The CUDA 10 form, with an error node and a log buffer (left untouched: nothing fails
/// per node here).
unsafe fn graph_instantiate_v1(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _error_node: *mut CUgraphNode,
    _log: *mut c_char,
    _log_size: usize,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(exec) }?;
    out.set(instantiate(graph)?);
    Ok(())
}
export!(cuGraphInstantiate, graph_instantiate_v1, (exec: *mut CUgraphExec, graph: CUgraph, error_node: *mut CUgraphNode, log: *mut c_char, log_size: usize));

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct GraphInstantiateParams {
    pub flags: u64,
    pub upload_stream: CUstream,
    pub err_node_out: CUgraphNode,
    pub result_out: c_int,
}

unsafe fn graph_instantiate_with_params(
    _pt: bool,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut GraphInstantiateParams,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(exec) }?;
    if params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and points to the caller's params struct (API contract).
    let flags = unsafe { (*params).flags };
    let r = check_instantiate_flags(flags, true).and_then(|()| instantiate(graph));
    // SAFETY: non-NULL and points to the caller's params struct (API contract).
    unsafe {
        (*params).err_node_out = std::ptr::null_mut();
        (*params).result_out = if r.is_ok() { 0 } else { 1 };
    }
    out.set(r?);
    Ok(())
}
per_thread_pair!(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz, graph_instantiate_with_params, (exec: *mut CUgraphExec, graph: CUgraph, params: *mut GraphInstantiateParams));

/// Queues the executable's nodes on the stream, in capture order. Launching into a
/// capturing stream (a child graph) is not simulated.
unsafe fn graph_launch(pt: bool, exec: CUgraphExec, h: CUstream) -> Result<(), CUresult> {
    let s = st()?;
    let g = s
        .graph_execs
        .get(exec as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (ctx, stream) = resolve_stream(h, pt)?;
    ctx.check()?;
    if stream.capture().is_some() {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    for node in &g.nodes {
        match node {
            Node::Op(op) => {
                ctx.submit(&stream, Vec::new(), op.clone());
            }
            Node::Record(ev) => {
                let generation = ev.begin_record();
                ctx.submit(&stream, Vec::new(), Op::Record(ev.clone(), generation));
            }
            Node::WaitExternal(ev) => {
                let generation = ev.current_generation();
                let waits = if generation > 0 {
                    vec![Dependency::Event(ev.clone(), generation)]
                } else {
                    Vec::new()
                };
                ctx.submit(&stream, waits, Op::Nop);
            }
        }
    }
    // The graph's memory must outlive this launch even if the graph is destroyed now.
    ctx.submit(&stream, Vec::new(), Op::Keep(g.memory.clone()));
    Ok(())
}
per_thread_pair!(cuGraphLaunch, cuGraphLaunch_ptsz, graph_launch, (exec: CUgraphExec, h: CUstream));

/// Uploading is free here: every launch reads the nodes from host memory.
unsafe fn graph_upload(pt: bool, exec: CUgraphExec, h: CUstream) -> Result<(), CUresult> {
    st()?
        .graph_execs
        .get(exec as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    resolve_stream(h, pt)?;
    Ok(())
}
per_thread_pair!(cuGraphUpload, cuGraphUpload_ptsz, graph_upload, (exec: CUgraphExec, h: CUstream));

unsafe fn graph_exec_destroy(exec: CUgraphExec) -> Result<(), CUresult> {
    st()?
        .graph_execs
        .remove(exec as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(())
}
export!(cuGraphExecDestroy, graph_exec_destroy, (exec: CUgraphExec));

unsafe fn graph_destroy(graph: CUgraph) -> Result<(), CUresult> {
    st()?
        .graphs
        .remove(graph as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(())
}
export!(cuGraphDestroy, graph_destroy, (graph: CUgraph));
