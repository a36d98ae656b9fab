//! Command-line front end: one `clap` subcommand per job.

use crate::error_text::error_text;
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
pub enum Command {
    /// Show a GGUF file's metadata, tensor bytes and validation; optionally dequantize a tensor.
    Inspect(crate::inspect::InspectArgs),
    /// Serve the model over OpenAI-compatible HTTP (chat, completions, models, SSE).
    Serve(crate::serve::ServeArgs),
    /// Replay a routing trace through the expert-placement policies; print served fractions.
    Replay(crate::replay::ReplayArgs),
    /// Compile a GGUF model; print the graph after a pipeline stage, or the plan as JSON.
    Gen(crate::gen::GenArgs),
    /// Run one prompt through the model on a backend (prefill, then decode).
    Run(crate::run::RunArgs),
    /// Record the routing of every token of one generation as a JSONL trace (for `replay`).
    Trace(crate::trace::TraceArgs),
    /// Write a synthetic mistral4 GGUF with the real dimensions and random valid quant blocks.
    Synth(crate::synth::SynthArgs),
    /// Compare two model configurations by teacher-forced NLL on one text (paired t verdict).
    Quality(crate::quality::QualityArgs),
    /// Measure prefill and decode tok/s, time to first token, peak RSS and weight bytes per token.
    Bench(crate::bench::BenchArgs),
    /// List the Vulkan devices with the limits and features the GPU kernels depend on.
    Devices(crate::devices::DevicesArgs),
}

/// Parses the command line and runs the chosen subcommand.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        restore_default_sigpipe();
    }
    match cli.command {
        Command::Inspect(args) => crate::inspect::run(args),
        Command::Serve(args) => crate::serve::run(args),
        Command::Replay(args) => crate::replay::run(args),
        Command::Gen(args) => report("gen", crate::gen::run(args)),
        Command::Run(args) => report("run", crate::run::run(args)),
        Command::Trace(args) => report("trace", crate::trace::run(args)),
        Command::Synth(args) => report("synth", crate::synth::run(args)),
        Command::Quality(args) => report("quality", crate::quality::run(args)),
        Command::Bench(args) => report("bench", crate::bench::run(args)),
        Command::Devices(args) => report("devices", crate::devices::run(args)),
    }
}

/// Exit status of a subcommand that returns `anyhow::Result`: the error chain goes to stderr.
fn report(name: &str, r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aubier {name}: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// Rust ignores SIGPIPE, so printing into a closed pipe (`aubier inspect FILE | head -1`) would
/// panic; one-shot commands take the default action instead and end quietly, as Unix tools do.
/// `serve` keeps it ignored: a client that vanishes must not kill the server.
fn restore_default_sigpipe() {
    // SAFETY: called once at start-up, before any thread is spawned; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
