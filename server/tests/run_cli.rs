//! `aubier run` end to end: the built binary on the bundled model, checked against the external
//! transformers reference on gguf-py-dequantized weights (tests/data/models/README.md).

use aubier_tests::{data_dir, json_ids, models_dir, read_f32, read_json, step_lines};
use std::process::Command;

fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn logits_out_writes_every_prompt_row_and_max_tokens_zero_runs_the_prompt_only() {
    let prompt = json_ids(
        &read_json(&data_dir().join("models/prompt-shared.json")),
        "ids",
    );
    let prompt = &prompt[..24];
    let out = std::env::temp_dir().join(format!("aubier-run-logits-{}.f32", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["run", "--model"])
        .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
        .args([
            "--prompt-ids",
            &csv(prompt),
            "--max-tokens",
            "0",
            "--json",
            "--backend",
            "oracle",
            "--logits-out",
        ])
        .arg(&out)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(json_ids(&v, "prompt_ids"), prompt);
    assert_eq!(v["generated_ids"].as_array().map(Vec::len), Some(0));
    assert!(v["prefill_tok_s"].as_f64().is_some() && v["decode_tok_s"].as_f64().is_some());

    let ours = read_f32(&out);
    let _ = std::fs::remove_file(&out);
    let n_vocab = 8192;
    assert_eq!(
        ours.len(),
        prompt.len() * n_vocab,
        "[n_prompt × n_vocab] f32"
    );
    let reference =
        read_f32(&data_dir().join("models/ms4-tiny256-q2k.transformers-dequant.logits.f32"));
    let max = ours
        .iter()
        .zip(&reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max <= 1e-4, "max abs diff {max}");
}

#[test]
fn greedy_json_matches_the_reference_chain_and_bad_input_is_an_error() {
    let r = read_json(&data_dir().join("models/ms4-tiny256-q2k.transformers-dequant.greedy.json"));
    let prefix = json_ids(&r, "prefix_ids");
    let expected = json_ids(&r, "generated_ids");
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["run", "--model"])
        .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
        .args(["--prompt-ids", &csv(&prefix), "--ignore-eos", "--json"])
        .args(["--cpu-kernels", "oracle"])
        .args(["--max-tokens", &expected.len().to_string()])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The deprecated spelling still works, and says so.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--cpu-kernels is deprecated; use --backend oracle"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(json_ids(&v, "generated_ids"), expected);
    assert!(v["text"].is_string());

    let bad = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["run", "--model"])
        .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
        .args(["--prompt-ids", "1,999999"])
        .output()
        .expect("runs");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("999999"), "error names the bad id: {err}");
}

#[test]
fn sampling_penalties_reach_the_sampler_and_bad_values_are_errors() {
    let prompt = [1u32, 1784, 3937, 1044];
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_aubier"))
            .args(["run", "--model"])
            .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
            .args(["--prompt-ids", &csv(&prompt), "--ignore-eos", "--json"])
            .args(["--max-tokens", "24"])
            .args(extra)
            .output()
            .expect("runs")
    };
    let ids = |extra: &[&str]| {
        let o = run(extra);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        json_ids(&v, "generated_ids")
    };
    // The greedy chain of this random model repeats no token in 24.
    let greedy = ids(&[]);
    let distinct: std::collections::BTreeSet<u32> = greedy.iter().copied().collect();
    assert_eq!(distinct.len(), greedy.len(), "{greedy:?}");
    // A strongly negative frequency or presence penalty raises each generated token so far
    // above the rest that greedy decoding repeats the first token for ever.
    for flag in ["--frequency-penalty", "--presence-penalty"] {
        assert_eq!(ids(&[flag, "-1000"]), vec![greedy[0]; 24], "{flag}");
    }
    // min_p 1 keeps only the most likely token: sampling at temperature 1 is greedy then,
    // and is not without it.
    let sampled = ["--temperature", "1", "--seed", "3"];
    assert_eq!(ids(&[&sampled[..], &["--min-p", "1"]].concat()), greedy);
    assert_ne!(ids(&sampled), greedy);
    // Under a huge repetition penalty every seen token's logit drops to about 0 or below: no
    // token repeats and none of the prompt's comes back.
    let penalized = ids(&["--repeat-penalty", "1e9"]);
    let distinct: std::collections::BTreeSet<u32> = penalized.iter().copied().collect();
    assert_eq!(distinct.len(), penalized.len(), "{penalized:?}");
    assert!(
        penalized.iter().all(|id| !prompt.contains(id)),
        "{penalized:?}"
    );
    for (flag, value) in [
        ("--repetition-penalty", "0"),
        ("--presence-penalty", "inf"),
        ("--frequency-penalty", "NaN"),
        ("--min-p", "1.5"),
    ] {
        let o = run(&[flag, value]);
        assert!(!o.status.success(), "{flag} {value}");
        let err = String::from_utf8_lossy(&o.stderr);
        let name = flag.trim_start_matches("--").replace('-', "_");
        assert!(err.contains(&name), "{flag} {value}: {err}");
    }
}

