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
        read_words(self, addr, n, u32::from_ne_bytes)
    }

    /// Reads `n` consecutive `f32`s.
    fn read_f32s(&self, addr: u64, n: u64) -> Result<Vec<f32>, Fault> {
        read_words(self, addr, n, f32::from_ne_bytes)
    }

    /// Reads one `u64`.
    fn read_u64(&self, addr: u64) -> Result<u64, Fault> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Writes consecutive `u32`s.
    fn write_u32s(&self, addr: u64, values: &[u32]) -> Result<(), Fault> {
        write_words(self, addr, values, |v| v.to_ne_bytes())
    }

    /// Writes consecutive `f32`s.
    fn write_f32s(&self, addr: u64, values: &[f32]) -> Result<(), Fault> {
        write_words(self, addr, values, |v| v.to_ne_bytes())
    }

    /// Writes one `u64`.
    fn write_u64(&self, addr: u64, value: u64) -> Result<(), Fault> {
        self.write(addr, &value.to_ne_bytes())
    }
}

/// Bytes moved per call when converting between words and bytes: large buffers go through
/// in slices of this size rather than as one doubled copy.
const CHUNK_BYTES: usize = 1 << 20;

/// Reads `n` 4-byte words. A count whose byte length overflows the address space is a fault
/// of the whole range (the GPU would run off the end of memory).
fn read_words<M: DeviceMemory + ?Sized, T>(
    mem: &M,
    addr: u64,
    n: u64,
    from: fn([u8; 4]) -> T,
) -> Result<Vec<T>, Fault> {
    let fault = Fault {
        addr,
        len: u64::MAX,
        kind: AccessKind::Read,
    };
    let len = n.checked_mul(4).ok_or(fault)?;
    addr.checked_add(len).ok_or(fault)?;
    let count = usize::try_from(n).map_err(|_| fault)?;
    let mut out = Vec::new();
    out.try_reserve_exact(count).map_err(|_| fault)?;
    let mut buf = vec![0u8; CHUNK_BYTES.min(count * 4)];
    let mut at = addr;
    while out.len() < count {
        let take = (count - out.len()).min(CHUNK_BYTES / 4);
        let bytes = &mut buf[..take * 4];
        mem.read(at, bytes)?;
        out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| from([c[0], c[1], c[2], c[3]])),
        );
        at += take as u64 * 4;
    }
    Ok(out)
}

/// Writes 4-byte words.
fn write_words<M: DeviceMemory + ?Sized, T: Copy>(
    mem: &M,
    addr: u64,
    values: &[T],
    to: fn(T) -> [u8; 4],
) -> Result<(), Fault> {
    let fault = Fault {
        addr,
        len: u64::MAX,
        kind: AccessKind::Write,
    };
    addr.checked_add(values.len() as u64 * 4).ok_or(fault)?;
    let mut buf = Vec::with_capacity(CHUNK_BYTES.min(values.len() * 4));
    let mut at = addr;
    for chunk in values.chunks(CHUNK_BYTES / 4) {
        buf.clear();
        buf.extend(chunk.iter().flat_map(|&v| to(v)));
        mem.write(at, &buf)?;
        at += buf.len() as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FlatMemory;

    const BASE: u64 = 0x5000_0000;

    #[test]
    fn large_transfers_round_trip_across_chunks() {
        let mem = FlatMemory::new(BASE, 3 << 20);
        let n = (5 << 20) / 8; // 2.5 MiB of words: three chunks
        let words: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        mem.write_u32s(BASE + 4, &words).unwrap();
        assert_eq!(mem.read_u32s(BASE + 4, n as u64).unwrap(), words);
        let floats: Vec<f32> = words.iter().map(|&w| f32::from_bits(w)).collect();
        mem.write_f32s(BASE, &floats).unwrap();
        let back = mem.read_f32s(BASE, n as u64).unwrap();
        assert!(back
            .iter()
            .zip(&floats)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn a_fault_past_the_first_chunk_is_reported() {
        let mem = FlatMemory::new(BASE, 3 << 20);
        let n = (4 << 20) / 4; // 4 MiB: the fourth chunk is outside
        let err = mem.read_u32s(BASE, n).unwrap_err();
        assert_eq!((err.addr, err.kind), (BASE + (3 << 20), AccessKind::Read));
        let err = mem.write_u32s(BASE, &vec![0; n as usize]).unwrap_err();
        assert_eq!((err.addr, err.kind), (BASE + (3 << 20), AccessKind::Write));
        assert_eq!(mem.read_u32s(BASE, u64::MAX).unwrap_err().len, u64::MAX);
    }
}
