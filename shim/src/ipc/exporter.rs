//! The exporting side: arena allocations shared through `cuIpcGetMemHandle`, and the
//! thread that hands their units to importing processes.
//!
//! An export pins its allocation on the device ([`MemoryManager::pin_for_export`]) and
//! keeps a descriptor of each unit backing it, so that any number of processes may open it
//! while it lives. Exporting an allocation again gives the same handle (as the driver
//! does).
//!
//! Lifetime: the importers' opens are counted by their connections ([`super::wire`]: a
//! connection stays open as long as its import, and ends with the importer's close or
//! death). A free of an exported allocation that nobody has open frees it at once and
//! revokes the export (a later open is `CUDA_ERROR_INVALID_HANDLE`). A free while it is
//! open elsewhere is answered with success but carried out when the last import ends:
//! until then the memory stays pinned and keeps its address, so the arena cannot hand it
//! (and the importer's writes) to another allocation. The driver leaves that case
//! undefined for its own IPC; this keeps the exporter's other data safe.
//!
//! The server thread (`tensile-ipc`, started by the first export) polls the listening
//! socket and every connection; it never takes the manager's lock except to carry out a
//! deferred free.
//!
//! [`MemoryManager::pin_for_export`]: crate::memory::MemoryManager::pin_for_export

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tensile_driver_abi::{
    CUdeviceptr, CUipcMemHandle, CUresult, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OPERATING_SYSTEM, CUDA_SUCCESS,
};

use super::handle::{ExportHandle, Parsed};
use super::wire::{self, Reply, UnitBatch, UnitPlace, MAX_MESSAGE, UNITS_PER_MESSAGE};
use crate::managed::Managed;
use crate::memory::manager::ExportedAllocation;

/// How long the server waits on one importer's send or receive before dropping it.
const IMPORTER_TIMEOUT: Duration = Duration::from_secs(2);

/// One exported allocation.
struct Export {
    managed: &'static Managed,
    alloc: ExportedAllocation,
    /// Connections that have it open.
    opens: u32,
    /// Freed by the application while open elsewhere: freed for real when `opens` drops
    /// to 0.
    freed: bool,
}

#[derive(Default)]
struct Table {
    exports: HashMap<u64, Export>,
    /// Export ids by allocation start.
    by_ptr: HashMap<CUdeviceptr, u64>,
    next_id: u64,
}

/// The process's exports and its server.
struct Exporter {
    table: Mutex<Table>,
    /// The process's nonce once the server listens (or why it could not).
    server: OnceLock<Result<u64, String>>,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

fn exporter() -> &'static Exporter {
    EXPORTER.get_or_init(|| Exporter {
        table: Mutex::new(Table {
            next_id: 1,
            ..Table::default()
        }),
        server: OnceLock::new(),
    })
}

