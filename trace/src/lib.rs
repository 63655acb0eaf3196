//! The on-disk trace format of libtensile.
//!
//! One crate shared by the recorder inside `libtensile.so` (which writes) and the analysis
//! tools (which read), so the two can never disagree about a byte. It defines the
//! [`Record`] types, a streaming [`Writer`] and a streaming [`Reader`]; it knows nothing
//! about CUDA or about what the records mean (that is `tensile-analyzer`'s job).
//!
//! # Layout
//! ```text
//! file   := magic:"TNSLTRC\0"  version:u16le  frame*
//! frame  := len:varint(u32)  payload:[u8; len]  crc32(payload):u32le
//! payload:= postcard(Record)
//! ```
//! The first record is always a [`Record::Header`]; a clean close ends with [`Record::End`].
//! Frames are self-delimiting and checksummed, so a file cut anywhere (the recording process
//! crashed or was killed) still yields every complete record before the cut, followed by
//! [`TraceError::Truncated`].
//!
//! # Versioning
//! [`FORMAT_VERSION`] is bumped on any incompatible change; a reader refuses other versions
//! with [`TraceError::UnsupportedVersion`] rather than misreading them. Adding a record
//! variant at the end of [`Record`] is a compatible change for old files, not for old readers:
//! the version is bumped, and this crate reads every version from [`OLDEST_READ_VERSION`].
//! Version 2 added the library's own work ([`Record::Swap`], [`Record::Busy`],
//! [`Record::Plan`]); version 3 the pages each swap moved ([`Swap::runs`]: a version 2
//! `Swap` is read with none).

mod crc32;
mod reader;
mod record;
mod writer;

pub use reader::{Reader, TraceError};
pub use record::*;
pub use writer::Writer;

/// The first eight bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"TNSLTRC\0";

/// The format version this crate writes (and the newest it reads).
pub const FORMAT_VERSION: u16 = 3;

/// The oldest format version this crate reads: later versions only added records.
pub const OLDEST_READ_VERSION: u16 = 1;

/// The largest payload a frame may carry; anything bigger is corruption, not data.
pub const MAX_FRAME_BYTES: u32 = 64 << 20;
