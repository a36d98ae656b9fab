//! The `vulkan` backend end to end on a real Vulkan device — lavapipe in CI, which installs it,
//! so a machine without a Vulkan device fails these tests instead of skipping them — against
//! the external references of `tests/data/models` (transformers), on every fixture model, with
//! the GPU fusions on and with each fusion flag off:
//! * max |Δlogit| ≤ 1e-4 over the 200 prompt positions, top-1 agreement 200/200;
//! * the 32-token greedy chain identical to the reference's.
//!
//! And the bundled model's greedy ids through `--backend vulkan` equal the oracle's; a router
//! of NaN weights (no expert selected: top-k writes −1) is refused with the expert-id error of the
//! host backends, not read outside the expert table.
//!
//! The figures are printed (`cargo test -p aubier-tests --test vulkan_backend -- --nocapture`).

use aubier_compiler::{compile, CompileOptions, Fusion, Target};
use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::backend::ExecError;
use aubier_runtime::engine::Model;
use aubier_runtime::error::EngineError;
use aubier_runtime::generate::{generate, GenerateParams};
use aubier_runtime::gguf::write::GgufWriter;
use aubier_runtime::gguf::GgufFile;
use aubier_runtime::model::{read_config, weight_refs};
use aubier_runtime::sampler::{argmax, SamplingParams};
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::FastBudget;
use aubier_tests::{data_dir, json_ids, model_path, read_f32, read_json};
use std::ops::ControlFlow;
use std::sync::Arc;

const N_VOCAB: usize = 8192;
const POSITIONS: usize = 200;
const MAX_DELTA: f32 = 1e-4;

/// The vulkan backend on the first device (lavapipe in CI).
fn vulkan() -> BackendSpec {
    BackendSpec::named("vulkan")
}

/// Fixture files and the stems of their exact references.
const FIXTURES: [(&str, &str); 4] = [
    ("ms4-tiny-f32.gguf", "ms4-tiny.transformers"),
    ("ms4-tiny-f32-split.gguf", "ms4-tiny.transformers"),
    (
        "ms4-tiny256-q2k.gguf",
        "ms4-tiny256-q2k.transformers-dequant",
    ),
    (
        "ms4-tiny256-iq2xxs.gguf",
        "ms4-tiny256-iq2xxs.transformers-dequant",
    ),
];

/// `file` compiled for the GPU target with the fusion flags `(phase, wkb, kqkv)` and bound to
/// the Vulkan backend.
fn model(file: &str, (phase, wkb, kqkv): (Fusion, Fusion, Fusion)) -> Arc<Model> {
    let gguf = Arc::new(GgufFile::open(model_path(file)).expect("fixture"));
    let cfg = read_config(&gguf).expect("config");
    let refs = weight_refs(&gguf, &cfg).expect("weights");
    let opts = CompileOptions {
        target: Target::Gpu,
        fuse_phase: phase,
        fuse_wkb: wkb,
        fuse_kqkv: kqkv,
        ..CompileOptions::default()
    };
    let plan = compile(&cfg, &refs, &opts).expect("compile");
    let backend = vulkan().make().expect("the vulkan backend");
    Model::from_plan(gguf, cfg, plan, backend, FastBudget::Auto)
        .unwrap_or_else(|e| panic!("{file} on the vulkan backend: {e}"))
}

fn session(model: Arc<Model>) -> Session {
    Session::open(model, SessionOptions { kv_max: 256 }).expect("session")
}

