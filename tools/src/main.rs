//! `tensile`: the command-line front end of libtensile.
//!
//! Each subcommand lives in its own module; this file only parses arguments and dispatches.

mod chrome_trace;
mod coordinator;
mod demo;
mod replay;
mod rerun;
mod run;
mod status;
mod trace_info;
mod workdir;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "tensile",
    version,
    about = "Transparent GPU memory management for deep learning"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a training-like workload at 4x its memory budget and check every byte.
    Demo(demo::DemoArgs),
    /// Run a program with libtensile.so preloaded.
    Run(run::RunArgs),
    /// Summarize a trace (either format): counts, allocations, launches, top kernels, swap
    /// statistics; --timeline writes it for Perfetto / chrome://tracing.
    TraceInfo(trace_info::TraceInfoArgs),
    /// Simulate a trace under a swap policy and memory budget.
    Replay(replay::ReplayArgs),
    /// Play a trace back as a driver program, natively and under libtensile, and set the
    /// measured step beside replay's prediction; stamps check every byte swapping moved.
    Rerun(rerun::RerunArgs),
    /// Serve the jobs of one GPU: learn each job's iteration, plan it, send it the plan.
    Coordinator(coordinator::CoordinatorArgs),
    /// List the live jobs of each running coordinator.
    Status(status::StatusArgs),
    /// The player `tensile rerun` starts (internal).
    #[command(hide = true)]
    RerunPlayer(rerun::PlayerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Run(args) => run::run(args),
        Command::TraceInfo(args) => trace_info::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Rerun(args) => rerun::run(args),
        Command::Coordinator(args) => coordinator::run(args),
        Command::Status(args) => status::run(args),
        Command::RerunPlayer(args) => return rerun::player_main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tensile: {message}");
            ExitCode::FAILURE
        }
    }
}
