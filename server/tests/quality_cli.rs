//! `aubier quality` end to end on the bundled model, with answers known in advance:
//! - A = B: every paired difference is exactly 0, so the interval is [0, 0] → EQUIVALENT;
//! - a text sampled from the model under A, scored against B = fewer routed experts: the expected
//!   difference E_A[NLL_B − NLL_A] is KL(A ‖ B) > 0 → WORSE;
//! - a one-letter text (BOS + one token) has one position, too few for an interval → INSUFFICIENT;
//! - the product path (the default backend, `cpu` with `q8x2`) against the oracle on real English
//!   (alice.txt's first 256 tokens) → EQUIVALENT within ±0.01 nats/token, the verdict its default
//!   ships on (ARCHITECTURE.md § numerics policy).

use aubier_tests::{json_ids, models_dir, step_lines};
use std::path::PathBuf;
use std::process::{Command, Output};

fn model() -> String {
    models_dir()
        .join("ms4-tiny256-q2k.gguf")
        .display()
        .to_string()
}

fn alice() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/data/alice.txt").to_owned()
}

fn aubier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(args)
        .output()
        .expect("runs")
}

fn quality_json(args: &[&str]) -> serde_json::Value {
    let m = model();
    let mut all = vec!["quality", "--model", &m, "--json"];
    all.extend_from_slice(args);
    let o = aubier(&all);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

/// `quality` of configurations `a` and `b` (their flags) on alice.txt's first 256 tokens, with
/// the further arguments `more`.
fn quality_on_alice(a: &str, b: &str, more: &[&str]) -> serde_json::Value {
    let text = alice();
    let mut args = vec!["--text", &text, "--max-tokens", "256", "--a", a, "--b", b];
    args.extend_from_slice(more);
    quality_json(&args)
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("aubier-quality-{}-{name}", std::process::id()))
}

#[test]
fn identical_configurations_are_equivalent_with_zero_difference() {
    let v = quality_on_alice("", "", &[]);
    assert_eq!(v["verdict"], "EQUIVALENT");
    assert_eq!(v["mean_diff"].as_f64(), Some(0.0));
    assert_eq!(v["ci95"], serde_json::json!([0.0, 0.0]));
    assert_eq!(v["ci_method"], "paired t");
    // The text is cut to --max-tokens.
    assert_eq!(v["tokens"], 256);
    assert_eq!(v["positions"], 255);
    assert!(v["tokens_in_input"].as_u64().unwrap() > 256);
    let nll = v["a"]["mean_nll"].as_f64().unwrap();
    assert!(nll > 0.0 && nll.is_finite());
}

#[test]
fn the_default_backend_is_equivalent_to_the_oracle_on_real_text() {
    let v = quality_on_alice("--backend oracle", "", &["--margin", "0.01"]);
    eprintln!(
        "oracle → default backend on alice.txt: mean NLL {} → {}, diff {} {}, {}",
        v["a"]["mean_nll"], v["b"]["mean_nll"], v["mean_diff"], v["ci95"], v["verdict"]
    );
    assert_eq!(v["positions"], 255);
    assert_eq!(v["verdict"], "EQUIVALENT", "{v}");
}

