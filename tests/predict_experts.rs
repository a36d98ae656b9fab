//! The engine's expert predictor (`predict_experts`: every MoE layer `L ≥ 1`'s router applied to
//! the residual before its attention) on the bundled model, on the `oracle`, `cpu` and `vulkan`
//! backends (lavapipe in CI; a machine without a Vulkan device fails, it does not skip):
//! * the logits of a 200-token prefill and of decode steps are those of the plan without the
//!   predictor, bit for bit, on each backend;
//! * the predicted ids are the same on the three backends;
//! * the session's recall is |predicted ∩ routed| ÷ k over tokens and layers, recomputed here
//!   from the predicted and routed ids the session returns.
//!
//! The recall is printed (`-- --nocapture`); random or tiny weights say nothing about the recall
//! on a trained model (docs/BENCHMARKS.md § issue 34).

use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::engine::Model;
use aubier_runtime::progress::Quiet;
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::FastBudget;
use aubier_tests::{data_dir, json_ids, models_dir, read_json};
use std::collections::HashSet;

const BACKENDS: [&str; 3] = ["oracle", "cpu", "vulkan"];

fn session(backend: &str, predict: bool) -> Session {
    let path = models_dir().join("ms4-tiny256-q2k.gguf");
    let b = BackendSpec::named(backend).make().expect("backend");
    let model =
        Model::load_predicting(&path, b, FastBudget::Auto, predict.then_some(1), &mut Quiet)
            .unwrap_or_else(|e| panic!("bundled model on {backend}: {e}"));
    Session::open(model, SessionOptions { kv_max: 256 }).expect("session")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One step's run: its logits, predicted ids, and (hits, slots) recounted from the ids.
struct Run {
    logits: Vec<Vec<u32>>,
    predicted: Vec<Vec<(usize, Vec<i32>)>>,
    counted: (u64, u64),
}

/// The 200-token prompt, then 4 one-token decode steps of its greedy continuation.
fn drive(s: &mut Session, k: usize) -> Run {
    let prompt = json_ids(
        &read_json(&data_dir().join("models/prompt-shared.json")),
        "ids",
    );
    let mut run = Run {
        logits: Vec::new(),
        predicted: Vec::new(),
        counted: (0, 0),
    };
    let mut next = prompt;
    for _ in 0..5 {
        let logits = s.step(&next).expect("step");
        let n_vocab = s.model().config.n_vocab;
        let last = &logits[logits.len() - n_vocab..];
        let top = aubier_runtime::sampler::argmax(last).expect("finite logits");
        run.logits.push(bits(&logits));
        for (l, pred) in s.predicted_ids() {
            let routed = &s.router_ids()[*l];
            assert_eq!(pred.len(), routed.len(), "layer {l}");
            for (p, r) in pred.chunks(k).zip(routed.chunks(k)) {
                let r: HashSet<i32> = r.iter().copied().collect();
                let p: HashSet<i32> = p.iter().copied().collect();
                assert_eq!(p.len(), k, "a top-k row without repeats");
                run.counted.0 += p.intersection(&r).count() as u64;
                run.counted.1 += k as u64;
            }
        }
        run.predicted.push(s.predicted_ids().to_vec());
        next = vec![top];
    }
    run
}

#[test]
fn predictions_agree_across_backends_and_leave_the_logits_alone() {
    let mut predicted = Vec::new();
    for backend in BACKENDS {
        let mut plain = session(backend, false);
        let mut pred = session(backend, true);
        let k = pred.model().config.n_expert_used;
        let n_layer = pred.model().config.n_layer;
        assert!(plain.prediction_report().is_none());
        let base = drive(&mut plain, k);
        assert!(base.predicted.iter().all(Vec::is_empty));
        let got = drive(&mut pred, k);
        assert_eq!(got.logits, base.logits, "{backend}: logits changed");
        for step in &got.predicted {
            let layers: Vec<usize> = step.iter().map(|(l, _)| *l).collect();
            assert_eq!(layers, (1..n_layer).collect::<Vec<_>>(), "{backend}");
        }
        let report = pred.prediction_report().expect("a report");
        assert_eq!((report.hits, report.slots), got.counted, "{backend}");
        assert_eq!(report.slots, (204 * k * (n_layer - 1)) as u64);
        assert!(report.recall > 0.0 && report.recall <= 1.0);
        assert_eq!(report.recall, got.counted.0 as f64 / got.counted.1 as f64);
        println!(
            "{backend}: recall {:.4} ({} of {} routed slots, layers 1..{n_layer})",
            report.recall, report.hits, report.slots
        );
        pred.reset();
        let zero = pred.prediction_report().expect("a report");
        assert_eq!((zero.hits, zero.slots, zero.recall), (0, 0, 0.0));
        predicted.push((backend, got.predicted));
    }
    let (first, want) = &predicted[0];
    for (backend, got) in &predicted[1..] {
        assert_eq!(got, want, "{backend}'s predicted ids differ from {first}'s");
    }
}
