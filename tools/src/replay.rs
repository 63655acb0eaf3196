//! `tensile replay`: simulate a trace under a policy and budget (being written).

/// Arguments of `tensile replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Trace file (the project's format or capture format v1, gzipped or not).
    pub trace: std::path::PathBuf,
}

/// Runs `tensile replay`.
pub fn run(args: ReplayArgs) -> Result<(), String> {
    Err(format!("replay of {} is not implemented yet", args.trace.display()))
}
