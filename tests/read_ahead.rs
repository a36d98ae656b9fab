//! The store's read-ahead (`--prefetch-budget`, issue 34 item 3) on the bundled model, on the
//! `oracle` and `cpu` backends (the `cpu` backend's slots hold its interleaved layout): a fast
//! store of 4 of 16 slots, a 28-token prefill, then one-token decode steps of the greedy
//! continuation, with a budget of 2 loads per layer per step.
//! * the logits are those of the run without read-ahead, bit for bit, in either mode;
//! * sync mode: the experts loaded are, per step and predicted layer, the first predicted ids
//!   that were not resident before the step (at most the budget), and the routed slots they
//!   served are |loaded ∩ routed|, both recounted here from the residents, predictions and
//!   routing the session exposes; none is late;
//! * background mode makes the same decisions (prefetches, promotions, evictions), and each
//!   routed slot of a loaded expert is served or late: its hits plus its late slots are sync's
//!   hits; its copies may outlive their step, and the routed slots of later steps that find a
//!   copy still in flight (pending) are the only other hits it loses against sync;
//! * every resident expert's slot holds the file's bytes afterwards;
//! * all of the above with the prediction one layer ahead and two (`--prefetch-lead 2`: layer
//!   2's ids predicted before layer 1's attention), and in background mode with each page-ahead
//!   ([`PageAhead`]: what else is read into the page cache changes no decision);
//! * a read-ahead never evicts an expert its step is predicted to read, under every policy
//!   that takes prefetches;
//! * a budget on a plan without predictions is refused by name.

use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::engine::Model;
use aubier_runtime::error::EngineError;
use aubier_runtime::placement::policy::PolicyKind;
use aubier_runtime::progress::Quiet;
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::expert_store::{
    ExpertStore, PageAhead, ReadAheadMode, StoreOptions, StoreReport,
};
use aubier_runtime::store::{FastBudget, StoreError};
use aubier_tests::{models_dir, shared_prompt, slots};
use std::sync::Arc;

const BUDGET: usize = 2;
const DECODE: usize = 10;

/// The bundled model on `backend`, its plan with the expert prediction `lead` layers ahead when
/// `Some`.
fn model(backend: &str, lead: Option<usize>) -> Arc<Model> {
    let path = models_dir().join("ms4-tiny256-q2k.gguf");
    let b = BackendSpec::named(backend).make().expect("backend");
    Model::load_predicting(&path, b, FastBudget::Slots(4), lead, &mut Quiet)
        .unwrap_or_else(|e| panic!("bundled model on {backend}: {e}"))
}

/// What one request did: every step's logits bits, the store's report, and the loads and
/// prefetch-served slots recounted from what the session exposes (sync mode's expectation).
struct Request {
    logits: Vec<Vec<u32>>,
    report: StoreReport,
    loads: u64,
    served: u64,
}

fn request(model: &Arc<Model>, opts: &StoreOptions) -> Request {
    let mut s = Session::open_with_store(Arc::clone(model), SessionOptions { kv_max: 64 }, opts)
        .expect("session");
    let n_vocab = model.config.n_vocab;
    let mut out = Request {
        logits: Vec::new(),
        report: StoreReport::default(),
        loads: 0,
        served: 0,
    };
    let mut next = shared_prompt()[..28].to_vec();
    for _ in 0..=DECODE {
        let before: Vec<Vec<u32>> = (0..s.expert_store().n_layers())
            .map(|i| s.expert_store().resident(i))
            .collect();
        let logits = s.step(&next).expect("step");
        out.logits
            .push(logits.iter().map(|x| x.to_bits()).collect());
        if next.len() == 1 {
            for (l, predicted) in s.predicted_ids() {
                let loaded: Vec<i32> = predicted
                    .iter()
                    .copied()
                    .filter(|&e| !before[*l].contains(&(e as u32)))
                    .take(opts.prefetch_budget)
                    .collect();
                out.loads += loaded.len() as u64;
                let routed = &s.router_ids()[*l];
                out.served += routed.iter().filter(|e| loaded.contains(e)).count() as u64;
            }
        }
        let last = &logits[logits.len() - n_vocab..];
        next = vec![aubier_runtime::sampler::argmax(last).expect("finite logits")];
    }
    out.report = s.store_report();
    check_copies(model, &s);
    out
}

/// Every resident expert's slot holds the file's bytes of each of its tensors.
fn check_copies(model: &Arc<Model>, s: &Session) {
    let bad = model.slot_mismatches(s.expert_store()).expect("read back");
    assert!(bad.is_empty(), "slots that differ from the file: {bad:?}");
}