/// The prompt's logits against the reference: max |Δlogit| and top-1 agreement.
fn check_logits(model: Arc<Model>, file: &str, reference: &str, what: &str) {
    let dir = data_dir().join("models");
    let prompt = json_ids(&read_json(&dir.join("prompt-shared.json")), "ids");
    let ours = session(model).step(&prompt).expect("prefill");
    let want = read_f32(&dir.join(format!("{reference}.logits.f32")));
    assert_eq!(ours.len(), POSITIONS * N_VOCAB);
    assert_eq!(want.len(), ours.len());
    let (mut max, mut worst) = (0f32, 0);
    for (i, (a, b)) in ours.iter().zip(&want).enumerate() {
        let d = (a - b).abs();
        assert!(!d.is_nan(), "{file} ({what}): NaN at flat index {i}");
        if d > max {
            (max, worst) = (d, i);
        }
    }
    let agree = ours
        .chunks(N_VOCAB)
        .zip(want.chunks(N_VOCAB))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    eprintln!(
        "{file} ({what}): top-1 {agree}/{POSITIONS}, max |Δlogit| {max:.3e} at position {} id {}",
        worst / N_VOCAB,
        worst % N_VOCAB
    );
    assert!(max <= MAX_DELTA, "{file} ({what}): max |Δlogit| {max}");
    assert_eq!(agree, POSITIONS, "{file} ({what}): top-1 agreement");
}

/// The 32-token greedy chain against the reference's.
fn check_greedy(model: Arc<Model>, file: &str, reference: &str, what: &str) {
    let r = read_json(
        &data_dir()
            .join("models")
            .join(format!("{reference}.greedy.json")),
    );
    let prefix = json_ids(&r, "prefix_ids");
    let expected = json_ids(&r, "generated_ids");
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
    let mut s = session(model);
    let out = generate(&mut s, &prefix, &params, None, &mut |_| {
        ControlFlow::Continue(())
    })
    .expect("generate");
    assert_eq!(out.ids, expected, "{file} ({what}): greedy chain");
}

#[test]
fn vulkan_agrees_with_the_references_on_every_fixture_model() {
    let on = (Fusion::Auto, Fusion::Auto, Fusion::Auto);
    for (file, reference) in FIXTURES {
        let m = model(file, on);
        check_logits(Arc::clone(&m), file, reference, "fusions on");
        check_greedy(m, file, reference, "fusions on");
    }
}

#[test]
fn vulkan_agrees_with_the_references_with_each_fusion_off() {
    let (a, o) = (Fusion::Auto, Fusion::Off);
    for (flags, what) in [
        ((o, a, a), "phase off"),
        ((a, o, a), "wkb off"),
        ((a, a, o), "kqkv off"),
    ] {
        for (file, reference) in FIXTURES {
            let m = model(file, flags);
            check_logits(Arc::clone(&m), file, reference, what);
            check_greedy(m, file, reference, what);
        }
    }
}

/// The bundled model's greedy continuation through the Vulkan backend equals the oracle's, its
/// decode steps replay one recorded command buffer, and a session's second request (after a
/// reset) repeats it: the device's latent cache is cleared.
#[test]
fn vulkan_greedy_ids_equal_the_oracles_on_the_bundled_model() {
    let file = "ms4-tiny256-q2k.gguf";
    let params = GenerateParams {
        max_tokens: 24,
        sampling: SamplingParams::default(),
        min_tokens: 0,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
        eos_ids: vec![2],
        keep_prompt_logits: false,
        logprobs: None,
    };
    let prompt = [1u32, 17, 4096, 8000, 3, 99, 512];
    let ids = |backend: BackendSpec, twice: bool| {
        let m = Model::load_with(&model_path(file), &backend).expect("model");
        let mut s = session(m);
        let go = |s: &mut Session| {
            generate(
                s,
                &prompt,
                &params,
                None,
                &mut |_| ControlFlow::Continue(()),
            )
            .expect("generate")
            .ids
        };
        let first = go(&mut s);
        if backend.name == "vulkan" {
            // The prefill and the first decode step record; every later step replays.
            let c = s.counters();
            assert_eq!((c.steps, c.recordings), (params.max_tokens as u64, 2));
        }
        if twice {
            s.reset();
            assert_eq!(go(&mut s), first, "the second request repeats the first");
        }
        first
    };
    assert_eq!(
        ids(vulkan(), true),
        ids(BackendSpec::named("oracle"), false)
    );
}

