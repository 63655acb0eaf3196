//! `tensile run [--] CMD...`: run a program with libtensile preloaded.
//!
//! Finds `libtensile.so` next to the `tensile` binary (where `cargo build` and an install
//! put both), prepends it to `LD_PRELOAD`, turns the convenience flags into the
//! `TENSILE_*` environment variables the library reads, and `exec`s the command, so the
//! program's exit status and signals are its own.
//!
//! The settings are checked first, with the library's own parser (`tensile_shim::config`,
//! which needs no driver): a bad `--budget` or `--policy`, or a bad `TENSILE_*` variable
//! inherited from the environment, is one error here before the program starts, instead of
//! a warning from the library in every process the program spawns.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use tensile_shim::config::Config;

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
    /// The program and its arguments; everything from the program's name on is its own,
    /// so `--` before it is optional.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// Runs `tensile run`; returns only on error (on success the process is replaced).
pub fn run(args: RunArgs) -> Result<(), String> {
    check_settings(&args, |name| {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    })?;
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

/// The flags, and whatever `TENSILE_*` settings the program would inherit (read through
/// `inherited`), checked by the library's own configuration parser. The flags win over the
/// environment, as they do when the program starts.
fn check_settings(
    args: &RunArgs,
    inherited: impl Fn(&str) -> Option<String>,
) -> Result<(), String> {
    let flags = [
        ("TENSILE_DEVICE_MEMORY", "--budget", args.budget.as_deref()),
        ("TENSILE_POLICY", "--policy", args.policy.as_deref()),
        ("TENSILE_LOG", "--log", args.log.as_deref()),
    ];
    let flag_of = |variable: &str| {
        flags
            .iter()
            .find(|(v, _, value)| *v == variable && value.is_some())
            .map(|(_, flag, _)| *flag)
    };
    let (_, problems) =
        Config::from_lookup(|name| match flags.iter().find(|(v, _, _)| *v == name) {
            Some((_, _, Some(value))) => Some((*value).to_string()),
            _ => inherited(name),
        });
    let Some(problem) = problems.first() else {
        return Ok(());
    };
    let why = &problem.why;
    Err(match flag_of(problem.variable) {
        Some(flag) => format!("{flag} {:?}: {why}", problem.value),
        None => format!(
            "{}={:?} in the environment is not valid ({why}); fix or unset it",
            problem.variable, problem.value
        ),
    })
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
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: RunArgs,
    }

    fn parse(argv: &[&str]) -> Result<RunArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("run").chain(argv.iter().copied())).map(|c| c.args)
    }

    fn check(argv: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
        let args = parse(argv).expect("valid arguments");
        check_settings(&args, |name| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_command_needs_no_double_dash_and_keeps_its_own_flags() {
        let args = parse(&["--budget", "6GiB", "ls", "-l", "--budget", "x"]).unwrap();
        assert_eq!(args.budget.as_deref(), Some("6GiB"));
        assert_eq!(args.command, ["ls", "-l", "--budget", "x"]);
        let args = parse(&["--policy", "lru", "--", "ls", "-l"]).unwrap();
        assert_eq!(args.command, ["ls", "-l"]);
        assert!(
            parse(&["--budget", "6GiB"]).is_err(),
            "a command is required"
        );
    }

    #[test]
    fn settings_are_checked_with_the_librarys_rules() {
        // The library's grammar: binary shorthands, SI units, percentages.
        for good in [
            "6GiB", "512MiB", "6G", "2.5MB", "40%", "12345678", " 6 gib ",
        ] {
            assert_eq!(check(&["--budget", good, "true"], &[]), Ok(()), "{good}");
        }
        let err = check(&["--budget", "abc", "true"], &[]).unwrap_err();
        assert_eq!(
            err,
            "--budget \"abc\": `abc` is not a number; expected e.g. 6GiB, 512MiB or 40%"
        );
        let err = check(&["--budget", "1.2.3GiB", "true"], &[]).unwrap_err();
        assert!(err.contains("`1.2.3` is not a number"), "{err}");
        assert!(err.contains("6GiB"), "the message gives an example: {err}");
        for bad in ["0", "101%", "-1GiB", "6 parsecs", "1.2.3GiB", "1.5MB"] {
            assert!(check(&["--budget", bad, "true"], &[]).is_err(), "{bad}");
        }
        let err = check(&["--policy", "fast", "true"], &[]).unwrap_err();
        assert!(
            err.contains("--policy \"fast\"") && err.contains("lru"),
            "{err}"
        );
        assert_eq!(check(&["--policy", "LRU", "true"], &[]), Ok(()));
    }

    #[test]
    fn a_bad_inherited_setting_is_named_and_a_flag_overrides_it() {
        let env = [("TENSILE_DEVICE_MEMORY", "lots")];
        let err = check(&["true"], &env).unwrap_err();
        assert!(
            err.starts_with("TENSILE_DEVICE_MEMORY=\"lots\" in the environment"),
            "{err}"
        );
        assert_eq!(check(&["--budget", "1GiB", "true"], &env), Ok(()));
        let env = [("TENSILE_HOST_MEMORY", "150%")];
        assert!(check(&["true"], &env)
            .unwrap_err()
            .contains("TENSILE_HOST_MEMORY"));
    }

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
