//! `aubier inspect` end to end, on the built binary: every fixture in text and `--json` form, the
//! `--dequant` output of an F32 tensor against the file bytes and of `q.Q2_K` against gguf-py's
//! `ref.Q2_K` in quant_vectors.gguf, and refusals (a truncated file, an unknown tensor).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use aubier_runtime::gguf::GgufFile;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture(rel: &str) -> PathBuf {
    repo().join("tests/data").join(rel)
}

fn bundled_q2k() -> PathBuf {
    repo().join("models/ms4-tiny256-q2k.gguf")
}

fn aubier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(args)
        .output()
        .expect("run aubier")
}

fn inspect_json(path: &Path) -> Value {
    let out = aubier(&["inspect", path.to_str().expect("utf-8 path"), "--json"]);
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

/// `aubier inspect PATH [--json] --tensor TENSOR --dequant OUT`.
fn dequant(path: &Path, tensor: &str, out: &Path, json: bool) -> Output {
    let mut args = vec!["inspect", path.to_str().expect("utf-8")];
    if json {
        args.push("--json");
    }
    args.extend([
        "--tensor",
        tensor,
        "--dequant",
        out.to_str().expect("utf-8"),
    ]);
    aubier(&args)
}

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// One fixture and what its report must say (numbers from the fixture READMEs; per-type tensor
/// counts also from gguf-py `GGUFReader`).
struct Case {
    path: PathBuf,
    bytes: u64,
    tensors: u64,
    binds: bool,
    types: Vec<(&'static str, u64)>,
    /// Bytes of one routed expert per layer, from the README shapes and ggml block sizes.
    expert: Option<u64>,
}

fn case(
    path: PathBuf,
    bytes: u64,
    tensors: u64,
    binds: bool,
    types: Vec<(&'static str, u64)>,
    expert: Option<u64>,
) -> Case {
    Case {
        path,
        bytes,
        tensors,
        binds,
        types,
        expert,
    }
}

#[test]
fn json_reports_every_fixture() {
    let cases = vec![
        // One expert: gate_up {128, 64} + down {32, 128}, F32: (8192 + 4096) × 4 bytes.
        case(
            fixture("models/ms4-tiny-f32.gguf"),
            12_104_160,
            51,
            true,
            vec![("F32", 51)],
            Some(49_152),
        ),
        case(
            fixture("models/ms4-tiny-f32-split.gguf"),
            12_104_352,
            54,
            true,
            vec![("F32", 54)],
            Some(49_152),
        ),
        // One expert: gate_up {256, 512} Q2_K (84 bytes per 256) + down {256, 256} Q3_K (110).
        case(
            bundled_q2k(),
            6_634_848,
            51,
            true,
            vec![
                ("F32", 16),
                ("Q2_K", 16),
                ("Q3_K", 6),
                ("Q4_0", 12),
                ("Q6_K", 1),
            ],
            Some(512 * 84 + 256 * 110),
        ),
        // One expert: gate_up and down IQ2_XXS (66 bytes per 256).
        case(
            fixture("models/ms4-tiny256-iq2xxs.gguf"),
            5_299_968,
            51,
            true,
            vec![
                ("F32", 16),
                ("IQ2_XXS", 21),
                ("IQ4_NL", 12),
                ("Q2_K", 1),
                ("Q5_K", 1),
            ],
            Some((512 + 256) * 66),
        ),
        case(
            fixture("quants/quant_vectors.gguf"),
            627_200,
            52,
            false,
            vec![("F32", 27), ("Q2_K", 1), ("IQ2_XXS", 1)],
            None,
        ),
        case(
            fixture("tokenizer/tekken-v15-vocab.gguf"),
            7_873_416,
            0,
            false,
            vec![],
            None,
        ),
    ];
    for Case {
        path,
        bytes,
        tensors,
        binds,
        types,
        expert,
    } in cases
    {
        let r = inspect_json(&path);
        let name = path.display().to_string();
        assert_eq!(r["file_bytes"], bytes, "{name}");
        assert_eq!(r["tensor_count"], tensors, "{name}");
        assert_eq!(r["validation"]["gguf"], "ok", "{name}");
        assert_eq!(
            r["validation"]["model"] == "ok",
            binds,
            "{name}: {}",
            r["validation"]
        );
        assert_eq!(r["config"].is_object(), binds, "{name}");
        for (ty, n) in types {
            assert_eq!(r["bytes_per_type"][ty]["tensors"], n, "{name} {ty}");
        }
        let per_type: u64 = r["bytes_per_type"]
            .as_object()
            .expect("object")
            .values()
            .map(|t| t["bytes"].as_u64().expect("bytes"))
            .sum();
        assert_eq!(r["tensor_bytes"].as_u64(), Some(per_type), "{name}");
        if let Some(expert) = expert {
            assert_eq!(r["arch"], "mistral4", "{name}");
            let layers = r["bytes_per_layer"].as_array().expect("layers");
            assert_eq!(layers.len(), 3, "{name}");
            let in_layers: u64 = layers.iter().map(|b| b.as_u64().expect("u64")).sum();
            assert_eq!(
                in_layers + r["bytes_outside_layers"].as_u64().expect("u64"),
                per_type,
                "{name}"
            );
            for e in r["bytes_per_expert"].as_array().expect("experts") {
                assert_eq!(e.as_u64(), Some(expert), "{name}");
            }
        }
    }
}

#[test]
fn tekken_metadata_summarises_the_vocab() {
    let r = inspect_json(&fixture("tokenizer/tekken-v15-vocab.gguf"));
    let meta = r["metadata"].as_array().expect("metadata");
    assert_eq!(meta.len(), 47);
    let tokens = meta
        .iter()
        .find(|m| m["key"] == "tokenizer.ggml.tokens")
        .expect("tokens");
    assert_eq!(tokens["type"], "array");
    assert_eq!(tokens["value"]["array"], "string");
    assert_eq!(tokens["value"]["len"], 131_072);
}

#[test]
fn text_report_states_validation() {
    let out = aubier(&["inspect", bundled_q2k().to_str().expect("utf-8")]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("arch: mistral4"), "{text}");
    assert!(text.contains("validation: gguf ok; model ok"), "{text}");
    assert!(text.contains("Q2_K"), "{text}");
}

#[test]
fn quant_vectors_report_says_why_it_does_not_bind() {
    let r = inspect_json(&fixture("quants/quant_vectors.gguf"));
    let why = r["validation"]["model"].as_str().expect("string");
    assert!(why.contains("quant_vectors"), "{why}");
}

#[test]
fn dequant_of_f32_tensor_equals_the_file_bytes() {
    let path = fixture("models/ms4-tiny-f32.gguf");
    let out = tmp("inspect_blk1_attn_q_b.f32");
    let status = dequant(&path, "blk.1.attn_q_b.weight", &out, false);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let file = GgufFile::open(&path).expect("fixture");
    let t = file.tensor("blk.1.attn_q_b.weight").expect("tensor");
    let written = std::fs::read(&out).expect("output");
    assert_eq!(written.len(), 64 * 256 * 4);
    assert!(
        written == file.tensor_data(t),
        "F32 dequant differs from the file bytes"
    );
}

#[test]
fn dequant_of_q2_k_equals_gguf_py_reference() {
    let path = fixture("quants/quant_vectors.gguf");
    let out = tmp("inspect_q_Q2_K.f32");
    let status = dequant(&path, "q.Q2_K", &out, true);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let file = GgufFile::open(&path).expect("fixture");
    let reference = file.tensor_data(file.tensor("ref.Q2_K").expect("ref.Q2_K"));
    let written = std::fs::read(&out).expect("output");
    assert_eq!(written.len(), 1024 * 8 * 4);
    // README: gguf-py's dequantize and ggml's to_float agree bit for bit on this file.
    assert!(written == reference, "Q2_K dequant differs from ref.Q2_K");
}

/// An unknown tensor is the only thing said, in text and JSON: the whole report had been
/// printed before the error, and nothing is written.
#[test]
fn unknown_tensor_fails() {
    let never = tmp("never.f32");
    for json in [false, true] {
        let out = dequant(&bundled_q2k(), "no.such.tensor", &never, json);
        assert_eq!(out.status.code(), Some(1), "json {json}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "json {json}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("no tensor \"no.such.tensor\""), "{err}");
        assert!(!never.exists());
    }
}

#[test]
fn truncated_file_is_refused_with_its_reason() {
    let bytes = std::fs::read(fixture("quants/quant_vectors.gguf")).expect("fixture");
    let cut = tmp("quant_vectors_truncated.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).expect("write");
    for json in [false, true] {
        let mut args = vec!["inspect", cut.to_str().expect("utf-8")];
        if json {
            args.push("--json");
        }
        let out = aubier(&args);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        // The last tensor (ref.NVFP4) no longer fits.
        assert!(err.contains("ref.NVFP4"), "{err}");
    }
}

/// The bundled model with `key` set to `value` (every other key/value and tensor as it is),
/// written to a temporary file named after `tag`.
fn bundled_with(tag: &str, key: &str, value: aubier_runtime::gguf::MetaValue) -> PathBuf {
    use aubier_runtime::gguf::write::{tensor_specs, GgufWriter};
    let file = GgufFile::open(bundled_q2k()).expect("bundled model");
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        w.kv(k, if k == key { &value } else { v });
    }
    w.tensors = tensor_specs(&file);
    let path = std::env::temp_dir().join(format!("aubier-{tag}-{}.gguf", std::process::id()));
    std::fs::write(&path, w.finish()).expect("write");
    path
}

#[test]
fn a_layer_index_past_the_tensor_count_does_not_size_the_layer_table() {
    use aubier_runtime::gguf::write::GgufWriter;
    // blk.N for a huge N: the per-layer table was resized to N + 1 entries (800 GB: the
    // allocation aborted the process; a smaller N printed N lines for minutes).
    let mut w = GgufWriter::new();
    w.kv(
        "general.architecture",
        &aubier_runtime::gguf::MetaValue::String("mistral4".into()),
    )
    .tensor("blk.99999999999.attn_norm.weight", &[8], 0, &[0u8; 32])
    .tensor("blk.0.attn_norm.weight", &[8], 0, &[0u8; 32]);
    let path = std::env::temp_dir().join(format!("aubier-blk-huge-{}.gguf", std::process::id()));
    std::fs::write(&path, w.finish()).expect("write");
    let r = inspect_json(&path);
    let text = aubier(&["inspect", path.to_str().expect("utf-8")]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(r["bytes_per_layer"], serde_json::json!([32]), "{r}");
    assert_eq!(r["bytes_outside_layers"], 32, "{r}");
    assert!(text.status.success());
    assert!(text.stdout.len() < 100_000, "{} bytes", text.stdout.len());
}

#[test]
fn a_tokenizer_the_runtime_refuses_is_named_in_the_validation() {
    let path = bundled_with(
        "bad-bos",
        "tokenizer.ggml.bos_token_id",
        aubier_runtime::gguf::MetaValue::U32(8192),
    );
    let r = inspect_json(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(r["validation"]["model"], "ok");
    let why = r["validation"]["tokenizer"].as_str().expect("string");
    assert!(
        why.contains("tokenizer.ggml.bos_token_id = 8192 is outside the vocabulary"),
        "{why}"
    );
    assert_eq!(
        inspect_json(&bundled_q2k())["validation"]["tokenizer"],
        "ok"
    );
    // A file without tokenizer.ggml.* keys has none (run takes --prompt-ids only).
    let path = bundled_with(
        "no-tokenizer",
        "general.name",
        aubier_runtime::gguf::MetaValue::String("x".into()),
    );
    let file = GgufFile::open(&path).expect("written");
    let mut w = aubier_runtime::gguf::write::GgufWriter::new();
    for (k, v) in file.metadata() {
        if !k.starts_with("tokenizer.") {
            w.kv(k, v);
        }
    }
    w.tensors = aubier_runtime::gguf::write::tensor_specs(&file);
    std::fs::write(&path, w.finish()).expect("write");
    let r = inspect_json(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(r["validation"]["tokenizer"], "none", "{}", r["validation"]);
}
