//! The importing side: `cuIpcOpenMemHandle` of a libtensile handle maps the exporter's
//! units in this process, `cuIpcCloseMemHandle` unmaps them.
//!
//! The units come from the exporting process over its socket ([`super::wire`]), are
//! imported (`cuMemImportFromShareableHandle`), mapped back to back in a reservation of
//! their span, and made accessible to the calling context's device; the pointer returned is
//! the allocation's start in that span. The mappings keep the memory alive (the driver
//! counts them), so it stays valid here even if the exporter exits first.
//!
//! Imported memory is never managed here: it is outside this process's arena, so a manager
//! running here neither swaps it nor counts it against its budget (the exporter pins it).
//! The import's connection to the exporter stays open until the close: its end tells the
//! exporter the memory is no longer used here.

use std::collections::HashMap;
use std::ffi::CStr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tensile_driver_abi::{
    CUdevice, CUdeviceptr, CUresult, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_SUPPORTED,
    CUDA_SUCCESS,
};

use super::handle::ExportHandle;
use super::wire::{self, Reply, UnitBatch, UnitPlace, MAX_MESSAGE, UNITS_PER_MESSAGE};
use crate::memory::table::{check, resolve, InContext, MemFns, TableDriver};
use crate::memory::{Driver, PhysHandle};
use crate::real::RealDriver;

/// How long an importer waits for the exporter's answer.
const EXPORTER_TIMEOUT: Duration = Duration::from_secs(10);

type PfnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;

/// The calling thread's context, as it is: an import is made where the application asked.
struct CallersContext {
    ctx_get_device: PfnCtxGetDevice,
}

impl InContext for CallersContext {
    fn in_context<T>(&self, call: impl FnOnce() -> Result<T, CUresult>) -> Result<T, CUresult> {
        call()
    }
}

type ImportDriver = TableDriver<CallersContext>;

impl ImportDriver {
    /// The device of the calling thread's context.
    fn current_device(&self) -> Result<CUdevice, CUresult> {
        let mut device: CUdevice = 0;
        // SAFETY: a valid out-pointer to a local.
        check(unsafe { (self.context.ctx_get_device)(&mut device) })?;
        Ok(device)
    }
}

/// The driver's functions, looked up in the real driver once.
fn driver(real: &RealDriver) -> Result<&'static ImportDriver, CUresult> {
    static DRIVER: OnceLock<Result<ImportDriver, &'static str>> = OnceLock::new();
    let d = DRIVER.get_or_init(|| {
        let lookup = |name: &CStr| real.symbol(name);
        let ctx_get_device: PfnCtxGetDevice = resolve!(lookup, "cuCtxGetDevice")?;
        // SAFETY: the real driver's function of each name, or null; the driver library is
        // never unloaded.
        let f = unsafe { MemFns::resolve(lookup) }?;
        Ok(TableDriver {
            f,
            context: CallersContext { ctx_get_device },
        })
    });
    d.as_ref().map_err(|missing| {
        tracing::error!(
            "tensile: cuIpcOpenMemHandle of a libtensile handle refused with \
             CUDA_ERROR_NOT_SUPPORTED: the driver has no {missing}"
        );
        CUDA_ERROR_NOT_SUPPORTED
    })
}

/// One open import.
struct Import {
    handle: ExportHandle,
    /// Opens not yet closed: the driver's rule for a handle opened again in the same
    /// context (the same pointer, counted).
    opens: u32,
    base: CUdeviceptr,
    span_bytes: u64,
    /// Held open for the import's life: its end is the close the exporter counts.
    _connection: OwnedFd,
}

/// Open imports by the pointer handed to the application.
fn imports() -> &'static Mutex<HashMap<CUdeviceptr, Import>> {
    static IMPORTS: OnceLock<Mutex<HashMap<CUdeviceptr, Import>>> = OnceLock::new();
    IMPORTS.get_or_init(Mutex::default)
}

/// Why an open failed: the code the application gets, and the line that says why.
struct Refusal(CUresult, String);

/// `cuIpcOpenMemHandle` of a libtensile handle: maps the export's units here and returns
/// the allocation's address. A refusal is logged in one line.
pub fn open(real: &RealDriver, h: &ExportHandle) -> Result<CUdeviceptr, CUresult> {
    let d = driver(real)?;
    // Held while a new import is made, so that two threads opening one handle map it once.
    let mut open = imports().lock().unwrap_or_else(|e| e.into_inner());
    if let Some((&ptr, import)) = open.iter_mut().find(|(_, i)| i.handle == *h) {
        import.opens += 1;
        return Ok(ptr);
    }
    match open_with(d, h) {
        Ok((ptr, import)) => {
            open.insert(ptr, import);
            Ok(ptr)
        }
        Err(Refusal(code, why)) => {
            tracing::error!(
                "tensile: cuIpcOpenMemHandle of memory exported by process {} (export {}, {} \
                 bytes) failed with error {code}: {why}",
                h.pid,
                h.export_id,
                h.size
            );
            Err(code)
        }
    }
}

