//! `tensile run -- CMD...`: run a program with libtensile preloaded.
//!
//! Finds `libtensile.so` next to the `tensile` binary (where `cargo build` and an install
//! put both), prepends it to `LD_PRELOAD`, turns the convenience flags into the
//! `TENSILE_*` environment variables the library reads, and `exec`s the command, so the
//! program's exit status and signals are its own.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The library's file name (a contract: see ARCHITECTURE.md).
pub const LIBRARY_NAME: &str = "libtensile.so";

/// Arguments of `tensile run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Write the program's trace here (sets TENSILE_TRACE).
    #[arg(long, value_name = "PATH")]
    pub trace: Option<PathBuf>,
    /// Device memory budget, e.g. 6GiB, 512MiB, 40% (sets TENSILE_DEVICE_MEMORY).
    #[arg(long, value_name = "SIZE")]
    pub budget: Option<String>,
    /// Swap policy: plan, lru or off (sets TENSILE_POLICY).
    #[arg(long)]
    pub policy: Option<String>,
    /// Log filter in tracing syntax, e.g. info or tensile=debug (sets TENSILE_LOG).
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
    /// Use this libtensile.so instead of the one next to the tensile binary.
    #[arg(long, value_name = "PATH")]
    pub library: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Runs `tensile run`; returns only on error (on success the process is replaced).
pub fn run(args: RunArgs) -> Result<(), String> {
    let library = match args.library {
        Some(path) => path,
        None => library_next_to_exe()?,
    };
    if !library.is_file() {
        return Err(format!("{} does not exist", library.display()));
    }
    let library = library
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", library.display()))?;
    let (program, rest) = args
        .command
        .split_first()
        .ok_or("no command given after --")?;
    let mut command = Command::new(program);
    command.args(rest);
    command.env(
        "LD_PRELOAD",
        preload_value(&library, std::env::var_os("LD_PRELOAD")),
    );
    let settings = [
        ("TENSILE_TRACE", args.trace.map(PathBuf::into_os_string)),
        ("TENSILE_DEVICE_MEMORY", args.budget.map(OsString::from)),
        ("TENSILE_POLICY", args.policy.map(OsString::from)),
        ("TENSILE_LOG", args.log.map(OsString::from)),
    ];
    for (name, value) in settings {
        if let Some(value) = value {
            command.env(name, value);
        }
    }
    let error = command.exec();
    Err(format!(
        "cannot run {}: {error}",
        Path::new(program).display()
    ))
}

/// `libtensile.so` in the directory of the running `tensile` binary.
pub fn library_next_to_exe() -> Result<PathBuf, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the tensile binary: {e}"))?;
    let dir = exe.parent().ok_or("the tensile binary has no directory")?;
    let library = dir.join(LIBRARY_NAME);
    if library.is_file() {
        Ok(library)
    } else {
        Err(format!(
            "{LIBRARY_NAME} is not next to {} (build it with `cargo build --release`, \
             or pass --library PATH)",
            exe.display()
        ))
    }
}

/// `LD_PRELOAD` with the library first, keeping whatever was preloaded already.
fn preload_value(library: &Path, existing: Option<OsString>) -> OsString {
    let mut value = library.as_os_str().to_owned();
    if let Some(existing) = existing.filter(|e| !e.is_empty()) {
        value.push(":");
        value.push(existing);
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_keeps_existing_entries_after_ours() {
        let lib = Path::new("/opt/tensile/libtensile.so");
        assert_eq!(
            preload_value(lib, None),
            OsString::from("/opt/tensile/libtensile.so")
        );
        assert_eq!(
            preload_value(lib, Some("".into())),
            OsString::from("/opt/tensile/libtensile.so")
        );
        assert_eq!(
            preload_value(lib, Some("/usr/lib/libasan.so".into())),
            OsString::from("/opt/tensile/libtensile.so:/usr/lib/libasan.so")
        );
    }
}
