//! A workload's view of the GPU: driver calls that also print what libtensile must see.
//!
//! Each method makes one driver call (through the [`Driver`] table, fetched the way the
//! workload chose) and prints its [`Expect`] line. The caller states which allocation each
//! pointer argument belongs to, because only the program knows that.

// Streams, events and pools are opaque driver handles passed through to the driver, never
// dereferenced here; the methods are safe in the sense of every CUDA wrapper (a dead
// handle is the program's bug, reported by the driver).
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_void, CString};
use std::io::Write;
use std::sync::Mutex;

use tensile_driver_abi::*;
use tensile_kernels::ptx::{parse_entries, EntrySignature};

use crate::driver::{check, Driver, Lookup};
use crate::expect::{fnv1a, Expect};

/// One kernel argument.
#[derive(Debug, Clone)]
pub enum Arg {
    /// A device pointer: `ptr`, inside the allocation starting at `base`.
    Ptr {
        ptr: CUdeviceptr,
        base: CUdeviceptr,
    },
    U32(u32),
    U64(u64),
    F32(f32),
    /// A by-value struct: its bytes, and (offset within, allocation base) of each pointer.
    Struct {
        bytes: Vec<u8>,
        pointers: Vec<(u32, CUdeviceptr)>,
    },
}

impl Arg {
    /// A pointer to the start of an allocation.
    pub fn ptr(p: CUdeviceptr) -> Arg {
        Arg::Ptr { ptr: p, base: p }
    }

    fn bytes(&self) -> Vec<u8> {
        match self {
            Arg::Ptr { ptr, .. } => ptr.to_le_bytes().to_vec(),
            Arg::U32(v) => v.to_le_bytes().to_vec(),
            Arg::U64(v) => v.to_le_bytes().to_vec(),
            Arg::F32(v) => v.to_le_bytes().to_vec(),
            Arg::Struct { bytes, .. } => bytes.clone(),
        }
    }
}

/// How a launch passes its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `cuLaunchKernel` with `kernelParams`.
    Params,
    /// `cuLaunchKernel` with the `extra` packed buffer.
    Extra,
    /// `cuLaunchKernelEx` with `kernelParams`.
    Ex,
}

/// A loaded kernel: the handle launched, and its parameter layout from the PTX.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub name: String,
    pub handle: CUfunction,
    pub signature: EntrySignature,
}

/// A context on device 0 and the driver table, printing expectations as it goes.
pub struct Session {
    pub d: Driver,
    pub ctx: CUcontext,
    out: Mutex<std::io::Stdout>,
}

// SAFETY: the driver handles are thread-safe by the CUDA API contract; stdout is locked.
unsafe impl Sync for Session {}
// SAFETY: as above.
unsafe impl Send for Session {}

