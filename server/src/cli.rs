//! Command-line front end: one `clap` subcommand per job.

use crate::error_text::error_text;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
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
    let cli = parse(std::env::args_os().collect());
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

/// The command line, as `clap`'s `Cli::parse` with two differences: a value that starts with `-`
/// and reads as a number (`--temperature -1`) is the option's value, checked by the option
/// itself, not an unknown flag `-1`; and an unknown flag that llama.cpp spells for something
/// aubier names otherwise (`-m`, `-p`, `-n`, `--ctx-size`) says the flag to use. Exits as `parse`
/// does on an error (status 2), or on `--help` / `--version` (status 0).
fn parse(argv: Vec<std::ffi::OsString>) -> Cli {
    let mut cmd = Cli::command().mut_subcommands(|sub| {
        sub.mut_args(|a| {
            if a.get_action().takes_values() {
                a.allow_negative_numbers(true)
            } else {
                a
            }
        })
    });
    let parsed = cmd
        .try_get_matches_from_mut(&argv)
        .and_then(|m| Cli::from_arg_matches(&m));
    match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let mut e = e.format(&mut cmd);
            if e.kind() == ErrorKind::UnknownArgument {
                let invalid = match e.get(ContextKind::InvalidArg) {
                    Some(ContextValue::String(s)) => s.clone(),
                    _ => String::new(),
                };
                if let Some(tip) = llama_cpp_tip(&cmd, &argv, &invalid) {
                    // clap's own guess by spelling (`--n-predict` → `--n-res`) would mislead.
                    e.remove(ContextKind::SuggestedArg);
                    e.insert(
                        ContextKind::Suggested,
                        ContextValue::StyledStrs(vec![tip.into()]),
                    );
                }
            }
            e.exit()
        }
    }
}

/// llama.cpp's spelling of an option, the subcommands where it means what an aubier option
/// does (llama-cli / llama-server flags for `run`, `trace` and `serve`; llama-bench's for
/// `bench`), and aubier's name for it.
const LLAMA_CPP_FLAGS: &[(&str, &[&str], &str)] = &[
    (
        "-m",
        &["run", "trace", "serve", "bench", "quality", "gen"],
        "--model",
    ),
    ("-p", &["run", "trace"], "--prompt"),
    ("-n", &["run", "trace"], "--max-tokens"),
    ("--n-predict", &["run", "trace"], "--max-tokens"),
    ("-c", &["run", "serve"], "--kv-max"),
    ("--ctx-size", &["run", "serve"], "--kv-max"),
    ("--temp", &["run"], "--temperature"),
    ("-s", &["run", "synth"], "--seed"),
    ("-b", &["run", "trace", "serve", "bench"], "--ubatch"),
    (
        "--batch-size",
        &["run", "trace", "serve", "bench"],
        "--ubatch",
    ),
    ("-ub", &["run", "trace", "serve", "bench"], "--ubatch"),
    (
        "--ubatch-size",
        &["run", "trace", "serve", "bench"],
        "--ubatch",
    ),
    ("-a", &["serve"], "--model-id"),
    ("--alias", &["serve"], "--model-id"),
    ("-p", &["bench"], "--n-prompt"),
    ("-n", &["bench"], "--n-gen"),
    ("-r", &["bench"], "--reps"),
    ("--repetitions", &["bench"], "--reps"),
    (
        "-ngl",
        &["run", "trace", "serve", "bench", "quality"],
        "--backend",
    ),
    (
        "--n-gpu-layers",
        &["run", "trace", "serve", "bench", "quality"],
        "--backend",
    ),
    (
        "--gpu-layers",
        &["run", "trace", "serve", "bench", "quality"],
        "--backend",
    ),
];

/// The tip for the argument of `argv` that clap refused as `invalid` (`-n` for `-ngl`, read as
/// the short flags `-n -g -l`) when llama.cpp users type it and aubier spells it otherwise, and
/// the subcommand has the option it maps to.
fn llama_cpp_tip(
    cmd: &clap::Command,
    argv: &[std::ffi::OsString],
    invalid: &str,
) -> Option<String> {
    let invalid = invalid.split_once('=').map_or(invalid, |(f, _)| f);
    let mut args = argv.iter().skip(1).filter_map(|a| a.to_str());
    let name = args.next()?;
    let sub = cmd.find_subcommand(name)?;
    for arg in args {
        if arg == "--" {
            break;
        }
        let flag = arg.split_once('=').map_or(arg, |(f, _)| f);
        let short_cluster = invalid.len() == 2 && !invalid.starts_with("--");
        if invalid.is_empty() || !(flag == invalid || short_cluster && flag.starts_with(invalid)) {
            continue;
        }
        let Some(&(_, _, ours)) = LLAMA_CPP_FLAGS
            .iter()
            .find(|(theirs, subs, _)| *theirs == flag && subs.contains(&name))
        else {
            continue;
        };
        let long = ours.trim_start_matches("--");
        if !sub.get_arguments().any(|a| a.get_long() == Some(long)) {
            continue;
        }
        return Some(if ours == "--backend" {
            format!(
                "aubier has no `{flag}`: every layer runs on the backend `--backend` names \
                 (`--backend vulkan` for the GPU; `aubier devices` lists them)"
            )
        } else {
            format!("llama.cpp's `{flag}` is `{ours}` in `aubier {name}`")
        });
    }
    None
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
