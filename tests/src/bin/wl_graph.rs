//! Workload: a CUDA graph made by stream capture, launched again and again while other work
//! squeezes the device.
//!
//! `wl_graph <lookup> [tensor_kib] [launches] [pressure_tensors]` (defaults 1536, 6, 8).
//! Four parameter tensors and an accumulator are allocated and filled outside the capture;
//! one round of pressure (below) runs before the capture, so that under a small budget the
//! capture starts with the parameters evicted and the manager's background work busy.
//! One step is captured on a stream in GLOBAL mode (the default of `cudaStreamBeginCapture`
//! and of PyTorch): a temporary allocated and freed stream-ordered inside the capture (a
//! graph memory node), kernels that read parameters and write the temporary, the
//! accumulator and a parameter. The graph is instantiated and launched `launches` times;
//! between launches, uncaptured work on another stream allocates and fills
//! `pressure_tensors` tensors, all live at once, sums them up and frees them (under a small
//! `TENSILE_DEVICE_MEMORY` that evicts everything the manager may move), and scales a
//! parameter, ordered with the graph by events.
//!
//! Prints `D` lines (compared bit for bit between runs): the accumulator, the parameters and
//! each pressure round's checksum (the warm-up round's too). Everything is deterministic: no
//! two streams race on a buffer.

use std::ffi::{c_uint, c_void, CStr};

use tensile_driver_abi::*;
use tensile_tests::driver::{check, Lookup};
use tensile_tests::session::{f32_bytes, kernel, numeric_arg, Arg, Form, Session};

type BeginCapture = unsafe extern "C" fn(CUstream, c_uint) -> CUresult;
type EndCapture = unsafe extern "C" fn(CUstream, *mut CUgraph) -> CUresult;
type IsCapturing = unsafe extern "C" fn(CUstream, *mut c_uint) -> CUresult;
type Instantiate = unsafe extern "C" fn(*mut CUgraphExec, CUgraph, u64) -> CUresult;
type GraphLaunch = unsafe extern "C" fn(CUgraphExec, CUstream) -> CUresult;
type ExecDestroy = unsafe extern "C" fn(CUgraphExec) -> CUresult;
type GraphDestroy = unsafe extern "C" fn(CUgraph) -> CUresult;

/// The graph entry points, which the test library's driver table does not have, looked up
/// in the same `libcuda.so.1`.
struct Graphs {
    begin: BeginCapture,
    end: EndCapture,
    is_capturing: IsCapturing,
    instantiate: Instantiate,
    launch: GraphLaunch,
    exec_destroy: ExecDestroy,
    destroy: GraphDestroy,
}

fn sym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: a live dlopen handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    assert!(!p.is_null(), "libcuda.so.1 has no {name:?}");
    p
}

impl Graphs {
    fn load(s: &Session) -> Graphs {
        let h = s.d.handle;
        // SAFETY: each symbol is the driver's function of that name, whose C signature
        // (cuda.h) is the type it is transmuted to.
        unsafe {
            Graphs {
                begin: std::mem::transmute::<*mut c_void, BeginCapture>(sym(
                    h,
                    c"cuStreamBeginCapture_v2",
                )),
                end: std::mem::transmute::<*mut c_void, EndCapture>(sym(h, c"cuStreamEndCapture")),
                is_capturing: std::mem::transmute::<*mut c_void, IsCapturing>(sym(
                    h,
                    c"cuStreamIsCapturing",
                )),
                instantiate: std::mem::transmute::<*mut c_void, Instantiate>(sym(
                    h,
                    c"cuGraphInstantiateWithFlags",
                )),
                launch: std::mem::transmute::<*mut c_void, GraphLaunch>(sym(h, c"cuGraphLaunch")),
                exec_destroy: std::mem::transmute::<*mut c_void, ExecDestroy>(sym(
                    h,
                    c"cuGraphExecDestroy",
                )),
                destroy: std::mem::transmute::<*mut c_void, GraphDestroy>(sym(
                    h,
                    c"cuGraphDestroy",
                )),
            }
        }
    }
}