impl Session {
    /// Loads the driver the way `lookup` says and makes device 0's primary context current.
    pub fn start(lookup: Lookup) -> Session {
        let d = Driver::load(lookup).unwrap_or_else(|e| panic!("loading the driver: {e}"));
        let mut dev = 0;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointers.
        unsafe {
            check((d.cuInit)(0), "cuInit");
            check((d.cuDeviceGet)(&mut dev, 0), "cuDeviceGet");
            check(
                (d.cuDevicePrimaryCtxRetain)(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            );
            check((d.cuCtxSetCurrent)(ctx), "cuCtxSetCurrent");
        }
        Session {
            d,
            ctx,
            out: Mutex::new(std::io::stdout()),
        }
    }

    /// Makes the context current on the calling thread (for worker threads).
    pub fn bind(&self) {
        // SAFETY: a live context.
        check(
            unsafe { (self.d.cuCtxSetCurrent)(self.ctx) },
            "cuCtxSetCurrent",
        );
    }

    /// Prints a line atomically.
    pub fn say(&self, line: impl std::fmt::Display) {
        let out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = out.lock();
        let _ = writeln!(out, "{line}");
    }

    fn expect(&self, e: Expect) {
        self.say(e);
    }

    /// The stream value the trace must show for `s`.
    pub fn stream_id(&self, s: CUstream) -> u64 {
        if s.is_null() && self.d.lookup.per_thread() {
            CU_STREAM_PER_THREAD as u64
        } else {
            s as u64
        }
    }

    /// A stream.
    pub fn stream(&self) -> CUstream {
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(
            unsafe { (self.d.cuStreamCreate)(&mut s, CU_STREAM_NON_BLOCKING) },
            "cuStreamCreate",
        );
        s
    }

    /// Every entry of the committed kernels, loaded as a module (`CUfunction` handles) or a
    /// library (`CUkernel` handles, what CUDA 12+ runtimes launch).
    pub fn kernels(&self, as_library: bool) -> Vec<Kernel> {
        let ptx = CString::new(tensile_kernels::PTX).expect("PTX has no NUL");
        let signatures = parse_entries(tensile_kernels::PTX).expect("committed PTX parses");
        let mut out = Vec::new();
        // SAFETY: valid C strings and out-pointers; null option arrays with zero counts.
        unsafe {
            if as_library {
                let mut lib = std::ptr::null_mut();
                let n = std::ptr::null_mut();
                check(
                    (self.d.cuLibraryLoadData)(
                        &mut lib,
                        ptx.as_ptr().cast(),
                        n,
                        std::ptr::null_mut(),
                        0,
                        n,
                        std::ptr::null_mut(),
                        0,
                    ),
                    "cuLibraryLoadData",
                );
                for sig in signatures {
                    let name = CString::new(sig.name.clone()).expect("entry names have no NUL");
                    let mut k = std::ptr::null_mut();
                    check(
                        (self.d.cuLibraryGetKernel)(&mut k, lib, name.as_ptr()),
                        "cuLibraryGetKernel",
                    );
                    out.push(Kernel {
                        name: sig.name.clone(),
                        handle: k,
                        signature: sig,
                    });
                }
            } else {
                let mut m = std::ptr::null_mut();
                check(
                    (self.d.cuModuleLoadData)(&mut m, ptx.as_ptr().cast()),
                    "cuModuleLoadData",
                );
                for sig in signatures {
                    let name = CString::new(sig.name.clone()).expect("entry names have no NUL");
                    let mut f = std::ptr::null_mut();
                    check(
                        (self.d.cuModuleGetFunction)(&mut f, m, name.as_ptr()),
                        "cuModuleGetFunction",
                    );
                    out.push(Kernel {
                        name: sig.name.clone(),
                        handle: f,
                        signature: sig,
                    });
                }
            }
        }
        out
    }

    /// `cuMemAlloc`.
    pub fn alloc(&self, bytes: usize) -> CUdeviceptr {
        let mut p = 0;
        // SAFETY: valid out-pointer.
        check(unsafe { (self.d.cuMemAlloc)(&mut p, bytes) }, "cuMemAlloc");
        self.expect(Expect::Alloc {
            ptr: p,
            bytes: bytes as u64,
            kind: "sync".into(),
            stream: 0,
        });
        p
    }

    /// `cuMemAllocPitch`; returns (pointer, pitch).
    pub fn alloc_pitch(&self, width: usize, height: usize) -> (CUdeviceptr, usize) {
        let (mut p, mut pitch) = (0, 0);
        // SAFETY: valid out-pointers.
        check(
            unsafe { (self.d.cuMemAllocPitch)(&mut p, &mut pitch, width, height, 4) },
            "cuMemAllocPitch",
        );
        self.expect(Expect::Alloc {
            ptr: p,
            bytes: (pitch * height) as u64,
            kind: "pitch".into(),
            stream: 0,
        });
        (p, pitch)
    }

    /// `cuMemAllocAsync`.
    pub fn alloc_async(&self, bytes: usize, s: CUstream) -> CUdeviceptr {
        let mut p = 0;
        // SAFETY: valid out-pointer, live stream.
        check(
            unsafe { (self.d.cuMemAllocAsync)(&mut p, bytes, s) },
            "cuMemAllocAsync",
        );
        self.expect(Expect::Alloc {
            ptr: p,
            bytes: bytes as u64,
            kind: "async".into(),
            stream: self.stream_id(s),
        });
        p
    }

    /// A memory pool on device 0.
    pub fn pool(&self) -> CUmemoryPool {
        let props = crate::driver::MemPoolProps {
            alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
            handle_types: 0,
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: 0,
            },
            win32_security_attributes: std::ptr::null_mut(),
            max_size: 0,
            usage: 0,
            reserved: [0; 54],
        };
        let mut pool = std::ptr::null_mut();
        // SAFETY: valid props and out-pointer.
        check(
            unsafe { (self.d.cuMemPoolCreate)(&mut pool, &props) },
            "cuMemPoolCreate",
        );
        pool
    }

