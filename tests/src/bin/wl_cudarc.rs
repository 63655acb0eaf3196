//! Workload: a program written with `cudarc` 0.19 (dynamic loading: `libloading` opens
//! libcuda and `dlsym`s every entry point by its versioned name, through libtensile's
//! `dlsym`). Contexts, streams, allocations, copies and frees go through cudarc's safe API;
//! kernels through `cudarc::driver::result`.
//!
//! Prints the launches it made (`E launch ...`), the pointers of its buffers
//! (`B <name> <ptr>`) and digests of its results.

use std::ffi::{c_void, CString};

use cudarc::driver::{result, sys, CudaContext, DevicePtr, DevicePtrMut};
use tensile_tests::expect::{fnv1a, Expect};

fn launch(
    f: sys::CUfunction,
    stream: sys::CUstream,
    grid: u32,
    block: u32,
    params: &mut [*mut c_void],
    name: &str,
    accesses: Vec<(u64, u32)>,
) {
    // SAFETY: the caller passes parameters matching the kernel's signature, alive for the call.
    unsafe { result::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, stream, params) }
        .expect("launch");
    let e = Expect::Launch {
        kernel: name.into(),
        stream: stream as u64,
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        smem: 0,
        accesses,
    };
    println!("{e}");
}

fn main() {
    let ctx = CudaContext::new(0).expect("context");
    let stream = ctx.new_stream().expect("stream");
    let cu_stream = stream.cu_stream();
    let n = 50_000usize;
    let xs: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.5 - 3.0).collect();
    let x = stream.clone_htod(&xs).expect("htod");
    let mut y = stream.alloc_zeros::<f32>(n).expect("alloc y");
    let mut pattern = stream.alloc_zeros::<u32>(n).expect("alloc pattern");

    let ptx = CString::new(tensile_kernels::PTX).expect("no NUL in PTX");
    // SAFETY: a NUL-terminated PTX image, with the context current.
    let module = unsafe { result::module::load_data(ptx.as_ptr().cast()) }.expect("module");
    let function = |name: &str| {
        // SAFETY: `module` is loaded.
        unsafe { result::module::get_function(module, CString::new(name).expect("name")) }
            .expect("function")
    };
    let (fill, axpy) = (function("fill_pattern"), function("axpy"));
    {
        let (p, _sync) = pattern.device_ptr_mut(&stream);
        println!("B pattern {p:#x}");
        let (mut ptr, mut len, mut seed) = (p, n as u64, 7u32);
        let mut params = [
            (&mut ptr as *mut u64).cast(),
            (&mut len as *mut u64).cast(),
            (&mut seed as *mut u32).cast(),
        ];
        launch(
            fill,
            cu_stream,
            16,
            128,
            &mut params,
            "fill_pattern",
            vec![(p, 0)],
        );
    }
    for round in 0..3 {
        let (xp, _sx) = x.device_ptr(&stream);
        let (yp, _sy) = y.device_ptr_mut(&stream);
        if round == 0 {
            println!("B x {xp:#x}");
            println!("B y {yp:#x}");
        }
        let (mut a, mut px, mut py, mut len) = (0.25f32 + round as f32, xp, yp, n as u64);
        let mut params = [
            (&mut a as *mut f32).cast(),
            (&mut px as *mut u64).cast(),
            (&mut py as *mut u64).cast(),
            (&mut len as *mut u64).cast(),
        ];
        launch(
            axpy,
            cu_stream,
            8,
            256,
            &mut params,
            "axpy",
            vec![(xp, 8), (yp, 16)],
        );
    }
    let ys = stream.clone_dtoh(&y).expect("dtoh y");
    let ps = stream.clone_dtoh(&pattern).expect("dtoh pattern");
    stream.synchronize().expect("sync");
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    println!("D y {:016x}", fnv1a(&bytes(&ys)));
    println!(
        "D pattern {:016x}",
        fnv1a(&ps.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
    );
    drop((x, y, pattern));
    stream.synchronize().expect("sync");
    println!("done");
}
