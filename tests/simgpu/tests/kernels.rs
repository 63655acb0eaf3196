//! Kernels through the simulated driver: module loading, parameter info, both launch forms,
//! bit-exact results of every twin on device memory.

mod common;

use std::ffi::{c_void, CString};

use common::*;
use cuda::api::launch::*;
use cuda::api::module::*;
use tensile_driver_abi::*;
use tensile_kernels::twins::{checksum_term, pattern_value};
use tensile_kernels::ParamBuilder;

#[test]
fn fill_copy_checksum_through_the_driver() {
    fresh_context();
    let n = 10_000usize;
    let (a, b, out) = (alloc(n * 4), alloc(n * 4), alloc(8));
    let fill = function("fill_pattern");
    let (mut pa, mut nn, mut seed) = (a, n as u64, 7u32);
    let mut args = [
        &mut pa as *mut u64 as *mut c_void,
        &mut nn as *mut u64 as *mut c_void,
        &mut seed as *mut u32 as *mut c_void,
    ];
    ck(launch_args(fill, std::ptr::null_mut(), &mut args));
    let p = ParamBuilder::new().ptr(b).ptr(a).u64(n as u64).build();
    ck(launch_packed(
        function("copy_u32"),
        std::ptr::null_mut(),
        &p,
    ));
    upload_u32(out, &[0, 0]);
    let p = ParamBuilder::new().ptr(b).u64(n as u64).ptr(out).build();
    ck(launch_packed(
        function("checksum"),
        std::ptr::null_mut(),
        &p,
    ));
    ck(ctx_sync());
    let got = download_u32(b, n);
    let want: Vec<u32> = (0..n as u64).map(|i| pattern_value(7, i)).collect();
    same(&got, &want, "copy of the pattern");
    let sum = download_u32(out, 2);
    let sum = u64::from(sum[0]) | (u64::from(sum[1]) << 32);
    let want_sum = want
        .iter()
        .zip(0u64..)
        .fold(0u64, |s, (&v, i)| s.wrapping_add(checksum_term(v, i)));
    assert_eq!(sum, want_sum);
}

#[test]
fn gather4_reads_pointers_inside_a_struct_parameter() {
    fresh_context();
    let n = 4096usize;
    let srcs: Vec<u64> = (0..4).map(|_| alloc(n * 4)).collect();
    for (j, &s) in srcs.iter().enumerate() {
        upload_u32(
            s,
            &(0..n as u64)
                .map(|i| pattern_value(j as u32 + 10, i))
                .collect::<Vec<_>>(),
        );
    }
    let dst = alloc(n * 4);
    let mut args = ParamBuilder::new();
    for &s in &srcs {
        args = args.ptr(s);
    }
    let mut args = args.ptr(dst).u64(n as u64).build();
    let mut params = [args.as_mut_ptr() as *mut c_void];
    ck(launch_args(
        function("gather4"),
        std::ptr::null_mut(),
        &mut params,
    ));
    let got = download_u32(dst, n);
    let want: Vec<u32> = (0..n as u64)
        .map(|i| (0..4).fold(0, |acc, j| acc ^ pattern_value(j + 10, i)))
        .collect();
    same(&got, &want, "gather4");
}

#[test]
fn float_kernels_are_bit_exact() {
    fresh_context();
    let (m, n, k) = (9usize, 11usize, 17usize);
    let floats = |seed: u32, len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| (pattern_value(seed, i as u64) % 1000) as f32 / 37.0 - 13.0)
            .collect()
    };
    let (av, bv) = (floats(1, m * k), floats(2, k * n));
    let (a, b, c) = (alloc(m * k * 4), alloc(k * n * 4), alloc(m * n * 4));
    let up = |p: u64, v: &[f32]| upload_u32(p, &v.iter().map(|f| f.to_bits()).collect::<Vec<_>>());
    up(a, &av);
    up(b, &bv);
    let p = ParamBuilder::new()
        .ptr(a)
        .ptr(b)
        .ptr(c)
        .u32(m as u32)
        .u32(n as u32)
        .u32(k as u32);
    ck(launch_packed(
        function("matmul_f32"),
        std::ptr::null_mut(),
        &p.build(),
    ));
    let got = download_u32(c, m * n);
    for r in 0..m {
        for col in 0..n {
            let mut acc = 0f32;
            for p in 0..k {
                acc = av[r * k + p].mul_add(bv[p * n + col], acc);
            }
            assert_eq!(got[r * n + col], acc.to_bits());
        }
    }
    // axpy then scale then sgd_momentum on the same buffers.
    let len = m * k;
    let p = ParamBuilder::new()
        .f32(0.5)
        .ptr(a)
        .ptr(a)
        .u64(len as u64)
        .build();
    ck(launch_packed(function("axpy"), std::ptr::null_mut(), &p));
    let p = ParamBuilder::new().ptr(a).f32(3.0).u64(len as u64).build();
    ck(launch_packed(function("scale"), std::ptr::null_mut(), &p));
    let (g, mom) = (alloc(len * 4), alloc(len * 4));
    let (gv, mv) = (floats(3, len), floats(4, len));
    up(g, &gv);
    up(mom, &mv);
    let p = ParamBuilder::new()
        .ptr(a)
        .ptr(g)
        .ptr(mom)
        .f32(0.1)
        .f32(0.9)
        .u64(len as u64)
        .build();
    ck(launch_packed(
        function("sgd_momentum"),
        std::ptr::null_mut(),
        &p,
    ));
    let (w, mm) = (download_u32(a, len), download_u32(mom, len));
    for i in 0..len {
        let x = 0.5f32.mul_add(av[i], av[i]) * 3.0;
        let m1 = 0.9f32.mul_add(mv[i], gv[i]);
        assert_eq!(mm[i], m1.to_bits());
        assert_eq!(w[i], (-0.1f32).mul_add(m1, x).to_bits());
    }
}

