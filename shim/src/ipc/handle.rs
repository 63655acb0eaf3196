//! The `CUipcMemHandle` libtensile hands out for arena memory: 64 opaque bytes to the
//! application, which passes them to another process as it would the driver's.
//!
//! Layout (little-endian, at fixed offsets in every version):
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..8 | magic `TNSL-IPC` |
//! | 8..12 | layout version (1) |
//! | 12..16 | the exporting process's pid |
//! | 16..24 | the export's id in that process (from 1) |
//! | 24..32 | the allocation's size, bytes |
//! | 32..40 | the exporting process's nonce: random, drawn once, so that a handle of a dead process is not taken for one of a later process with the same pid |
//! | 40..64 | zero |
//!
//! A driver handle is opaque bytes too, so a driver's handle could in principle carry the
//! magic; it is 8 bytes followed by a version and 24 zero bytes, which a handle the driver
//! wrote is not known to do.

use tensile_driver_abi::CUipcMemHandle;

const MAGIC: [u8; 8] = *b"TNSL-IPC";
const VERSION: u32 = 1;

/// What a libtensile handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportHandle {
    pub pid: u32,
    pub export_id: u64,
    pub size: u64,
    pub nonce: u64,
}

/// What a handle is, to the importer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// One of ours, of a layout this build reads.
    Ours(ExportHandle),
    /// Ours, of a layout version this build does not know.
    OtherVersion(u32),
    /// Not ours: the driver's (or garbage); forwarded to the driver.
    Foreign,
}

fn u32_at(b: &[u8; 64], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

fn u64_at(b: &[u8; 64], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

impl ExportHandle {
    pub fn encode(&self) -> CUipcMemHandle {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.pid.to_le_bytes());
        b[16..24].copy_from_slice(&self.export_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..40].copy_from_slice(&self.nonce.to_le_bytes());
        CUipcMemHandle { reserved: b }
    }

    pub fn parse(h: &CUipcMemHandle) -> Parsed {
        let b = &h.reserved;
        if b[0..8] != MAGIC || b[40..64].iter().any(|&x| x != 0) {
            return Parsed::Foreign;
        }
        match u32_at(b, 8) {
            VERSION => Parsed::Ours(ExportHandle {
                pid: u32_at(b, 12),
                export_id: u64_at(b, 16),
                size: u64_at(b, 24),
                nonce: u64_at(b, 32),
            }),
            v => Parsed::OtherVersion(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_reads_back_as_written_and_other_bytes_are_foreign() {
        let h = ExportHandle {
            pid: 4242,
            export_id: 7,
            size: 3 << 20,
            nonce: 0xfeed_beef_0123_4567,
        };
        let bytes = h.encode();
        assert_eq!(ExportHandle::parse(&bytes), Parsed::Ours(h));
        let mut newer = bytes;
        newer.reserved[8] = 2;
        assert_eq!(ExportHandle::parse(&newer), Parsed::OtherVersion(2));
        let mut trailing = bytes;
        trailing.reserved[63] = 1;
        assert_eq!(ExportHandle::parse(&trailing), Parsed::Foreign);
        // The simulated driver's legacy handle: an address, then zeros.
        let mut driver = CUipcMemHandle { reserved: [0; 64] };
        driver.reserved[..8].copy_from_slice(&0x7f00_1234_0000u64.to_le_bytes());
        assert_eq!(ExportHandle::parse(&driver), Parsed::Foreign);
    }
}
