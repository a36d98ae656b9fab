//! Logits parity of the CPU oracle against the external references in `tests/data/models`
//! (transformers on the same weights; llama.cpp as the peer). See that folder's README for how each
//! reference was produced.

use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::engine::Model;
use aubier_runtime::generate::{generate, GenerateParams};
use aubier_runtime::sampler::{argmax, SamplingParams};
use aubier_runtime::session::{Session, SessionOptions};
use aubier_tests::{data_dir, json_ids, model_path, read_f32, read_i32, read_json};
use std::ops::ControlFlow;

const N_VOCAB: usize = 8192;

fn prompt_ids() -> Vec<u32> {
    json_ids(
        &read_json(&data_dir().join("models/prompt-shared.json")),
        "ids",
    )
}

fn prompt_logits(file: &str) -> Vec<f32> {
    let model =
        Model::load_with(&model_path(file), &BackendSpec::named("oracle")).expect("model loads");
    let mut s = Session::open(model, SessionOptions { kv_max: 256 }).expect("session");
    s.step(&prompt_ids()).expect("step")
}

/// Max |a − b| and the number of rows whose argmax agrees.
fn compare(ours: &[f32], reference: &[f32]) -> (f32, usize, usize) {
    assert_eq!(ours.len(), reference.len());
    let mut max = 0f32;
    let mut worst = 0;
    for (i, (a, b)) in ours.iter().zip(reference).enumerate() {
        let d = (a - b).abs();
        assert!(!d.is_nan(), "NaN at flat index {i}");
        if d > max {
            max = d;
            worst = i;
        }
    }
    let agree = ours
        .chunks(N_VOCAB)
        .zip(reference.chunks(N_VOCAB))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    (max, agree, worst)
}

fn check_against(file: &str, reference_file: &str) -> Vec<f32> {
    let ours = prompt_logits(file);
    let reference = read_f32(&data_dir().join("models").join(reference_file));
    let (max, agree, worst) = compare(&ours, &reference);
    eprintln!("{file} vs {reference_file}: max abs {max:.3e} (worst at position {} id {}), argmax {agree}/200",
        worst / N_VOCAB, worst % N_VOCAB);
    assert!(
        max <= 1e-4,
        "{file}: max abs diff {max} > 1e-4 at position {} id {}",
        worst / N_VOCAB,
        worst % N_VOCAB
    );
    assert_eq!(agree, 200, "{file}: argmax agreement");
    ours
}

fn greedy(file: &str, reference: &str) {
    let r = read_json(&data_dir().join("models").join(reference));
    let prefix = json_ids(&r, "prefix_ids");
    let expected = json_ids(&r, "generated_ids");
    let model =
        Model::load_with(&model_path(file), &BackendSpec::named("oracle")).expect("model loads");
    let mut s = Session::open(model, SessionOptions { kv_max: 256 }).expect("session");
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
    let out = generate(&mut s, &prefix, &params, None, &mut |_| {
        ControlFlow::Continue(())
    })
    .expect("generate");
    assert_eq!(
        out.ids, expected,
        "{file}: greedy continuation differs from {reference}"
    );
}

#[test]
fn f32_fused_and_split_match_transformers_and_each_other() {
    let fused = check_against("ms4-tiny-f32.gguf", "ms4-tiny.transformers.logits.f32");
    let split = check_against(
        "ms4-tiny-f32-split.gguf",
        "ms4-tiny.transformers.logits.f32",
    );
    let same = fused
        .iter()
        .zip(&split)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(
        same,
        "fused and split expert layouts must give bit-identical logits"
    );
}

#[test]
fn f32_greedy_chains_match_transformers() {
    greedy("ms4-tiny-f32.gguf", "ms4-tiny.transformers.greedy.json");
    greedy(
        "ms4-tiny-f32-split.gguf",
        "ms4-tiny.transformers.greedy.json",
    );
}

#[test]
fn q2k_matches_transformers_on_dequantized_weights() {
    check_against(
        "ms4-tiny256-q2k.gguf",
        "ms4-tiny256-q2k.transformers-dequant.logits.f32",
    );
    greedy(
        "ms4-tiny256-q2k.gguf",
        "ms4-tiny256-q2k.transformers-dequant.greedy.json",
    );
}

#[test]
fn iq2xxs_matches_transformers_on_dequantized_weights() {
    check_against(
        "ms4-tiny256-iq2xxs.gguf",
        "ms4-tiny256-iq2xxs.transformers-dequant.logits.f32",
    );
    greedy(
        "ms4-tiny256-iq2xxs.gguf",
        "ms4-tiny256-iq2xxs.transformers-dequant.greedy.json",
    );
}

/// Rank-level agreement with llama.cpp, which quantizes activations (so only ranks can agree).
/// Our logits equal the dequantized-weights reference to 1e-4, so our top-1 agreement with llama.cpp
/// must equal that reference's own agreement with llama.cpp, computed here from the fixture files.
/// Prints the figures reported in docs/BENCHMARKS.md.
#[test]
fn two_bit_files_agree_with_llamacpp_at_rank_level() {
    for (file, stem) in [
        ("ms4-tiny256-q2k.gguf", "ms4-tiny256-q2k"),
        ("ms4-tiny256-iq2xxs.gguf", "ms4-tiny256-iq2xxs"),
    ] {
        let ours = prompt_logits(file);
        let dir = data_dir().join("models");
        let dequant = read_f32(&dir.join(format!("{stem}.transformers-dequant.logits.f32")));
        let top_ids = read_i32(&dir.join(format!("{stem}.llamacpp.top20_ids.i32")));
        let top_logits = read_f32(&dir.join(format!("{stem}.llamacpp.top20_logits.f32")));
        let lse = read_f32(&dir.join(format!("{stem}.llamacpp.logsumexp.f32")));
        let mut ours_agree = 0;
        let mut ref_agree = 0;
        let mut max_dlogp = 0f64;
        for p in 0..200 {
            let row = &ours[p * N_VOCAB..(p + 1) * N_VOCAB];
            let llama_top = top_ids[p * 20] as u32;
            ours_agree += usize::from(argmax(row) == Some(llama_top));
            ref_agree +=
                usize::from(argmax(&dequant[p * N_VOCAB..(p + 1) * N_VOCAB]) == Some(llama_top));
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let our_lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            for r in 0..20 {
                let id = top_ids[p * 20 + r] as usize;
                let llama_lp = top_logits[p * 20 + r] as f64 - lse[p] as f64;
                let our_lp = row[id] as f64 - our_lse;
                max_dlogp = max_dlogp.max((llama_lp - our_lp).abs());
            }
        }
        eprintln!("{file} vs llama.cpp: top-1 agreement {ours_agree}/200 (dequant reference: {ref_agree}/200), max |Δ log-prob| over llama.cpp's top-20 {max_dlogp:.3}");
        assert_eq!(ours_agree, ref_agree, "{file}");
    }
}
