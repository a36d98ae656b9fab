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
pub enum Command {
    /// Show a GGUF file's metadata, tensor bytes and validation; optionally dequantize a tensor.
    Inspect(crate::inspect::InspectArgs),
    /// Serve the model over OpenAI-compatible HTTP (chat, completions, models, SSE).
    Serve(crate::serve::ServeArgs),
    /// Replay a routing trace through the expert-placement policies; print served fractions.
    Replay(crate::replay::ReplayArgs),
    /// Compile a GGUF model; print the graph after a pipeline stage, or the plan as JSON.
    Gen(crate::gen::GenArgs),
    /// Run one prompt through the model on the CPU oracle (prefill, then decode).
    Run(crate::run::RunArgs),
    /// Record the routing of every token of one generation as a JSONL trace (for `replay`).
    Trace(crate::trace::TraceArgs),
    /// Write a synthetic mistral4 GGUF with the real dimensions and random valid quant blocks.
    Synth(crate::synth::SynthArgs),
    /// Compare two model configurations by teacher-forced NLL on one text (paired t verdict).
    Quality(crate::quality::QualityArgs),
    /// Measure prefill and decode tok/s, time to first token, peak RSS and weight bytes per token.
    Bench(crate::bench::BenchArgs),
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

/// An error and its causes, outermost first, joined by `": "` as anyhow's `{:#}` does, except
/// that a cause whose text the message so far already contains is left out: many of the
/// runtime's errors print their source in their own message (`expert store: {0}`) and also
/// return it as `source()`, which `{:#}` then printed a second (or third) time.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
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

#[cfg(test)]
mod tests {
    use super::error_text;

    #[derive(Debug, thiserror::Error)]
    #[error("inner detail")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Outer(#[source] Inner);

    #[test]
    fn causes_already_in_the_message_are_printed_once() {
        let e = anyhow::Error::new(Outer(Inner)).context("loading");
        assert_eq!(
            format!("{e:#}"),
            "loading: outer: inner detail: inner detail"
        );
        assert_eq!(error_text(&e), "loading: outer: inner detail");
        let plain = anyhow::anyhow!("alone").context("step");
        assert_eq!(error_text(&plain), "step: alone");
    }
}