fn main() {
    let lookup = std::env::args()
        .nth(1)
        .and_then(|a| Lookup::parse(&a))
        .expect("usage: wl_graph <lookup> [tensor_kib] [launches] [pressure_tensors]");
    let tensor_kib = numeric_arg(2, 1536) as usize;
    let launches = numeric_arg(3, 6);
    let pressure = numeric_arg(4, 8) as usize;
    let s = Session::start(lookup);
    let g = Graphs::load(&s);
    let ks = s.kernels(false);
    let (fill, axpy, scale, copy, checksum) = (
        kernel(&ks, "fill_pattern"),
        kernel(&ks, "axpy"),
        kernel(&ks, "scale"),
        kernel(&ks, "copy_u32"),
        kernel(&ks, "checksum"),
    );
    let bytes = tensor_kib * 1024;
    let n = (bytes / 4) as u64;
    let (cs, ws) = (s.stream(), s.stream());
    let grid = 4;

    // Parameters and the accumulator, outside the capture.
    let params: Vec<u64> = (0..4)
        .map(|i| {
            let p = s.alloc(bytes);
            let v: Vec<f32> = (0..n)
                .map(|j| ((j * (i + 3)) % 101) as f32 * 0.01 - 0.5)
                .collect();
            s.upload(p, &f32_bytes(&v), None);
            p
        })
        .collect();
    let acc = s.alloc(bytes);
    s.memset(acc, 4, 0, n as usize, None);

    // Uncaptured pressure on the other stream, independent of the graph's buffers: a round's
    // tensors are all live at once, so they cannot all stay on the device. Returns the
    // buffer their checksums are summed into.
    let press = |round: u64| -> u64 {
        let sum = s.alloc(8);
        s.memset(sum, 4, 0, 2, Some(ws));
        let tensors: Vec<u64> = (0..pressure)
            .map(|t| {
                let p = s.alloc_async(bytes, ws);
                s.launch(
                    fill,
                    grid,
                    256,
                    ws,
                    &[
                        Arg::ptr(p),
                        Arg::U64(n),
                        Arg::U32((round * 100 + t as u64) as u32),
                    ],
                    Form::Params,
                );
                p
            })
            .collect();
        for &p in &tensors {
            s.launch(
                checksum,
                grid,
                256,
                ws,
                &[Arg::ptr(p), Arg::U64(n), Arg::ptr(sum)],
                Form::Params,
            );
        }
        for p in tensors {
            s.free_async(p, ws);
        }
        sum
    };
    // One round before the capture, so that the capture finds the parameters evicted (the
    // manager must bring them back without touching the capturing stream) and the manager's
    // background work still busy.
    let warmup = press(99);
    s.sync_stream(ws);
    s.digest("pressure_warmup", warmup, 8);
    s.free(warmup);

    // The captured step.
    let mut status = 99;
    // SAFETY: live stream, valid out-pointer.
    check(
        unsafe { (g.begin)(cs, CU_STREAM_CAPTURE_MODE_GLOBAL) },
        "cuStreamBeginCapture_v2",
    );
    // SAFETY: as above.
    check(
        unsafe { (g.is_capturing)(cs, &mut status) },
        "cuStreamIsCapturing",
    );
    assert_eq!(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    let tmp = s.alloc_async(bytes, cs);
    s.launch(
        copy,
        grid,
        256,
        cs,
        &[Arg::ptr(tmp), Arg::ptr(params[0]), Arg::U64(n)],
        Form::Params,
    );
    s.launch(
        axpy,
        grid,
        256,
        cs,
        &[
            Arg::F32(0.5),
            Arg::ptr(params[1]),
            Arg::ptr(tmp),
            Arg::U64(n),
        ],
        Form::Ex,
    );
    s.launch(
        axpy,
        grid,
        256,
        cs,
        &[Arg::F32(1.0), Arg::ptr(tmp), Arg::ptr(acc), Arg::U64(n)],
        Form::Params,
    );
    s.launch(
        scale,
        grid,
        256,
        cs,
        &[Arg::ptr(params[2]), Arg::F32(1.001), Arg::U64(n)],
        Form::Extra,
    );
    s.launch(
        axpy,
        grid,
        256,
        cs,
        &[
            Arg::F32(0.25),
            Arg::ptr(params[3]),
            Arg::ptr(acc),
            Arg::U64(n),
        ],
        Form::Params,
    );
    s.free_async(tmp, cs);
    let mut graph = std::ptr::null_mut();
    // SAFETY: live stream, valid out-pointer.
    check(unsafe { (g.end)(cs, &mut graph) }, "cuStreamEndCapture");
    let mut exec = std::ptr::null_mut();
    // SAFETY: a graph from this capture, valid out-pointer.
    check(
        unsafe { (g.instantiate)(&mut exec, graph, 0) },
        "cuGraphInstantiateWithFlags",
    );

    for round in 0..launches {
        // SAFETY: a live executable graph and stream.
        check(unsafe { (g.launch)(exec, cs) }, "cuGraphLaunch");
        let sum = press(round);
        // Then, after this launch of the graph, a parameter the graph reads is changed
        // outside it; the next launch waits for that.
        let launched = s.record_event(cs);
        s.wait_event(ws, launched);
        s.launch(
            scale,
            grid,
            256,
            ws,
            &[Arg::ptr(params[3]), Arg::F32(0.75), Arg::U64(n)],
            Form::Params,
        );
        let scaled = s.record_event(ws);
        s.wait_event(cs, scaled);
        s.sync_stream(ws);
        s.digest(&format!("pressure{round}"), sum, 8);
        s.free(sum);
    }
    s.sync_stream(cs);
    s.digest("acc", acc, bytes);
    for (i, p) in params.iter().enumerate() {
        s.digest(&format!("param{i}"), *p, bytes);
    }
    // SAFETY: live handles, no launch of them pending (the stream was synchronized).
    unsafe {
        check((g.exec_destroy)(exec), "cuGraphExecDestroy");
        check((g.destroy)(graph), "cuGraphDestroy");
    }
    for p in params {
        s.free(p);
    }
    s.free(acc);
    s.sync_ctx();
    s.say("done");
}
