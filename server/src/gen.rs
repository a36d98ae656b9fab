//! `aubier gen [--model FILE] [--dump-after STAGE [--format text|dot]] [--disable PASS]…`: compile
//! the model of a GGUF file and print the graph after a named pipeline stage, or, without
//! `--dump-after`, the scheduled `Plan` as JSON (deterministic: the same file gives the same
//! bytes).
//!
//! Steps: open the file (`aubier_runtime::gguf`), bind it (`aubier_runtime::model::read_config`
//! and `weight_refs`), then `aubier_compiler::dump_after` or `aubier_compiler::compile`. The
//! default model is the bundled `models/ms4-tiny256-q2k.gguf` of this workspace. Exit status 0 on
//! success, 1 with the error on stderr otherwise.

use anyhow::Context;
use aubier_compiler::{compile, dump_after, CompileOptions, DumpFormat};
use aubier_runtime::gguf::GgufFile;
use aubier_runtime::model::{read_config, weight_refs};
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The model `gen` compiles when `--model` is not given: `models/ms4-tiny256-q2k.gguf` at the
/// workspace root.
pub fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("models")
        .join("ms4-tiny256-q2k.gguf")
}

/// Arguments of `aubier gen`.
#[derive(Args, Debug)]
pub struct GenArgs {
    /// GGUF model file (default: the workspace's models/ms4-tiny256-q2k.gguf).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Print the graph after this pipeline stage (build, cse, dce) instead of the plan.
    #[arg(long, value_name = "STAGE")]
    pub dump_after: Option<String>,
    /// Format of the --dump-after graph.
    #[arg(long, value_enum, default_value_t = Format::Text, requires = "dump_after")]
    pub format: Format,
    /// Skip this pass (repeatable; `build` cannot be skipped).
    #[arg(long, value_name = "STAGE")]
    pub disable: Vec<String>,
}

/// Graph dump format.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One node per line.
    Text,
    /// Graphviz DOT.
    Dot,
}

/// Runs `aubier gen`, printing to stdout.
pub fn run(args: GenArgs) -> ExitCode {
    match generate(&args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("aubier gen: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What `aubier gen` prints: the graph dump after `--dump-after`, or the plan as pretty JSON.
///
/// Errors: the file cannot be opened or bound (naming the key or tensor), an unknown stage, or a
/// compile error (naming the weight or node).
pub fn generate(args: &GenArgs) -> anyhow::Result<String> {
    let path = args.model.clone().unwrap_or_else(default_model);
    let file = GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let cfg = read_config(&file).with_context(|| format!("binding {}", path.display()))?;
    let weights =
        weight_refs(&file, &cfg).with_context(|| format!("binding {}", path.display()))?;
    let opts = CompileOptions {
        disable: args.disable.clone(),
    };
    match &args.dump_after {
        Some(stage) => {
            let format = match args.format {
                Format::Text => DumpFormat::Text,
                Format::Dot => DumpFormat::Dot,
            };
            Ok(dump_after(&cfg, &weights, &opts, stage, format)?)
        }
        None => {
            let plan = compile(&cfg, &weights, &opts)?;
            let mut json = serde_json::to_string_pretty(&plan)?;
            json.push('\n');
            Ok(json)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dump_after: Option<&str>, format: Format) -> GenArgs {
        GenArgs {
            model: None,
            dump_after: dump_after.map(str::to_string),
            format,
            disable: Vec::new(),
        }
    }

    #[test]
    fn dumps_the_bundled_model_after_each_stage() {
        for stage in aubier_compiler::stage_names() {
            let text = generate(&args(Some(stage), Format::Text)).unwrap();
            assert!(text.contains("= input tokens : i32[T]"), "{stage}");
            assert!(text.contains("output logits = %"), "{stage}");
            assert!(text.contains("output router_ids.2 = %"), "{stage}");
        }
        let dot = generate(&args(Some("dce"), Format::Dot)).unwrap();
        assert!(dot.starts_with("digraph aubier {") && dot.ends_with("}\n"));
    }

    #[test]
    fn plan_of_the_bundled_model_is_deterministic_json() {
        let a = generate(&args(None, Format::Text)).unwrap();
        let b = generate(&args(None, Format::Text)).unwrap();
        assert_eq!(a, b);
        let plan: aubier_compiler::plan::Plan = serde_json::from_str(&a).unwrap();
        assert_eq!(plan.config.n_layer, 3);
        assert_eq!(plan.outputs.last().map(|(n, _)| n.as_str()), Some("logits"));
    }

    #[test]
    fn errors_name_the_stage_or_file() {
        let e = generate(&args(Some("fuse_all"), Format::Text)).unwrap_err();
        assert!(format!("{e:#}").contains("fuse_all"));
        let mut missing = args(None, Format::Text);
        missing.model = Some(PathBuf::from("/nonexistent/model.gguf"));
        let e = generate(&missing).unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent/model.gguf"));
    }
}