    /// `cuMemAllocFromPoolAsync`.
    pub fn alloc_from_pool(&self, bytes: usize, pool: CUmemoryPool, s: CUstream) -> CUdeviceptr {
        let mut p = 0;
        // SAFETY: valid out-pointer, live pool and stream.
        check(
            unsafe { (self.d.cuMemAllocFromPoolAsync)(&mut p, bytes, pool, s) },
            "cuMemAllocFromPoolAsync",
        );
        self.expect(Expect::Alloc {
            ptr: p,
            bytes: bytes as u64,
            kind: "pool".into(),
            stream: self.stream_id(s),
        });
        p
    }

    /// `cuMemFree`.
    pub fn free(&self, p: CUdeviceptr) {
        // SAFETY: a live allocation.
        check(unsafe { (self.d.cuMemFree)(p) }, "cuMemFree");
        self.expect(Expect::Free { ptr: p, stream: 0 });
    }

    /// `cuMemFreeAsync`.
    pub fn free_async(&self, p: CUdeviceptr, s: CUstream) {
        // SAFETY: a live allocation and stream.
        check(unsafe { (self.d.cuMemFreeAsync)(p, s) }, "cuMemFreeAsync");
        self.expect(Expect::Free {
            ptr: p,
            stream: self.stream_id(s),
        });
    }

    /// `cuMemcpyHtoD` (or the async form on `s`) to the start of an allocation.
    pub fn upload(&self, dst: CUdeviceptr, data: &[u8], s: Option<CUstream>) {
        self.upload_at((dst, dst), data, s)
    }

    /// `cuMemcpyHtoD` (or async) to `dst.0`, inside the allocation starting at `dst.1`.
    pub fn upload_at(
        &self,
        (dst, base): (CUdeviceptr, CUdeviceptr),
        data: &[u8],
        s: Option<CUstream>,
    ) {
        // SAFETY: `data` is live for its length; the destination is device memory the
        // caller allocated; for the async form the caller keeps `data` alive until a sync.
        let r = unsafe {
            match s {
                Some(s) => (self.d.cuMemcpyHtoDAsync)(dst, data.as_ptr().cast(), data.len(), s),
                None => (self.d.cuMemcpyHtoD)(dst, data.as_ptr().cast(), data.len()),
            }
        };
        check(r, "cuMemcpyHtoD");
        let (stream, asynchronous) = self.copy_stream(s);
        self.expect(Expect::Copy {
            kind: "htod".into(),
            dst: base,
            src: 0,
            bytes: data.len() as u64,
            asynchronous,
            stream,
        });
    }

    /// `cuMemcpyDtoH` (or the async form on `s`, then a stream sync).
    pub fn download(&self, src: CUdeviceptr, bytes: usize, s: Option<CUstream>) -> Vec<u8> {
        let mut v = vec![0u8; bytes];
        // SAFETY: `v` holds `bytes` bytes; the source is the caller's device memory.
        let r = unsafe {
            match s {
                Some(s) => (self.d.cuMemcpyDtoHAsync)(v.as_mut_ptr().cast(), src, bytes, s),
                None => (self.d.cuMemcpyDtoH)(v.as_mut_ptr().cast(), src, bytes),
            }
        };
        check(r, "cuMemcpyDtoH");
        let (stream, asynchronous) = self.copy_stream(s);
        self.expect(Expect::Copy {
            kind: "dtoh".into(),
            dst: 0,
            src,
            bytes: bytes as u64,
            asynchronous,
            stream,
        });
        if let Some(s) = s {
            self.sync_stream(s);
        }
        v
    }

