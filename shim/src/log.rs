//! Logging: `tracing` events to stderr, filtered by `TENSILE_LOG` (default `warn`).
//!
//! libtensile carries its own copy of `tracing`, so its subscriber never collides with one
//! the host program installs. This module only sets logging up; modules log with the
//! `tracing` macros directly.

use std::sync::Once;

use tracing_subscriber::EnvFilter;

static INIT: Once = Once::new();

/// The filter used when `TENSILE_LOG` is unset.
pub const DEFAULT_FILTER: &str = "warn";

/// Installs the stderr subscriber once; later calls do nothing.
pub fn init(filter: Option<&str>) {
    INIT.call_once(|| {
        let (env_filter, problem) = match filter.map(EnvFilter::try_new) {
            None => (EnvFilter::new(DEFAULT_FILTER), None),
            Some(Ok(f)) => (f, None),
            Some(Err(e)) => (EnvFilter::new(DEFAULT_FILTER), Some(e.to_string())),
        };
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(env_filter)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_target(true)
            .finish();
        // Fails only if this copy of `tracing` already has a global subscriber, which
        // nothing but this function sets.
        let _ = tracing::subscriber::set_global_default(subscriber);
        if let (Some(bad), Some(why)) = (filter, problem) {
            tracing::warn!(
                "TENSILE_LOG={bad:?} is not a valid filter ({why}); using {DEFAULT_FILTER}"
            );
        }
    });
}

/// Writes one line to stderr without allocating, locking or going through `tracing`: for
/// reporting a panic caught at the C boundary, when the logging machinery itself may be
/// what failed.
pub fn emergency(line: &str) {
    for part in ["tensile: ", line, "\n"] {
        let mut rest = part.as_bytes();
        while !rest.is_empty() {
            // SAFETY: writing initialised bytes to fd 2.
            let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
            if n <= 0 {
                return;
            }
            rest = &rest[n as usize..];
        }
    }
}

/// Reports a panic caught at the C boundary in `function` (which then returns an error).
pub fn hook_panicked(function: &str) {
    let logged = std::panic::catch_unwind(|| {
        tracing::error!(
            "internal error (panic) in {function}; the call fails with CUDA_ERROR_UNKNOWN"
        );
    });
    if logged.is_err() {
        emergency("internal error (panic) in a hook; the call fails with CUDA_ERROR_UNKNOWN");
    }
}
