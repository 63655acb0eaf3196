//! Workload: a training-like loop whose footprint is several times a small device budget.
//!
//! `wl_train <lookup> [layers] [tensor_kib] [iterations]` (defaults 16, 1536, 3): per layer a
//! parameter tensor, a gradient and an optimizer state (momentum), all live for the whole
//! run; per iteration an input uploaded from the host, one activation per layer allocated
//! stream-ordered in the forward pass and kept for the backward pass, where it is read
//! again and then freed. Forward runs on one stream, backward and the optimizer
//! (`sgd_momentum`) on another, ordered by events; the legacy default stream zeroes and
//! reads a loss accumulator. Copies go into and out of tensors that are likely swapped out
//! (a device-to-device snapshot of the first parameter, a host upload into a parameter's
//! middle, a download of the last activation), one activation is freed synchronously, and
//! gradients are zeroed with memsets. The tensor size is deliberately not a multiple of the
//! 2 MiB page, so tensors share pages.
//!
//! Prints `D` lines (compared bit for bit between runs): the loss of every iteration, and
//! the final parameters, momenta and snapshot. Everything is deterministic: the streams
//! never race on a buffer.
//!
//! `wl_train probe` instead reports whether the `libcuda.so.1` the loader finds has a device
//! (`devices <n>`, exit 0) or not (exit 1): `tensile demo` asks it before choosing between a
//! real GPU and the simulated one.

use tensile_tests::driver::Lookup;
use tensile_tests::expect::fnv1a;
use tensile_tests::session::{f32_bytes, kernel, numeric_arg, Arg, Form, Kernel, Session};

