//! Kernel launches: validate the shape, gather the parameter buffer (from `kernelParams`, or
//! from the `extra` packed-buffer form), and queue the entry's CPU twin.
//!
//! A launch of an entry without a twin is `CUDA_ERROR_NOT_SUPPORTED` at launch time.
//! Launch attributes of `cuLaunchKernelEx` (clusters, priorities, ...) are accepted and ignored.

use std::ffi::{c_uint, c_void};

use tensile_driver_abi::*;
use tensile_kernels::Dim3;

use super::module::launch_entry;
use super::{per_thread_pair, resolve_stream, submit};
use crate::module::Entry;
use crate::ops::Op;

const MAX_BLOCK_THREADS: u64 = 1024;
const MAX_SHARED_BYTES: u32 = 227 << 10;

fn check_shape(grid: Dim3, block: Dim3, shared: u32) -> Result<(), CUresult> {
    let dims = [grid.x, grid.y, grid.z, block.x, block.y, block.z];
    if dims.contains(&0) || grid.y > 65535 || grid.z > 65535 || grid.x > i32::MAX as u32 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if block.x > 1024 || block.y > 1024 || block.z > 64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let threads = u64::from(block.x) * u64::from(block.y) * u64::from(block.z);
    if threads > MAX_BLOCK_THREADS {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if shared > MAX_SHARED_BYTES {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// The parameter buffer laid out per the entry's signature.
///
/// # Safety
/// `params`: NULL or one pointer per parameter, each to that parameter's bytes; `extra`: NULL
/// or a `CU_LAUNCH_PARAM_END`-terminated key/value list (the API contract).
unsafe fn gather_params(
    entry: &Entry,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<Vec<u8>, CUresult> {
    let total = entry.sig.param_bytes() as usize;
    let mut buf = vec![0u8; total];
    match (params.is_null(), extra.is_null()) {
        (false, false) => Err(CUDA_ERROR_INVALID_VALUE),
        (false, true) => {
            for (i, slot) in entry.sig.params.iter().enumerate() {
                // SAFETY: `params` has one pointer per parameter (API contract).
                let p = unsafe { *params.add(i) };
                if p.is_null() {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let at = slot.offset as usize;
                // SAFETY: `p` points to the parameter's `size` bytes (API contract); the slot
                // lies inside `buf` by construction of the signature.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        p as *const u8,
                        buf[at..].as_mut_ptr(),
                        slot.size as usize,
                    )
                };
            }
            Ok(buf)
        }
        (true, false) => {
            let (mut pointer, mut size): (*const u8, Option<usize>) = (std::ptr::null(), None);
            let mut i = 0;
            loop {
                // SAFETY: the list is END-terminated, with a value after every other key.
                let key = unsafe { *extra.add(i) } as usize;
                if key == CU_LAUNCH_PARAM_END {
                    break;
                }
                // SAFETY: as above.
                let value = unsafe { *extra.add(i + 1) };
                match key {
                    CU_LAUNCH_PARAM_BUFFER_POINTER => pointer = value as *const u8,
                    CU_LAUNCH_PARAM_BUFFER_SIZE if !value.is_null() => {
                        // SAFETY: the value of BUFFER_SIZE points to a size_t.
                        size = Some(unsafe { *(value as *const usize) });
                    }
                    _ => return Err(CUDA_ERROR_INVALID_VALUE),
                }
                i += 2;
            }
            match size {
                Some(n) if !pointer.is_null() && n >= total => {
                    // SAFETY: the buffer holds `n >= total` bytes (API contract).
                    unsafe { std::ptr::copy_nonoverlapping(pointer, buf.as_mut_ptr(), total) };
                    Ok(buf)
                }
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        (true, true) if total == 0 => Ok(buf),
        (true, true) => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// # Safety
/// As for `cuLaunchKernel`.
#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    pt: bool,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    h: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), CUresult> {
    let entry = launch_entry(f)?;
    let (grid, block) = (Dim3::new(gx, gy, gz), Dim3::new(bx, by, bz));
    check_shape(grid, block, shared)?;
    // SAFETY: API contract of the parameter arguments.
    let buf = unsafe { gather_params(&entry, params, extra) }?;
    let (ctx, stream) = resolve_stream(h, pt)?;
    ctx.check()?;
    let twin = entry.twin.ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    let modelled = twin.modelled_duration.and_then(|duration_of| {
        duration_of(&tensile_kernels::Launch {
            grid,
            block,
            params: &buf,
        })
    });
    let op = Op::Kernel {
        name: entry.name.clone(),
        run: twin.run,
        grid,
        block,
        params: buf,
        modelled,
    };
    submit(&ctx, &stream, Vec::new(), op)?;
    Ok(())
}
per_thread_pair!(cuLaunchKernel, cuLaunchKernel_ptsz, launch, (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, h: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void));

unsafe fn launch_ex(
    pt: bool,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<(), CUresult> {
    if config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and points to a CUlaunchConfig (API contract).
    let c = unsafe { std::ptr::read_unaligned(config) };
    if c.num_attrs > 0 && c.attrs.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: forwarded under the same contract.
    unsafe {
        launch(
            pt,
            f,
            c.grid_dim_x,
            c.grid_dim_y,
            c.grid_dim_z,
            c.block_dim_x,
            c.block_dim_y,
            c.block_dim_z,
            c.shared_mem_bytes,
            c.h_stream,
            params,
            extra,
        )
    }
}
per_thread_pair!(cuLaunchKernelEx, cuLaunchKernelEx_ptsz, launch_ex, (config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void));

/// Cooperative launches run like ordinary ones (the twins need no grid-wide sync).
#[allow(clippy::too_many_arguments)]
unsafe fn launch_cooperative(
    pt: bool,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    h: CUstream,
    params: *mut *mut c_void,
) -> Result<(), CUresult> {
    // SAFETY: forwarded under the same contract, without the `extra` form.
    unsafe {
        launch(
            pt,
            f,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            shared,
            h,
            params,
            std::ptr::null_mut(),
        )
    }
}
per_thread_pair!(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz, launch_cooperative, (f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, h: CUstream, params: *mut *mut c_void));