    /// `cuMemcpyDtoD` (or async). `dst_base`/`src_base`: the allocations the pointers are in.
    pub fn copy_dtod(
        &self,
        dst: (CUdeviceptr, CUdeviceptr),
        src: (CUdeviceptr, CUdeviceptr),
        bytes: usize,
        s: Option<CUstream>,
    ) {
        // SAFETY: both ranges are the caller's device memory.
        let r = unsafe {
            match s {
                Some(s) => (self.d.cuMemcpyDtoDAsync)(dst.0, src.0, bytes, s),
                None => (self.d.cuMemcpyDtoD)(dst.0, src.0, bytes),
            }
        };
        check(r, "cuMemcpyDtoD");
        let (stream, asynchronous) = self.copy_stream(s);
        self.expect(Expect::Copy {
            kind: "dtod".into(),
            dst: dst.1,
            src: src.1,
            bytes: bytes as u64,
            asynchronous,
            stream,
        });
    }

    /// `cuMemcpy` / `cuMemcpyAsync` (unified addressing) between two device buffers.
    pub fn copy_any(&self, dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, s: Option<CUstream>) {
        // SAFETY: both ranges are the caller's device memory.
        let r = unsafe {
            match s {
                Some(s) => (self.d.cuMemcpyAsync)(dst, src, bytes, s),
                None => (self.d.cuMemcpy)(dst, src, bytes),
            }
        };
        check(r, "cuMemcpy");
        let (stream, asynchronous) = self.copy_stream(s);
        self.expect(Expect::Copy {
            kind: "any".into(),
            dst,
            src,
            bytes: bytes as u64,
            asynchronous,
            stream,
        });
    }

    /// `cuMemcpy2D` (or async) of `height` rows of `width` bytes from host rows to a
    /// pitched device allocation.
    pub fn upload_2d(
        &self,
        dst: CUdeviceptr,
        pitch: usize,
        host: &[u8],
        width: usize,
        height: usize,
        s: Option<CUstream>,
    ) {
        let c = CUDA_MEMCPY2D {
            src_x_in_bytes: 0,
            src_y: 0,
            src_memory_type: CU_MEMORYTYPE_HOST,
            src_host: host.as_ptr().cast(),
            src_device: 0,
            src_array: std::ptr::null_mut(),
            src_pitch: width,
            dst_x_in_bytes: 0,
            dst_y: 0,
            dst_memory_type: CU_MEMORYTYPE_DEVICE,
            dst_host: std::ptr::null_mut(),
            dst_device: dst,
            dst_array: std::ptr::null_mut(),
            dst_pitch: pitch,
            width_in_bytes: width,
            height,
        };
        assert!(host.len() >= width * height);
        // SAFETY: the descriptor describes live host and device memory.
        let r = unsafe {
            match s {
                Some(s) => (self.d.cuMemcpy2DAsync)(&c, s),
                None => (self.d.cuMemcpy2D)(&c),
            }
        };
        check(r, "cuMemcpy2D");
        let (stream, asynchronous) = self.copy_stream(s);
        self.expect(Expect::Copy {
            kind: "htod".into(),
            dst,
            src: 0,
            bytes: (width * height) as u64,
            asynchronous,
            stream,
        });
    }

    /// `cuMemsetD32` / `cuMemsetD8` / `cuMemsetD16` (sync) or the async D8/D32 forms, from
    /// the start of an allocation.
    pub fn memset(
        &self,
        dst: CUdeviceptr,
        elem: usize,
        value: u32,
        count: usize,
        s: Option<CUstream>,
    ) {
        self.memset_at((dst, dst), elem, value, count, s)
    }

