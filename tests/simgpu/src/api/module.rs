//! Modules, libraries, functions and kernels: loading PTX, looking entries up, and the
//! parameter-layout queries the shim relies on.
//!
//! `CUfunction` and `CUkernel` handles live in different tables, so, as on the real driver,
//! `cuFuncGetParamInfo` on a `CUkernel` fails (`CUDA_ERROR_INVALID_HANDLE`) while
//! `cuKernelGetParamInfo` works; `cuLaunchKernel` accepts either.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Arc, Mutex};

use tensile_driver_abi::*;

use super::{current_ctx, export, st, Out};
use crate::module::{read_image, Entry, Function, Kernel, Library, Module};

/// # Safety
/// `name` must be NULL or a NUL-terminated string.
unsafe fn name_arg<'a>(name: *const c_char) -> Result<&'a str, CUresult> {
    if name.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and NUL-terminated (API contract).
    unsafe { CStr::from_ptr(name) }
        .to_str()
        .map_err(|_| CUDA_ERROR_NOT_FOUND)
}

/// # Safety
/// `image` as for [`read_image`].
unsafe fn load_module(module: *mut CUmodule, image: *const c_void) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(module) }?;
    current_ctx()?;
    // SAFETY: API contract for the image.
    let entries = unsafe { read_image(image) }?;
    let m = Arc::new(Module {
        entries,
        functions: Mutex::new(HashMap::new()),
    });
    out.set(st()?.modules.insert(m) as CUmodule);
    Ok(())
}
export!(cuModuleLoadData, load_module, (module: *mut CUmodule, image: *const c_void));

/// JIT options are accepted and ignored.
unsafe fn load_module_ex(
    module: *mut CUmodule,
    image: *const c_void,
    _n: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> Result<(), CUresult> {
    // SAFETY: same contract.
    unsafe { load_module(module, image) }
}
export!(cuModuleLoadDataEx, load_module_ex, (module: *mut CUmodule, image: *const c_void, n: c_uint, options: *mut c_int, values: *mut *mut c_void));

unsafe fn module_unload(module: CUmodule) -> Result<(), CUresult> {
    let s = st()?;
    let m = s
        .modules
        .remove(module as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for (_, f) in m
        .functions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain()
    {
        s.functions.remove(f);
    }
    Ok(())
}
export!(cuModuleUnload, module_unload, (module: CUmodule));

unsafe fn module_get_function(
    f: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(f) }?;
    // SAFETY: API contract.
    let name = unsafe { name_arg(name) }?;
    let s = st()?;
    let m = s
        .modules
        .get(module as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let entry = m.entry(name).ok_or(CUDA_ERROR_NOT_FOUND)?.clone();
    let mut functions = m.functions.lock().unwrap_or_else(|e| e.into_inner());
    let h = *functions.entry(name.to_owned()).or_insert_with(|| {
        s.functions.insert(Arc::new(Function {
            entry,
            module: module as usize,
        }))
    });
    out.set(h as CUfunction);
    Ok(())
}
export!(cuModuleGetFunction, module_get_function, (f: *mut CUfunction, module: CUmodule, name: *const c_char));

unsafe fn module_get_loading_mode(mode: *mut c_int) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(mode) }?;
    st()?;
    out.set(1); // CU_MODULE_EAGER_LOADING
    Ok(())
}
export!(cuModuleGetLoadingMode, module_get_loading_mode, (mode: *mut c_int));

/// JIT and library options are accepted and ignored; no context is needed.
#[allow(clippy::too_many_arguments)]
unsafe fn library_load_data(
    library: *mut CUlibrary,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _n_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _n_lib: c_uint,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(library) }?;
    st()?;
    // SAFETY: API contract for the image.
    let entries = unsafe { read_image(code) }?;
    let lib = Arc::new(Library {
        entries,
        kernels: Mutex::new(HashMap::new()),
    });
    out.set(st()?.libraries.insert(lib) as CUlibrary);
    Ok(())
}
export!(cuLibraryLoadData, library_load_data, (library: *mut CUlibrary, code: *const c_void, jit_options: *mut c_int, jit_values: *mut *mut c_void, n_jit: c_uint, lib_options: *mut c_int, lib_values: *mut *mut c_void, n_lib: c_uint));

