//! `aubier bench` end to end on the bundled model with tiny sizes: the JSON report has every
//! field, rates and times are positive, the weight bytes per decoded token equal a sum taken
//! straight from the GGUF tensor table (every tensor in full, but `token_embd` one row and the
//! `*_exps` tensors n_expert_used / n_expert of their bytes), the per-component times add up to
//! their totals, the kernels' weight bytes add up to the same sum, each kernel's per-step shares
//! add up to it and name the file's tensors with their GGUF types and dimensions, and the default
//! kernels are `q8x2`; with `--tools` the report has the grammar section.

use aubier_runtime::gguf::GgufFile;
use aubier_tests::models_dir;
use std::process::Command;

#[test]
fn json_report_on_the_bundled_model() {
    let model = models_dir().join("ms4-tiny256-q2k.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["bench", "--model"])
        .arg(&model)
        .args(["--n-prompt", "40", "--n-gen", "6", "--reps", "3", "--json"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["n_prompt"], 40);
    assert_eq!(v["n_gen"], 6);
    assert_eq!(v["reps"], 3);
    assert!(
        v["grammar"].is_null(),
        "no grammar without --json-schema / --tools"
    );
    for k in ["prefill_tok_s", "decode_tok_s", "ttft_ms"] {
        let s = &v[k];
        let (lo, med, hi) = (
            s["min"].as_f64().unwrap(),
            s["median"].as_f64().unwrap(),
            s["max"].as_f64().unwrap(),
        );
        assert!(0.0 < lo && lo <= med && med <= hi, "{k}: {s}");
    }
    assert!(v["peak_rss_bytes"].as_u64().unwrap() > 1 << 20);
    let served = v["served_fraction"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&served));
    assert_eq!(v["backend"], "cpu (q8x2)");
    let isa = v["isa"].as_str().unwrap();
    assert!(
        ["amx", "avx512-vnni", "avx2", "scalar"].contains(&isa),
        "{isa}"
    );
    let components = [
        "attention",
        "router",
        "experts",
        "shared_expert",
        "output_head",
        "embedding",
    ];
    for k in [
        "prefill_ms_by_component",
        "decode_ms_per_token_by_component",
    ] {
        let total = v[k]["total"].as_f64().unwrap();
        let sum: f64 = components.iter().map(|c| v[k][c].as_f64().unwrap()).sum();
        assert!(
            total > 0.0 && (sum - total).abs() <= 1e-9 * total,
            "{k}: {}",
            v[k]
        );
    }
    for k in ["slowest_prefill_steps", "slowest_decode_steps"] {
        assert!(!v[k].as_array().unwrap().is_empty(), "{k}");
    }

    let file = GgufFile::open(&model).unwrap();
    let share = 4.0 / 16.0;
    let expected: f64 = file
        .tensors()
        .iter()
        .map(|t| {
            if t.name == "token_embd.weight" {
                t.row_bytes() as f64
            } else if t.name.contains("_exps") {
                t.n_bytes as f64 * share
            } else {
                t.n_bytes as f64
            }
        })
        .sum();
    let got = v["weight_bytes_per_token"]["total"].as_f64().unwrap();
    assert!(
        (got - expected).abs() < 1e-6 * expected,
        "{got} vs {expected}"
    );
    let parts: f64 = components
        .iter()
        .map(|k| v["weight_bytes_per_token"][k].as_f64().unwrap())
        .sum();
    assert!((parts - got).abs() < 1e-6 * got);

    // Per kernel: the weights its steps bind, so over all kernels every weight once (no weight
    // of this plan is read by two steps), the same total as the GGUF table's sum above.
    let kernels = v["kernels"].as_array().unwrap();
    let by_kernel: f64 = kernels
        .iter()
        .map(|k| k["decode_weight_bytes_per_token"].as_f64().unwrap())
        .sum();
    assert!(
        (by_kernel - expected).abs() < 1e-6 * expected,
        "{by_kernel} vs {expected}"
    );
    assert!(kernels.iter().all(|k| k["launches"].as_u64().unwrap() > 0));

    // Per kernel per step: the steps' times and bytes add up to the kernel's, each weight is
    // named with the type and dimensions of the GGUF table, and over all kernels every tensor
    // of the file is some step's weight.
    let mut named = std::collections::BTreeSet::new();
    for k in kernels {
        let steps = k["steps"].as_array().unwrap();
        assert!(!steps.is_empty(), "{}", k["name"]);
        for f in [
            "prefill_ms",
            "decode_ms_per_token",
            "decode_weight_bytes_per_token",
        ] {
            let sum: f64 = steps.iter().map(|s| s[f].as_f64().unwrap()).sum();
            let total = k[f].as_f64().unwrap();
            assert!(
                (sum - total).abs() <= 1e-9 * total.max(1.0),
                "{}: {f}",
                k["name"]
            );
        }
        for s in steps {
            assert!(!s["op"].as_str().unwrap().is_empty());
            for w in s["weights"].as_array().unwrap() {
                let name = w["name"].as_str().unwrap();
                let t = file
                    .tensor(name)
                    .unwrap_or_else(|| panic!("{name} not in the file"));
                assert_eq!(w["ggml_type"], t.ggml_type.name(), "{name}");
                let ne: Vec<usize> = w["ne"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect();
                assert_eq!(ne, t.ne, "{name}");
                named.insert(name.to_owned());
            }
        }
    }
    let all: std::collections::BTreeSet<String> =
        file.tensors().iter().map(|t| t.name.clone()).collect();
    assert_eq!(named, all);
}

#[test]
fn bad_sizes_are_errors() {
    let model = models_dir().join("ms4-tiny256-q2k.gguf");
    for (args, needle) in [
        (
            ["--n-prompt", "0"],
            "--n-prompt and --reps must be at least 1",
        ),
        // The default 512 prompt tokens + 3585 > the bundled model's context_length, 4096
        // (models/README.md).
        (
            ["--n-gen", "3585"],
            "--n-prompt 512 + --n-gen 3585 exceed the model's context_length 4096",
        ),
        // Refused before the prompt is built: it had been fitted first, a capacity-overflow
        // panic for this one.
        (
            ["--n-prompt", "18446744073709551615"],
            "--n-prompt 18446744073709551615 + --n-gen 128 exceed the model's context_length",
        ),
        (["--n-gen", "0"], "--n-gen must be at least 2"),
        (["--n-gen", "1"], "--n-gen must be at least 2"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
            .args(["bench", "--model"])
            .arg(&model)
            .args(args)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(
            err.contains(needle) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

/// `--tools`: the grammar section counts one mask per sampled token (and one for the EOS that
/// ends the calls), every figure is positive and ordered, and the run without a grammar has none.
#[test]
fn grammar_report_with_tools() {
    let model = models_dir().join("ms4-tiny256-q2k.gguf");
    let tools = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/grammar/tools.json");
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["bench", "--model"])
        .arg(&model)
        .args([
            "--n-prompt",
            "8",
            "--n-gen",
            "200",
            "--reps",
            "2",
            "--json",
            "--tools",
        ])
        .arg(&tools)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let g = &v["grammar"];
    let (tokens, masks) = (g["tokens"].as_u64().unwrap(), g["masks"].as_u64().unwrap());
    assert!(tokens > 0 && (tokens..=tokens + 2).contains(&masks), "{g}");
    let f = |k: &str| g[k].as_f64().unwrap();
    assert!(
        0.0 < f("mask_ms_median") && f("mask_ms_median") <= f("mask_ms_p99"),
        "{g}"
    );
    assert!(f("mask_ms_p99") <= f("mask_ms_max"), "{g}");
    for k in [
        "compiler_build_ms",
        "step_ms",
        "constrained_step_ms",
        "slowdown",
    ] {
        assert!(f(k) > 0.0, "{k}: {g}");
    }
    assert!(f("exposed_ms_per_token") >= 0.0);
    assert!(g["grammar"].as_str().unwrap().starts_with("tools "));
}
