//! `aubier run` end to end: the built binary on the bundled model, checked against the external
//! transformers reference on gguf-py-dequantized weights (tests/data/models/README.md).

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture_json(name: &str) -> serde_json::Value {
    let p = root().join("tests/data/models").join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("json")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    let list = match v {
        serde_json::Value::String(s) => serde_json::from_str(s).expect("id list"),
        other => other.clone(),
    };
    list.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn logits_out_writes_every_prompt_row_and_max_tokens_zero_runs_the_prompt_only() {
    let prompt = ids(&fixture_json("prompt-shared.json")["ids"]);
    let prompt = &prompt[..24];
    let out = std::env::temp_dir().join(format!("aubier-run-logits-{}.f32", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["run", "--model"])
        .arg(root().join("models/ms4-tiny256-q2k.gguf"))
        .args([
            "--prompt-ids",
            &csv(prompt),
            "--max-tokens",
            "0",
            "--json",
            "--logits-out",
        ])
        .arg(&out)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(ids(&v["prompt_ids"]), prompt);
    assert_eq!(v["generated_ids"].as_array().map(Vec::len), Some(0));
    assert!(v["prefill_tok_s"].as_f64().is_some() && v["decode_tok_s"].as_f64().is_some());

    let bytes = std::fs::read(&out).expect("logits file");
    let _ = std::fs::remove_file(&out);
    let ours: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let n_vocab = 8192;
    assert_eq!(
        ours.len(),
        prompt.len() * n_vocab,
        "[n_prompt × n_vocab] f32"
    );
    let reference_bytes = std::fs::read(
        root().join("tests/data/models/ms4-tiny256-q2k.transformers-dequant.logits.f32"),
    )
    .expect("reference");
    let reference: Vec<f32> = reference_bytes[..ours.len() * 4]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let max = ours
        .iter()
        .zip(&reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max <= 1e-4, "max abs diff {max}");
}

#[test]
fn greedy_json_matches_the_reference_chain_and_bad_input_is_an_error() {
    let r = fixture_json("ms4-tiny256-q2k.transformers-dequant.greedy.json");
    let prefix = ids(&r["prefix_ids"]);
    let expected = ids(&r["generated_ids"]);
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["run", "--model"])
        .arg(root().join("models/ms4-tiny256-q2k.gguf"))
        .args(["--prompt-ids", &csv(&prefix), "--ignore-eos", "--json"])
        .args(["--max-tokens", &expected.len().to_string()])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(ids(&v["generated_ids"]), expected);
    assert!(v["text"].is_string());

    let bad = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["run", "--model"])
        .arg(root().join("models/ms4-tiny256-q2k.gguf"))
        .args(["--prompt-ids", "1,999999"])
        .output()
        .expect("runs");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("999999"), "error names the bad id: {err}");
}

#[test]
fn a_directory_as_the_model_is_named_once() {
    let dir = std::env::temp_dir().join(format!("aubier-dir-{}.gguf", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["run", "--prompt-ids", "1", "--model"])
        .arg(&dir)
        .output()
        .expect("runs");
    let _ = std::fs::remove_dir(&dir);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("directory").count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
