//! Importer for the project's own trace format (crate `tensile-trace`).
//!
//! The format crate does framing, checksums and versions; this module maps its records onto the
//! analyzer's model through the shared builder. It does not decide what records mean beyond that
//! mapping (swap statistics written by the shim at exit are not part of the model).

use std::io::Read;

use tensile_trace::{Reader, Record, TraceError};

use super::builder::TraceBuilder;
use super::error::{LoadError, Location};
use crate::model::{SourceFormat, Trace};

/// Reads a whole tensile trace. `input` must start at the magic bytes.
pub fn read_tensile(
    input: impl Read,
    path: &str,
    allow_truncated: bool,
    tick: &mut dyn FnMut(),
) -> Result<Trace, LoadError> {
    let reader = Reader::new(input).map_err(|e| format_error(path, e))?;
    let mut builder = TraceBuilder::new(SourceFormat::Tensile);
    let mut complete = false;
    // The header is record 0 and was consumed by `Reader::new`.
    for (record_no, item) in (1u64..).zip(reader) {
        let record = match item {
            Ok(record) => record,
            Err(TraceError::Truncated { .. }) if allow_truncated => break,
            Err(e) => return Err(format_error(path, e)),
        };
        if record_no.is_multiple_of(4096) {
            tick();
        }
        let at = Location::Record(record_no);
        let result = match record {
            Record::Header(_) => {
                return Err(LoadError::Inconsistent {
                    path: path.into(),
                    at,
                    reason: "a second header record".into(),
                })
            }
            Record::End(_) => {
                complete = true;
                Ok(())
            }
            other => builder.record(&other),
        };
        result.map_err(|e| e.at(path, at))?;
    }
    Ok(builder.finish(complete))
}

fn format_error(path: &str, e: TraceError) -> LoadError {
    match e {
        TraceError::Io(source) => LoadError::Io {
            path: path.into(),
            source,
        },
        TraceError::Truncated { records_read } => LoadError::Truncated {
            path: path.into(),
            at: Location::Record(records_read),
            // The format crate reports a cut gzip stream this way too, with the records it kept.
            what: format!(
                "the file ends after {records_read} complete records (the recording process \
                 died, or the file was cut)"
            ),
        },
        other => LoadError::Format {
            path: path.into(),
            reason: other.to_string(),
        },
    }
}
