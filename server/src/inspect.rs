//! `aubier inspect FILE [--json] [--tensor NAME --dequant OUT]`: what a GGUF file holds and
//! whether this engine can run it.
//!
//! Steps: open and validate the file (`aubier_runtime::gguf`); summarise the metadata (arrays as
//! element type + length, long strings cut in text mode); total the tensor bytes per ggml type,
//! per layer (`blk.N.*`) and per routed expert (each `*_exps` tensor divided by its `ne[2]`); bind
//! the model (`aubier_runtime::model::read_config` + `weight_refs`) and report the config or the
//! refusal. `--dequant` writes one tensor, every row through
//! `aubier_runtime::gguf::quant::dequantize_row`, as little-endian f32 in row-major order (ne[0]
//! fastest).
//!
//! Exit status: 0 when the file is valid GGUF (even if the model binding is refused: that is
//! part of the report), 1 when the file is refused or `--dequant` fails.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use aubier_compiler::config::Mistral4Config;
use aubier_runtime::gguf::quant::dequantize_row;
use aubier_runtime::gguf::{GgufFile, MetaValue, TensorInfo};
use aubier_runtime::model::{read_config, weight_refs};
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

/// Arguments of `aubier inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// GGUF file to inspect.
    pub file: PathBuf,
    /// Print a machine-readable JSON report instead of text.
    #[arg(long)]
    pub json: bool,
    /// Tensor to dequantize (with --dequant).
    #[arg(long, requires = "dequant")]
    pub tensor: Option<String>,
    /// Write --tensor dequantized to this file: little-endian f32, row-major (ne[0] fastest).
    #[arg(long, requires = "tensor")]
    pub dequant: Option<PathBuf>,
}

/// Bytes and counts of the tensors of one ggml type.
#[derive(Serialize, Debug, Default)]
pub struct TypeTotals {
    /// Tensors of this type.
    pub tensors: usize,
    /// Elements over those tensors.
    pub elements: u64,
    /// Data bytes over those tensors.
    pub bytes: u64,
}

/// The report `inspect` prints (the `--json` schema).
#[derive(Serialize, Debug)]
pub struct Report {
    /// The path given.
    pub file: String,
    /// File size in bytes.
    pub file_bytes: usize,
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Data alignment in bytes.
    pub alignment: usize,
    /// `general.architecture`, if present.
    pub arch: Option<String>,
    /// Key/value pairs in file order.
    pub metadata: Vec<MetaEntry>,
    /// Number of tensors.
    pub tensor_count: usize,
    /// Total tensor data in bytes.
    pub tensor_bytes: u64,
    /// Totals per ggml type name.
    pub bytes_per_type: BTreeMap<String, TypeTotals>,
    /// Data bytes of the tensors of each layer `blk.N.*`, index N (empty without layers); an N
    /// not below the file's tensor count names no layer and counts in `bytes_outside_layers`.
    pub bytes_per_layer: Vec<u64>,
    /// Data bytes outside the layers (embeddings, output norm, output).
    pub bytes_outside_layers: u64,
    /// Bytes of one routed expert in each layer: Σ over `blk.N.*_exps` of n_bytes / ne[2].
    pub bytes_per_expert: Vec<u64>,
    /// Validation: `gguf` is always "ok" here (a refused file prints the error instead);
    /// `model` is "ok" or the binding error.
    pub validation: Validation,
    /// The bound config, when the model binding succeeded.
    pub config: Option<Mistral4Config>,
}

/// One key/value pair of the report.
#[derive(Serialize, Debug)]
pub struct MetaEntry {
    /// The key.
    pub key: String,
    /// The GGUF value type (`"u32"`, `"string"`, `"array"`, ...).
    #[serde(rename = "type")]
    pub value_type: &'static str,
    /// The value; an array as `{"array": element type, "len": n}`.
    pub value: Value,
}

/// Validation results.
#[derive(Serialize, Debug)]
pub struct Validation {
    /// "ok" (the GGUF reader accepted the file).
    pub gguf: String,
    /// "ok", or why `aubier_runtime::model` refused the file.
    pub model: String,
    /// "ok", "none" (no `tokenizer.ggml.*` keys: `run --prompt-ids` only), or why the keys make
    /// no tokenizer (`run` and `serve` refuse such a file).
    pub tokenizer: String,
}

/// Runs `aubier inspect`; prints the report (or the refusal) and returns the exit status.
pub fn run(args: InspectArgs) -> ExitCode {
    match inspect(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", crate::error_text::error_text(&e));
            ExitCode::FAILURE
        }
    }
}

