//! Modules, libraries and their kernels: PTX text in, named entries with parameter layouts
//! and CPU twins out.
//!
//! Only PTX text is accepted (cubins and fatbins are `CUDA_ERROR_INVALID_IMAGE`): the
//! simulator runs twins, not machine code. PTX with `.version` above 9.0 is refused with
//! `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, as the H100's CUDA 13.0 driver does, and a target
//! above `sm_90` with `CUDA_ERROR_INVALID_PTX`. An entry without a twin loads (so its
//! parameter info can be asked) but launching it is `CUDA_ERROR_NOT_SUPPORTED`.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Arc, Mutex};

use tensile_driver_abi::*;
use tensile_kernels::{ptx, twin, EntrySignature, Twin};

/// The newest PTX ISA the simulated driver (CUDA 13.0) JIT-compiles.
pub const MAX_PTX_VERSION: (u32, u32) = (9, 0);

#[derive(Debug)]
pub struct Entry {
    pub name: Arc<str>,
    pub c_name: CString,
    pub sig: EntrySignature,
    pub twin: Option<Twin>,
}

/// Parses PTX text into entries (see the module docs for what is refused).
pub fn parse_image(text: &str) -> Result<Vec<Arc<Entry>>, CUresult> {
    let version = ptx::ptx_version(text).ok_or(CUDA_ERROR_INVALID_PTX)?;
    if version > MAX_PTX_VERSION {
        return Err(CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
    }
    if let Some(target) = ptx::ptx_target(text) {
        let digits: String = target
            .trim_start_matches("sm_")
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        match digits.parse::<u32>() {
            Ok(sm) if sm <= 90 => {}
            _ => return Err(CUDA_ERROR_INVALID_PTX),
        }
    }
    let sigs = ptx::parse_entries(text).map_err(|_| CUDA_ERROR_INVALID_PTX)?;
    sigs.into_iter()
        .map(|sig| {
            let c_name = CString::new(sig.name.clone()).map_err(|_| CUDA_ERROR_INVALID_PTX)?;
            Ok(Arc::new(Entry {
                name: sig.name.as_str().into(),
                c_name,
                twin: twin(&sig.name),
                sig,
            }))
        })
        .collect()
}

/// Reads a module/library image from the pointer the application passed.
///
/// # Safety
/// `image` must point to a NUL-terminated PTX string or to a binary image with its magic.
pub unsafe fn read_image(image: *const c_void) -> Result<Vec<Arc<Entry>>, CUresult> {
    if image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Read the magic a byte at a time, stopping at a NUL: a short PTX string must not be
    // read past its terminator, and binary images start with four non-zero bytes.
    let mut head = [0u8; 4];
    for (i, slot) in head.iter_mut().enumerate() {
        // SAFETY: bytes up to and including the first NUL (or the 4-byte magic) are readable.
        let b = unsafe { *(image as *const u8).add(i) };
        *slot = b;
        if b == 0 {
            break;
        }
    }
    if head == *b"\x7fELF" || head == [0x50, 0xed, 0x55, 0xba] || head == [0x46, 0x62, 0xec, 0x91] {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    // SAFETY: not a binary image, so by the API contract a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(image as *const c_char) };
    let text = text.to_str().map_err(|_| CUDA_ERROR_INVALID_PTX)?;
    parse_image(text)
}

fn find<'a>(entries: &'a [Arc<Entry>], name: &str) -> Option<&'a Arc<Entry>> {
    entries.iter().find(|e| &*e.name == name)
}

/// A loaded module (`cuModuleLoadData*`).
#[derive(Debug)]
pub struct Module {
    pub entries: Vec<Arc<Entry>>,
    /// name -> CUfunction handle, so repeated look-ups give the same handle.
    pub functions: Mutex<HashMap<String, usize>>,
}

impl Module {
    pub fn entry(&self, name: &str) -> Option<&Arc<Entry>> {
        find(&self.entries, name)
    }
}

/// A loaded library (`cuLibraryLoadData`).
#[derive(Debug)]
pub struct Library {
    pub entries: Vec<Arc<Entry>>,
    /// name -> CUkernel handle.
    pub kernels: Mutex<HashMap<String, usize>>,
}

impl Library {
    pub fn entry(&self, name: &str) -> Option<&Arc<Entry>> {
        find(&self.entries, name)
    }
}

/// A `CUfunction`: an entry of a module, or the per-context function of a library kernel.
#[derive(Debug)]
pub struct Function {
    pub entry: Arc<Entry>,
    /// Owning module handle (0 for a library kernel's function).
    pub module: usize,
}

/// A `CUkernel`: an entry of a library, context-independent.
#[derive(Debug)]
pub struct Kernel {
    pub entry: Arc<Entry>,
    pub library: usize,
    /// The `CUfunction` handed out by `cuKernelGetFunction`, made on first request.
    pub function: Mutex<Option<usize>>,
}
