//! The managed entry points, written down once.
//!
//! [`with_managed_entry_points!`](crate::with_managed_entry_points) holds the list: for each *family* (one C signature), the
//! hook in [`crate::hooks`] that implements it and the versioned driver symbols that share
//! it (`cuMemcpyHtoD_v2` and `cuMemcpyHtoD_v2_ptds` are one family). The list is expanded
//! twice: here, into the [`Sym`] enum, the function pointer types ([`pfn`]) and the Rust
//! entry functions ([`crate::entry`]); and in `ld-preload`, into the exported C functions.
//! One list means the two can never disagree about which symbols exist or their signatures.
//!
//! This module is not the place for behaviour: every entry function only looks up the real
//! function for its symbol and hands over to its hook.

/// Calls `$callback! { ... }` with the list of managed entry point families.
///
/// Each line is `Family => hook::path : (arg: Type, ...) = [symbol, ...];`. Every symbol
/// of a family has exactly the C signature `(args) -> CUresult`. `cuGetProcAddress` and
/// `cuGetProcAddress_v2` are not in the list: their exports are written by hand because
/// they need the table of wrappers (see [`crate::proc_address`]).
#[macro_export]
macro_rules! with_managed_entry_points {
    ($callback:path) => {
        $callback! {
            // Allocations and frees.
            MemAlloc => alloc::mem_alloc
                : (dptr: *mut $crate::abi::CUdeviceptr, bytesize: usize)
                = [cuMemAlloc_v2];
            MemAllocPitch => alloc::mem_alloc_pitch
                : (dptr: *mut $crate::abi::CUdeviceptr, pitch: *mut usize, width: usize,
                   height: usize, element_size: u32)
                = [cuMemAllocPitch_v2];
            MemAllocAsync => alloc::mem_alloc_async
                : (dptr: *mut $crate::abi::CUdeviceptr, bytesize: usize,
                   stream: $crate::abi::CUstream)
                = [cuMemAllocAsync, cuMemAllocAsync_ptsz];
            MemAllocFromPoolAsync => alloc::mem_alloc_from_pool_async
                : (dptr: *mut $crate::abi::CUdeviceptr, bytesize: usize,
                   pool: $crate::abi::CUmemoryPool, stream: $crate::abi::CUstream)
                = [cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz];
            MemFree => alloc::mem_free
                : (dptr: $crate::abi::CUdeviceptr)
                = [cuMemFree_v2];
            MemFreeAsync => alloc::mem_free_async
                : (dptr: $crate::abi::CUdeviceptr, stream: $crate::abi::CUstream)
                = [cuMemFreeAsync, cuMemFreeAsync_ptsz];
            MemGetInfo => alloc::mem_get_info
                : (free: *mut usize, total: *mut usize)
                = [cuMemGetInfo_v2];

            // Memory shared with other processes.
            IpcGetMemHandle => ipc::ipc_get_mem_handle
                : (handle: *mut $crate::abi::CUipcMemHandle, dptr: $crate::abi::CUdeviceptr)
                = [cuIpcGetMemHandle];
            IpcOpenMemHandle => ipc::ipc_open_mem_handle
                : (dptr: *mut $crate::abi::CUdeviceptr, handle: $crate::abi::CUipcMemHandle,
                   flags: u32)
                = [cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2];
            IpcCloseMemHandle => ipc::ipc_close_mem_handle
                : (dptr: $crate::abi::CUdeviceptr)
                = [cuIpcCloseMemHandle];

            // Kernel launches.
            LaunchKernel => launch::launch_kernel
                : (f: $crate::abi::CUfunction, grid_x: u32, grid_y: u32, grid_z: u32,
                   block_x: u32, block_y: u32, block_z: u32, shared_mem_bytes: u32,
                   stream: $crate::abi::CUstream, kernel_params: *mut *mut ::std::ffi::c_void,
                   extra: *mut *mut ::std::ffi::c_void)
                = [cuLaunchKernel, cuLaunchKernel_ptsz];
            LaunchKernelEx => launch::launch_kernel_ex
                : (config: *const $crate::abi::CUlaunchConfig, f: $crate::abi::CUfunction,
                   kernel_params: *mut *mut ::std::ffi::c_void,
                   extra: *mut *mut ::std::ffi::c_void)
                = [cuLaunchKernelEx, cuLaunchKernelEx_ptsz];
            LaunchCooperativeKernel => launch::launch_cooperative_kernel
                : (f: $crate::abi::CUfunction, grid_x: u32, grid_y: u32, grid_z: u32,
                   block_x: u32, block_y: u32, block_z: u32, shared_mem_bytes: u32,
                   stream: $crate::abi::CUstream, kernel_params: *mut *mut ::std::ffi::c_void)
                = [cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz];

            // Copies.
            Memcpy => copy::memcpy
                : (dst: $crate::abi::CUdeviceptr, src: $crate::abi::CUdeviceptr, bytes: usize)
                = [cuMemcpy, cuMemcpy_ptds];
            MemcpyAsync => copy::memcpy_async
                : (dst: $crate::abi::CUdeviceptr, src: $crate::abi::CUdeviceptr, bytes: usize,
                   stream: $crate::abi::CUstream)
                = [cuMemcpyAsync, cuMemcpyAsync_ptsz];
            MemcpyHtoD => copy::memcpy_htod
                : (dst: $crate::abi::CUdeviceptr, src: *const ::std::ffi::c_void, bytes: usize)
                = [cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds];
            MemcpyHtoDAsync => copy::memcpy_htod_async
                : (dst: $crate::abi::CUdeviceptr, src: *const ::std::ffi::c_void, bytes: usize,
                   stream: $crate::abi::CUstream)
                = [cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz];
            MemcpyDtoH => copy::memcpy_dtoh
                : (dst: *mut ::std::ffi::c_void, src: $crate::abi::CUdeviceptr, bytes: usize)
                = [cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds];
            MemcpyDtoHAsync => copy::memcpy_dtoh_async
                : (dst: *mut ::std::ffi::c_void, src: $crate::abi::CUdeviceptr, bytes: usize,
                   stream: $crate::abi::CUstream)
                = [cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz];
            MemcpyDtoD => copy::memcpy_dtod
                : (dst: $crate::abi::CUdeviceptr, src: $crate::abi::CUdeviceptr, bytes: usize)
                = [cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds];
            MemcpyDtoDAsync => copy::memcpy_dtod_async
                : (dst: $crate::abi::CUdeviceptr, src: $crate::abi::CUdeviceptr, bytes: usize,
                   stream: $crate::abi::CUstream)
                = [cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz];
            MemcpyPeer => copy::memcpy_peer
                : (dst: $crate::abi::CUdeviceptr, dst_ctx: $crate::abi::CUcontext,
                   src: $crate::abi::CUdeviceptr, src_ctx: $crate::abi::CUcontext,
                   bytes: usize)
                = [cuMemcpyPeer, cuMemcpyPeer_ptds];
            MemcpyPeerAsync => copy::memcpy_peer_async
                : (dst: $crate::abi::CUdeviceptr, dst_ctx: $crate::abi::CUcontext,
                   src: $crate::abi::CUdeviceptr, src_ctx: $crate::abi::CUcontext,
                   bytes: usize, stream: $crate::abi::CUstream)
                = [cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz];
            Memcpy2D => copy::memcpy_2d
                : (copy: *const $crate::abi::CUDA_MEMCPY2D)
                = [cuMemcpy2D_v2, cuMemcpy2D_v2_ptds,
                   cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds];
            Memcpy2DAsync => copy::memcpy_2d_async
                : (copy: *const $crate::abi::CUDA_MEMCPY2D, stream: $crate::abi::CUstream)
                = [cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz];

            // Memsets.
            MemsetD8 => memset::memset_d8
                : (dst: $crate::abi::CUdeviceptr, value: u8, count: usize)
                = [cuMemsetD8_v2, cuMemsetD8_v2_ptds];
            MemsetD16 => memset::memset_d16
                : (dst: $crate::abi::CUdeviceptr, value: u16, count: usize)
                = [cuMemsetD16_v2, cuMemsetD16_v2_ptds];
            MemsetD32 => memset::memset_d32
                : (dst: $crate::abi::CUdeviceptr, value: u32, count: usize)
                = [cuMemsetD32_v2, cuMemsetD32_v2_ptds];
            MemsetD8Async => memset::memset_d8_async
                : (dst: $crate::abi::CUdeviceptr, value: u8, count: usize,
                   stream: $crate::abi::CUstream)
                = [cuMemsetD8Async, cuMemsetD8Async_ptsz];
            MemsetD16Async => memset::memset_d16_async
                : (dst: $crate::abi::CUdeviceptr, value: u16, count: usize,
                   stream: $crate::abi::CUstream)
                = [cuMemsetD16Async, cuMemsetD16Async_ptsz];
            MemsetD32Async => memset::memset_d32_async
                : (dst: $crate::abi::CUdeviceptr, value: u32, count: usize,
                   stream: $crate::abi::CUstream)
                = [cuMemsetD32Async, cuMemsetD32Async_ptsz];
            MemsetD2D8 => memset::memset_d2d8
                : (dst: $crate::abi::CUdeviceptr, pitch: usize, value: u8, width: usize,
                   height: usize)
                = [cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds];
            MemsetD2D16 => memset::memset_d2d16
                : (dst: $crate::abi::CUdeviceptr, pitch: usize, value: u16, width: usize,
                   height: usize)
                = [cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds];
            MemsetD2D32 => memset::memset_d2d32
                : (dst: $crate::abi::CUdeviceptr, pitch: usize, value: u32, width: usize,
                   height: usize)
                = [cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds];
            MemsetD2D8Async => memset::memset_d2d8_async
                : (dst: $crate::abi::CUdeviceptr, pitch: usize, value: u8, width: usize,
                   height: usize, stream: $crate::abi::CUstream)
                = [cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz];
            MemsetD2D16Async => memset::memset_d2d16_async
                : (dst: $crate::abi::CUdeviceptr, pitch: usize, value: u16, width: usize,
                   height: usize, stream: $crate::abi::CUstream)
                = [cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz];
            MemsetD2D32Async => memset::memset_d2d32_async
                : (dst: $crate::abi::CUdeviceptr, pitch: usize, value: u32, width: usize,
                   height: usize, stream: $crate::abi::CUstream)
                = [cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz];

            // Host waits, recorded in the trace.
            StreamSynchronize => sync::stream_synchronize
                : (stream: $crate::abi::CUstream)
                = [cuStreamSynchronize, cuStreamSynchronize_ptsz];
            CtxSynchronize => sync::ctx_synchronize
                : ()
                = [cuCtxSynchronize];
            CtxSynchronizeV2 => sync::ctx_synchronize_v2
                : (ctx: $crate::abi::CUcontext)
                = [cuCtxSynchronize_v2];
            EventSynchronize => sync::event_synchronize
                : (event: $crate::abi::CUevent)
                = [cuEventSynchronize];

            // Unloads invalidate cached kernel handles (a new kernel may reuse the address).
            ModuleUnload => module::module_unload
                : (module: $crate::abi::CUmodule)
                = [cuModuleUnload];
            LibraryUnload => module::library_unload
                : (library: $crate::abi::CUlibrary)
                = [cuLibraryUnload];
        }
    };
}