#[test]
fn backend_flags_that_contradict_each_other_are_errors() {
    for (args, says) in [
        (
            &["--backend", "oracle", "--cpu-numerics", "q8"][..],
            "--cpu-numerics q8 applies to --backend cpu",
        ),
        (
            &["--cpu-kernels", "q8", "--backend", "cpu"][..],
            "cannot be used with",
        ),
        (&["--cpu-kernels", "q4"][..], "unknown value `q4`"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
            .args(["run", "--prompt-ids", "1", "--max-tokens", "1", "--model"])
            .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
            .args(args)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
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

fn run_json(args: &[&str]) -> serde_json::Value {
    let prompt = json_ids(
        &read_json(&data_dir().join("models/prompt-shared.json")),
        "ids",
    );
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["run", "--model"])
        .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
        .args(["--prompt-ids", &csv(&prompt[..20]), "--max-tokens", "6"])
        .args(["--ignore-eos", "--json"])
        .args(args)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("json")
}

#[test]
fn json_reports_the_expert_store_and_placement_does_not_change_the_tokens() {
    // 20 prompt tokens + 5 decode steps (the 6th token is not stepped), 3 layers × top-4.
    let routed = (20 + 5) * 12;
    let all = run_json(&[]);
    let s = &all["store"];
    assert_eq!(
        s["n_res"], 16,
        "the default keeps every expert of a model that fits: {s}"
    );
    assert_eq!(
        (s["routed"].as_u64(), s["fast_hits"].as_u64()),
        (Some(routed), Some(routed))
    );
    assert_eq!(s["served_fraction"], 1.0);
    assert_eq!(s["promotions"], 0);
    assert!(s["fast_bytes"].as_u64().is_some_and(|b| b > 0) && s["reset_ms"].is_f64());

    let small = run_json(&["--n-res", "4", "--a1in", "0", "--policy", "2q"]);
    let s = &small["store"];
    assert_eq!(small["generated_ids"], all["generated_ids"]);
    assert_eq!(s["n_res"], 4);
    assert_eq!(
        s["fast_bytes"].as_u64().map(|b| b * 4),
        all["store"]["fast_bytes"].as_u64()
    );
    let hits = s["fast_hits"].as_u64().expect("hits");
    assert_eq!(s["routed"].as_u64(), Some(routed));
    assert!(0 < hits && hits < routed, "{s}");
    let f = s["served_fraction"].as_f64().expect("fraction");
    assert!((f - hits as f64 / routed as f64).abs() < 1e-12);

    let none = run_json(&["--n-res", "0"]);
    assert_eq!(none["generated_ids"], all["generated_ids"]);
    assert_eq!(
        (
            none["store"]["fast_hits"].as_u64(),
            none["store"]["fast_bytes"].as_u64()
        ),
        (Some(0), Some(0))
    );

    let budget = run_json(&[
        "--fast-budget",
        &s["fast_bytes"].to_string(),
        "--reset",
        "none",
    ]);
    assert_eq!(
        budget["store"]["n_res"], 4,
        "a budget of 4 slots' bytes gives 4 slots"
    );
    assert_eq!(budget["store"]["reset_ms"], 0.0);
}

#[test]
fn predict_experts_reports_the_recall_and_does_not_change_the_tokens() {
    // 20 prompt tokens + 5 decode steps, layers 1 and 2 predicted, top-4.
    let slots = (20 + 5) * 2 * 4;
    let plain = run_json(&["--backend", "oracle"]);
    assert!(plain["prediction"].is_null(), "{plain}");
    let pred = run_json(&["--backend", "oracle", "--predict-experts"]);
    assert_eq!(pred["generated_ids"], plain["generated_ids"]);
    let p = &pred["prediction"];
    assert_eq!(p["slots"].as_u64(), Some(slots), "{p}");
    let hits = p["hits"].as_u64().expect("hits");
    assert!(hits <= slots);
    let recall = p["recall"].as_f64().expect("recall");
    assert!((recall - hits as f64 / slots as f64).abs() < 1e-12, "{p}");
    assert_eq!(pred["prediction_lead"], 1);
    // Two layers ahead: the same tokens, layer 2 predicted from an earlier residual.
    let two = run_json(&[
        "--backend",
        "oracle",
        "--predict-experts",
        "--prefetch-lead",
        "2",
    ]);
    assert_eq!(two["generated_ids"], plain["generated_ids"]);
    assert_eq!(two["prediction_lead"], 2);
    assert_eq!(two["prediction"]["slots"].as_u64(), Some(slots));
    assert_ne!(two["prediction"]["hits"], p["hits"], "{two}");
}

#[test]
fn a_prefetch_lead_outside_one_to_the_layer_count_is_refused() {
    for (lead, says) in [
        ("0", "the lead is at least 1 layer"),
        (
            "4",
            "prefetch lead 4 is out of range: the expert prediction runs 1 to 3 layers",
        ),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
            .args(["run", "--model"])
            .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
            .args([
                "--prompt-ids",
                "1,2,3",
                "--max-tokens",
                "1",
                "--backend",
                "oracle",
            ])
            .args(["--predict-experts", "--prefetch-lead", lead])
            .output()
            .expect("runs");
        assert!(!o.status.success(), "--prefetch-lead {lead} should fail");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "--prefetch-lead {lead}: {err}");
    }
}

#[test]
fn bad_store_flags_are_clear_errors() {
    let fail = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
            .args(["run", "--model"])
            .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
            .args(["--prompt-ids", "1,2,3", "--max-tokens", "1"])
            .args(args)
            .output()
            .expect("runs");
        assert!(!o.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let n_res = fail(&["--n-res", "17"]);
    assert_eq!(
        n_res.matches("--n-res 17 exceeds the 16 experts").count(),
        1,
        "said once: {n_res}"
    );
    let a1in = fail(&["--n-res", "4", "--a1in", "NaN"]);
    assert_eq!(
        a1in.matches("must be a finite fraction").count(),
        1,
        "{a1in}"
    );
    assert!(fail(&["--policy", "min"]).contains("offline"));
    assert!(fail(&["--n-res", "2", "--fast-budget", "1M"]).contains("cannot be used with"));
    assert!(fail(&["--reset", "later"]).contains("unknown reset mode"));
    let missing = fail(&["--resident-set", "/nonexistent/hot.json"]);
    assert!(
        missing.contains("--resident-set /nonexistent/hot.json"),
        "{missing}"
    );
}

/// A report that cannot be written (stdout on a full device) is an error exit naming stdout,
/// not a panic.
#[cfg(target_os = "linux")]
#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["run", "--model"])
        .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
        .args(["--prompt-ids", "1,2,3", "--max-tokens", "2", "--json"])
        .stdout(full)
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("writing to stdout") && !err.contains("panicked"),
        "{err}"
    );
}

