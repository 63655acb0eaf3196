//! How a CPU twin reaches device memory: the [`DeviceMemory`] trait.
//!
//! Twins never dereference device addresses themselves; they move whole ranges in and out
//! through this trait, so the implementation (the simulated GPU) can check each range against
//! its mappings and access rights and report a [`Fault`] instead of touching memory that is
//! not there. The typed helpers move bulk slices, one call per buffer, not per element.

use std::fmt;

/// Whether a faulting access read or wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    Read,
    Write,
}

/// An access to device memory that is unmapped or not accessible (the simulator turns it into
/// `CUDA_ERROR_ILLEGAL_ADDRESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// First address of the access.
    pub addr: u64,
    /// Length of the access in bytes.
    pub len: u64,
    pub kind: AccessKind,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            AccessKind::Read => "read",
            AccessKind::Write => "write",
        };
        write!(
            f,
            "illegal {kind} of {} bytes at {:#x}",
            self.len, self.addr
        )
    }
}

impl std::error::Error for Fault {}

/// Device memory as a twin sees it.
pub trait DeviceMemory {
    /// Copies `buf.len()` bytes starting at device address `addr` into `buf`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault>;
    /// Copies `data` to device address `addr`.
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), Fault>;

    /// Reads `n` consecutive `u32`s.
    fn read_u32s(&self, addr: u64, n: u64) -> Result<Vec<u32>, Fault> {
        let bytes = read_bytes(self, addr, n, 4)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Reads `n` consecutive `f32`s.
    fn read_f32s(&self, addr: u64, n: u64) -> Result<Vec<f32>, Fault> {
        let bytes = read_bytes(self, addr, n, 4)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Reads one `u64`.
    fn read_u64(&self, addr: u64) -> Result<u64, Fault> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Writes consecutive `u32`s.
    fn write_u32s(&self, addr: u64, values: &[u32]) -> Result<(), Fault> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        self.write(addr, &bytes)
    }

    /// Writes consecutive `f32`s.
    fn write_f32s(&self, addr: u64, values: &[f32]) -> Result<(), Fault> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        self.write(addr, &bytes)
    }

    /// Writes one `u64`.
    fn write_u64(&self, addr: u64, value: u64) -> Result<(), Fault> {
        self.write(addr, &value.to_ne_bytes())
    }
}

/// Reads `n` elements of `elem` bytes; an element count whose byte length overflows the
/// address space is a fault of the whole range (the GPU would run off the end of memory).
fn read_bytes<M: DeviceMemory + ?Sized>(
    mem: &M,
    addr: u64,
    n: u64,
    elem: u64,
) -> Result<Vec<u8>, Fault> {
    let fault = Fault {
        addr,
        len: u64::MAX,
        kind: AccessKind::Read,
    };
    let len = n.checked_mul(elem).ok_or(fault)?;
    addr.checked_add(len).ok_or(fault)?;
    let len = usize::try_from(len).map_err(|_| fault)?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(len).map_err(|_| fault)?;
    buf.resize(len, 0);
    mem.read(addr, &mut buf)?;
    Ok(buf)
}
