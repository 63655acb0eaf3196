//! Importer for capture format v1, the text format of the shared PyTorch traces.
//!
//! Reads line by line from any `BufRead` (the caller handles gzip and progress), so a large file
//! is never held in memory as text. Each line is checked strictly: a malformed line is an error
//! naming the line and what was expected there, not something silently skipped. This module
//! knows the syntax only; consistency (ids, frees) is checked by the builder.

use std::io::BufRead;

use super::builder::TraceBuilder;
use super::error::{LoadError, Location, ModelError};
use crate::model::{CopyDir, SourceFormat, SyncScope, Trace};

/// What the first line of a capture v1 file starts with.
pub const CAPTURE_V1_SIGNATURE: &[u8] = b"# capture v1";

/// Called every few thousand lines so the caller can show progress.
pub type Tick<'a> = &'a mut dyn FnMut();

/// Reads a whole capture v1 file.
pub fn read_capture(
    mut input: impl BufRead,
    path: &str,
    tick: Tick<'_>,
) -> Result<Trace, LoadError> {
    let mut builder = TraceBuilder::new(SourceFormat::CaptureV1);
    let mut buf = Vec::with_capacity(256);
    let mut line_no = 0u64;
    let mut complete = false;
    loop {
        buf.clear();
        let n = input
            .read_until(b'\n', &mut buf)
            .map_err(|e| read_error(path, line_no + 1, e))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if line_no.is_multiple_of(4096) {
            tick();
        }
        let at = Location::Line(line_no);
        if buf.last() != Some(&b'\n') {
            return Err(LoadError::Truncated {
                path: path.into(),
                at,
                what: "the last line has no end (the file was cut while being written)".into(),
            });
        }
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        let text = std::str::from_utf8(&buf).map_err(|_| LoadError::Syntax {
            path: path.into(),
            at,
            expected: "a line of text (UTF-8)".into(),
            found: String::from_utf8_lossy(&buf).into_owned(),
        })?;
        if line_no == 1 && !text.as_bytes().starts_with(CAPTURE_V1_SIGNATURE) {
            return Err(LoadError::Foreign {
                path: path.into(),
                start: printable(&buf),
            });
        }
        if text.is_empty() {
            continue;
        }
        if let Some(comment) = text.strip_prefix('#') {
            if comment.trim() == "end" {
                complete = true;
            }
            continue;
        }
        parse_line(&mut builder, text).map_err(|e| match e {
            LineError::Syntax { expected, found } => LoadError::Syntax {
                path: path.into(),
                at,
                expected,
                found,
            },
            LineError::Model(m) => m.at(path, at),
        })?;
    }
    if line_no == 0 {
        return Err(LoadError::Foreign {
            path: path.into(),
            start: "nothing (empty file)".into(),
        });
    }
    Ok(builder.finish(complete))
}

fn read_error(path: &str, line: u64, e: std::io::Error) -> LoadError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        LoadError::Truncated {
            path: path.into(),
            at: Location::Line(line),
            what: "the compressed stream ends early (the file was cut)".into(),
        }
    } else {
        LoadError::Io {
            path: path.into(),
            source: e,
        }
    }
}

/// A rendering of the first bytes of a file that is safe to print.
pub(crate) fn printable(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(24)];
    let text: String = head
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            }
        })
        .collect();
    format!("{text:?}")
}

enum LineError {
    Syntax { expected: String, found: String },
    Model(ModelError),
}

impl From<ModelError> for LineError {
    fn from(e: ModelError) -> Self {
        LineError::Model(e)
    }
}

fn syntax(expected: &str, found: &str) -> LineError {
    LineError::Syntax {
        expected: expected.into(),
        found: found.into(),
    }
}

/// Splits a line into its space-separated fields and parses them with context.
struct Fields<'a> {
    line: &'a str,
    parts: std::str::SplitAsciiWhitespace<'a>,
}

