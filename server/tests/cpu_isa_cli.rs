//! `--cpu-isa` through the built binary: the cpu backend capped at each level binds only that
//! level's kernels (`aubier gen --plan`), computes the same logits bit for bit at every level this
//! machine has (prefill and decode, the default numerics), and refuses a level the machine lacks
//! by name.

use aubier_tests::models_dir;
use std::process::{Command, Output};

const LEVELS: [&str; 4] = ["scalar", "avx2", "avx512-vnni", "amx"];

fn aubier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(args)
        .output()
        .expect("runs")
}

#[test]
fn gen_plan_at_avx2_binds_no_avx512_kernel() {
    let model = models_dir().join("ms4-tiny256-q2k.gguf");
    let model = model.to_str().expect("a UTF-8 path");
    let o = aubier(&[
        "gen",
        "--model",
        model,
        "--plan",
        "--backend",
        "cpu",
        "--cpu-isa",
        "avx2",
    ]);
    assert!(
        o.status.success(),
        "AVX2 (with FMA, F16C) is on every x86_64 machine CI runs on: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the plan as JSON");
    assert_eq!(v["isa"], "avx2", "{}", v["isa"]);
    let binding = v["binding"].as_array().expect("binding");
    let products = binding
        .iter()
        .filter(|b| b["variant"].as_str().is_some_and(|s| s.contains("avx2")))
        .count();
    assert!(products > 0, "no step names its AVX2 kernel");
    for b in binding {
        let variant = b["variant"].as_str().expect("variant");
        for wide in ["avx512", "vnni", "amx"] {
            assert!(!variant.contains(wide), "step {}: {variant}", b["step"]);
        }
    }
    // The Q2_K products' tile kernels at this level are the AVX2 ones (`avx2_grid.rs`).
    assert!(
        binding.iter().any(|b| b["variant"]
            .as_str()
            .is_some_and(|s| s.contains("Q2_K") && s.contains("tile kernels"))),
        "no Q2_K step names its AVX2 tile kernels"
    );
}

#[test]
fn every_level_this_cpu_has_computes_the_same_logits() {
    let model = models_dir().join("ms4-tiny256-q2k.gguf");
    let model = model.to_str().expect("a UTF-8 path");
    let dir = std::env::temp_dir();
    let mut ran: Vec<(&str, Vec<u8>, serde_json::Value)> = Vec::new();
    for level in LEVELS {
        let out = dir.join(format!("aubier-isa-{level}-{}.f32", std::process::id()));
        let out_s = out.to_str().expect("a UTF-8 path");
        let o = aubier(&[
            "run",
            "--model",
            model,
            "--backend",
            "cpu",
            "--cpu-isa",
            level,
            "--prompt-ids",
            "1,17,4096,8000,3,900,77,12,5000,31,64,1023,2,2048,9,18,300",
            "--max-tokens",
            "12",
            "--temperature",
            "0",
            "--ignore-eos",
            "--json",
            "--logits-out",
            out_s,
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            assert!(
                err.contains(&format!("--cpu-isa {level}: this CPU lacks it")),
                "{level}: {err}"
            );
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
        let logits = std::fs::read(&out).expect("the prompt's logits");
        std::fs::remove_file(&out).ok();
        assert!(!logits.is_empty(), "{level}");
        ran.push((level, logits, v["generated_ids"].clone()));
    }
    let names: Vec<&str> = ran.iter().map(|r| r.0).collect();
    assert!(
        names.starts_with(&["scalar", "avx2"]),
        "scalar and AVX2 run on every x86_64 machine CI runs on; ran {names:?}"
    );
    let (first, logits, ids) = &ran[0];
    for (level, l, i) in &ran[1..] {
        assert!(l == logits, "{level}'s prompt logits differ from {first}'s");
        assert_eq!(i, ids, "{level}'s greedy ids differ from {first}'s");
    }
}