fn inspect(args: &InspectArgs) -> anyhow::Result<()> {
    let file = match GgufFile::open(&args.file) {
        Ok(f) => f,
        Err(e) => {
            if args.json {
                let out = json!({
                    "file": args.file.display().to_string(),
                    "validation": { "gguf": e.to_string() },
                });
                outln!("{}", serde_json::to_string_pretty(&out)?);
            }
            bail!("{}: invalid GGUF: {e}", args.file.display());
        }
    };
    // The tensor is found and written before the report is printed, so that an unknown name or
    // a failed write is the only thing said (the whole report had come first).
    let dequantized = match (&args.tensor, &args.dequant) {
        (Some(name), Some(out)) => {
            let t = file
                .tensor(name)
                .with_context(|| format!("no tensor {name:?} in {}", args.file.display()))?;
            write_dequant(&file, t, out)
                .with_context(|| format!("dequantizing {name:?} to {}", out.display()))?;
            Some((name, t, out))
        }
        _ => None,
    };
    let report = build_report(&args.file, &file);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report)?;
    }
    if let (Some((name, t, out)), false) = (dequantized, args.json) {
        outln!(
            "wrote {name} ({} f32 values, ne {:?}) to {}",
            t.n_elements(),
            t.ne,
            out.display()
        );
    }
    Ok(())
}

/// The report for a validated file.
pub fn build_report(path: &Path, file: &GgufFile) -> Report {
    let mut bytes_per_type: BTreeMap<String, TypeTotals> = BTreeMap::new();
    let mut bytes_per_layer: Vec<u64> = Vec::new();
    let mut bytes_per_expert: Vec<u64> = Vec::new();
    let mut outside = 0u64;
    // A layer list 0..=N needs at least N + 1 tensors, so an index past the tensor count names
    // no layer of this file (a hostile `blk.99999999999.*` would otherwise size the per-layer
    // table at that many entries); such a tensor counts outside the layers.
    let n_tensors = file.tensors().len();
    for t in file.tensors() {
        let n_bytes = t.n_bytes as u64;
        let e = bytes_per_type
            .entry(t.ggml_type.name().to_owned())
            .or_default();
        e.tensors += 1;
        e.elements += t.n_elements() as u64;
        e.bytes += n_bytes;
        match layer_of(t).filter(|&l| l < n_tensors) {
            Some(l) => {
                if bytes_per_layer.len() <= l {
                    bytes_per_layer.resize(l + 1, 0);
                    bytes_per_expert.resize(l + 1, 0);
                }
                bytes_per_layer[l] += n_bytes;
                if let Some(&n_expert) = t.ne.get(2).filter(|_| is_expert_tensor(t)) {
                    bytes_per_expert[l] += n_bytes / n_expert as u64;
                }
            }
            None => outside += n_bytes,
        }
    }
    let (config, model) = match read_config(file).and_then(|cfg| {
        weight_refs(file, &cfg)?;
        Ok(cfg)
    }) {
        Ok(cfg) => (Some(cfg), "ok".to_owned()),
        Err(e) => (None, e.to_string()),
    };
    Report {
        file: path.display().to_string(),
        file_bytes: file.bytes().len(),
        version: file.version(),
        alignment: file.alignment(),
        arch: file
            .get("general.architecture")
            .and_then(MetaValue::as_str)
            .map(str::to_owned),
        metadata: file
            .metadata()
            .iter()
            .map(|(k, v)| MetaEntry {
                key: k.clone(),
                value_type: v.type_name(),
                value: summarise(v),
            })
            .collect(),
        tensor_count: file.tensors().len(),
        tensor_bytes: file.tensors().iter().map(|t| t.n_bytes as u64).sum(),
        bytes_per_type,
        bytes_per_layer,
        bytes_outside_layers: outside,
        bytes_per_expert,
        validation: Validation {
            gguf: "ok".to_owned(),
            model,
            tokenizer: match crate::run::file_tokenizer(file) {
                Ok(Some(_)) => "ok".to_owned(),
                Ok(None) => "none".to_owned(),
                Err(e) => e.to_string(),
            },
        },
        config,
    }
}

