//! Errors of the trace importers: what went wrong and where, in words a user can act on.

use std::fmt;

/// Where in a file a problem was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// 1-based line of a text (capture) file.
    Line(u64),
    /// 0-based record of a binary (tensile) file.
    Record(u64),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Line(n) => write!(f, "line {n}"),
            Location::Record(n) => write!(f, "record {n}"),
        }
    }
}

/// Why a trace could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Neither a capture v1 file nor a tensile trace.
    #[error(
        "{path} is not a trace: expected a tensile trace (magic TNSLTRC) or a capture v1 text \
         file (first line \"# capture v1...\"), gzipped or not; it starts with {start}"
    )]
    Foreign {
        /// The file.
        path: String,
        /// A printable rendering of its first bytes.
        start: String,
    },
    /// The file ends in the middle of something (the recording was cut short).
    #[error(
        "{path} is truncated at {at}: {what} (pass --allow-truncated to use what comes before \
         the cut)"
    )]
    Truncated {
        /// The file.
        path: String,
        /// Where the cut is.
        at: Location,
        /// What was being read.
        what: String,
    },
    /// A line or record does not have the expected shape.
    #[error("{path}, {at}: expected {expected}, found {found:?}")]
    Syntax {
        /// The file.
        path: String,
        /// Where.
        at: Location,
        /// What the format requires there.
        expected: String,
        /// What the file has.
        found: String,
    },
    /// Well-formed, but inconsistent with what came before (unknown id, double free...).
    #[error("{path}, {at}: {reason}")]
    Inconsistent {
        /// The file.
        path: String,
        /// Where.
        at: Location,
        /// What is wrong.
        reason: String,
    },
    /// A tensile trace the format crate refused (version, checksum...).
    #[error("{path}: {reason}")]
    Format {
        /// The file.
        path: String,
        /// The format crate's explanation.
        reason: String,
    },
}

/// A problem found while building the model, before the file name and location are attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModelError(pub String);

impl ModelError {
    pub(crate) fn at(self, path: &str, at: Location) -> LoadError {
        LoadError::Inconsistent {
            path: path.to_string(),
            at,
            reason: self.0,
        }
    }
}