#[test]
fn read_ahead_keeps_the_logits_and_counts_what_it_loads() {
    for (backend, lead) in [("oracle", 1), ("cpu", 1), ("oracle", 2), ("cpu", 2)] {
        let model = model(backend, Some(lead));
        let backend = format!("{backend}, lead {lead}");
        let base = request(&model, &slots(4));
        assert_eq!(
            base.report.prefetches, 0,
            "{backend}: no budget, no read-ahead"
        );
        let with = |read_ahead, page_ahead| StoreOptions {
            prefetch_budget: BUDGET,
            read_ahead,
            page_ahead,
            ..slots(4)
        };
        let sync = request(&model, &with(ReadAheadMode::Sync, PageAhead::Host));
        assert!(
            sync.logits == base.logits,
            "{backend}: sync read-ahead changed the logits"
        );

        let r = sync.report;
        assert!(sync.loads > 0, "{backend}: the read-ahead loaded nothing");
        assert_eq!(r.prefetches, sync.loads, "{backend}: sync loads");
        assert_eq!(r.prefetch_served, sync.served, "{backend}: sync served");
        assert_eq!(r.prefetch_late, 0, "{backend}: a sync copy was late");
        let moe = model.plan.moe_layers().expect("moe layers");
        let expert_bytes = moe[0].expert_bytes() as u64;
        assert!(moe.iter().all(|l| l.expert_bytes() as u64 == expert_bytes));
        assert_eq!(r.prefetch_bytes, r.prefetches * expert_bytes);
        assert!(r.fast_hits >= r.prefetch_served);
        println!(
            "{backend}: served {:.3} without read-ahead, {:.3} with ({} loads, {} of their \
             routed slots served)",
            base.report.served_fraction, r.served_fraction, r.prefetches, r.prefetch_served
        );

        assert_eq!(
            r.prefetch_pending, 0,
            "{backend}: a sync copy outlived its step"
        );
        // Every count the same (the reset's time aside).
        let untimed = |r: StoreReport| StoreReport { reset_ms: 0.0, ..r };
        for page_ahead in [PageAhead::Host, PageAhead::Off, PageAhead::All] {
            let what = format!("{backend}, page-ahead {page_ahead}");
            if page_ahead != PageAhead::Host {
                let sync_page = request(&model, &with(ReadAheadMode::Sync, page_ahead));
                assert!(sync_page.logits == base.logits, "{what}");
                assert_eq!(untimed(sync_page.report), untimed(r), "{what}, sync");
            }
            let bg = request(&model, &with(ReadAheadMode::Background, page_ahead));
            assert!(
                bg.logits == base.logits,
                "{what}: background changed the logits"
            );
            let b = bg.report;
            assert_eq!(
                (b.prefetches, b.promotions, b.evictions, b.routed),
                (r.prefetches, r.promotions, r.evictions, r.routed),
                "{what}: background made other decisions than sync"
            );
            assert_eq!(b.prefetch_served + b.prefetch_late, r.prefetch_served);
            assert_eq!(
                b.fast_hits + b.prefetch_late + b.prefetch_pending,
                r.fast_hits
            );
        }
    }
}

/// Lead 2 moves layer 2's prediction before layer 1's attention: the same logits, other
/// predictions for layer 2 (from an earlier residual), the same for layer 1 (whose lead is 1,
/// layer 0 having no residual before it); its sync loads are recounted as for lead 1 above.
#[test]
fn lead_two_predicts_layer_two_from_the_residual_before_layer_one() {
    let one = model("oracle", Some(1));
    let two = model("oracle", Some(2));
    let predicted = |m: &Arc<Model>| {
        let mut s = Session::open(Arc::clone(m), SessionOptions { kv_max: 64 }).expect("session");
        let logits = s.step(&shared_prompt()[..28]).expect("step");
        let bits: Vec<u32> = logits.iter().map(|x| x.to_bits()).collect();
        (bits, s.predicted_ids().to_vec())
    };
    let (l1, p1) = predicted(&one);
    let (l2, p2) = predicted(&two);
    assert!(l1 == l2, "the lead changed the logits");
    let layers = |p: &[(usize, Vec<i32>)]| p.iter().map(|(l, _)| *l).collect::<Vec<_>>();
    assert_eq!(layers(&p1), [1, 2]);
    assert_eq!(layers(&p2), [1, 2]);
    assert_eq!(p1[0], p2[0], "layer 1's lead is 1 either way");
    assert_ne!(
        p1[1], p2[1],
        "layer 2 predicted from the same residual at leads 1 and 2"
    );
}

#[test]
fn a_budget_needs_the_plans_predictions() {
    let model = model("oracle", None);
    let opts = StoreOptions {
        prefetch_budget: 1,
        ..slots(4)
    };
    match Session::open_with_store(model, SessionOptions { kv_max: 64 }, &opts) {
        Err(EngineError::Store(StoreError::NoPrediction)) => {}
        other => panic!("expected the NoPrediction refusal, got {:?}", other.err()),
    }
}

/// A read-ahead never evicts an expert its step is predicted to read: of the prediction
/// `[0, 5, 6]` into a layer of 2 slots seeded `[0, 1]` with a budget of 2, the member 0 is
/// pinned, so 5 takes 1's slot and 6 finds every resident pinned (without the pin, 6 would
/// have evicted 0). Every policy that takes prefetches.
#[test]
fn a_read_ahead_keeps_the_predicted_members() {
    let model = model("oracle", Some(1));
    for policy in [
        PolicyKind::TwoQ,
        PolicyKind::Lru,
        PolicyKind::Lfu,
        PolicyKind::Arc,
        PolicyKind::Lrfu,
        PolicyKind::LeCaR,
    ] {
        let opts = StoreOptions {
            prefetch_budget: BUDGET,
            policy,
            ..slots(2)
        };
        let store = ExpertStore::new(&model.plan, &opts, &mut model.slots().lock())
            .unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        assert_eq!(store.resident(1), vec![0, 1], "{policy:?}");
        let copies: Vec<u32> = store
            .read_ahead(1, &[0, 5, 6])
            .iter()
            .map(|c| c.expert)
            .collect();
        assert_eq!(copies, vec![5], "{policy:?}");
        assert_eq!(store.resident(1), vec![0, 5], "{policy:?}");
    }
}