#[test]
fn param_info_comes_from_the_ptx_and_handles_are_distinct() {
    fresh_context();
    let ptx = CString::new(tensile_kernels::PTX).unwrap();
    let name = CString::new("gather4").unwrap();
    // SAFETY: valid strings and out-pointers throughout.
    unsafe {
        let mut lib = std::ptr::null_mut();
        let null = std::ptr::null_mut();
        ck(cuLibraryLoadData(
            &mut lib,
            ptx.as_ptr() as *const c_void,
            null,
            null as _,
            0,
            null,
            null as _,
            0,
        ));
        let mut kernel = std::ptr::null_mut();
        ck(cuLibraryGetKernel(&mut kernel, lib, name.as_ptr()));
        let (mut off, mut size) = (99usize, 0usize);
        ck(cuKernelGetParamInfo(kernel, 0, &mut off, &mut size));
        assert_eq!((off, size), (0, 48));
        assert_eq!(
            cuKernelGetParamInfo(kernel, 1, &mut off, &mut size),
            CUDA_ERROR_INVALID_VALUE
        );
        // The function form fails on a CUkernel, as on the real driver...
        assert_eq!(
            cuFuncGetParamInfo(kernel as CUfunction, 0, &mut off, &mut size),
            CUDA_ERROR_INVALID_HANDLE
        );
        // ...and works on the CUfunction.
        let mut f = std::ptr::null_mut();
        ck(cuKernelGetFunction(&mut f, kernel));
        assert_ne!(f as usize, kernel as usize);
        ck(cuFuncGetParamInfo(f, 0, &mut off, &mut size));
        assert_eq!((off, size), (0, 48));
        let mut cname = std::ptr::null();
        ck(cuKernelGetName(&mut cname, kernel));
        assert_eq!(std::ffi::CStr::from_ptr(cname).to_str().unwrap(), "gather4");
        ck(cuFuncGetName(&mut cname, f));
        assert_eq!(std::ffi::CStr::from_ptr(cname).to_str().unwrap(), "gather4");

        let mm = function("matmul_f32");
        let want = [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4), (32, 4)];
        for (i, w) in want.iter().enumerate() {
            ck(cuFuncGetParamInfo(mm, i, &mut off, &mut size));
            assert_eq!((off, size), *w);
        }
        assert_eq!(
            cuFuncGetParamInfo(mm, 6, &mut off, &mut size),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut count = 0;
        ck(cuFuncGetParamCount(mm, &mut count));
        assert_eq!(count, 6);
        ck(cuLibraryUnload(lib));
        assert_eq!(
            cuKernelGetParamInfo(kernel, 0, &mut off, &mut size),
            CUDA_ERROR_INVALID_HANDLE
        );
    }
}

#[test]
fn ptx_versions_and_missing_twins() {
    fresh_context();
    let load = |text: &str| -> (CUresult, CUmodule) {
        let c = CString::new(text).unwrap();
        let mut m = std::ptr::null_mut();
        // SAFETY: valid string and out-pointer.
        (
            unsafe { cuModuleLoadData(&mut m, c.as_ptr() as *const c_void) },
            m,
        )
    };
    assert_eq!(load("").0, CUDA_ERROR_INVALID_PTX);
    assert_eq!(load("\x7fELF and then some").0, CUDA_ERROR_INVALID_IMAGE);
    let newer = tensile_kernels::PTX.replace(".version 9.0", ".version 9.5");
    assert_eq!(load(&newer).0, CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
    assert_eq!(
        load(".version 9.0\n.target sm_90\n.entry k(.param .q64 a)\n{}").0,
        CUDA_ERROR_INVALID_PTX
    );
    let (rc, m) = load(".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry mystery(.param .u64 p)\n{ ret; }");
    ck(rc);
    let name = CString::new("mystery").unwrap();
    let mut f = std::ptr::null_mut();
    // SAFETY: valid handles and out-pointers.
    unsafe {
        ck(cuModuleGetFunction(&mut f, m, name.as_ptr()));
        let missing = CString::new("nope").unwrap();
        let mut g = std::ptr::null_mut();
        assert_eq!(
            cuModuleGetFunction(&mut g, m, missing.as_ptr()),
            CUDA_ERROR_NOT_FOUND
        );
    }
    let p = ParamBuilder::new().ptr(0).build();
    assert_eq!(
        launch_packed(f, std::ptr::null_mut(), &p),
        CUDA_ERROR_NOT_SUPPORTED
    );
    // Bad launch shapes and parameter forms.
    let fill = function("fill_pattern");
    let mut buf = ParamBuilder::new().ptr(0).u64(0).u32(0).build();
    let mut args = [buf.as_mut_ptr() as *mut c_void];
    // SAFETY: valid pointers; the calls must fail validation before using them.
    unsafe {
        assert_eq!(
            cuLaunchKernel(
                fill,
                0,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                args.as_mut_ptr(),
                std::ptr::null_mut()
            ),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(
                fill,
                1,
                1,
                1,
                2048,
                1,
                1,
                0,
                std::ptr::null_mut(),
                args.as_mut_ptr(),
                std::ptr::null_mut()
            ),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(
                fill,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            CUDA_ERROR_INVALID_VALUE
        );
    }
}