    /// A memset at `dst.0`, inside the allocation starting at `dst.1`.
    pub fn memset_at(
        &self,
        (dst, base): (CUdeviceptr, CUdeviceptr),
        elem: usize,
        value: u32,
        count: usize,
        s: Option<CUstream>,
    ) {
        // SAFETY: the range is the caller's device memory.
        let r = unsafe {
            match (elem, s) {
                (1, None) => (self.d.cuMemsetD8)(dst, value as u8, count),
                (2, None) => (self.d.cuMemsetD16)(dst, value as u16, count),
                (4, None) => (self.d.cuMemsetD32)(dst, value, count),
                (1, Some(s)) => (self.d.cuMemsetD8Async)(dst, value as u8, count, s),
                (4, Some(s)) => (self.d.cuMemsetD32Async)(dst, value, count, s),
                _ => panic!("no memset of {elem}-byte elements here"),
            }
        };
        check(r, "cuMemset");
        let (stream, asynchronous) = self.copy_stream(s);
        self.expect(Expect::Memset {
            dst: base,
            bytes: (elem * count) as u64,
            asynchronous,
            stream,
        });
    }

    fn copy_stream(&self, s: Option<CUstream>) -> (u64, bool) {
        match s {
            Some(s) => (self.stream_id(s), true),
            None => (self.stream_id(std::ptr::null_mut()), false),
        }
    }

    /// `cuStreamSynchronize`.
    pub fn sync_stream(&self, s: CUstream) {
        // SAFETY: a live stream.
        check(
            unsafe { (self.d.cuStreamSynchronize)(s) },
            "cuStreamSynchronize",
        );
        self.expect(Expect::Sync {
            scope: "stream".into(),
            handle: self.stream_id(s),
        });
    }

    /// `cuCtxSynchronize`.
    pub fn sync_ctx(&self) {
        // SAFETY: a current context.
        check(unsafe { (self.d.cuCtxSynchronize)() }, "cuCtxSynchronize");
        self.expect(Expect::Sync {
            scope: "ctx".into(),
            handle: 0,
        });
    }

    /// An event recorded on `s`.
    pub fn record_event(&self, s: CUstream) -> CUevent {
        let mut e = std::ptr::null_mut();
        // SAFETY: valid out-pointer, live stream.
        unsafe {
            check(
                (self.d.cuEventCreate)(&mut e, CU_EVENT_DEFAULT),
                "cuEventCreate",
            );
            check((self.d.cuEventRecord)(e, s), "cuEventRecord");
        }
        e
    }

    /// `cuStreamWaitEvent`.
    pub fn wait_event(&self, s: CUstream, e: CUevent) {
        // SAFETY: live stream and event.
        check(
            unsafe { (self.d.cuStreamWaitEvent)(s, e, 0) },
            "cuStreamWaitEvent",
        );
    }

    /// `cuEventSynchronize`.
    pub fn sync_event(&self, e: CUevent) {
        // SAFETY: a live event.
        check(
            unsafe { (self.d.cuEventSynchronize)(e) },
            "cuEventSynchronize",
        );
        self.expect(Expect::Sync {
            scope: "event".into(),
            handle: e as u64,
        });
    }

    /// Launches `k` with `args` on `s`, passing them in `form`.
    pub fn launch(&self, k: &Kernel, grid: u32, block: u32, s: CUstream, args: &[Arg], form: Form) {
        let r = self.try_launch(k, grid, block, s, args, form);
        check(r, &format!("launch of {}", k.name));
    }