#[test]
fn fewer_experts_on_the_models_own_samples_is_worse() {
    let m = model();
    let o = aubier(&[
        "run",
        "--model",
        &m,
        "--prompt-ids",
        "1",
        "--max-tokens",
        "250",
        "--temperature",
        "1",
        "--seed",
        "11",
        "--ignore-eos",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut ids = json_ids(&v, "prompt_ids");
    ids.extend(json_ids(&v, "generated_ids"));
    assert_eq!(ids.len(), 251);
    let path = tmp("sampled.ids");
    let csv: Vec<String> = ids.iter().map(u32::to_string).collect();
    std::fs::write(&path, csv.join(",")).unwrap();
    let v = quality_json(&[
        "--ids",
        path.to_str().unwrap(),
        "--b",
        "--override-kv mistral4.expert_used_count=int:1",
    ]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(v["verdict"], "WORSE", "{v}");
    assert!(v["ci95"][0].as_f64().unwrap() > 0.0);
    assert!(v["b"]["mean_nll"].as_f64() > v["a"]["mean_nll"].as_f64());
}

#[test]
fn a_one_letter_text_is_insufficient() {
    let path = tmp("tiny.txt");
    std::fs::write(&path, "I").unwrap();
    let v = quality_json(&[
        "--text",
        path.to_str().unwrap(),
        "--b",
        "--override-kv mistral4.expert_used_count=int:2",
    ]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(v["positions"], 1);
    assert_eq!(v["verdict"], "INSUFFICIENT");
    assert!(v["ci95"].is_null());
}

#[test]
fn bad_flags_and_overrides_are_errors() {
    let m = model();
    let a = alice();
    for (b, needle) in [
        ("--bogus", "--b"),
        ("--override-kv mistral4.expert_used_count=int:x", "int:x"),
        (
            "--override-kv general.architecture=int:3",
            "general.architecture",
        ),
        (
            "--override-kv mistral4.expert_used_count=int:99",
            "expert_used_count",
        ),
        (
            "--override-kv mistral4.expert_used_cont=int:2",
            "no such key",
        ),
        (
            "--override-kv tokenizer.ggml.add_bos_token=bool:false",
            "A's",
        ),
    ] {
        let o = aubier(&["quality", "--model", &m, "--text", &a, "--b", b]);
        assert!(!o.status.success(), "{b}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(needle) && !err.contains("panicked"),
            "{b}: {err}"
        );
    }
    // A flag of --a / --b clap refuses is one line, without clap's usage block (which named
    // the library's binary, `aubier-server`).
    let o = aubier(&["quality", "--model", &m, "--text", &a, "--a", "--bogus"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        "aubier quality: --a: unexpected argument '--bogus' found"
    );
    let o = aubier(&["quality", "--model", &m, "--a", ""]);
    assert!(!o.status.success(), "a text is required");
    for (flag, value, needle) in [
        ("--chunk", "0", "--chunk must be at least 1"),
        // One token more than the bundled model's context_length (models/README.md).
        (
            "--max-tokens",
            "4097",
            "exceeds the model's context_length 4096",
        ),
    ] {
        let o = aubier(&["quality", "--model", &m, "--text", &a, flag, value]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(needle) && !err.contains("panicked"),
            "{flag} {value}: {err}"
        );
    }
}

/// An id outside the vocabulary is an error naming its position, wherever it falls (here the
/// first token of the second prefill chunk, whose logits row the first chunk's last position
/// reads), never a panic.
#[test]
fn an_id_outside_the_vocabulary_is_an_error_at_any_chunk() {
    let m = model();
    let ids = tmp("oov-ids.txt");
    std::fs::write(&ids, "1 2 3 999999 5 6").expect("write");
    let path = ids.display().to_string();
    for chunk in ["1", "3", "256"] {
        let o = aubier(&["quality", "--model", &m, "--ids", &path, "--chunk", chunk]);
        assert!(!o.status.success(), "chunk {chunk}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("token 3") && err.contains("999999") && !err.contains("panicked"),
            "chunk {chunk}: {err}"
        );
    }
    std::fs::remove_file(&ids).ok();
}

/// Off a terminal, each configuration's load and its scoring say each step on stderr with its
/// time, the scoring with the tokens it prefilled. Stdout keeps the JSON.
#[test]
fn quality_reports_loading_and_scoring_off_a_terminal() {
    let (m, text) = (model(), alice());
    let o = aubier(&[
        "quality",
        "--model",
        &m,
        "--json",
        "--text",
        &text,
        "--max-tokens",
        "64",
        "--a",
        "",
        "--b",
        "",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("stdout is the JSON alone");
    let err = String::from_utf8_lossy(&o.stderr);
    let scoring: Vec<(String, Option<String>)> = step_lines(&err, "scoring")
        .into_iter()
        .map(|s| (s.what, s.amount))
        .collect();
    let one = (
        "teacher-forced prefill".to_string(),
        Some("64 tokens".to_string()),
    );
    assert_eq!(scoring, [one.clone(), one], "{err}");
    let loads = step_lines(&err, &format!("loading {m}"));
    assert!(
        loads
            .iter()
            .filter(|s| s.what == "binding the weights")
            .count()
            == 2,
        "{err}"
    );
}

/// A text of fewer than 2 tokens has no position to score: an error naming the input (it
/// printed a NaN mean NLL and exited 0).
#[test]
fn fewer_than_two_tokens_is_an_error() {
    let dir = std::env::temp_dir().join(format!("aubier-quality-short-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "").expect("write");
    let no_ids = dir.join("ids.txt");
    std::fs::write(&no_ids, "\n").expect("write");
    let alice = alice();
    let model = model();
    for (input, extra, what) in [
        (
            vec!["--text", empty.to_str().unwrap()],
            vec![],
            "has 1 token(s), BOS included: scoring needs at least 2",
        ),
        (
            vec!["--ids", no_ids.to_str().unwrap()],
            vec![],
            "has 0 token(s): scoring needs at least 2",
        ),
        (
            vec!["--text", alice.as_str()],
            vec!["--max-tokens", "1"],
            "--max-tokens 1 leaves 1 token(s)",
        ),
    ] {
        let mut args = vec!["quality", "--model", model.as_str(), "--a", "--backend cpu"];
        args.extend(input.iter().copied());
        args.extend(extra.iter().copied());
        let o = aubier(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(what), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
