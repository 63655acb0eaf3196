//! Streaming trace reader with clear errors for foreign, newer, cut and damaged files.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use crate::crc32::crc32;
use crate::record::{Header, Record, Swap, SwapCause, SwapDir};
use crate::{FORMAT_VERSION, MAGIC, MAX_FRAME_BYTES, OLDEST_READ_VERSION};

/// Why a trace could not be read (completely).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("I/O error reading the trace: {0}")]
    Io(#[from] io::Error),
    #[error("not a libtensile trace (bad magic bytes)")]
    NotATrace,
    #[error(
        "trace format version {found} is not supported (this build reads versions {oldest} to {supported})"
    )]
    UnsupportedVersion {
        found: u16,
        oldest: u16,
        supported: u16,
    },
    #[error(
        "trace is truncated after {records_read} complete records \
         (the recording process probably died)"
    )]
    Truncated { records_read: u64 },
    #[error("trace is corrupt at record {record}: {reason}")]
    Corrupt { record: u64, reason: String },
}

/// Reads records one at a time; iterate it.
///
/// After the last complete record of a cut file the iterator yields one
/// `Err(TraceError::Truncated)`, then `None`. Any error ends the iteration.
pub struct Reader<R: Read> {
    input: R,
    /// The file's format version (records are read as it wrote them).
    version: u16,
    header: Header,
    records: u64,
    saw_end: bool,
    done: bool,
    buf: Vec<u8>,
}

impl Reader<Box<dyn Read>> {
    /// Opens a trace file, gzipped or not (detected by its first bytes).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let mut file = BufReader::new(File::open(path)?);
        let gzipped = {
            let head = io::BufRead::fill_buf(&mut file)?;
            head.starts_with(&[0x1f, 0x8b])
        };
        let input: Box<dyn Read> = if gzipped {
            Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(file)))
        } else {
            Box::new(file)
        };
        Reader::new(input)
    }
}

impl<R: Read> Reader<R> {
    /// Checks the magic bytes and version, and reads the header record.
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let mut magic = [0u8; 8];
        if read_full(&mut input, &mut magic)? < magic.len() || magic != MAGIC {
            return Err(TraceError::NotATrace);
        }
        let mut version = [0u8; 2];
        if read_full(&mut input, &mut version)? < version.len() {
            return Err(TraceError::Truncated { records_read: 0 });
        }
        let found = u16::from_le_bytes(version);
        if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&found) {
            return Err(TraceError::UnsupportedVersion {
                found,
                oldest: OLDEST_READ_VERSION,
                supported: FORMAT_VERSION,
            });
        }
        let placeholder = Header {
            format_version: found,
            pid: 0,
            start_unix_ns: 0,
            producer: String::new(),
            command: String::new(),
        };
        let mut reader = Reader {
            input,
            version: found,
            header: placeholder,
            records: 0,
            saw_end: false,
            done: false,
            buf: Vec::new(),
        };
        let first = reader.next_record();
        match first.map_err(|e| reader.cut_stream_is_truncation(e))? {
            Some(Record::Header(h)) => reader.header = h,
            Some(_) => {
                return Err(TraceError::Corrupt {
                    record: 0,
                    reason: "the first record is not a header".into(),
                })
            }
            None => return Err(TraceError::Truncated { records_read: 0 }),
        }
        Ok(reader)
    }

    /// The trace's header record.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Complete records read so far, the header included.
    pub fn records_read(&self) -> u64 {
        self.records
    }

    /// Whether the [`Record::End`] marker has been read: the recorder closed the trace cleanly.
    pub fn finished_cleanly(&self) -> bool {
        self.saw_end
    }

    /// A gzip stream that ends early surfaces as an I/O "unexpected end of file"; that is a
    /// cut file like any other, so it is reported with the number of complete records read
    /// (not as an I/O error, and not as a cut "at record 0").
    fn cut_stream_is_truncation(&self, e: TraceError) -> TraceError {
        match e {
            TraceError::Io(io) if io.kind() == io::ErrorKind::UnexpectedEof => {
                TraceError::Truncated {
                    records_read: self.records,
                }
            }
            other => other,
        }
    }

    fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        let truncated = |records| TraceError::Truncated {
            records_read: records,
        };
        let Some(len) = read_varint(&mut self.input)? else {
            return Ok(None);
        };
        let len = len.ok_or_else(|| truncated(self.records))?;
        if len > MAX_FRAME_BYTES {
            return Err(TraceError::Corrupt {
                record: self.records,
                reason: format!("frame length {len} exceeds the {MAX_FRAME_BYTES}-byte limit"),
            });
        }
        self.buf.resize(len as usize + 4, 0);
        if read_full(&mut self.input, &mut self.buf)? < self.buf.len() {
            return Err(truncated(self.records));
        }
        let (payload, crc) = self.buf.split_at(len as usize);
        let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32(payload) != stored {
            return Err(TraceError::Corrupt {
                record: self.records,
                reason: "checksum mismatch".into(),
            });
        }
        let record = decode(payload, self.version).map_err(|e| TraceError::Corrupt {
            record: self.records,
            reason: format!("undecodable record: {e}"),
        })?;
        self.records += 1;
        if matches!(record, Record::End(_)) {
            self.saw_end = true;
        }
        Ok(Some(record))
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Record, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self
            .next_record()
            .map_err(|e| self.cut_stream_is_truncation(e))
            .transpose();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }
}

