//! `POST /debug/tokens` on the real engine (bundled model): the ids it produces are byte-identical
//! to `aubier run`'s greedy ids at the same flags, on a first request and on a later one (after
//! another request has used the session: the reset), and they follow the external reference
//! greedy chain (transformers on the dequantized GGUF, `tests/data/models`). The engine runs with
//! a small rotating expert store (4 of 16 experts resident, 2Q), which must not change a token,
//! and `/metrics` reports its served fraction and counters.

mod serve_common;

use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::engine::Model;
use aubier_runtime::store::expert_store::StoreOptions;
use aubier_runtime::store::FastBudget;
use aubier_server::serve::real::RealEngine;
use serde_json::{json, Value};
use serve_common::*;
use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/models")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("u32 id"))
        .collect()
}

async fn debug_tokens(srv: &TestServer, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let body = json!({"ids": prompt, "max_tokens": max_tokens, "ignore_eos": true}).to_string();
    let resp = raw_request(srv.addr, "POST", "/debug/tokens", body.as_bytes()).await;
    assert_eq!(
        resp.status,
        200,
        "{}",
        String::from_utf8_lossy(&resp.body())
    );
    ids(&resp.json()["ids"])
}

fn aubier_run(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let list: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .arg("run")
        .arg("--model")
        .arg(bundled_model())
        .arg("--prompt-ids")
        .arg(list.join(","))
        .arg("--max-tokens")
        .arg(max_tokens.to_string())
        .arg("--ignore-eos")
        .arg("--json")
        .output()
        .expect("aubier run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("aubier run --json output");
    ids(&v["generated_ids"])
}

#[tokio::test]
async fn debug_tokens_equal_aubier_run_and_the_reference_chain_first_and_after_reset() {
    let reference = fixture("ms4-tiny256-q2k.transformers-dequant.greedy.json");
    let prefix = ids(&reference["prefix_ids"]);
    let expected = ids(&reference["generated_ids"]);
    let n = expected.len();

    // The oracle: its greedy chain is held to transformers' exactly.
    let model = Model::load_with(&bundled_model(), &BackendSpec::named("oracle"))
        .expect("load the bundled model");
    let kv_max = model.config.n_ctx_train.min(4096);
    let store = StoreOptions {
        budget: FastBudget::Slots(4),
        a1in: 0.0,
        ..StoreOptions::default()
    };
    let engine = RealEngine::open(model, kv_max, &store, 0).expect("session");
    let srv = start(Box::new(engine), None, limits()).await;

    let first = debug_tokens(&srv, &prefix, n).await;
    // Another request in between writes other cells of the KV cache.
    let other: Vec<u32> = prefix.iter().rev().copied().collect();
    let _ = debug_tokens(&srv, &other, 5).await;
    let later = debug_tokens(&srv, &prefix, n).await;
    let m = raw_request(srv.addr, "GET", "/metrics", b"").await;
    srv.stop().await;
    let text = String::from_utf8(m.body()).expect("UTF-8");
    let metric = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
            .parse()
            .expect("number")
    };
    // Every stepped token routes 3 layers × top-4; at least the three prompts were stepped.
    let routed = metric("aubier_expert_routed_total");
    assert!(
        routed % 12.0 == 0.0 && routed >= (3 * prefix.len() * 12) as f64,
        "{routed}"
    );
    let hits = metric("aubier_expert_fast_hits_total");
    assert!(hits > 0.0 && hits < routed, "{hits} of {routed}");
    assert!(metric("aubier_expert_promotions_total") > 0.0);
    let f = metric("aubier_expert_served_ratio");
    assert!(f > 0.0 && f < 1.0, "{f}");

    assert_eq!(
        first, later,
        "a later request differs from the first (reset)"
    );
    assert_eq!(
        first, expected,
        "differs from the transformers greedy chain"
    );
    assert_eq!(
        first,
        aubier_run(&prefix, n),
        "/debug/tokens and aubier run differ"
    );
}
