//! POSIX shared memory: create, open, map and unlink `DIR/NAME`, and nothing else.
//!
//! This is the only module that opens segment files and calls `mmap`. What the bytes mean
//! (the header, the slots) is [`crate::segment`]'s business; here a mapping is an address and
//! a length that stay valid until it is dropped.
//!
//! `DIR` is [`shm_dir`]: `/dev/shm` (where glibc's `shm_open` puts its objects), or what
//! `TENSILE_SHM_DIR` says, read here and nowhere else, so a job, the coordinator it starts
//! (which inherits its environment) and `tensile status` agree on it. The files are opened
//! as `shm_open` opens them (`open` with `O_NOFOLLOW | O_CLOEXEC`), in that directory.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// Where POSIX shared-memory objects appear as files on Linux: the default [`shm_dir`].
pub const SHM_DIR: &str = "/dev/shm";

/// The variable that moves the segments out of [`SHM_DIR`]: an absolute path, best on a
/// tmpfs (elsewhere the segment's pages are a file's, written back to its disk).
pub const SHM_DIR_VARIABLE: &str = "TENSILE_SHM_DIR";

/// The directory segments live in: `TENSILE_SHM_DIR` if set and not empty, else
/// [`SHM_DIR`]; read once per process. A value that is not an absolute path is an error
/// every open and create reports (a relative one would name another file in each process's
/// working directory).
pub fn shm_dir() -> Result<&'static Path, &'static str> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| match std::env::var_os(SHM_DIR_VARIABLE) {
        Some(v) if !v.is_empty() => {
            let p = PathBuf::from(v);
            if p.is_absolute() {
                Ok(p)
            } else {
                Err(format!(
                    "{SHM_DIR_VARIABLE}={} is not an absolute path",
                    p.display()
                ))
            }
        }
        _ => Ok(PathBuf::from(SHM_DIR)),
    });
    match dir {
        Ok(p) => Ok(p.as_path()),
        Err(e) => Err(e.as_str()),
    }
}

/// The directory for messages: [`shm_dir`], or what the variable said if it is unusable.
pub fn shm_dir_display() -> String {
    match shm_dir() {
        Ok(p) => p.display().to_string(),
        Err(_) => std::env::var_os(SHM_DIR_VARIABLE)
            .map(|v| PathBuf::from(v).display().to_string())
            .unwrap_or_else(|| SHM_DIR.to_string()),
    }
}

/// Who may do what with a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads only (`tensile status`): a store through it would fault, so the types that
    /// hold a read-only mapping only ever load.
    ReadOnly,
    /// Reads and writes (the coordinator and jobs).
    ReadWrite,
}

/// An open shared-memory object, before it is mapped.
#[derive(Debug)]
pub struct ShmFile {
    fd: OwnedFd,
    name: String,
}

/// What `fstat` says about the object.
#[derive(Debug, Clone, Copy)]
pub struct ShmMetadata {
    pub uid: u32,
    pub mode: u32,
    pub size: u64,
    pub dev: u64,
    pub ino: u64,
}

/// The path of object `name` as a C string: `DIR/name`, `name` one file name.
fn c_path(name: &str) -> io::Result<CString> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file name",
        ));
    }
    let dir = shm_dir().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    CString::new(dir.join(name).as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the name"))
}

/// `open(2)` as glibc's `shm_open` calls it.
fn open_object(path: &CString, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl ShmFile {
    /// `open(DIR/NAME, O_CREAT | O_EXCL | O_RDWR, 0600)`: fails with `AlreadyExists` when the name
    /// is taken. The mode is set again with `fchmod`, so a umask cannot widen or narrow it.
    pub fn create_exclusive(name: &str) -> io::Result<ShmFile> {
        let c = c_path(name)?;
        let fd = open_object(&c, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600)?;
        let file = ShmFile {
            fd,
            name: name.to_string(),
        };
        // SAFETY: a valid descriptor.
        if unsafe { libc::fchmod(file.fd.as_raw_fd(), 0o600) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(file)
    }

    /// Opens an existing object.
    pub fn open(name: &str, access: Access) -> io::Result<ShmFile> {
        let c = c_path(name)?;
        let flags = match access {
            Access::ReadOnly => libc::O_RDONLY,
            Access::ReadWrite => libc::O_RDWR,
        };
        let fd = open_object(&c, flags, 0)?;
        Ok(ShmFile {
            fd,
            name: name.to_string(),
        })
    }

    /// Sets the size (the memory is not reserved yet: see [`ShmFile::reserve`]).
    pub fn set_size(&self, bytes: u64) -> io::Result<()> {
        let len = libc::off_t::try_from(bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
        // SAFETY: a valid descriptor.
        if unsafe { libc::ftruncate(self.fd.as_raw_fd(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reserves the memory of the first `bytes` now (`posix_fallocate`), so that a full
    /// `/dev/shm` is an error here rather than a `SIGBUS` in a job writing its ring later.
    pub fn reserve(&self, bytes: u64) -> io::Result<()> {
        let len = libc::off_t::try_from(bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
        // SAFETY: a valid descriptor; posix_fallocate returns the error number itself.
        let r = unsafe { libc::posix_fallocate(self.fd.as_raw_fd(), 0, len) };
        if r != 0 && r != libc::EOPNOTSUPP && r != libc::EINVAL {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(())
    }

    pub fn metadata(&self) -> io::Result<ShmMetadata> {
        // SAFETY: `st` is written whole by fstat before it is read.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a valid stat buffer.
        if unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ShmMetadata {
            uid: st.st_uid,
            mode: st.st_mode & 0o7777,
            size: st.st_size as u64,
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    /// Maps the first `len` bytes, shared.
    pub fn map(&self, len: usize, access: Access) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        let prot = match access {
            Access::ReadOnly => libc::PROT_READ,
            Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        };
        // SAFETY: a fresh mapping chosen by the kernel (no MAP_FIXED), of a descriptor we own.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            base: NonNull::new(p.cast()).ok_or_else(io::Error::last_os_error)?,
            len,
            access,
        })
    }

    /// The name this file was opened under.
    pub fn name(&self) -> String {
        self.name.clone()
    }
}

/// Removes the name (mappings stay valid until unmapped).
pub fn unlink(name: &str) -> io::Result<()> {
    let c = c_path(name)?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    if unsafe { libc::unlink(c.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `(dev, ino)` of the object now at `name`, to tell whether a name still refers to the
/// object one has open.
pub fn identity_of(name: &str) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let dir = shm_dir().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let m = std::fs::symlink_metadata(dir.join(name))?;
    Ok((m.dev(), m.ino()))
}

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
    access: Access,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through atomics
// (see `crate::segment`), so sharing and sending it between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn access(&self) -> Access {
        self.access
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is a mapping this value made and nothing else unmaps; the
        // references handed out borrow `self`, so none outlives it.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