impl<'a> Fields<'a> {
    fn next(&mut self, what: &str) -> Result<&'a str, LineError> {
        self.parts
            .next()
            .ok_or_else(|| syntax(&format!("{what} (line too short)"), self.line))
    }

    fn u64(&mut self, what: &str) -> Result<u64, LineError> {
        let field = self.next(what)?;
        field
            .parse()
            .map_err(|_| syntax(&format!("{what} as a decimal integer"), field))
    }

    fn u32(&mut self, what: &str) -> Result<u32, LineError> {
        let field = self.next(what)?;
        field
            .parse()
            .map_err(|_| syntax(&format!("{what} as a decimal integer"), field))
    }

    fn hex(&mut self, what: &str) -> Result<u64, LineError> {
        let field = self.next(what)?;
        let digits = field.strip_prefix("0x").unwrap_or(field);
        u64::from_str_radix(digits, 16).map_err(|_| syntax(&format!("{what} in hex"), field))
    }

    fn stream(&mut self) -> Result<u64, LineError> {
        let field = self.next("a stream handle")?;
        parse_stream(field).ok_or_else(|| syntax("a stream handle ((nil) or 0x...)", field))
    }

    fn triple(&mut self, what: &str) -> Result<[u32; 3], LineError> {
        let field = self.next(what)?;
        let mut out = [0u32; 3];
        let mut parts = field.split(',');
        for slot in &mut out {
            *slot = parts
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| syntax(&format!("{what} as x,y,z"), field))?;
        }
        if parts.next().is_some() {
            return Err(syntax(&format!("{what} as x,y,z"), field));
        }
        Ok(out)
    }

    fn end(&mut self) -> Result<(), LineError> {
        match self.parts.next() {
            None => Ok(()),
            Some(extra) => Err(syntax("end of line", extra)),
        }
    }
}

fn parse_stream(field: &str) -> Option<u64> {
    if field == "(nil)" {
        Some(0)
    } else if let Some(hex) = field.strip_prefix("0x") {
        u64::from_str_radix(hex, 16).ok()
    } else {
        field.parse().ok()
    }
}

fn parse_line(builder: &mut TraceBuilder, line: &str) -> Result<(), LineError> {
    let mut f = Fields {
        line,
        parts: line.split_ascii_whitespace(),
    };
    let tag = f.next("a record letter")?;
    match tag {
        "N" => {
            let id = f.u32("a kernel handle number")?;
            let nparams = f.u32("a parameter count")?;
            let name = f.next("a kernel name")?.to_string();
            f.end()?;
            builder.kernel(id, nparams, name);
        }
        "A" => {
            let t = f.u64("a time in ns")?;
            let stream = f.stream()?;
            let id = f.u64("an allocation id")?;
            let ptr = f.hex("a device address")?;
            let bytes = f.u64("a size in bytes")?;
            f.end()?;
            builder.alloc(t, stream, id, ptr, bytes)?;
        }
        "F" => {
            let t = f.u64("a time in ns")?;
            let _stream = f.stream()?;
            let id = f.u64("an allocation id")?;
            f.end()?;
            builder.free(t, id)?;
        }
        "K" => {
            let t = f.u64("a time in ns")?;
            let stream = f.stream()?;
            let seq = f.u64("a launch number")?;
            let kernel = f.u32("a kernel handle number")?;
            let _grid = f.triple("a grid size")?;
            let _block = f.triple("a block size")?;
            let _smem = f.u32("a shared memory size")?;
            let mut ids = Vec::new();
            for access in f.parts.by_ref() {
                let (id, offset) = access
                    .split_once('@')
                    .ok_or_else(|| syntax("an access as <id>@<offset>", access))?;
                let id = id.parse().map_err(|_| syntax("an allocation id", access))?;
                let _offset: u32 = offset
                    .parse()
                    .map_err(|_| syntax("a parameter offset", access))?;
                ids.push(id);
            }
            builder.launch(t, stream, seq, kernel, ids)?;
        }
        "D" => {
            let seq = f.u64("a launch number")?;
            let ns = f.u64("a GPU duration in ns")?;
            f.end()?;
            builder.duration(seq, ns)?;
        }
        "C" => {
            let t = f.u64("a time in ns")?;
            let stream = f.stream()?;
            let kind = f.next("a copy kind")?;
            let dir = match kind {
                "h2d" => CopyDir::HostToDevice,
                "d2h" => CopyDir::DeviceToHost,
                "d2d" => CopyDir::DeviceToDevice,
                "any" => CopyDir::Any,
                other => return Err(syntax("a copy kind (h2d, d2h, d2d or any)", other)),
            };
            let dst = f.u64("a destination allocation id")?;
            let src = f.u64("a source allocation id")?;
            let bytes = f.u64("a size in bytes")?;
            f.end()?;
            builder.copy(t, stream, dir, dst, src, bytes)?;
        }
        "S" => {
            let t = f.u64("a time in ns")?;
            let target = f.next("a stream handle or \"all\"")?;
            let scope = if target == "all" {
                SyncScope::Device
            } else {
                SyncScope::Stream(
                    parse_stream(target)
                        .ok_or_else(|| syntax("a stream handle or \"all\"", target))?,
                )
            };
            f.end()?;
            builder.sync(t, scope);
        }
        other => return Err(syntax("a record letter (N, A, F, K, D, C or S)", other)),
    }
    Ok(())
}