/// Expands the list into [`Sym`], [`pfn`] and [`crate::entry`].
macro_rules! define_symbols_and_entries {
    ($( $family:ident => $($hook:ident)::+ : ($($arg:ident : $ty:ty),* $(,)?)
        = [$($sym:ident),+ $(,)?]; )*) => {
        /// C function pointer types, one per family (`PFN_*` in `cudaTypedefs.h`).
        pub mod pfn {
            use $crate::abi::CUresult;
            $(
                #[doc = concat!("The signature of the `", stringify!($family), "` family.")]
                pub type $family = unsafe extern "C" fn($($ty),*) -> CUresult;
            )*
            /// `cuGetProcAddress` (CUDA 11.3 ABI).
            pub type GetProcAddress = unsafe extern "C" fn(
                *const ::std::ffi::c_char, *mut *mut ::std::ffi::c_void, i32, u64,
            ) -> CUresult;
            /// `cuGetProcAddress_v2` (CUDA 12.0 ABI).
            pub type GetProcAddressV2 = unsafe extern "C" fn(
                *const ::std::ffi::c_char, *mut *mut ::std::ffi::c_void, i32, u64, *mut i32,
            ) -> CUresult;
        }

        /// A versioned driver symbol the shim manages (wraps with its own function).
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum Sym {
            $($($sym,)+)*
            cuGetProcAddress,
            cuGetProcAddress_v2,
        }

        impl Sym {
            /// Every managed symbol, in declaration order (`ALL[s as usize] == s`).
            pub const ALL: &'static [Sym] = &[$($(Sym::$sym,)+)* Sym::cuGetProcAddress,
                Sym::cuGetProcAddress_v2];

            /// The number of managed symbols.
            pub const COUNT: usize = Self::ALL.len();

            /// The exported symbol name.
            pub const fn name(self) -> &'static str {
                match self {
                    $($(Sym::$sym => stringify!($sym),)+)*
                    Sym::cuGetProcAddress => "cuGetProcAddress",
                    Sym::cuGetProcAddress_v2 => "cuGetProcAddress_v2",
                }
            }

            /// The symbol with this exact name, if it is managed. Does not allocate.
            pub fn from_name(name: &[u8]) -> Option<Sym> {
                match name {
                    $($(n if n == stringify!($sym).as_bytes() => Some(Sym::$sym),)+)*
                    b"cuGetProcAddress" => Some(Sym::cuGetProcAddress),
                    b"cuGetProcAddress_v2" => Some(Sym::cuGetProcAddress_v2),
                    _ => None,
                }
            }
        }

        /// The Rust side of every managed export: find the real function, call the hook.
        ///
        /// `ld-preload` wraps each of these in an `extern "C"` function with a panic guard.
        pub mod entry {
            $( entry_fns!($family, [$($hook)::+], ($($arg : $ty),*), [$($sym),+]); )*
        }
    };
}

