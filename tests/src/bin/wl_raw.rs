//! Workload: raw driver calls on one thread, the way cuBLAS-style libraries make them.
//!
//! `wl_raw <lookup> <module|library>`: `<lookup>` is how entry points are found (see
//! `tensile_tests::driver::Lookup::parse`, e.g. `proc:13000:2`), `module|library` whether
//! kernels are launched as `CUfunction`s or as `CUkernel`s. Every kernel of
//! `tensile-kernels`, sync and async copies (1D, 2D, unified), memsets, pitched memory,
//! interior pointers, a context sync, and frees. Prints expectations and digests.
//! With `WL_RAW_ABORT_AFTER_MS=<ms>` it aborts (a crash) that long after the digests; with
//! `WL_RAW_FORK=1` it forks there, and the child exits at once.

use tensile_tests::driver::Lookup;
use tensile_tests::session::{f32_bytes, kernel, u32_bytes, Arg, Form, Session};

fn main() {
    let mut args = std::env::args().skip(1);
    let lookup = args
        .next()
        .and_then(|a| Lookup::parse(&a))
        .expect("usage: wl_raw <lookup> <module|library>");
    let as_library = match args.next().as_deref() {
        Some("library") => true,
        Some("module") => false,
        other => panic!("expected module or library, got {other:?}"),
    };
    let s = Session::start(lookup);
    let ks = s.kernels(as_library);
    let null = std::ptr::null_mut();
    let n: u64 = 4096;
    let bytes = (n * 4) as usize;

    // Integer kernels.
    let a = s.alloc(bytes);
    let b = s.alloc(bytes);
    s.launch(
        kernel(&ks, "fill_pattern"),
        8,
        128,
        null,
        &[Arg::ptr(a), Arg::U64(n), Arg::U32(1)],
        Form::Params,
    );
    s.launch(
        kernel(&ks, "fill_pattern"),
        4,
        64,
        null,
        &[Arg::ptr(b), Arg::U64(n), Arg::U32(2)],
        Form::Params,
    );
    // An interior pointer: copy_u32(b + 16 words, a + 32 words, n - 32).
    s.launch(
        kernel(&ks, "copy_u32"),
        2,
        256,
        null,
        &[
            Arg::Ptr {
                ptr: b + 64,
                base: b,
            },
            Arg::Ptr {
                ptr: a + 128,
                base: a,
            },
            Arg::U64(n - 32),
        ],
        Form::Params,
    );
    let sum = s.alloc(8);
    s.memset(sum, 4, 0, 2, None);
    s.launch(
        kernel(&ks, "checksum"),
        4,
        128,
        null,
        &[Arg::ptr(b), Arg::U64(n), Arg::ptr(sum)],
        Form::Params,
    );
    s.digest("checksum_b", sum, 8);

    // Floating point: axpy, scale, sgd_momentum, matmul.
    let xs: Vec<f32> = (0..n).map(|i| (i as f32) * 0.25 - 100.0).collect();
    let ys: Vec<f32> = (0..n).map(|i| 1.0 / (1.0 + i as f32)).collect();
    let x = s.alloc(bytes);
    let y = s.alloc(bytes);
    s.upload(x, &f32_bytes(&xs), None);
    s.upload(y, &f32_bytes(&ys), None);
    s.launch(
        kernel(&ks, "axpy"),
        8,
        128,
        null,
        &[Arg::F32(1.5), Arg::ptr(x), Arg::ptr(y), Arg::U64(n)],
        Form::Params,
    );
    s.launch(
        kernel(&ks, "scale"),
        8,
        128,
        null,
        &[Arg::ptr(y), Arg::F32(0.75), Arg::U64(n)],
        Form::Params,
    );
    let m = s.alloc(bytes);
    s.memset(m, 1, 0, bytes, None);
    s.launch(
        kernel(&ks, "sgd_momentum"),
        8,
        128,
        null,
        &[
            Arg::ptr(x),
            Arg::ptr(y),
            Arg::ptr(m),
            Arg::F32(0.01),
            Arg::F32(0.9),
            Arg::U64(n),
        ],
        Form::Params,
    );
    let dim = 24u32;
    let mat: Vec<f32> = (0..dim * dim)
        .map(|i| ((i * 7) % 13) as f32 - 6.0)
        .collect();
    let ma = s.alloc((dim * dim * 4) as usize);
    let mb = s.alloc((dim * dim * 4) as usize);
    let mc = s.alloc((dim * dim * 4) as usize);
    s.upload(ma, &f32_bytes(&mat), None);
    s.copy_dtod((mb, mb), (ma, ma), (dim * dim * 4) as usize, None);
    s.launch(
        kernel(&ks, "matmul_f32"),
        4,
        64,
        null,
        &[
            Arg::ptr(ma),
            Arg::ptr(mb),
            Arg::ptr(mc),
            Arg::U32(dim),
            Arg::U32(dim),
            Arg::U32(dim),
        ],
        Form::Params,
    );

    // Pitched memory with a 2D upload, then a unified-address copy out of it.
    let (width, height) = (100usize, 12usize);
    let (pm, pitch) = s.alloc_pitch(width, height);
    let rows: Vec<u32> = (0..(width * height / 4) as u32)
        .map(|i| i.wrapping_mul(2654435761))
        .collect();
    s.upload_2d(pm, pitch, &u32_bytes(&rows), width, height, None);
    let flat = s.alloc(pitch * height);
    s.memset(flat, 2, 0xbeef, pitch * height / 2, None);
    s.copy_any(flat, pm, pitch * height, None);
    s.sync_ctx();

    for (name, p, len) in [
        ("a", a, bytes),
        ("b", b, bytes),
        ("x", x, bytes),
        ("y", y, bytes),
        ("m", m, bytes),
        ("mc", mc, (dim * dim * 4) as usize),
        ("flat", flat, pitch * height),
    ] {
        s.digest(name, p, len);
    }
    if std::env::var_os("WL_RAW_FORK").is_some() {
        // A child that exits normally (running exit handlers) must leave the parent's
        // trace alone.
        // SAFETY: the child only calls exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            std::process::exit(0);
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(status, 0, "the forked child failed");
    }
    if let Some(ms) = std::env::var("WL_RAW_ABORT_AFTER_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        // Simulate a crash: no exit handlers run.
        std::thread::sleep(std::time::Duration::from_millis(ms));
        std::process::abort();
    }
    for p in [a, b, sum, x, y, m, ma, mb, mc, pm, flat] {
        s.free(p);
    }
    s.say("done");
}
