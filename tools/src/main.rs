//! `tensile`: the command-line front end of libtensile.
//!
//! Each subcommand lives in its own module; this file only parses arguments and dispatches.

mod replay;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "tensile", version, about = "Transparent GPU memory management for deep learning")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a trace under a swap policy and memory budget.
    Replay(replay::ReplayArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => replay::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("tensile: {message}");
            ExitCode::FAILURE
        }
    }
}