/// The variant index of [`Record::Swap`] in postcard's encoding (its position in the enum).
const SWAP_TAG: u8 = 11;

/// A [`Swap`] as format 2 wrote it: without the pages' addresses.
#[derive(serde::Deserialize)]
struct SwapV2 {
    t_ns: u64,
    dir: SwapDir,
    cause: SwapCause,
    pages: u32,
    bytes: u64,
}

/// One record's payload, in a file of format `version`.
fn decode(payload: &[u8], version: u16) -> Result<Record, postcard::Error> {
    if version < 3 && payload.first() == Some(&SWAP_TAG) {
        let old: SwapV2 = postcard::from_bytes(&payload[1..])?;
        return Ok(Record::Swap(Swap {
            t_ns: old.t_ns,
            dir: old.dir,
            cause: old.cause,
            pages: old.pages,
            bytes: old.bytes,
            runs: Vec::new(),
        }));
    }
    postcard::from_bytes(payload)
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Reads a LEB128 `u32`. `Ok(None)`: clean end of input before the first byte;
/// `Ok(Some(None))`: the input ended inside the varint.
fn read_varint(input: &mut impl Read) -> io::Result<Option<Option<u32>>> {
    let mut value: u64 = 0;
    for i in 0..5 {
        let mut byte = [0u8; 1];
        if read_full(input, &mut byte)? == 0 {
            return Ok(if i == 0 { None } else { Some(None) });
        }
        value |= u64::from(byte[0] & 0x7F) << (7 * i);
        if byte[0] & 0x80 == 0 {
            return Ok(Some(Some(u32::try_from(value).unwrap_or(u32::MAX))));
        }
    }
    // Five continuation bytes cannot be a u32 length: report as an oversized frame.
    Ok(Some(Some(u32::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A format 2 `Swap`'s fields, as it wrote them.
    #[derive(serde::Serialize)]
    struct WrittenV2 {
        t_ns: u64,
        dir: SwapDir,
        cause: SwapCause,
        pages: u32,
        bytes: u64,
    }

    fn swap(runs: Vec<(u64, u32)>) -> Swap {
        Swap {
            t_ns: 7,
            dir: SwapDir::ToDevice,
            cause: SwapCause::Access,
            pages: 3,
            bytes: 3 << 21,
            runs,
        }
    }

    #[test]
    fn a_format_2_swap_reads_without_its_pages_and_a_format_3_one_with_them() {
        let now = postcard::to_allocvec(&Record::Swap(swap(vec![(0x1000_0000, 3)]))).unwrap();
        assert_eq!(now[0], SWAP_TAG, "Swap's place in Record moved");
        assert_eq!(
            decode(&now, 3).unwrap(),
            Record::Swap(swap(vec![(0x1000_0000, 3)]))
        );
        let mut old = vec![SWAP_TAG];
        old.extend(
            postcard::to_allocvec(&WrittenV2 {
                t_ns: 7,
                dir: SwapDir::ToDevice,
                cause: SwapCause::Access,
                pages: 3,
                bytes: 3 << 21,
            })
            .unwrap(),
        );
        assert_eq!(decode(&old, 2).unwrap(), Record::Swap(swap(Vec::new())));
        // Read as format 3, the same bytes lack the runs: refused, not misread.
        assert!(decode(&old, 3).is_err());
    }
}