/// Loads `libcuda.so.1` as the loader finds it and counts its devices.
fn probe() -> Result<i32, String> {
    type Init = unsafe extern "C" fn(u32) -> u32;
    type Count = unsafe extern "C" fn(*mut i32) -> u32;
    // SAFETY: a C string literal.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        return Err("no libcuda.so.1".into());
    }
    // SAFETY: a live handle and C string literals.
    let (init, count) = unsafe {
        (
            libc::dlsym(h, c"cuInit".as_ptr()),
            libc::dlsym(h, c"cuDeviceGetCount".as_ptr()),
        )
    };
    if init.is_null() || count.is_null() {
        return Err("libcuda.so.1 lacks cuInit or cuDeviceGetCount".into());
    }
    // SAFETY: the driver's cuInit and cuDeviceGetCount have these C signatures (cuda.h).
    let (init, count) = unsafe {
        (
            std::mem::transmute::<*mut libc::c_void, Init>(init),
            std::mem::transmute::<*mut libc::c_void, Count>(count),
        )
    };
    let mut n = 0;
    // SAFETY: plain driver calls with a valid out-pointer.
    let r = unsafe {
        match init(0) {
            0 => count(&mut n),
            e => e,
        }
    };
    if r != 0 {
        return Err(format!("the driver failed with error {r}"));
    }
    Ok(n)
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("probe") {
        match probe() {
            Ok(n) if n > 0 => println!("devices {n}"),
            Ok(_) => {
                println!("devices 0");
                std::process::exit(1);
            }
            Err(e) => {
                println!("no device: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let lookup = std::env::args()
        .nth(1)
        .and_then(|a| Lookup::parse(&a))
        .expect("usage: wl_train <lookup> [layers] [tensor_kib] [iterations]");
    let layers = numeric_arg(2, 16) as usize;
    let n = numeric_arg(3, 1536) * 1024 / 4; // f32 elements per tensor
    let iterations = numeric_arg(4, 3);
    let bytes = (n * 4) as usize;
    let footprint = (3 * layers + layers + 2) * bytes;
    eprintln!(
        "wl_train: {layers} layers of {} KiB, {iterations} iterations, footprint {} MiB",
        bytes >> 10,
        footprint >> 20
    );

    let s = Session::start(lookup);
    let ks = s.kernels(true);
    let (axpy, scale, copy, sgd, checksum) = (
        kernel(&ks, "axpy"),
        kernel(&ks, "scale"),
        kernel(&ks, "copy_u32"),
        kernel(&ks, "sgd_momentum"),
        kernel(&ks, "checksum"),
    );
    let (fwd, bwd) = (s.stream(), s.stream());
    let legacy = std::ptr::null_mut();
    let launch = |k: &Kernel, st, args: &[Arg]| s.launch(k, 4, 128, st, args, Form::Params);

    // Parameters (small floats from the host), gradients, momenta.
    let mut params = Vec::new();
    let mut grads = Vec::new();
    let mut moms = Vec::new();
    for l in 0..layers {
        let w = s.alloc(bytes);
        let init: Vec<f32> = (0..n)
            .map(|i| ((i * 7 + l as u64 * 13) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        s.upload(w, &f32_bytes(&init), None);
        let g = s.alloc_async(bytes, fwd);
        let m = s.alloc_async(bytes, fwd);
        s.memset(m, 4, 0, n as usize, Some(fwd));
        params.push(w);
        grads.push(g);
        moms.push(m);
    }
    let snapshot = s.alloc(bytes);
    let loss = s.alloc(8);
    let host_input: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8 & 0x3f).collect();
    let host_patch: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8).collect();

    for it in 0..iterations {
        // Forward: input from the host, then one kept activation per layer.
        let input = s.alloc_async(bytes, fwd);
        s.upload(input, &host_input, Some(fwd));
        let mut acts = vec![input];
        for l in 0..layers {
            let prev = acts[l];
            let a = s.alloc_async(bytes, fwd);
            launch(copy, fwd, &[Arg::ptr(a), Arg::ptr(prev), Arg::U64(n)]);
            launch(
                axpy,
                fwd,
                &[Arg::F32(0.5), Arg::ptr(params[l]), Arg::ptr(a), Arg::U64(n)],
            );
            launch(scale, fwd, &[Arg::ptr(a), Arg::F32(0.75), Arg::U64(n)]);
            acts.push(a);
        }
        // Loss on the legacy stream, after the forward pass.
        s.sync_stream(fwd);
        s.memset(loss, 4, 0, 2, None);
        launch(
            checksum,
            legacy,
            &[Arg::ptr(acts[layers]), Arg::U64(n), Arg::ptr(loss)],
        );
        s.digest(&format!("loss{it}"), loss, 8);
        // A copy out of the last activation (probably swapped out by now).
        let out = s.download(acts[layers], bytes, Some(fwd));
        s.say(format!("D output{it} {:016x}", fnv1a(&out)));

        // Backward on the other stream, after the forward pass.
        let forward_done = s.record_event(fwd);
        s.wait_event(bwd, forward_done);
        for l in (0..layers).rev() {
            let (g, w, m) = (grads[l], params[l], moms[l]);
            s.memset(g, 4, 0, n as usize, Some(bwd));
            launch(
                axpy,
                bwd,
                &[
                    Arg::F32(1.0),
                    Arg::ptr(acts[l + 1]),
                    Arg::ptr(g),
                    Arg::U64(n),
                ],
            );
            launch(
                axpy,
                bwd,
                &[Arg::F32(-0.25), Arg::ptr(acts[l]), Arg::ptr(g), Arg::U64(n)],
            );
            launch(
                sgd,
                bwd,
                &[
                    Arg::ptr(w),
                    Arg::ptr(g),
                    Arg::ptr(m),
                    Arg::F32(0.01),
                    Arg::F32(0.9),
                    Arg::U64(n),
                ],
            );
            // The activation is not needed any more.
            s.free_async(acts[l + 1], bwd);
        }
        // The input goes synchronously: cuMemFree waits for the backward pass.
        s.free(acts[0]);
        // A snapshot of the first layer's parameters, and a host patch into another.
        s.copy_dtod(
            (snapshot, snapshot),
            (params[0], params[0]),
            bytes,
            Some(bwd),
        );
        let mid = params[layers / 2] + (bytes / 2) as u64;
        s.upload_at((mid, params[layers / 2]), &host_patch, Some(bwd));
        let step_done = s.record_event(bwd);
        s.wait_event(fwd, step_done);
        s.sync_stream(bwd);
        eprintln!("wl_train: iteration {} of {iterations} done", it + 1);
    }
    s.sync_ctx();
    for l in 0..layers {
        s.digest(&format!("param{l}"), params[l], bytes);
        s.digest(&format!("momentum{l}"), moms[l], bytes);
    }
    s.digest("snapshot", snapshot, bytes);
    for l in 0..layers {
        s.free(params[l]);
        s.free_async(grads[l], fwd);
        s.free_async(moms[l], bwd);
    }
    s.free(snapshot);
    s.free(loss);
    s.sync_ctx();
    s.say("done");
}