unsafe fn library_unload(library: CUlibrary) -> Result<(), CUresult> {
    let s = st()?;
    let lib = s
        .libraries
        .remove(library as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for (_, k) in lib
        .kernels
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain()
    {
        if let Some(kernel) = s.kernels.remove(k) {
            if let Some(f) = *kernel.function.lock().unwrap_or_else(|e| e.into_inner()) {
                s.functions.remove(f);
            }
        }
    }
    Ok(())
}
export!(cuLibraryUnload, library_unload, (library: CUlibrary));

unsafe fn library_get_kernel(
    kernel: *mut CUkernel,
    library: CUlibrary,
    name: *const c_char,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(kernel) }?;
    // SAFETY: API contract.
    let name = unsafe { name_arg(name) }?;
    let s = st()?;
    let lib = s
        .libraries
        .get(library as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let entry = lib.entry(name).ok_or(CUDA_ERROR_NOT_FOUND)?.clone();
    let mut kernels = lib.kernels.lock().unwrap_or_else(|e| e.into_inner());
    let h = *kernels.entry(name.to_owned()).or_insert_with(|| {
        s.kernels.insert(Arc::new(Kernel {
            entry,
            library: library as usize,
            function: Mutex::new(None),
        }))
    });
    out.set(h as CUkernel);
    Ok(())
}
export!(cuLibraryGetKernel, library_get_kernel, (kernel: *mut CUkernel, library: CUlibrary, name: *const c_char));

unsafe fn kernel_get_function(f: *mut CUfunction, kernel: CUkernel) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(f) }?;
    current_ctx()?;
    let s = st()?;
    let k = s
        .kernels
        .get(kernel as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let mut slot = k.function.lock().unwrap_or_else(|e| e.into_inner());
    let h = *slot.get_or_insert_with(|| {
        s.functions.insert(Arc::new(Function {
            entry: k.entry.clone(),
            module: 0,
        }))
    });
    out.set(h as CUfunction);
    Ok(())
}
export!(cuKernelGetFunction, kernel_get_function, (f: *mut CUfunction, kernel: CUkernel));

fn kernel_entry(kernel: CUkernel) -> Result<Arc<Entry>, CUresult> {
    Ok(st()?
        .kernels
        .get(kernel as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .entry
        .clone())
}

fn function_entry(f: CUfunction) -> Result<Arc<Entry>, CUresult> {
    Ok(st()?
        .functions
        .get(f as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .entry
        .clone())
}

/// The entry a launch names: a `CUfunction`, or a `CUkernel` passed as one.
pub fn launch_entry(f: CUfunction) -> Result<Arc<Entry>, CUresult> {
    function_entry(f).or_else(|_| kernel_entry(f as CUkernel))
}

/// # Safety
/// Non-NULL outputs must be writable.
unsafe fn param_info(
    entry: &Entry,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Result<(), CUresult> {
    let slot = entry
        .sig
        .params
        .get(index)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if offset.is_null() && size.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if !offset.is_null() {
        // SAFETY: API contract.
        unsafe { Out::new(offset) }?.set(slot.offset as usize);
    }
    if !size.is_null() {
        // SAFETY: API contract.
        unsafe { Out::new(size) }?.set(slot.size as usize);
    }
    Ok(())
}

unsafe fn kernel_get_param_info(
    kernel: CUkernel,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Result<(), CUresult> {
    let entry = kernel_entry(kernel)?;
    // SAFETY: API contract.
    unsafe { param_info(&entry, index, offset, size) }
}
export!(cuKernelGetParamInfo, kernel_get_param_info, (kernel: CUkernel, index: usize, offset: *mut usize, size: *mut usize));

unsafe fn func_get_param_info(
    f: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Result<(), CUresult> {
    let entry = function_entry(f)?;
    // SAFETY: API contract.
    unsafe { param_info(&entry, index, offset, size) }
}
export!(cuFuncGetParamInfo, func_get_param_info, (f: CUfunction, index: usize, offset: *mut usize, size: *mut usize));

unsafe fn kernel_get_param_count(kernel: CUkernel, count: *mut usize) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(count) }?;
    out.set(kernel_entry(kernel)?.sig.params.len());
    Ok(())
}
export!(cuKernelGetParamCount, kernel_get_param_count, (kernel: CUkernel, count: *mut usize));

unsafe fn func_get_param_count(f: CUfunction, count: *mut usize) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(count) }?;
    out.set(function_entry(f)?.sig.params.len());
    Ok(())
}
export!(cuFuncGetParamCount, func_get_param_count, (f: CUfunction, count: *mut usize));

unsafe fn kernel_get_name(name: *mut *const c_char, kernel: CUkernel) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(name) }?;
    let entry = kernel_entry(kernel)?;
    // The entry lives as long as its library; the string is owned by it.
    out.set(entry.c_name.as_ptr());
    Ok(())
}
export!(cuKernelGetName, kernel_get_name, (name: *mut *const c_char, kernel: CUkernel));

