//! Memset hooks: make managed memory device-resident, forward, then record which
//! allocation was written.

use tensile_driver_abi::{CUdeviceptr, CUresult, CUstream, CUDA_SUCCESS};

use super::{implicit_stream, residency, Call};
use crate::syms::pfn;

/// `span`: bytes from `dst` to one past the last byte written (rows and pitch for 2D).
#[allow(clippy::too_many_arguments)]
fn memset_with<F>(
    call: &Call<F>,
    dst: CUdeviceptr,
    bytes: usize,
    span: usize,
    stream: u64,
    asynchronous: bool,
    forward: impl FnOnce() -> CUresult,
) -> CUresult {
    let t = call.rt.now_ns();
    let what = || format!("{} of {} bytes", call.sym.name(), bytes);
    let r = residency::forward_pinned(call.rt, stream, &[(dst, span)], what, forward);
    if r == CUDA_SUCCESS {
        if let Some(rec) = call.rt.records() {
            call.rt
                .tracker
                .memset(rec, t, stream, dst, bytes as u64, asynchronous);
        }
    }
    r
}

/// Bytes a 2D memset covers: `height` rows of `width` elements.
fn bytes_2d(width: usize, height: usize, element: usize) -> usize {
    width.saturating_mul(element).saturating_mul(height)
}

/// Bytes from the start of a 2D memset to one past its last byte.
fn span_2d(pitch: usize, width: usize, height: usize, element: usize) -> usize {
    if height == 0 {
        return 0;
    }
    (height - 1)
        .saturating_mul(pitch)
        .saturating_add(width.saturating_mul(element))
}

macro_rules! memset_hooks {
    ($( $name:ident, $name_async:ident, $fam:ident, $fam_async:ident, $t:ty, $size:expr; )*) => {$(
        #[doc = concat!("`cuMemsetD", stringify!($fam), "`-style synchronous memset.")]
        ///
        /// # Safety
        /// The driver's contract for the function of `call.sym`.
        pub unsafe fn $name(call: Call<pfn::$fam>, dst: CUdeviceptr, value: $t, count: usize) -> CUresult {
            let bytes = count.saturating_mul($size);
            // SAFETY: forwarded unchanged.
            memset_with(&call, dst, bytes, bytes, implicit_stream(call.sym), false, || unsafe { (call.real)(dst, value, count) })
        }

        #[doc = concat!("`cuMemsetD", stringify!($fam), "Async`-style memset.")]
        ///
        /// # Safety
        /// The driver's contract for the function of `call.sym`.
        pub unsafe fn $name_async(call: Call<pfn::$fam_async>, dst: CUdeviceptr, value: $t, count: usize, stream: CUstream) -> CUresult {
            let bytes = count.saturating_mul($size);
            // SAFETY: forwarded unchanged.
            memset_with(&call, dst, bytes, bytes, call.stream(stream), true, || unsafe { (call.real)(dst, value, count, stream) })
        }
    )*};
}

macro_rules! memset_2d_hooks {
    ($( $name:ident, $name_async:ident, $fam:ident, $fam_async:ident, $t:ty, $size:expr; )*) => {$(
        #[doc = concat!("`cuMemset", stringify!($fam), "`-style synchronous 2D memset.")]
        ///
        /// # Safety
        /// The driver's contract for the function of `call.sym`.
        pub unsafe fn $name(call: Call<pfn::$fam>, dst: CUdeviceptr, pitch: usize, value: $t, width: usize, height: usize) -> CUresult {
            let bytes = bytes_2d(width, height, $size);
            let span = span_2d(pitch, width, height, $size);
            // SAFETY: forwarded unchanged.
            memset_with(&call, dst, bytes, span, implicit_stream(call.sym), false, || unsafe { (call.real)(dst, pitch, value, width, height) })
        }

        #[doc = concat!("`cuMemset", stringify!($fam), "Async`-style 2D memset.")]
        ///
        /// # Safety
        /// The driver's contract for the function of `call.sym`.
        pub unsafe fn $name_async(
            call: Call<pfn::$fam_async>,
            dst: CUdeviceptr,
            pitch: usize,
            value: $t,
            width: usize,
            height: usize,
            stream: CUstream,
        ) -> CUresult {
            let bytes = bytes_2d(width, height, $size);
            let span = span_2d(pitch, width, height, $size);
            // SAFETY: forwarded unchanged.
            memset_with(&call, dst, bytes, span, call.stream(stream), true, || unsafe { (call.real)(dst, pitch, value, width, height, stream) })
        }
    )*};
}

memset_hooks! {
    memset_d8, memset_d8_async, MemsetD8, MemsetD8Async, u8, 1;
    memset_d16, memset_d16_async, MemsetD16, MemsetD16Async, u16, 2;
    memset_d32, memset_d32_async, MemsetD32, MemsetD32Async, u32, 4;
}

memset_2d_hooks! {
    memset_d2d8, memset_d2d8_async, MemsetD2D8, MemsetD2D8Async, u8, 1;
    memset_d2d16, memset_d2d16_async, MemsetD2D16, MemsetD2D16Async, u16, 2;
    memset_d2d32, memset_d2d32_async, MemsetD2D32, MemsetD2D32Async, u32, 4;
}
