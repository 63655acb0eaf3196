//! The operating-system memory primitives the simulated GPU is built on: anonymous mappings,
//! `memfd` physical allocations and fixed-address remapping.
//!
//! Invariants for callers: every function here that takes an address operates only on ranges
//! the caller owns (obtained from [`map_anonymous`] or [`reserve`] and not yet released), so
//! remapping them cannot clobber memory that anything else in the process uses. This module
//! does not track anything; [`crate::memory`] does.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The host page size the simulator assumes (x86-64 Linux).
pub const PAGE: u64 = 4096;

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

/// A new private anonymous mapping of `len` bytes with protection `prot`, placed by the
/// kernel (near `hint` if that range is free). Returns its address.
pub fn map_anonymous(len: u64, prot: i32, hint: u64) -> Result<u64, i32> {
    let len = usize::try_from(len).map_err(|_| libc::ENOMEM)?;
    // SAFETY: a non-fixed anonymous mapping cannot replace an existing one; the hint is only a
    // hint without MAP_FIXED.
    let p = unsafe {
        libc::mmap(
            hint as *mut libc::c_void,
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(errno())
    } else {
        Ok(p as u64)
    }
}

/// Reserves `len` bytes of address space (`PROT_NONE`) aligned to `align` (a power of two),
/// at `hint` when that exact aligned range is free.
pub fn reserve(len: u64, align: u64, hint: u64) -> Result<u64, i32> {
    if hint != 0 && hint.is_multiple_of(align) {
        let got = map_anonymous(len, libc::PROT_NONE, hint)?;
        if got == hint {
            return Ok(got);
        }
        unmap(got, len);
    }
    // Over-reserve, then trim the unaligned head and the tail.
    let total = len.checked_add(align).ok_or(libc::ENOMEM)?;
    let raw = map_anonymous(total, libc::PROT_NONE, 0)?;
    let start = raw.next_multiple_of(align);
    if start > raw {
        unmap(raw, start - raw);
    }
    let end = start + len;
    if raw + total > end {
        unmap(end, raw + total - end);
    }
    Ok(start)
}

/// Releases `[addr, addr + len)`. Failures are ignored: the range was ours and page-aligned,
/// so munmap cannot fail for a reason the simulator could act on.
pub fn unmap(addr: u64, len: u64) {
    if len == 0 {
        return;
    }
    // SAFETY: callers only pass ranges they mapped and own (module invariant).
    unsafe {
        libc::munmap(addr as *mut libc::c_void, len as usize);
    }
}

/// Changes the protection of an owned, mapped range.
pub fn protect(addr: u64, len: u64, prot: i32) -> Result<(), i32> {
    // SAFETY: callers only pass ranges they mapped and own (module invariant).
    let rc = unsafe { libc::mprotect(addr as *mut libc::c_void, len as usize, prot) };
    if rc == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// Maps `len` bytes of `fd` at `offset` over the owned range at `addr`, shared, `PROT_NONE`.
pub fn map_fd_fixed(addr: u64, len: u64, fd: &MemFd, offset: u64) -> Result<(), i32> {
    let off = libc::off_t::try_from(offset).map_err(|_| libc::EINVAL)?;
    // SAFETY: MAP_FIXED replaces only [addr, addr + len), which lies inside a reservation the
    // caller owns (module invariant).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.0.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Puts an owned range back to reserved-but-unbacked (`PROT_NONE`, anonymous), dropping its
/// reference to whatever file was mapped there.
pub fn reset_to_reserved(addr: u64, len: u64) -> Result<(), i32> {
    // SAFETY: as in `map_fd_fixed`, the range is inside a reservation the caller owns.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(errno())
    } else {
        Ok(())
    }
}

/// An anonymous in-memory file: the backing store of one physical allocation. Its bytes
/// outlive any mapping of it, which is what makes unmap/remap keep data.
#[derive(Debug)]
pub struct MemFd(OwnedFd);

impl MemFd {
    /// Copies `len` bytes at `src_offset` of `src` to `dst_offset` of `dst` inside the kernel
    /// (`copy_file_range`), without mapping either. Ranges of one file must not overlap.
    pub fn copy_to(
        &self,
        src_offset: u64,
        dst: &MemFd,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), i32> {
        let mut done = 0u64;
        while done < len {
            let mut from = libc::loff_t::try_from(src_offset + done).map_err(|_| libc::EINVAL)?;
            let mut to = libc::loff_t::try_from(dst_offset + done).map_err(|_| libc::EINVAL)?;
            // SAFETY: both descriptors are open; the kernel reads and writes only the files.
            let n = unsafe {
                libc::copy_file_range(
                    self.0.as_raw_fd(),
                    &mut from,
                    dst.0.as_raw_fd(),
                    &mut to,
                    (len - done) as usize,
                    0,
                )
            };
            match n {
                n if n > 0 => done += n as u64,
                0 => return Err(libc::EIO),
                _ => return Err(errno()),
            }
        }
        Ok(())
    }

    /// Writes `len` bytes from `src` at `offset` of the file (`pwrite`), without mapping it.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes.
    pub unsafe fn write_at(&self, offset: u64, src: *const u8, len: usize) -> Result<(), i32> {
        let mut done = 0usize;
        while done < len {
            let at = libc::off_t::try_from(offset + done as u64).map_err(|_| libc::EINVAL)?;
            // SAFETY: the caller vouches for `src`'s `len` bytes; the descriptor is open.
            let n = unsafe {
                libc::pwrite(
                    self.0.as_raw_fd(),
                    src.add(done) as *const libc::c_void,
                    len - done,
                    at,
                )
            };
            match n {
                n if n > 0 => done += n as usize,
                0 => return Err(libc::EIO),
                _ => return Err(errno()),
            }
        }
        Ok(())
    }

    /// A new descriptor of this file (close-on-exec), for `cuMemExportToShareableHandle`.
    pub fn duplicate(&self) -> Result<OwnedFd, i32> {
        self.0
            .try_clone()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EBADF))
    }

    /// The file behind `fd` (a descriptor another process's [`Self::duplicate`] sent), on a
    /// descriptor of its own: the caller keeps `fd`.
    pub fn duplicate_of(fd: std::os::fd::BorrowedFd<'_>) -> Result<Self, i32> {
        let own = fd
            .try_clone_to_owned()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EBADF))?;
        Ok(Self(own))
    }

    /// The file's size in bytes.
    pub fn size(&self) -> Result<u64, i32> {
        // SAFETY: an all-zero `stat` is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid open descriptor and a valid out-pointer.
        if unsafe { libc::fstat(self.0.as_raw_fd(), &mut st) } != 0 {
            return Err(errno());
        }
        u64::try_from(st.st_size).map_err(|_| libc::EINVAL)
    }

    pub fn create(len: u64) -> Result<Self, i32> {
        // SAFETY: the name is a valid NUL-terminated string; the flags are plain bits.
        let fd = unsafe { libc::memfd_create(c"tensile-simgpu".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len).map_err(|_| libc::EINVAL)?;
        // SAFETY: `fd` is a valid open descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(errno());
        }
        Ok(Self(fd))
    }
}
