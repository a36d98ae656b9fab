//! Command-line front end: one `clap` subcommand per job.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// aubier: compiler, engine and OpenAI-compatible server for Mistral Small 4 GGUF files.
#[derive(Parser, Debug)]
#[command(name = "aubier", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {}

/// Parses the command line and runs the chosen subcommand.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {}
}