fn open_with(d: &ImportDriver, h: &ExportHandle) -> Result<(CUdeviceptr, Import), Refusal> {
    let invalid = |why: String| Refusal(CUDA_ERROR_INVALID_HANDLE, why);
    let name = wire::socket_name(h.pid);
    let sock = wire::connect(&name, EXPORTER_TIMEOUT).map_err(|e| {
        invalid(format!(
            "the exporting process cannot be reached ({e}): it has exited, or does not run \
             under libtensile as this user"
        ))
    })?;
    let mut request = [0u8; 64];
    request.copy_from_slice(&h.encode().reserved);
    wire::send(sock.as_fd(), &request, &[])
        .map_err(|e| invalid(format!("asking the exporting process failed ({e})")))?;
    let mut buf = [0u8; MAX_MESSAGE];
    let reply = wire::recv(sock.as_fd(), &mut buf, 0)
        .ok()
        .and_then(|(n, _)| Reply::decode(&buf[..n]))
        .ok_or_else(|| invalid("the exporting process did not answer".into()))?;
    if reply.status != CUDA_SUCCESS {
        return Err(Refusal(
            reply.status,
            "the exporting process refused it (the allocation was freed, or the handle is \
             not one of its exports)"
                .into(),
        ));
    }
    let mut units: Vec<(UnitPlace, OwnedFd)> = Vec::with_capacity(reply.units as usize);
    while units.len() < reply.units as usize {
        let (n, fds) = wire::recv(sock.as_fd(), &mut buf, UNITS_PER_MESSAGE)
            .map_err(|e| invalid(format!("receiving the memory failed ({e})")))?;
        let places = UnitBatch::decode(&buf[..n])
            .filter(|p| p.len() == fds.len() && !p.is_empty())
            .ok_or_else(|| invalid("the exporting process sent a malformed answer".into()))?;
        units.extend(places.into_iter().zip(fds));
    }
    let covered: u64 = units.iter().map(|(p, _)| p.bytes).sum();
    if covered != reply.span_bytes || reply.offset + reply.size > reply.span_bytes {
        return Err(invalid(
            "the exporting process sent a malformed answer".into(),
        ));
    }
    let base = map_units(d, reply.span_bytes, &units)
        .map_err(|code| Refusal(code, "mapping the memory here failed".into()))?;
    Ok((
        base + reply.offset,
        Import {
            handle: *h,
            opens: 1,
            base,
            span_bytes: reply.span_bytes,
            _connection: sock,
        },
    ))
}

/// Reserves `span_bytes`, maps every unit at its place and gives the calling context's
/// device read-write access; undone entirely on failure.
fn map_units(
    d: &ImportDriver,
    span_bytes: u64,
    units: &[(UnitPlace, OwnedFd)],
) -> Result<CUdeviceptr, CUresult> {
    let span = span_bytes as usize;
    let device = d.current_device()?;
    let base = d.mem_address_reserve(span, 0)?;
    let mut mapped: Vec<UnitPlace> = Vec::with_capacity(units.len());
    let result = (|| {
        for (place, fd) in units {
            let handle: PhysHandle = d.mem_import_fd(fd.as_fd())?;
            let mapping = d.mem_map(base + place.offset, place.bytes as usize, 0, handle);
            // The mapping holds the memory from now on (or nothing does, if it failed).
            let _ = d.mem_release(handle);
            mapping?;
            mapped.push(*place);
        }
        d.mem_set_access(base, span, device)
    })();
    if let Err(code) = result {
        for place in mapped {
            let _ = d.mem_unmap(base + place.offset, place.bytes as usize);
        }
        let _ = d.mem_address_free(base, span);
        return Err(code);
    }
    Ok(base)
}

/// `cuIpcCloseMemHandle`: `None` unless `ptr` is an open import of a libtensile handle
/// (then the call is the driver's); else one open fewer, and at the last one the memory is
/// unmapped and the exporter told.
pub fn close(real: &RealDriver, ptr: CUdeviceptr) -> Option<CUresult> {
    let import = {
        let mut open = imports().lock().unwrap_or_else(|e| e.into_inner());
        let import = open.get_mut(&ptr)?;
        import.opens -= 1;
        if import.opens > 0 {
            return Some(CUDA_SUCCESS);
        }
        open.remove(&ptr)?
    };
    let d = match driver(real) {
        Ok(d) => d,
        Err(code) => return Some(code),
    };
    let span = import.span_bytes as usize;
    let r = d
        .mem_unmap(import.base, span)
        .and_then(|()| d.mem_address_free(import.base, span));
    // Dropping the import closes its connection: the exporter counts the close.
    drop(import);
    Some(r.err().unwrap_or(CUDA_SUCCESS))
}