impl Exporter {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A random number (from the time and pid where `getrandom` fails).
fn random_nonce() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: a valid buffer of 8 bytes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

/// The nonce of this process's server, starting it on the first call.
fn server_nonce(ex: &'static Exporter) -> Result<u64, CUresult> {
    let started = ex.server.get_or_init(|| {
        let name = wire::socket_name(std::process::id());
        let listener = wire::listen(&name).map_err(|e| format!("listening on @{name}: {e}"))?;
        let nonce = random_nonce();
        std::thread::Builder::new()
            .name("tensile-ipc".into())
            .spawn(move || serve(ex, listener, nonce))
            .map_err(|e| format!("starting its thread: {e}"))?;
        Ok(nonce)
    });
    started.as_ref().copied().map_err(|why| {
        tracing::error!(
            "tensile: cuIpcGetMemHandle of arena memory refused with CUDA_ERROR_OPERATING_SYSTEM: \
             the server that hands it to other processes could not start ({why})"
        );
        CUDA_ERROR_OPERATING_SYSTEM
    })
}

/// `cuIpcGetMemHandle` of `dptr`, arena memory of `managed`: the handle of the allocation
/// containing it, exported now if it was not. Refusals are logged, one line each.
pub fn export(managed: &'static Managed, dptr: CUdeviceptr) -> Result<CUipcMemHandle, CUresult> {
    let ex = exporter();
    let Some((ptr, size)) = managed.mm.allocation_containing(dptr) else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let handle_of = |id: u64, nonce: u64| {
        ExportHandle {
            pid: std::process::id(),
            export_id: id,
            size: size as u64,
            nonce,
        }
        .encode()
    };
    let nonce = server_nonce(ex)?;
    if let Some(&id) = ex.lock().by_ptr.get(&ptr) {
        return Ok(handle_of(id, nonce));
    }
    let alloc = managed.mm.pin_for_export(ptr).inspect_err(|&code| {
        tracing::error!(
            "tensile: cuIpcGetMemHandle of {dptr:#x} ({size} bytes at {ptr:#x}) refused with \
             error {code}: the allocation could not be pinned on the device and exported \
             (does it fit TENSILE_DEVICE_MEMORY? does the driver export VMM memory as file \
             descriptors?); its data is intact"
        );
    })?;
    let mut t = ex.lock();
    // Another thread may have exported it meanwhile: one export per allocation.
    if let Some(&id) = t.by_ptr.get(&ptr) {
        return Ok(handle_of(id, nonce));
    }
    let id = t.next_id;
    t.next_id += 1;
    tracing::debug!(
        "exported {size} bytes at {ptr:#x} as export {id} ({} units)",
        alloc.units.len()
    );
    t.by_ptr.insert(ptr, id);
    t.exports.insert(
        id,
        Export {
            managed,
            alloc,
            opens: 0,
            freed: false,
        },
    );
    Ok(handle_of(id, nonce))
}

/// Called before the application's free of `ptr` (an allocation start in the arena):
/// whether the free must wait for the imports of an export of it to end (then it is
/// carried out when the last one does, and the caller reports success now). An export
/// nobody has open is revoked, and the free goes ahead.
pub fn free_is_deferred(ptr: CUdeviceptr) -> bool {
    let Some(ex) = EXPORTER.get() else {
        return false;
    };
    let mut t = ex.lock();
    let Some(&id) = t.by_ptr.get(&ptr) else {
        return false;
    };
    let Some(e) = t.exports.get_mut(&id) else {
        return false;
    };
    if e.opens > 0 {
        e.freed = true;
        tracing::debug!(
            "the free of {ptr:#x} waits for {} process(es) that have it open",
            e.opens
        );
        return true;
    }
    t.by_ptr.remove(&ptr);
    t.exports.remove(&id);
    false
}

/// One importer's connection, and the export it holds open once served.
struct Connection {
    sock: OwnedFd,
    open: Option<u64>,
}

/// The server loop: accepts importers, answers each one's request, and counts its open
/// until its connection ends.
fn serve(ex: &'static Exporter, listener: OwnedFd, nonce: u64) {
    let mut conns: Vec<Connection> = Vec::new();
    loop {
        let mut fds: Vec<libc::pollfd> = std::iter::once(&listener)
            .chain(conns.iter().map(|c| &c.sock))
            .map(|s| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of `fds.len()` entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!("tensile: the IPC server stopped: poll failed ({e})");
            return;
        }
        // Connections first (from the back, so removals keep the indices of the rest).
        for i in (0..conns.len()).rev() {
            if fds[i + 1].revents == 0 {
                continue;
            }
            let keep = match conns[i].open {
                None => match request(ex, conns[i].sock.as_fd(), nonce) {
                    Some(id) => {
                        conns[i].open = Some(id);
                        true
                    }
                    None => false,
                },
                // An importer sends nothing after its request: anything readable is its
                // end (or a protocol error, treated alike).
                Some(_) => false,
            };
            if !keep {
                let c = conns.swap_remove(i);
                if let Some(id) = c.open {
                    closed(ex, id);
                }
            }
        }
        if fds[0].revents != 0 {
            match wire::accept(listener.as_fd()) {
                Ok(sock) => {
                    let same_user =
                        wire::peer_uid(sock.as_fd()).is_ok_and(|u| u == wire::own_uid());
                    let timed = wire::set_timeouts(sock.as_fd(), IMPORTER_TIMEOUT).is_ok();
                    if same_user && timed {
                        conns.push(Connection { sock, open: None });
                    } else if !same_user {
                        tracing::warn!("tensile: refused an IPC connection from another user");
                    }
                }
                Err(e) => tracing::debug!("accepting an IPC connection failed: {e}"),
            }
        }
    }
}

/// Reads and answers one importer's request; the export it opened, if it did.
fn request(ex: &Exporter, sock: BorrowedFd<'_>, nonce: u64) -> Option<u64> {
    let mut buf = [0u8; MAX_MESSAGE];
    let n = match wire::recv(sock, &mut buf, 0) {
        Ok((n, _)) => n,
        Err(_) => return None,
    };
    let mut handle = CUipcMemHandle { reserved: [0; 64] };
    if n != handle.reserved.len() {
        return None;
    }
    handle.reserved.copy_from_slice(&buf[..n]);
    let refuse = |status| {
        let _ = wire::send(sock, &Reply::refusal(status).encode(), &[]);
        None
    };
    let h = match ExportHandle::parse(&handle) {
        Parsed::Ours(h) if h.pid == std::process::id() && h.nonce == nonce => h,
        _ => return refuse(CUDA_ERROR_INVALID_HANDLE),
    };
    // Sent under the table's lock: the export (and its descriptors) cannot go meanwhile.
    let mut t = ex.lock();
    let Some(e) = t.exports.get_mut(&h.export_id).filter(|e| !e.freed) else {
        drop(t);
        return refuse(CUDA_ERROR_INVALID_HANDLE);
    };
    let a = &e.alloc;
    let reply = Reply {
        status: CUDA_SUCCESS,
        units: a.units.len() as u32,
        span_bytes: a.span_bytes,
        offset: a.ptr - a.span_start,
        size: a.size,
    };
    let sent = wire::send(sock, &reply.encode(), &[]).and_then(|()| {
        for batch in a.units.chunks(UNITS_PER_MESSAGE) {
            let places: Vec<UnitPlace> = batch
                .iter()
                .map(|u| UnitPlace {
                    offset: u.offset,
                    bytes: u.bytes,
                })
                .collect();
            let fds: Vec<BorrowedFd<'_>> = batch.iter().map(|u| u.fd.as_fd()).collect();
            wire::send(sock, &UnitBatch::encode(&places), &fds)?;
        }
        Ok(())
    });
    match sent {
        Ok(()) => {
            e.opens += 1;
            Some(h.export_id)
        }
        Err(err) => {
            tracing::debug!("handing export {} over failed: {err}", h.export_id);
            None
        }
    }
}

/// An import of export `id` ended: the deferred free is carried out after the last one.
fn closed(ex: &Exporter, id: u64) {
    let mut t = ex.lock();
    let Some(e) = t.exports.get_mut(&id) else {
        return;
    };
    e.opens = e.opens.saturating_sub(1);
    if e.opens > 0 || !e.freed {
        return;
    }
    let Some(e) = t.exports.remove(&id) else {
        return;
    };
    t.by_ptr.remove(&e.alloc.ptr);
    drop(t);
    // The importers are done with the memory. A `cuMemFreeAsync` deferred here was ordered
    // after work on its stream, which a synchronous free must wait for.
    if let Err(code) = e.managed.driver.synchronize() {
        tracing::debug!("synchronizing before a deferred free failed with error {code}");
    }
    match e.managed.mm.free(e.alloc.ptr, None) {
        Ok(()) => tracing::debug!(
            "the free of {:#x}, deferred while other processes had it open, is done",
            e.alloc.ptr
        ),
        Err(code) => tracing::error!(
            "tensile: the deferred free of {:#x}, shared with other processes until now, \
             failed with error {code}",
            e.alloc.ptr
        ),
    }
}