/// Every command that takes a model defaults to the same file (`model_file::resolve_model`): the
/// bundled demo model, or `$AUBIER_MODEL`, which when it names a missing file is refused by name.
#[test]
fn every_command_takes_the_same_default_model() {
    let aubier = |args: &[&str], env_model: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_aubier"));
        cmd.args(args);
        match env_model {
            Some(m) => cmd.env("AUBIER_MODEL", m),
            None => cmd.env_remove("AUBIER_MODEL"),
        };
        cmd.output().expect("runs")
    };
    let commands: [&[&str]; 4] = [
        &[
            "run",
            "--prompt-ids",
            "1,17,4096",
            "--max-tokens",
            "2",
            "--json",
        ],
        &[
            "bench",
            "--n-prompt",
            "16",
            "--n-gen",
            "2",
            "--reps",
            "1",
            "--json",
        ],
        &[
            "quality",
            "--a",
            "--backend cpu",
            "--b",
            "--backend oracle",
            "--ids",
        ],
        &["gen", "--plan"],
    ];
    let ids = std::env::temp_dir().join(format!("aubier-default-ids-{}.json", std::process::id()));
    std::fs::write(&ids, "1,17,4096,8000,3,900,77,12,5000,31,64").expect("write ids");
    let ids = ids.to_str().expect("a UTF-8 path").to_owned();
    let bundled = models_dir().join("ms4-tiny256-q2k.gguf");
    for args in commands {
        let mut args: Vec<&str> = args.to_vec();
        if args[0] == "quality" {
            args.push(&ids);
        }
        let o = aubier(&args, None);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        if args[0] == "bench" {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
            let model = v["model"].as_str().expect("the model path");
            assert_eq!(
                std::fs::canonicalize(model).expect("the bench's model exists"),
                std::fs::canonicalize(&bundled).expect("the bundled model exists")
            );
        }
        let o = aubier(&args, Some("/nonexistent/aubier-model.gguf"));
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("$AUBIER_MODEL is /nonexistent/aubier-model.gguf, which does not exist"),
            "{args:?}: {err}"
        );
    }
    std::fs::remove_file(&ids).ok();
}