unsafe fn func_get_name(name: *mut *const c_char, f: CUfunction) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(name) }?;
    let entry = function_entry(f)?;
    out.set(entry.c_name.as_ptr());
    Ok(())
}
export!(cuFuncGetName, func_get_name, (name: *mut *const c_char, f: CUfunction));

unsafe fn func_get_module(module: *mut CUmodule, f: CUfunction) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(module) }?;
    let func = st()?
        .functions
        .get(f as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    out.set(func.module as CUmodule);
    Ok(())
}
export!(cuFuncGetModule, func_get_module, (module: *mut CUmodule, f: CUfunction));

/// Function attributes with plausible constant values (the twins have no real resources).
fn func_attribute(attr: c_int) -> Option<c_int> {
    Some(match attr {
        0 => 1024,   // max threads per block
        1..=3 => 0,  // shared, const, local sizes
        4 => 32,     // registers
        5 | 6 => 90, // PTX and binary version
        7 => 0,      // cache mode
        8 => 0,      // max dynamic shared size
        9 => -1,     // preferred shared carveout
        10..=15 => 0,
        _ => return None,
    })
}

unsafe fn func_get_attribute(pi: *mut c_int, attr: c_int, f: CUfunction) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pi) }?;
    launch_entry(f)?;
    out.set(func_attribute(attr).ok_or(CUDA_ERROR_INVALID_VALUE)?);
    Ok(())
}
export!(cuFuncGetAttribute, func_get_attribute, (pi: *mut c_int, attr: c_int, f: CUfunction));

unsafe fn kernel_get_attribute(
    pi: *mut c_int,
    attr: c_int,
    kernel: CUkernel,
    dev: CUdevice,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pi) }?;
    super::check_device(dev)?;
    kernel_entry(kernel)?;
    out.set(func_attribute(attr).ok_or(CUDA_ERROR_INVALID_VALUE)?);
    Ok(())
}
export!(cuKernelGetAttribute, kernel_get_attribute, (pi: *mut c_int, attr: c_int, kernel: CUkernel, dev: CUdevice));

/// Accepted and ignored (the twins have no shared-memory or carveout limits).
unsafe fn func_set_attribute(f: CUfunction, attr: c_int, _value: c_int) -> Result<(), CUresult> {
    launch_entry(f)?;
    func_attribute(attr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(())
}
export!(cuFuncSetAttribute, func_set_attribute, (f: CUfunction, attr: c_int, value: c_int));

unsafe fn func_set_cache_config(f: CUfunction, _config: c_int) -> Result<(), CUresult> {
    launch_entry(f).map(|_| ())
}
export!(cuFuncSetCacheConfig, func_set_cache_config, (f: CUfunction, config: c_int));
