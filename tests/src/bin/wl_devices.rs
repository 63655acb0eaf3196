//! Workload: one process using several devices, each with a footprint of its own.
//!
//! `wl_devices <devices> <tensors> <tensor_kib> <rounds>` (defaults 2, 16, 1536, 3): on each
//! device (its primary context, its own stream and module) `tensors` float tensors of
//! `tensor_kib` KiB, uploaded from the host with values of that device's own; then `rounds`
//! rounds in which, tensor by tensor, every device in turn adds half of tensor `i` into
//! tensor `i + 1` (`axpy`, wrapping around), so that the devices' work interleaves and
//! every tensor is read and written each round. The tensor size is deliberately not a
//! multiple of the 2 MiB page, so tensors share pages.
//!
//! With two devices or more, a copy between devices comes next (`cuMemcpyAsync` on device 1's
//! stream, with device 1's context current, from device 0's tensor 1 into device 1's tensor 0:
//! memory of another device than the current context's), and one more round follows.
//!
//! Prints `D dev<d>-t<i> <digest>` for every tensor at the end (compared bit for bit between
//! runs) and `done`. Deterministic: each device's work is on one stream.

use tensile_driver_abi::{CUcontext, CUdeviceptr, CUstream};
use tensile_tests::driver::{check, Lookup};
use tensile_tests::session::{f32_bytes, kernel, numeric_arg, Arg, Form, Kernel, Session};

/// What the workload holds on one device.
struct OnDevice {
    ordinal: i32,
    ctx: CUcontext,
    stream: CUstream,
    kernels: Vec<Kernel>,
    tensors: Vec<CUdeviceptr>,
}

/// Makes `ctx` current on this thread.
fn make_current(s: &Session, ctx: CUcontext) {
    // SAFETY: a live primary context.
    check(unsafe { (s.d.cuCtxSetCurrent)(ctx) }, "cuCtxSetCurrent");
}

/// Values of tensor `i` of device `d`: small, so that every sum stays finite.
fn values(d: i32, i: usize, n: usize) -> Vec<f32> {
    let mut x = (d as u64 + 1) * 0x9e37_79b9 + i as u64 * 0x85eb_ca6b;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 40) as f32) / (1u64 << 24) as f32
        })
        .collect()
}

fn main() {
    let devices = numeric_arg(1, 2) as i32;
    let tensors = numeric_arg(2, 16) as usize;
    let tensor_bytes = numeric_arg(3, 1536) as usize * 1024;
    let rounds = numeric_arg(4, 3) as usize;
    let n = tensor_bytes / 4;

    let s = Session::start(Lookup::ProcAddress {
        version: 13000,
        flags: 0,
    });
    let mut on: Vec<OnDevice> = (0..devices)
        .map(|ordinal| {
            let mut dev = 0;
            let mut ctx = std::ptr::null_mut();
            // SAFETY: valid out-pointers.
            unsafe {
                check((s.d.cuDeviceGet)(&mut dev, ordinal), "cuDeviceGet");
                check(
                    (s.d.cuDevicePrimaryCtxRetain)(&mut ctx, dev),
                    "cuDevicePrimaryCtxRetain",
                );
            }
            make_current(&s, ctx);
            OnDevice {
                ordinal,
                ctx,
                stream: s.stream(),
                kernels: s.kernels(false),
                tensors: Vec::new(),
            }
        })
        .collect();

    // Allocations alternate between the devices, as do the uploads.
    for i in 0..tensors {
        for d in &mut on {
            make_current(&s, d.ctx);
            let p = s.alloc(tensor_bytes);
            s.upload(p, &f32_bytes(&values(d.ordinal, i, n)), None);
            d.tensors.push(p);
        }
    }
    let round = |on: &[OnDevice]| {
        for i in 0..tensors {
            for d in on {
                make_current(&s, d.ctx);
                let (x, y) = (d.tensors[i], d.tensors[(i + 1) % tensors]);
                s.launch(
                    kernel(&d.kernels, "axpy"),
                    8,
                    128,
                    d.stream,
                    &[Arg::F32(0.5), Arg::ptr(x), Arg::ptr(y), Arg::U64(n as u64)],
                    Form::Params,
                );
            }
        }
    };
    for _ in 0..rounds {
        round(&on);
    }
    if on.len() >= 2 {
        for d in &on {
            make_current(&s, d.ctx);
            s.sync_stream(d.stream);
        }
        make_current(&s, on[1].ctx);
        let st = on[1].stream;
        s.copy_any(on[1].tensors[0], on[0].tensors[1], tensor_bytes, Some(st));
        // Device 0's next round writes the source.
        s.sync_stream(st);
        round(&on);
    }
    for d in &on {
        make_current(&s, d.ctx);
        s.sync_stream(d.stream);
        for (i, &p) in d.tensors.iter().enumerate() {
            s.digest(&format!("dev{}-t{i}", d.ordinal), p, tensor_bytes);
        }
        for &p in &d.tensors {
            s.free(p);
        }
    }
    s.say("done");
}
