//! Reading trace files into the analyzer's [`Trace`] model.
//!
//! [`load`] opens a file, detects gzip and the format from the first bytes (capture v1 text or
//! the project's own binary format), and streams it through the matching importer, reporting
//! progress as compressed bytes are consumed. Nothing here interprets the trace.

pub(crate) mod builder;
mod capture;
mod error;
mod native;

use std::cell::Cell;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;

pub use capture::{read_capture, CAPTURE_V1_SIGNATURE};
pub use error::{LoadError, Location};
pub use native::read_tensile;

use crate::model::Trace;

/// How to load a trace.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Keep the records before a cut instead of failing on a truncated file.
    pub allow_truncated: bool,
}

/// Progress of a load: bytes of the file consumed so far, and the file's size.
pub type ProgressFn<'a> = &'a mut dyn FnMut(u64, u64);

/// Loads a trace file of either format, gzipped or not.
pub fn load(path: &Path, options: LoadOptions) -> Result<Trace, LoadError> {
    load_with_progress(path, options, &mut |_, _| {})
}

/// Like [`load`], calling `progress(done, total)` every few thousand records.
pub fn load_with_progress(
    path: &Path,
    options: LoadOptions,
    progress: ProgressFn<'_>,
) -> Result<Trace, LoadError> {
    let name = path.display().to_string();
    let io_err = |source| LoadError::Io {
        path: name.clone(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let total = file.metadata().map_err(io_err)?.len();
    let consumed = Rc::new(Cell::new(0u64));
    let counting = CountingReader {
        inner: file,
        consumed: Rc::clone(&consumed),
    };
    let mut raw = BufReader::with_capacity(1 << 16, counting);
    let gzipped = raw.fill_buf().map_err(io_err)?.starts_with(&[0x1f, 0x8b]);
    let mut tick = || progress(consumed.get(), total);
    if gzipped {
        let decoder = flate2::read::MultiGzDecoder::new(raw);
        let input = BufReader::with_capacity(1 << 16, decoder);
        dispatch(input, &name, options, &mut tick)
    } else {
        dispatch(raw, &name, options, &mut tick)
    }
}

fn dispatch(
    mut input: impl BufRead,
    name: &str,
    options: LoadOptions,
    tick: &mut dyn FnMut(),
) -> Result<Trace, LoadError> {
    let head = match input.fill_buf() {
        Ok(head) => head,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(LoadError::Truncated {
                path: name.into(),
                at: Location::Line(1),
                what: "the compressed stream ends before any data".into(),
            })
        }
        Err(e) => {
            // A gzip header that does not decode means the file only looks compressed.
            return Err(LoadError::Foreign {
                path: name.into(),
                start: format!("bad gzip data ({e})"),
            });
        }
    };
    if head.starts_with(&tensile_trace::MAGIC[..4]) {
        read_tensile(input, name, options.allow_truncated, tick)
    } else if head.starts_with(b"#") {
        read_capture_lenient(input, name, options, tick)
    } else if head.is_empty() {
        Err(LoadError::Foreign {
            path: name.into(),
            start: "nothing (the file is empty)".into(),
        })
    } else {
        Err(LoadError::Foreign {
            path: name.into(),
            start: capture::printable(head),
        })
    }
}

fn read_capture_lenient(
    input: impl BufRead,
    name: &str,
    options: LoadOptions,
    tick: &mut dyn FnMut(),
) -> Result<Trace, LoadError> {
    if !options.allow_truncated {
        return read_capture(input, name, tick);
    }
    // Keep every complete line before a cut: stop reading at the first I/O error or at a last
    // line without its newline.
    let mut kept = Vec::new();
    let mut reader = input;
    loop {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line.last() != Some(&b'\n') => break,
            Ok(_) => kept.extend_from_slice(&line),
        }
    }
    read_capture(&kept[..], name, tick)
}

/// Counts the bytes read from the file, for progress.
struct CountingReader<R> {
    inner: R,
    consumed: Rc<Cell<u64>>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.consumed.set(self.consumed.get() + n as u64);
        Ok(n)
    }
}