/// N of a `blk.N.*` tensor.
fn layer_of(t: &TensorInfo) -> Option<usize> {
    t.name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// A routed-expert tensor: `blk.N.ffn_{gate_up,gate,up,down}_exps.*`, ne {.., .., n_expert}.
fn is_expert_tensor(t: &TensorInfo) -> bool {
    t.ne.len() == 3 && t.name.contains("_exps.")
}

/// A JSON view of a value: scalars as themselves, arrays as their element type and length.
fn summarise(v: &MetaValue) -> Value {
    match v {
        MetaValue::U8(x) => json!(x),
        MetaValue::I8(x) => json!(x),
        MetaValue::U16(x) => json!(x),
        MetaValue::I16(x) => json!(x),
        MetaValue::U32(x) => json!(x),
        MetaValue::I32(x) => json!(x),
        MetaValue::U64(x) => json!(x),
        MetaValue::I64(x) => json!(x),
        MetaValue::F32(x) => json!(x),
        MetaValue::F64(x) => json!(x),
        MetaValue::Bool(x) => json!(x),
        MetaValue::String(s) => json!(s),
        MetaValue::Array(a) => json!({ "array": a.elem_type_name(), "len": a.len() }),
    }
}

fn print_text(r: &Report) -> anyhow::Result<()> {
    outln!("file: {} ({} bytes)", r.file, r.file_bytes);
    outln!(
        "GGUF v{}, alignment {}, {} key/values, {} tensors ({} bytes of data)",
        r.version,
        r.alignment,
        r.metadata.len(),
        r.tensor_count,
        r.tensor_bytes
    );
    outln!("arch: {}", r.arch.as_deref().unwrap_or("(none)"));
    outln!("metadata:");
    for MetaEntry { key, value, .. } in &r.metadata {
        let text = match value {
            Value::String(s) if s.chars().count() > 80 => {
                let cut: String = s.chars().take(77).collect();
                format!("{cut:?}... ({} chars)", s.chars().count())
            }
            Value::Object(o) => format!(
                "[{}; {}]",
                o.get("array").and_then(Value::as_str).unwrap_or("?"),
                o.get("len").map(Value::to_string).unwrap_or_default()
            ),
            other => other.to_string(),
        };
        outln!("  {key} = {text}");
    }
    if !r.bytes_per_type.is_empty() {
        outln!("bytes per ggml type:");
        for (ty, t) in &r.bytes_per_type {
            outln!(
                "  {ty:<8} {:>4} tensors {:>12} elements {:>12} bytes",
                t.tensors,
                t.elements,
                t.bytes
            );
        }
    }
    if !r.bytes_per_layer.is_empty() {
        outln!("bytes per layer (one routed expert):");
        for (l, (b, e)) in r
            .bytes_per_layer
            .iter()
            .zip(&r.bytes_per_expert)
            .enumerate()
        {
            outln!("  blk.{l:<3} {b:>12} ({e})");
        }
        outln!("  outside  {:>12}", r.bytes_outside_layers);
    }
    if let Some(c) = &r.config {
        outln!(
            "config: n_layer {} n_embd {} n_vocab {} n_head {} q_lora {} kv_lora {} \
             qk_nope {} qk_rope {} v_head {} experts {} (top-{}, {} shared, ff {}) {:?}",
            c.n_layer,
            c.n_embd,
            c.n_vocab,
            c.n_head,
            c.q_lora_rank,
            c.kv_lora_rank,
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.v_head_dim,
            c.n_expert,
            c.n_expert_used,
            c.n_expert_shared,
            c.n_ff_exp,
            c.expert_layout
        );
    }
    outln!(
        "validation: gguf {}; model {}; tokenizer {}",
        r.validation.gguf,
        r.validation.model,
        r.validation.tokenizer
    );
    Ok(())
}

/// Writes every row of `t` dequantized, little-endian f32, rows in order (ne[0] fastest).
fn write_dequant(file: &GgufFile, t: &TensorInfo, out: &Path) -> anyhow::Result<()> {
    let data = file.tensor_data(t);
    let row_len = t.row_len();
    let row_bytes = t.row_bytes();
    if row_bytes == 0 || data.len() != row_bytes * t.n_rows() {
        bail!("tensor {:?} has no whole rows of data", t.name);
    }
    let mut row = vec![0f32; row_len];
    let mut w = BufWriter::new(
        std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?,
    );
    let mut bytes = Vec::with_capacity(row_len * 4);
    for (r, src) in data.chunks_exact(row_bytes).enumerate() {
        dequantize_row(t.ggml_type, src, &mut row).with_context(|| format!("row {r}"))?;
        bytes.clear();
        bytes.extend(row.iter().flat_map(|x| x.to_le_bytes()));
        w.write_all(&bytes)?;
    }
    w.flush()?;
    Ok(())
}