/// One entry function per symbol of a family (a recursion over the symbols, because the
/// argument list cannot be repeated inside the symbol repetition).
macro_rules! entry_fns {
    ($family:ident, [$($hook:ident)::+], ($($arg:ident : $ty:ty),*), []) => {};
    ($family:ident, [$($hook:ident)::+], ($($arg:ident : $ty:ty),*), [$sym:ident $(, $rest:ident)*]) => {
        #[doc = concat!("`", stringify!($sym), "`, with the C contract of the driver.")]
        #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
        pub unsafe fn $sym($($arg: $ty),*) -> $crate::abi::CUresult {
            use $crate::syms::{pfn, Sym};
            // SAFETY: `$sym` is declared in the `$family` family, whose C signature is
            // exactly `pfn::$family`.
            match unsafe { $crate::hooks::Call::<pfn::$family>::new(Sym::$sym) } {
                // SAFETY: the arguments come unchanged from the C caller, who promised the
                // driver's contract for this function.
                Ok(call) => unsafe { $crate::hooks::$($hook)::+(call, $($arg),*) },
                Err(code) => code,
            }
        }
        entry_fns!($family, [$($hook)::+], ($($arg : $ty),*), [$($rest),*]);
    };
}

with_managed_entry_points!(define_symbols_and_entries);

