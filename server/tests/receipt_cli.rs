//! `--receipt FILE` of `aubier bench`, `replay` and `quality` end to end: each command run on the
//! bundled model or a small synthetic trace writes a receipt whose fields parse and agree with
//! what the test reads on its own (the command's stdout, `/proc/cpuinfo`, `git rev-parse HEAD`,
//! the clock around the run, the peer file it was given); bad `--receipt` / `--peer` inputs fail
//! with a message naming the file, before anything is measured.

use aubier_tests::models_dir;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn aubier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(args)
        .output()
        .expect("run aubier")
}

fn ok_stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).expect("UTF-8 stdout")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("the receipt was written");
    serde_json::from_str(&text).expect("the receipt is JSON")
}

fn model() -> String {
    models_dir()
        .join("ms4-tiny256-q2k.gguf")
        .display()
        .to_string()
}

/// The UTC time now, to the second, as receipts write it (`YYYY-MM-DDTHH:MM:SSZ` sorts as text).
fn utc_now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The `model name` of the first processor of `/proc/cpuinfo`, read here on its own.
fn cpuinfo_model_name() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_owned())
}

/// The fields every receipt takes from the process, checked against what this test sees; `kind`
/// and `words` (which must appear in the command line) as given; the run ended between
/// `before` and `after`.
fn check_common(r: &Value, kind: &str, words: &[&str], before: &str, after: &str) {
    assert_eq!(r["schema"], "aubier-receipt/1");
    assert_eq!(r["kind"], kind);
    let date = r["date"].as_str().expect("a date");
    chrono::NaiveDateTime::parse_from_str(date, "%Y-%m-%dT%H:%M:%SZ").expect("date format");
    assert!(
        before <= date && date <= after,
        "{before} ≤ {date} ≤ {after}"
    );
    let command = r["command"].as_str().expect("a command");
    assert!(command.starts_with(&format!("aubier {kind} ")), "{command}");
    for w in words {
        assert!(command.contains(w), "{command} lacks {w}");
    }
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match head {
        Some(h) => assert_eq!(r["commit"], h.as_str()),
        None => assert!(r["commit"].is_null(), "{}", r["commit"]),
    }
    let host = &r["host"];
    assert_eq!(
        host["model_name"].as_str().map(str::to_owned),
        cpuinfo_model_name()
    );
    let cpus = std::thread::available_parallelism().map(|n| n.get()).ok();
    assert_eq!(host["cpus"].as_u64().map(|n| n as usize), cpus);
    let isa = host["isa"].as_str().expect("an ISA tier");
    assert!(
        ["amx", "avx512-vnni", "avx2", "scalar"].contains(&isa),
        "{isa}"
    );
    assert!(host["flags"].is_array());
    assert!(r["source"].is_null());
}

#[test]
fn bench_receipt_holds_the_json_report_and_the_peer() {
    let dir = tempfile::tempdir().expect("scratch dir");
    let (receipt, peer) = (dir.path().join("bench.json"), dir.path().join("peer.json"));
    let peer_value = serde_json::json!({
        "engine": "llama.cpp (llama-cpp-python 0.3.36)",
        "n_prompt": 24,
        "n_gen": 4,
        "prefill_tok_s": {"median": 100.5, "min": 90.0, "max": 101.0},
        "decode_tok_s": {"median": 20.25, "min": 19.0, "max": 21.0},
        "peak_rss_bytes": 123456789
    });
    std::fs::write(&peer, peer_value.to_string()).unwrap();
    let (r_arg, p_arg) = (receipt.display().to_string(), peer.display().to_string());
    let m = model();
    let before = utc_now();
    let out = ok_stdout(&aubier(&[
        "bench",
        "--model",
        &m,
        "--n-prompt",
        "24",
        "--n-gen",
        "4",
        "--reps",
        "2",
        "--json",
        "--receipt",
        &r_arg,
        "--peer",
        &p_arg,
    ]));
    let after = utc_now();
    let report: Value = serde_json::from_str(&out).expect("stdout is one JSON object");
    let r = read_json(&receipt);
    check_common(
        &r,
        "bench",
        &["--receipt", &r_arg, "--n-prompt 24"],
        &before,
        &after,
    );
    assert_eq!(r["figures"], report, "figures are the --json report");
    assert_eq!(r["backend"], report["backend"]);
    assert_eq!(r["device"], report["device"]);
    assert_eq!(r["model"], m.as_str());
    assert_eq!(r["host"]["isa"], report["isa"]);
    assert_eq!(r["peer"], peer_value);
}