    /// [`Session::launch`] that returns the driver's result instead of panicking on an
    /// error (the expectation line is printed only for a launch the driver accepted).
    pub fn try_launch(
        &self,
        k: &Kernel,
        grid: u32,
        block: u32,
        s: CUstream,
        args: &[Arg],
        form: Form,
    ) -> CUresult {
        let params = &k.signature.params;
        assert_eq!(params.len(), args.len(), "{}: argument count", k.name);
        let mut accesses = Vec::new();
        // Each argument in its own 8-aligned storage (the kernelParams form).
        let storage: Vec<Vec<u64>> = args
            .iter()
            .zip(params)
            .map(|(a, slot)| {
                let b = a.bytes();
                assert_eq!(b.len(), slot.size as usize, "{}: argument size", k.name);
                let mut words = vec![0u64; b.len().div_ceil(8)];
                // SAFETY: `words` holds at least `b.len()` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        b.as_ptr(),
                        words.as_mut_ptr().cast::<u8>(),
                        b.len(),
                    )
                };
                words
            })
            .collect();
        for (a, slot) in args.iter().zip(params) {
            match a {
                Arg::Ptr { base, .. } => accesses.push((*base, slot.offset)),
                Arg::Struct { pointers, .. } => accesses.extend(
                    pointers
                        .iter()
                        .map(|(within, base)| (*base, slot.offset + within)),
                ),
                _ => {}
            }
        }
        let mut kernel_params: Vec<*mut c_void> =
            storage.iter().map(|w| w.as_ptr() as *mut c_void).collect();
        let mut packed = vec![0u8; k.signature.param_bytes() as usize];
        for (a, slot) in args.iter().zip(params) {
            let b = a.bytes();
            packed[slot.offset as usize..slot.offset as usize + b.len()].copy_from_slice(&b);
        }
        let mut size = packed.len();
        let mut extra: [*mut c_void; 5] = [
            CU_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            packed.as_mut_ptr().cast(),
            CU_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            CU_LAUNCH_PARAM_END as *mut c_void,
        ];
        // SAFETY: the parameters match the kernel's PTX signature; all buffers outlive the
        // call (the driver copies the arguments at launch).
        let r = unsafe {
            match form {
                Form::Params => (self.d.cuLaunchKernel)(
                    k.handle,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    s,
                    kernel_params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
                Form::Extra => (self.d.cuLaunchKernel)(
                    k.handle,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    s,
                    std::ptr::null_mut(),
                    extra.as_mut_ptr(),
                ),
                Form::Ex => {
                    let config = CUlaunchConfig {
                        grid_dim_x: grid,
                        grid_dim_y: 1,
                        grid_dim_z: 1,
                        block_dim_x: block,
                        block_dim_y: 1,
                        block_dim_z: 1,
                        shared_mem_bytes: 0,
                        h_stream: s,
                        attrs: std::ptr::null_mut(),
                        num_attrs: 0,
                    };
                    (self.d.cuLaunchKernelEx)(
                        &config,
                        k.handle,
                        kernel_params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                }
            }
        };
        if r == CUDA_SUCCESS {
            self.expect(Expect::Launch {
                kernel: k.name.clone(),
                stream: self.stream_id(s),
                grid: [grid, 1, 1],
                block: [block, 1, 1],
                smem: 0,
                accesses,
            });
        }
        r
    }

    /// Prints the digest of a device buffer's contents (downloaded synchronously).
    pub fn digest(&self, name: &str, p: CUdeviceptr, bytes: usize) {
        let data = self.download(p, bytes, None);
        self.say(format!("D {name} {:016x}", fnv1a(&data)));
    }
}

/// Bytes of `n` u32 values.
pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Bytes of `n` f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The kernel called `name` among `kernels` (a workload's own module: a missing one is a bug
/// in the workload, so it panics).
pub fn kernel<'a>(kernels: &'a [Kernel], name: &str) -> &'a Kernel {
    kernels
        .iter()
        .find(|k| k.name == name)
        .unwrap_or_else(|| panic!("no kernel {name}"))
}

/// The workload's numeric argument `i` (`std::env::args` numbering), or `default` when it is
/// absent; a malformed one panics with its position.
pub fn numeric_arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map(|a| a.parse().unwrap_or_else(|_| panic!("argument {i}: {a:?}")))
        .unwrap_or(default)
}