/// Off a terminal, loading says each step and how long it took, the backend's own steps (code,
/// the fast store, the dense weights' copy and mapping, counted in bytes) among them, then the
/// whole load's time, and the session's opening its steps (the fast store's fill counted in
/// bytes), on stderr (stdout keeps the JSON).
#[test]
fn loading_reports_each_step_off_a_terminal() {
    let model = models_dir().join("ms4-tiny256-q2k.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["run", "--backend", "cpu", "--model"])
        .arg(&model)
        .args(["--prompt-ids", "1,17,4096", "--max-tokens", "2", "--json"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("stdout is the JSON alone");
    let err = String::from_utf8_lossy(&o.stderr);
    let prefix = format!("loading {}", model.display());
    let steps = step_lines(&err, &prefix);
    let names: Vec<&str> = steps.iter().map(|s| s.what.as_str()).collect();
    assert_eq!(
        names,
        [
            "reading the GGUF file",
            "compiling the plan",
            "binding the weights",
            "starting the backend",
            "generating host code",
            "allocating the fast store",
            "copying dense weights",
            "mapping dense weights",
        ],
        "{err}"
    );
    for s in &steps {
        let counted = s.what.ends_with("dense weights");
        assert_eq!(s.amount.is_some(), counted, "{s:?}");
        assert!(s.secs >= 0.0, "{s:?}");
    }
    assert!(
        steps[6..]
            .iter()
            .all(|s| s.amount.as_deref() != Some("0 B")),
        "{err}"
    );
    // Then the session opens: its latent cache, the fast store filled with every expert.
    let opening = step_lines(&err, "opening a session");
    let names: Vec<(&str, bool)> = opening
        .iter()
        .map(|s| (s.what.as_str(), s.amount.is_some()))
        .collect();
    assert_eq!(
        names,
        [
            ("allocating the latent cache", false),
            ("filling the fast store", true),
        ],
        "{err}"
    );
    assert!(err.contains("opening a session: opened in "), "{err}");
    let loaded = err.lines().find_map(|l| {
        l.strip_prefix(&format!("{prefix}: loaded in "))?
            .strip_suffix(" s")?
            .parse::<f64>()
            .ok()
    });
    let within: f64 = steps.iter().map(|s| s.secs).sum();
    assert!(
        loaded.is_some_and(|t| t + 0.05 >= within),
        "the whole load's time, at least its steps' ({within} s), in:\n{err}"
    );
}

/// Runs the binary with `args`; returns (exit code, stderr).
fn aubier_stderr(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(args)
        .output()
        .expect("runs");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn llama_cpp_flags_say_aubiers_name_for_them() {
    let cases: &[(&[&str], &str)] = &[
        (&["run", "-m", "x.gguf"], "`-m` is `--model`"),
        (&["run", "-p", "hi"], "`-p` is `--prompt`"),
        (&["run", "-n", "5"], "`-n` is `--max-tokens`"),
        // clap's guess by spelling was `--n-res`.
        (
            &["run", "--n-predict", "5"],
            "`--n-predict` is `--max-tokens`",
        ),
        (&["run", "--ctx-size=10"], "`--ctx-size` is `--kv-max`"),
        (&["run", "-c", "10"], "`-c` is `--kv-max`"),
        (&["run", "--temp", "0.5"], "`--temp` is `--temperature`"),
        (&["run", "-ub", "4"], "`-ub` is `--ubatch`"),
        (
            &["trace", "-n", "4"],
            "`-n` is `--max-tokens` in `aubier trace`",
        ),
        (
            &["serve", "-c", "100"],
            "`-c` is `--kv-max` in `aubier serve`",
        ),
        (&["serve", "--alias", "m"], "`--alias` is `--model-id`"),
        (
            &["bench", "-p", "512"],
            "`-p` is `--n-prompt` in `aubier bench`",
        ),
        (
            &["bench", "-n", "128"],
            "`-n` is `--n-gen` in `aubier bench`",
        ),
        (&["run", "-ngl", "99"], "aubier has no `-ngl`"),
    ];
    for (args, tip) in cases {
        let (code, err) = aubier_stderr(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(tip), "{args:?}: {err}");
        assert!(!err.contains("similar argument"), "{args:?}: {err}");
    }
    // A flag llama.cpp does not have keeps clap's own message.
    let (code, err) = aubier_stderr(&["run", "--bogus"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("unexpected argument '--bogus'") && !err.contains("llama.cpp"));
}

#[test]
fn a_negative_number_is_the_options_value_not_an_unknown_flag() {
    // Refused by clap's parser of the option's type: it names the option.
    for (args, what) in [
        (
            &["run", "--top-k", "-1"][..],
            "invalid value '-1' for '--top-k",
        ),
        (
            &["run", "--seed", "-1"][..],
            "invalid value '-1' for '--seed",
        ),
        (
            &["run", "--kv-max", "-1"][..],
            "invalid value '-1' for '--kv-max",
        ),
        (
            &["bench", "--reps", "-3"][..],
            "invalid value '-3' for '--reps",
        ),
    ] {
        let (code, err) = aubier_stderr(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(what), "{args:?}: {err}");
    }
    // Accepted by clap and refused by the sampler's own check, which names the range.
    let model = models_dir().join("ms4-tiny256-q2k.gguf");
    let model = model.to_str().expect("utf-8 path");
    for (flag, value, what) in [
        (
            "--temperature",
            "-1",
            "temperature must be a finite number >= 0, got -1",
        ),
        ("--top-p", "-0.1", "top_p must be in (0, 1], got -0.1"),
    ] {
        let (code, err) = aubier_stderr(&[
            "run",
            "--model",
            model,
            "--backend",
            "cpu",
            "--prompt-ids",
            "1",
            flag,
            value,
        ]);
        assert_eq!(code, Some(1), "{flag} {value}: {err}");
        assert!(err.contains(what), "{flag} {value}: {err}");
    }
}

#[test]
fn a_broken_tokenizer_is_named_not_reported_as_missing() {
    use aubier_runtime::gguf::write::{tensor_specs, GgufWriter};
    use aubier_runtime::gguf::{GgufFile, MetaValue};
    let file = GgufFile::open(models_dir().join("ms4-tiny256-q2k.gguf")).expect("bundled");
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        let eos = MetaValue::U32(8192);
        w.kv(
            k,
            if k == "tokenizer.ggml.eos_token_id" {
                &eos
            } else {
                v
            },
        );
    }
    w.tensors = tensor_specs(&file);
    let path = std::env::temp_dir().join(format!("aubier-run-bad-eos-{}.gguf", std::process::id()));
    std::fs::write(&path, w.finish()).expect("write");
    let model = path.to_str().expect("utf-8 path").to_owned();
    // --prompt said "this file has none"; --prompt-ids ran on without the file's EOS.
    for prompt in [["--prompt", "hi"], ["--prompt-ids", "1"]] {
        let mut args = vec!["run", "--model", &model, "--backend", "cpu"];
        args.extend(prompt);
        let (code, err) = aubier_stderr(&args);
        assert_eq!(code, Some(1), "{prompt:?}: {err}");
        assert!(
            err.contains("the file's tokenizer: tokenizer.ggml.eos_token_id = 8192 is outside"),
            "{prompt:?}: {err}"
        );
    }
    let _ = std::fs::remove_file(&path);
}

/// A generation the KV cache ends before --max-tokens says so on stderr (it stopped short with
/// only `finish length`); one --max-tokens ends does not.
#[test]
fn a_generation_the_kv_cache_ends_says_so() {
    let model = models_dir().join("ms4-tiny256-q2k.gguf");
    let model = model.to_str().expect("utf-8 path");
    let base = [
        "run",
        "--model",
        model,
        "--backend",
        "cpu",
        "--kv-max",
        "8",
        "--prompt-ids",
        "1,2,3,4",
        "--json",
        "--max-tokens",
    ];
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(base)
        .arg("9")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["generated_ids"].as_array().map(Vec::len), Some(4));
    assert!(
        err.contains(
            "stopped after 4 of --max-tokens 9: the KV cache holds 8 tokens (prompt 4 + generated 4)"
        ),
        "{err}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(base)
        .arg("4")
        .output()
        .expect("runs");
    assert!(o.status.success());
    assert!(!String::from_utf8_lossy(&o.stderr).contains("stopped after"));
}

#[test]
fn a_prompt_id_outside_the_vocabulary_names_the_flag_and_position() {
    let model = models_dir().join("ms4-tiny256-q2k.gguf");
    let (code, err) = aubier_stderr(&[
        "run",
        "--model",
        model.to_str().expect("utf-8 path"),
        "--backend",
        "cpu",
        "--prompt-ids",
        "1,2,8192",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "--prompt-ids: id 8192 (position 2) is outside the model's vocabulary of 8192 tokens"
        ),
        "{err}"
    );
}
