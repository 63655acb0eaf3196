//! A [`DeviceMemory`] over one flat host buffer, for unit tests of twins (here and in other
//! crates). Not a simulator: no mappings, no access rights, just bounds.

use std::sync::Mutex;

use crate::memory::{AccessKind, DeviceMemory, Fault};

/// `len` bytes of zeroed memory at device address `base`; anything outside is a fault.
#[derive(Debug)]
pub struct FlatMemory {
    base: u64,
    bytes: Mutex<Vec<u8>>,
}

impl FlatMemory {
    pub fn new(base: u64, len: usize) -> Self {
        Self {
            base,
            bytes: Mutex::new(vec![0; len]),
        }
    }

    fn range(&self, addr: u64, len: usize, kind: AccessKind, size: usize) -> Result<usize, Fault> {
        let fault = Fault {
            addr,
            len: len as u64,
            kind,
        };
        let start = addr.checked_sub(self.base).ok_or(fault)?;
        let start = usize::try_from(start).map_err(|_| fault)?;
        match start.checked_add(len) {
            Some(end) if end <= size => Ok(start),
            _ => Err(fault),
        }
    }
}

impl DeviceMemory for FlatMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        let bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let start = self.range(addr, buf.len(), AccessKind::Read, bytes.len())?;
        buf.copy_from_slice(&bytes[start..start + buf.len()]);
        Ok(())
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let mut bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let start = self.range(addr, data.len(), AccessKind::Write, bytes.len())?;
        bytes[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }
}