#[test]
fn a_nan_router_on_the_device_is_an_expert_id_error() {
    let file = GgufFile::open(model_path("ms4-tiny256-q2k.gguf")).expect("fixture");
    let mut w = GgufWriter::from_file(&file);
    let router = w
        .tensors
        .iter_mut()
        .find(|t| t.name == b"blk.0.ffn_gate_inp.weight")
        .expect("layer 0's router");
    router.data = f32::NAN.to_le_bytes().repeat(router.data.len() / 4);
    let path = std::env::temp_dir().join(format!("aubier-nan-router-{}.gguf", std::process::id()));
    std::fs::write(&path, w.finish()).expect("write");
    let m = Model::load_with(&path, &vulkan()).expect("model");
    let _ = std::fs::remove_file(&path);
    let mut s = session(m);
    match s.step(&[1, 17, 4096]) {
        Err(EngineError::Exec(ExecError::Index {
            op: "top_k",
            what: "expert id of layer",
            id: -1,
            ..
        })) => {}
        other => panic!("expected the expert-id error, got {other:?}"),
    }
    assert_eq!(
        s.position(),
        0,
        "a refused step leaves the session where it was"
    );
}

/// A prefill (its weight products in the tiled mat-mat form) gives the bits of the same tokens
/// stepped one at a time (the mat-vec form) at every position, on the bundled quantized model:
/// the binding's `one_token_matches_prefill` holds on the device; and a run for the last
/// position's logits alone (`step_last`) gives the last row of the whole run's.
#[test]
fn vulkan_prefill_logits_equal_one_token_steps_bit_for_bit() {
    let file = "ms4-tiny256-q2k.gguf";
    let on = (Fusion::Auto, Fusion::Auto, Fusion::Auto);
    let dir = data_dir().join("models");
    let prompt = json_ids(&read_json(&dir.join("prompt-shared.json")), "ids");
    let prompt = &prompt[..13];
    let m = model(file, on);
    let all = session(Arc::clone(&m)).step(prompt).expect("prefill");
    // The last position alone (the last layer's FFN, the final norm and the head for that row,
    // `Plan::last_rows`): the last row of the whole prefill, then of a whole second step.
    let mut s = session(Arc::clone(&m));
    let last = s.step_last(&prompt[..9]).expect("step_last");
    let next = s.step_last(&prompt[9..]).expect("step_last");
    let mut whole = session(Arc::clone(&m));
    let first = whole.step(&prompt[..9]).expect("prefill");
    for (got, want) in [
        (&last, &first[8 * N_VOCAB..]),
        (&next, &all[12 * N_VOCAB..]),
    ] {
        assert_eq!(got.len(), N_VOCAB);
        assert!(
            got.iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "step_last is not the last row of step"
        );
    }
    let mut s = session(m);
    for (p, &id) in prompt.iter().enumerate() {
        let one = s.step(&[id]).expect("decode");
        let want = &all[p * N_VOCAB..(p + 1) * N_VOCAB];
        assert_eq!(one.len(), N_VOCAB);
        for (i, (a, b)) in one.iter().zip(want).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "position {p} id {i}: one token {a:e}, prefill {b:e}"
            );
        }
    }
}

/// With the device's timestamps on, every launch names the plan weights bound to it (what
/// `aubier bench` turns into each kernel's GB/s): each one a weight operand of its own step, and
/// together every weight the plan's steps read.
#[test]
fn vulkan_kernel_times_name_the_weights_each_launch_reads() {
    let m = Model::load_with(&model_path("ms4-tiny256-q2k.gguf"), &vulkan()).expect("model");
    let plan = Arc::clone(&m.plan);
    let mut s = session(m);
    s.profile(true).expect("timestamps on lavapipe");
    s.step(&[1, 17, 4096]).expect("prefill");
    s.step(&[8000]).expect("decode");
    let times = s.counters().times;
    let mut read = vec![false; plan.weights.len()];
    for k in &times {
        let own: Vec<usize> = plan.steps[k.step].weights().collect();
        for &w in &k.weights {
            assert!(
                own.contains(&w),
                "{} binds weight {w} of another step",
                k.kernel
            );
            read[w] = true;
        }
    }
    for (step, st) in plan.steps.iter().enumerate() {
        for w in st.weights() {
            assert!(
                read[w],
                "step {step} reads {} yet no launch names it",
                plan.weights[w].name
            );
        }
    }
}