#[test]
fn bench_refuses_bad_receipt_and_peer_files_before_measuring() {
    let dir = tempfile::tempdir().expect("scratch dir");
    let m = model();
    let missing_dir = dir.path().join("no-such-dir/r.json").display().to_string();
    let o = aubier(&["bench", "--model", &m, "--receipt", &missing_dir]);
    assert!(!o.status.success());
    assert!(o.stdout.is_empty(), "nothing measured");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--receipt") && err.contains(&missing_dir),
        "{err}"
    );

    let peer = dir.path().join("peer.json");
    std::fs::write(&peer, r#"{"prefill_tok_s": {"median": 1.0}}"#).unwrap();
    let receipt = dir.path().join("r.json");
    let (r_arg, p_arg) = (receipt.display().to_string(), peer.display().to_string());
    let o = aubier(&[
        "bench",
        "--model",
        &m,
        "--receipt",
        &r_arg,
        "--peer",
        &p_arg,
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("decode_tok_s.median") && err.contains(&p_arg),
        "{err}"
    );
    assert!(!receipt.exists(), "no receipt for a refused peer file");

    let o = aubier(&["bench", "--model", &m, "--peer", &p_arg]);
    assert!(!o.status.success(), "--peer needs --receipt");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--receipt"));
}

#[test]
fn replay_receipt_matches_the_printed_table_and_the_json() {
    let dir = tempfile::tempdir().expect("scratch dir");
    let spec = "experts=8,top_k=2,layers=2,tokens=64,seq_len=32,batch=1,zipf=1,hot=4,drift=0.1,sigma=0,tau=64,topic=0,carry=0,rho=0,seed=3";
    let (text_receipt, json_receipt) = (dir.path().join("text.json"), dir.path().join("json.json"));
    let t_arg = text_receipt.display().to_string();
    let before = utc_now();
    let table = ok_stdout(&aubier(&[
        "replay",
        "--synthetic",
        spec,
        "--sweep",
        "2,4",
        "--receipt",
        &t_arg,
    ]));
    let after = utc_now();
    let r = read_json(&text_receipt);
    check_common(&r, "replay", &["--sweep 2,4", &t_arg], &before, &after);
    assert_eq!(r["model"], format!("synthetic {spec}").as_str());
    assert!(r["backend"].is_null() && r["peer"].is_null());
    // The table's `served` rows: slots, `served`, then the served fraction of each default
    // policy to 4 decimals (the loads and MiB rows below each are not the receipt's figures).
    let policies = ["2q", "lru", "lfu", "static", "min"];
    let rows: Vec<Vec<f64>> = table
        .lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            (words.get(1) == Some(&"served")).then(|| {
                std::iter::once(words[0])
                    .chain(words[2..].iter().copied())
                    .map(|w| w.parse().expect("a number"))
                    .collect()
            })
        })
        .collect();
    let figures = r["figures"].as_array().expect("a sweep is a list");
    assert_eq!(rows.len(), 2);
    assert_eq!(figures.len(), 2);
    for (row, fig) in rows.iter().zip(figures) {
        assert_eq!(fig["slots"].as_f64(), Some(row[0]));
        for (p, printed) in policies.iter().zip(&row[1..]) {
            let f = fig["policies"][p].as_f64().expect("a fraction");
            assert!((f - printed).abs() <= 5e-5, "{p}: {f} printed {printed}");
        }
    }

    let j_arg = json_receipt.display().to_string();
    let out = ok_stdout(&aubier(&[
        "replay",
        "--synthetic",
        spec,
        "--sweep",
        "2,4",
        "--json",
        "--receipt",
        &j_arg,
    ]));
    let printed: Value = serde_json::from_str(&out).unwrap();
    let r = read_json(&json_receipt);
    assert_eq!(r["figures"], printed);
    assert_eq!(r["figures"], read_json(&text_receipt)["figures"]);
}

#[test]
fn quality_receipt_matches_the_printed_verdict() {
    let dir = tempfile::tempdir().expect("scratch dir");
    let receipt = dir.path().join("q.json");
    let r_arg = receipt.display().to_string();
    let (m, text) = (
        model(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/data/alice.txt"),
    );
    let b = "--override-kv mistral4.expert_used_count=int:2";
    let before = utc_now();
    let out = ok_stdout(&aubier(&[
        "quality",
        "--model",
        &m,
        "--text",
        text,
        "--max-tokens",
        "64",
        "--a",
        "",
        "--b",
        b,
        "--receipt",
        &r_arg,
    ]));
    let after = utc_now();
    let r = read_json(&receipt);
    check_common(&r, "quality", &[&format!("'{b}'"), &r_arg], &before, &after);
    assert_eq!(r["model"], m.as_str());
    let f = &r["figures"];
    assert_eq!(f["tokens"], 64);
    assert_eq!(f["b"]["flags"], b);
    let verdict = out
        .lines()
        .find_map(|l| l.strip_prefix("verdict: "))
        .expect("a verdict line");
    assert_eq!(f["verdict"], verdict);
    let printed_a: f64 = out
        .lines()
        .find_map(|l| l.split("mean NLL ").nth(1).filter(|_| l.starts_with("A [")))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("A's mean NLL");
    let a = f["a"]["mean_nll"].as_f64().unwrap();
    assert!((a - printed_a).abs() <= 5e-7, "{a} printed {printed_a}");
}
