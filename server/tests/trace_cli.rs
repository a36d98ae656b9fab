//! `aubier trace` end to end: the routing it records for the 200 prompt ids equals the expert ids
//! transformers selected on the same (dequantized) weights (`*.transformers-dequant.router_ids.i32`,
//! [3 layers, 200 positions, 4] sorted by weight — tests/data/models/README.md), and the trace it
//! writes is read back by `aubier replay`.

use aubier_tests::{data_dir, json_ids, models_dir, read_i32, read_json};
use std::process::Command;

#[test]
fn recorded_routing_equals_transformers_and_replays() {
    let ids = json_ids(
        &read_json(&data_dir().join("models/prompt-shared.json")),
        "ids",
    );
    let csv = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let out = std::env::temp_dir().join(format!("aubier-trace-{}.jsonl", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["trace", "--model"])
        .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
        .args(["--prompt-ids", &csv, "--max-tokens", "0", "--out"])
        .arg(&out)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).expect("trace");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 200);

    let reference =
        read_i32(&data_dir().join("models/ms4-tiny256-q2k.transformers-dequant.router_ids.i32"));
    for (p, line) in lines.iter().enumerate() {
        assert_eq!(line["seq"], 0);
        assert_eq!(line["pos"], p as u64);
        assert_eq!(line["n_experts"], 16);
        assert_eq!(line["top_k"], 4);
        for l in 0..3 {
            let ours: Vec<i64> = serde_json::from_value(line["layers"][l].clone()).unwrap();
            let theirs: Vec<i64> = reference[(l * 200 + p) * 4..(l * 200 + p + 1) * 4]
                .iter()
                .map(|&e| i64::from(e))
                .collect();
            assert_eq!(ours, theirs, "layer {l} position {p}");
        }
    }

    let r = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .arg("replay")
        .arg(&out)
        .args(["--slots", "4", "--json"])
        .output()
        .expect("runs");
    let _ = std::fs::remove_file(&out);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("json");
    assert_eq!(v["slots"], 4);
    let min = v["policies"]["min"].as_f64().expect("min");
    for p in ["2q", "lru", "lfu"] {
        let f = v["policies"][p].as_f64().expect(p);
        assert!(
            (0.0..=min).contains(&f),
            "{p} = {f} must lie in [0, MIN = {min}]"
        );
    }
}
