//! Initialization, the device, and error strings.

use std::ffi::{c_char, c_int, c_uint};

use tensile_driver_abi::*;

use super::{check_device, export, guard, st, Out};
use crate::errors;
use crate::state;

/// The driver version reported (CUDA 13.0, the H100 machine's driver).
pub const DRIVER_VERSION: i32 = 13000;
pub const DEVICE_NAME: &str = "Tensile Simulated GPU";

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        state::init()?;
        Ok(())
    })
}

unsafe fn driver_get_version(v: *mut c_int) -> Result<(), CUresult> {
    // SAFETY: API contract of the caller's pointer.
    unsafe { Out::new(v) }?.set(DRIVER_VERSION);
    Ok(())
}
export!(cuDriverGetVersion, driver_get_version, (v: *mut c_int));

unsafe fn device_get(dev: *mut CUdevice, ordinal: c_int) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(dev) }?;
    check_device(ordinal)?;
    out.set(ordinal);
    Ok(())
}
export!(cuDeviceGet, device_get, (dev: *mut CUdevice, ordinal: c_int));

unsafe fn device_get_count(count: *mut c_int) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(count) }?;
    out.set(st()?.device_count() as c_int);
    Ok(())
}
export!(cuDeviceGetCount, device_get_count, (count: *mut c_int));

unsafe fn device_get_name(name: *mut c_char, len: c_int, dev: CUdevice) -> Result<(), CUresult> {
    if name.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_device(dev)?;
    let bytes = DEVICE_NAME.as_bytes();
    let n = bytes.len().min(len as usize - 1);
    // SAFETY: `name` holds `len` bytes (API contract); we write n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), name as *mut u8, n);
        *name.add(n) = 0;
    }
    Ok(())
}
export!(cuDeviceGetName, device_get_name, (name: *mut c_char, len: c_int, dev: CUdevice));

unsafe fn device_total_mem(bytes: *mut usize, dev: CUdevice) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(bytes) }?;
    let device = check_device(dev)?;
    out.set(st()?.space.capacity(device) as usize);
    Ok(())
}
export!(cuDeviceTotalMem_v2, device_total_mem, (bytes: *mut usize, dev: CUdevice));

/// The value of a device attribute: an H100-like device with VMM, pools and 3 copy engines.
pub fn attribute(attr: CUdevice_attribute) -> Option<i32> {
    Some(match attr {
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        2 | 3 => 1024,  // max block dim x, y
        4 => 64,        // max block dim z
        5 => i32::MAX,  // max grid dim x
        6 | 7 => 65535, // max grid dim y, z
        8 => 48 << 10,  // max shared memory per block
        9 => 64 << 10,  // total constant memory
        CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        11 => i32::MAX,  // max pitch
        12 => 65536,     // max registers per block
        13 => 1_980_000, // clock rate (kHz)
        14 => 512,       // texture alignment
        15 => 1,         // gpu overlap
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => 132,
        17 | 18 => 0, // kernel exec timeout, integrated
        19 => 1,      // can map host memory
        20 => 0,      // compute mode default
        31 | 32 => 1, // concurrent kernels, ECC
        33 => 1,      // PCI bus id
        34 | 35 | 50 => 0,
        36 => 2_619_000, // memory clock (kHz)
        37 => 5120,      // bus width
        38 => 50 << 20,  // L2
        39 => 2048,      // threads per SM
        CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 3,
        CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING => 1,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => 9,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => 0,
        78..=80 => 1,
        81 => 228 << 10,
        82 => 65536,
        83 => 1, // managed memory
        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => 1,
        103 => 1, // POSIX fd handles
        106 => 32,
        CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => 1,
        119 => 1,       // mempool handle types: POSIX fd
        141 | 142 => 1, // host-NUMA VMM and pools
        134 => 0,       // host NUMA id
        a if (1..=200).contains(&a) => 0,
        _ => return None,
    })
}

unsafe fn device_get_attribute(
    pi: *mut c_int,
    attr: CUdevice_attribute,
    dev: CUdevice,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(pi) }?;
    check_device(dev)?;
    out.set(attribute(attr).ok_or(CUDA_ERROR_INVALID_VALUE)?);
    Ok(())
}
export!(cuDeviceGetAttribute, device_get_attribute, (pi: *mut c_int, attr: CUdevice_attribute, dev: CUdevice));

unsafe fn device_compute_capability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let (a, b) = unsafe { (Out::new(major)?, Out::new(minor)?) };
    check_device(dev)?;
    a.set(9);
    b.set(0);
    Ok(())
}
export!(cuDeviceComputeCapability, device_compute_capability, (major: *mut c_int, minor: *mut c_int, dev: CUdevice));

unsafe fn device_get_uuid(uuid: *mut [u8; 16], dev: CUdevice) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(uuid) }?;
    let device = check_device(dev)?;
    out.set(card_uuid(device));
    Ok(())
}

/// A device's UUID names the card behind it, as a real card's does: processes that share a
/// card (`TENSILE_SIM_CARD`) see the same UUID for it, and a process's own private card is
/// another card than every other process's (so a coordinator per card, keyed by UUID, never
/// groups private cards together).
fn card_uuid(device: usize) -> [u8; 16] {
    let identity = match crate::config::card_name() {
        Some(name) => format!(
            "shared:{}",
            crate::shared_card::device_card_name(&name, device)
        ),
        None => format!("private:{}:{device}", std::process::id()),
    };
    // Two FNV-1a hashes with different offsets: 128 bits, stable across processes.
    let fnv = |basis: u64| {
        identity.bytes().fold(basis, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&fnv(0xcbf2_9ce4_8422_2325).to_le_bytes());
    uuid[8..].copy_from_slice(&fnv(0x6c62_272e_07bb_0142).to_le_bytes());
    uuid
}
export!(cuDeviceGetUuid, device_get_uuid, (uuid: *mut [u8; 16], dev: CUdevice));
export!(cuDeviceGetUuid_v2, device_get_uuid, (uuid: *mut [u8; 16], dev: CUdevice));

unsafe fn device_get_pci_bus_id(
    buf: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> Result<(), CUresult> {
    if buf.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let device = check_device(dev)?;
    let id = format!("0000:{:02x}:00.0", device + 1);
    let id = id.as_bytes();
    let n = id.len().min(len as usize - 1);
    // SAFETY: `buf` holds `len` bytes (API contract); we write n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(id.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    Ok(())
}
export!(cuDeviceGetPCIBusId, device_get_pci_bus_id, (buf: *mut c_char, len: c_int, dev: CUdevice));

unsafe fn get_error_name(code: CUresult, out: *mut *const c_char) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(out) }?;
    match errors::describe(code) {
        Some((name, _)) => {
            out.set(name.as_ptr());
            Ok(())
        }
        None => {
            out.set(std::ptr::null());
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}
export!(cuGetErrorName, get_error_name, (code: CUresult, out: *mut *const c_char));

unsafe fn get_error_string(code: CUresult, out: *mut *const c_char) -> Result<(), CUresult> {
    // SAFETY: API contract.
    let out = unsafe { Out::new(out) }?;
    match errors::describe(code) {
        Some((_, text)) => {
            out.set(text.as_ptr());
            Ok(())
        }
        None => {
            out.set(std::ptr::null());
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}
export!(cuGetErrorString, get_error_string, (code: CUresult, out: *mut *const c_char));