impl Sym {
    /// Whether this is a per-thread-default-stream variant (`_ptsz` / `_ptds`).
    pub fn per_thread(self) -> bool {
        let name = self.name();
        name.ends_with("_ptsz") || name.ends_with("_ptds")
    }

    /// Whether this entry point allocates device memory (what the memory manager serves).
    pub fn allocates(self) -> bool {
        matches!(
            self,
            Sym::cuMemAlloc_v2
                | Sym::cuMemAllocPitch_v2
                | Sym::cuMemAllocAsync
                | Sym::cuMemAllocAsync_ptsz
                | Sym::cuMemAllocFromPoolAsync
                | Sym::cuMemAllocFromPoolAsync_ptsz
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_driver_abi::{proc_table, resolve_proc, ProcLookup};

    #[test]
    fn all_is_indexed_by_discriminant() {
        for (i, s) in Sym::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
            assert_eq!(Sym::from_name(s.name().as_bytes()), Some(*s));
        }
        assert_eq!(Sym::from_name(b"cuMemAlloc"), None);
        assert_eq!(Sym::from_name(b"cuMemAlloc_v2_"), None);
        assert_eq!(Sym::from_name(b""), None);
    }

    #[test]
    fn every_managed_symbol_is_a_real_versioned_driver_symbol() {
        let table = proc_table();
        for s in Sym::ALL {
            let row = table.iter().find(|e| e.symbol == s.name());
            let row = row.unwrap_or_else(|| panic!("{} is not in cudaTypedefs.h", s.name()));
            assert_eq!(row.per_thread, s.per_thread(), "{}", s.name());
        }
    }

    #[test]
    fn the_symbols_modern_callers_get_are_managed() {
        let asked = [
            "cuMemAlloc",
            "cuMemAllocPitch",
            "cuMemAllocAsync",
            "cuMemAllocFromPoolAsync",
            "cuMemFree",
            "cuMemFreeAsync",
            "cuMemGetInfo",
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cuLaunchCooperativeKernel",
            "cuMemcpy",
            "cuMemcpyAsync",
            "cuMemcpyHtoD",
            "cuMemcpyHtoDAsync",
            "cuMemcpyDtoH",
            "cuMemcpyDtoHAsync",
            "cuMemcpyDtoD",
            "cuMemcpyDtoDAsync",
            "cuMemcpy2D",
            "cuMemcpy2DAsync",
            "cuMemcpy2DUnaligned",
            "cuMemcpyPeer",
            "cuMemcpyPeerAsync",
            "cuMemsetD8",
            "cuMemsetD16",
            "cuMemsetD32",
            "cuMemsetD8Async",
            "cuMemsetD16Async",
            "cuMemsetD32Async",
            "cuMemsetD2D8",
            "cuMemsetD2D16",
            "cuMemsetD2D32",
            "cuMemsetD2D8Async",
            "cuMemsetD2D16Async",
            "cuMemsetD2D32Async",
            "cuStreamSynchronize",
            "cuEventSynchronize",
            "cuGetProcAddress",
            "cuModuleUnload",
            "cuLibraryUnload",
            "cuCtxSynchronize",
        ];
        for name in asked {
            for version in [12000, 13000] {
                for flags in [0, 1, 2] {
                    let ProcLookup::Found(e) = resolve_proc(name, version, flags) else {
                        panic!("{name} {version} {flags} does not resolve");
                    };
                    assert!(
                        Sym::from_name(e.symbol.as_bytes()).is_some(),
                        "{name} {version} {flags} -> {} is not managed",
                        e.symbol
                    );
                }
            }
        }
    }
}
