//! Streaming trace writer: one frame per record, nothing buffered beyond the inner writer.

use std::io::{self, Write};

use crate::crc32::crc32;
use crate::record::{End, Header, Record};
use crate::{FORMAT_VERSION, MAGIC, MAX_FRAME_BYTES};

/// Writes records to `W` as they come.
///
/// Give it a `BufWriter` for files: each record is a handful of small writes. A record is
/// complete on disk once [`Writer::flush`] returns; what a crash leaves behind reads back up
/// to the last complete frame.
pub struct Writer<W: Write> {
    out: W,
    scratch: Vec<u8>,
    records: u64,
}

impl<W: Write> Writer<W> {
    /// Writes the file header and the [`Record::Header`] record.
    pub fn new(mut out: W, header: &Header) -> io::Result<Self> {
        out.write_all(&MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        let mut writer = Writer {
            out,
            scratch: Vec::with_capacity(256),
            records: 0,
        };
        writer.write(&Record::Header(header.clone()))?;
        Ok(writer)
    }

    /// Appends one record.
    pub fn write(&mut self, record: &Record) -> io::Result<()> {
        self.scratch.clear();
        let payload = postcard::to_extend(record, std::mem::take(&mut self.scratch))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|&n| n <= MAX_FRAME_BYTES)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "record too large"))?;
        let mut varint = [0u8; 5];
        let n = encode_varint(len, &mut varint);
        self.out.write_all(&varint[..n])?;
        self.out.write_all(&payload)?;
        self.out.write_all(&crc32(&payload).to_le_bytes())?;
        self.scratch = payload;
        self.records += 1;
        Ok(())
    }

    /// Records written so far, the header included.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Flushes the inner writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Writes the [`Record::End`] marker, flushes, and returns the inner writer.
    pub fn finish(mut self, end: End) -> io::Result<W> {
        self.write(&Record::End(end))?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// LEB128 encoding of `v`; returns the number of bytes used.
fn encode_varint(mut v: u32, buf: &mut [u8; 5]) -> usize {
    let mut i = 0;
    loop {
        let byte = (v & 0x7F) as u8;
        v >>= 7;
        if v == 0 {
            buf[i] = byte;
            return i + 1;
        }
        buf[i] = byte | 0x80;
        i += 1;
    }
}
