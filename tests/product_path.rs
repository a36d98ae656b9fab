//! The product path — the default backend (`cpu`, `q8x2` numerics), what `aubier run` and `aubier
//! serve` execute — on every fixture model, against the external references of
//! `tests/data/models` (transformers; llama.cpp as the peer):
//! * top-1 agreement with the exact reference over the 200 prompt positions at least llama.cpp's
//!   own (`agreement.json`: llama.cpp, which also quantizes activations, against the same
//!   reference);
//! * the max |Δlogit| against that reference is reported and bounded by llama.cpp's own max
//!   |Δlogit| against it (the peer's deviation is the error budget);
//! * the 32-token greedy chain equals the reference's up to the first position whose reference
//!   top-2 margin is below that measured max |Δlogit| (past it a flip is allowed: greedy chains
//!   are chaotic, ARCHITECTURE.md § numerics policy).
//!
//! The figures are printed (`cargo test -p aubier-tests --test product_path -- --nocapture`).

use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::engine::Model;
use aubier_runtime::generate::{generate, GenerateParams};
use aubier_runtime::sampler::{argmax, SamplingParams};
use aubier_runtime::session::{Session, SessionOptions};
use aubier_tests::{data_dir, json_ids, model_path, read_f32, read_json};
use std::ops::ControlFlow;

const N_VOCAB: usize = 8192;
const POSITIONS: usize = 200;

/// One fixture model: its file, the exact reference's file stem, and where llama.cpp's agreement
/// with that reference is recorded in `agreement.json` (`[model][key].llamacpp_vs_…`).
struct Fixture {
    file: &'static str,
    reference: &'static str,
    agreement: (&'static str, &'static str, &'static str),
}

const FIXTURES: [Fixture; 4] = [
    Fixture {
        file: "ms4-tiny-f32.gguf",
        reference: "ms4-tiny.transformers",
        agreement: ("ms4-tiny", "f32", "llamacpp_vs_transformers_f32"),
    },
    Fixture {
        file: "ms4-tiny-f32-split.gguf",
        reference: "ms4-tiny.transformers",
        agreement: ("ms4-tiny", "f32-split", "llamacpp_vs_transformers_f32"),
    },
    Fixture {
        file: "ms4-tiny256-q2k.gguf",
        reference: "ms4-tiny256-q2k.transformers-dequant",
        agreement: ("ms4-tiny256", "q2k", "llamacpp_vs_transformers_dequant"),
    },
    Fixture {
        file: "ms4-tiny256-iq2xxs.gguf",
        reference: "ms4-tiny256-iq2xxs.transformers-dequant",
        agreement: ("ms4-tiny256", "iq2xxs", "llamacpp_vs_transformers_dequant"),
    },
];

fn session(file: &str) -> Session {
    let model = Model::load_with(&model_path(file), &BackendSpec::default()).expect("model loads");
    Session::open(model, SessionOptions { kv_max: 256 }).expect("session")
}

/// The agreement of `file` with its exact reference, and llama.cpp's; returns the max |Δlogit|.
fn check_logits(f: &Fixture) -> f32 {
    let dir = data_dir().join("models");
    let prompt = json_ids(&read_json(&dir.join("prompt-shared.json")), "ids");
    let ours = session(f.file).step(&prompt).expect("prefill");
    let reference = read_f32(&dir.join(format!("{}.logits.f32", f.reference)));
    assert_eq!(ours.len(), POSITIONS * N_VOCAB);
    assert_eq!(reference.len(), ours.len());
    let (mut max, mut worst) = (0f32, 0);
    for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
        let d = (a - b).abs();
        assert!(!d.is_nan(), "{}: NaN at flat index {i}", f.file);
        if d > max {
            (max, worst) = (d, i);
        }
    }
    let agree = ours
        .chunks(N_VOCAB)
        .zip(reference.chunks(N_VOCAB))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    let (model, key, field) = f.agreement;
    let peer = &read_json(&dir.join("agreement.json"))[model][key][field];
    let peer_agree = peer["argmax_agree"].as_u64().expect("argmax_agree") as usize;
    let peer_max = peer["max_abs"].as_f64().expect("max_abs") as f32;
    eprintln!(
        "{}: top-1 {agree}/{POSITIONS} (llama.cpp {peer_agree}), max |Δlogit| {max:.3e} at \
         position {} id {} (llama.cpp {peer_max:.3e})",
        f.file,
        worst / N_VOCAB,
        worst % N_VOCAB
    );
    assert!(
        agree >= peer_agree,
        "{}: top-1 {agree} < llama.cpp's {peer_agree}",
        f.file
    );
    assert!(
        max <= peer_max,
        "{}: max |Δlogit| {max} > llama.cpp's {peer_max}",
        f.file
    );
    max
}

/// The greedy chain of `f` against the reference's, identical up to the first position whose
/// reference top-2 margin is below `max_delta`.
fn check_greedy(f: &Fixture, max_delta: f32) {
    let r = read_json(
        &data_dir()
            .join("models")
            .join(format!("{}.greedy.json", f.reference)),
    );
    let prefix = json_ids(&r, "prefix_ids");
    let expected = json_ids(&r, "generated_ids");
    let margins: Vec<f64> = r["margin"]
        .as_array()
        .expect("margins")
        .iter()
        .map(|m| m.as_f64().expect("a margin"))
        .collect();
    assert_eq!(margins.len(), expected.len());
    let params = GenerateParams {
        max_tokens: expected.len(),
        sampling: SamplingParams::default(),
        min_tokens: 0,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
        eos_ids: vec![2],
        keep_prompt_logits: false,
        logprobs: None,
    };
    let mut s = session(f.file);
    let out = generate(&mut s, &prefix, &params, None, &mut |_| {
        ControlFlow::Continue(())
    })
    .expect("generate");
    let must = margins
        .iter()
        .position(|&m| m < f64::from(max_delta))
        .unwrap_or(expected.len());
    let same = out
        .ids
        .iter()
        .zip(&expected)
        .take_while(|(a, b)| a == b)
        .count();
    eprintln!(
        "{}: greedy chain equal for {same} of {} tokens (required: {must}, the first reference \
         margin below {max_delta:.3e})",
        f.file,
        expected.len()
    );
    assert!(
        same >= must,
        "{}: greedy chain differs at token {same}, before token {must}: ours {:?}, reference {:?}",
        f.file,
        out.ids,
        expected
    );
}

#[test]
fn the_default_backend_agrees_with_the_references_at_least_as_llamacpp_does() {
    for f in &FIXTURES {
        let max = check_logits(f);
        check_greedy(f, max);
    }
}
