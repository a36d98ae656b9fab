//! Property tests of the split expert store (`aubier_runtime::store::expert_store`) on the bundled
//! 2-bit model (3 MoE layers of 16 experts, top-4): over random routing sequences, policies, slot
//! counts and seeds,
//! * the fast store never holds more than `n_res` experts per layer, and its size never exceeds
//!   the byte budget it was given;
//! * every resident slot holds exactly the file's bytes of its expert (each stacked tensor's slice),
//!   read back from the cpu backend's slots in the file's layout or, with its copies on, in the
//!   interleaved one;
//! * with one token per step, the fast hits are what an independent replay of the same policy over
//!   the same sequence counts (`Policy::access_step`: a hit is a resident expert);
//! * `reset` with `exact` returns membership and policy state to the boot state, so a sequence
//!   after a reset is served exactly as on a fresh store; with `none` the state is kept.

use aubier_runtime::backend::cpu::CpuBackend;
use aubier_runtime::engine::Model;
use aubier_runtime::placement::arc::ArcCache;
use aubier_runtime::placement::hotset::HotSet;
use aubier_runtime::placement::lecar::LeCaR;
use aubier_runtime::placement::lrfu::Lrfu;
use aubier_runtime::placement::policy::{
    Access, Lfu, Lru, Policy, PolicyKind, StaticSet, TwoQ, TwoQParams,
};
use aubier_runtime::store::expert_store::{ExpertStore, ResetMode, StoreOptions, StoreReport};
use aubier_runtime::store::{FastBudget, StoreError};
use aubier_tests::models_dir;
use proptest::prelude::*;
use std::sync::{Arc, OnceLock};

/// The bundled model on the cpu backend, every expert's slot available, its copies into the
/// interleaved layout on or off; loaded once per test binary each.
fn model(interleave: bool) -> Arc<Model> {
    static MODELS: [OnceLock<Arc<Model>>; 2] = [OnceLock::new(), OnceLock::new()];
    Arc::clone(MODELS[usize::from(interleave)].get_or_init(|| {
        let backend = Arc::new(CpuBackend::default().with_copies(interleave));
        let path = models_dir().join("ms4-tiny256-q2k.gguf");
        Model::load_backend(&path, backend, FastBudget::Slots(N_EXPERT)).expect("bundled model")
    }))
}

/// A store of `opts` over the slots of `model(interleave)`.
struct Store {
    model: Arc<Model>,
    store: ExpertStore,
}

impl Store {
    fn new(opts: &StoreOptions, interleave: bool) -> Result<Store, StoreError> {
        let model = model(interleave);
        let store = ExpertStore::new(&model.plan, opts, &mut model.slots().lock())?;
        Ok(Store { model, store })
    }

    fn observe(&mut self, ids: &[Vec<i32>], t: usize) -> Result<(), StoreError> {
        self.store.observe(ids, t, &mut self.model.slots().lock())
    }

    fn reset(&mut self) -> Result<f64, StoreError> {
        self.store.reset(&mut self.model.slots().lock())
    }
}

const N_EXPERT: usize = 16;
const TOP_K: usize = 4;

/// One step's routing: `[n_layers][t × TOP_K]`, each token's ids distinct.
type Step = Vec<Vec<i32>>;

/// `t` tokens of routing for 3 layers, each token a random set of `TOP_K` distinct experts drawn
/// with a skew (low ids likelier) so that rotation has something to find.
fn step(t: usize) -> impl Strategy<Value = Step> {
    let token =
        prop::collection::btree_set(prop_oneof![3 => 0i32..6, 1 => 0i32..N_EXPERT as i32], TOP_K)
            .prop_map(|s| s.into_iter().collect::<Vec<i32>>())
            .prop_shuffle();
    prop::collection::vec(prop::collection::vec(token, t), 3)
        .prop_map(|layers| layers.into_iter().map(|toks| toks.concat()).collect())
}

fn steps(max_t: usize, max_len: usize) -> impl Strategy<Value = Vec<(usize, Step)>> {
    prop::collection::vec(
        (1..=max_t).prop_flat_map(|t| step(t).prop_map(move |s| (t, s))),
        1..max_len,
    )
}

fn policy_kind() -> impl Strategy<Value = PolicyKind> {
    prop_oneof![
        Just(PolicyKind::TwoQ),
        Just(PolicyKind::Lru),
        Just(PolicyKind::Lfu),
        Just(PolicyKind::Static),
        Just(PolicyKind::Arc),
        Just(PolicyKind::Lrfu),
        Just(PolicyKind::LeCaR),
    ]
}

fn options() -> impl Strategy<Value = (StoreOptions, bool)> {
    (
        policy_kind(),
        0..=N_EXPERT,
        0.0f64..1.0,
        0.0f64..1.5,
        prop::option::of(0usize..3),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(policy, n_res, a1in, a1out, max_promotions, seeded, interleave)| {
                let resident_set = seeded.then(|| HotSet {
                    layers: (0..3)
                        .map(|l| (0..N_EXPERT as u32).rev().skip(l).collect())
                        .collect(),
                });
                let opts = StoreOptions {
                    budget: FastBudget::Slots(n_res),
                    resident_set,
                    policy,
                    a1in,
                    a1out,
                    max_promotions,
                    admission: TwoQParams::DEFAULT_ADMISSION,
                    reset: ResetMode::Exact,
                    ..StoreOptions::default()
                };
                (opts, interleave)
            },
        )
}

/// Asserts the store's invariants: at most `n_res` residents per layer, every slot's bytes,
/// read back, equal to the file's.
fn check_store(s: &Store) -> Result<(), TestCaseError> {
    let moe = s.model.plan.moe_layers().expect("moe layers");
    for (i, layer) in moe.iter().enumerate() {
        let resident = s.store.resident(i);
        prop_assert!(resident.len() <= s.store.n_res(), "layer {i}: {resident:?}");
        let n = layer.tensors.len();
        // gate/up (fused, or split in two) and down: two or three tensors per resident expert
        prop_assert!(n == 2 || n == 3, "layer {i}: {n} tensors");
        let copies = s
            .store
            .copies(i, &mut s.model.slots().lock(), n)
            .expect("read back");
        prop_assert_eq!(copies.len(), n * resident.len());
        for (e, t, fast) in copies {
            let tensor = layer.tensors[t];
            let view = s.model.weight_view(tensor.weight).expect("view");
            let at = e as usize * tensor.expert_bytes;
            prop_assert!(
                fast.as_slice() == &view[at..at + tensor.expert_bytes],
                "layer {i} expert {e} tensor {t}: copy differs"
            );
        }
    }
    Ok(())
}

/// The boot-comparable state: each layer's residents and its policy snapshot (Debug form).
fn state(s: &Store) -> Vec<(Vec<u32>, String)> {
    (0..s.store.n_layers())
        .map(|i| {
            (
                s.store.resident(i),
                format!("{:?}", s.store.policy_snapshot(i)),
            )
        })
        .collect()
}

fn run(store: &mut Store, seq: &[(usize, Step)]) -> Result<StoreReport, TestCaseError> {
    for (t, s) in seq {
        store.observe(s, *t).expect("observe");
        check_store(store)?;
    }
    Ok(store.store.report())
}

/// The policy `opts` builds for `layer`, built here from the policy module directly.
fn reference_policy(opts: &StoreOptions, layer: usize) -> Option<Box<dyn Policy>> {
    let n_res = match opts.budget {
        FastBudget::Slots(n) => n,
        _ => unreachable!("the tests give slots"),
    };
    if n_res == 0 {
        return None;
    }
    let identity: Vec<u32> = (0..n_res as u32).collect();
    let seed = match &opts.resident_set {
        Some(h) => h.seed(layer, n_res).to_vec(),
        None => identity,
    };
    let n = N_EXPERT as u32;
    Some(match opts.policy {
        PolicyKind::TwoQ => Box::new(
            TwoQ::new(
                n,
                TwoQParams::from_fractions(
                    n_res,
                    opts.a1in,
                    opts.a1out,
                    opts.max_promotions,
                    opts.admission,
                )
                .expect("fractions"),
                &seed,
            )
            .expect("2q"),
        ),
        PolicyKind::Lru => Box::new(Lru::new(n, n_res, &seed).expect("lru")),
        PolicyKind::Lfu => Box::new(Lfu::new(n, n_res, &seed).expect("lfu")),
        PolicyKind::Arc => Box::new(ArcCache::new(n, n_res, &seed).expect("arc")),
        PolicyKind::Lrfu => {
            Box::new(Lrfu::new(n, n_res, Lrfu::DEFAULT_LAMBDA, &seed).expect("lrfu"))
        }
        PolicyKind::LeCaR => Box::new(LeCaR::new(n, n_res, &seed).expect("lecar")),
        _ => Box::new(StaticSet::new(n, n_res, &seed).expect("static")),
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn budget_and_bytes_hold_over_random_routing((opts, il) in options(), seq in steps(5, 24)) {
        let mut store = Store::new(&opts, il).expect("store");
        check_store(&store)?;
        let FastBudget::Slots(n_res) = opts.budget else { unreachable!() };
        prop_assert_eq!(store.store.n_res(), n_res);
        let report = run(&mut store, &seq)?;
        let routed: usize = seq.iter().map(|(_, s)| s.iter().map(Vec::len).sum::<usize>()).sum();
        prop_assert_eq!(report.routed, routed as u64);
        prop_assert!(report.fast_hits <= report.routed);
        if n_res == 0 {
            prop_assert_eq!((report.fast_hits, report.fast_bytes), (0, 0));
        }
        if n_res == N_EXPERT && opts.resident_set.is_none() {
            // every expert resident from boot (the seeded lists are shorter than 16 past layer 0)
            prop_assert_eq!(report.fast_hits, report.routed);
            prop_assert_eq!(report.promotions, 0);
        }
    }

    #[test]
    fn byte_budget_is_never_exceeded(budget in 0u64..8_000_000, seq in steps(3, 12)) {
        let opts = StoreOptions { budget: FastBudget::Bytes(budget), ..StoreOptions::default() };
        let mut store = Store::new(&opts, true).expect("store");
        let fast = store.store.fast_bytes();
        prop_assert!(fast <= budget, "{fast} > {budget}");
        // One more slot per layer would not fit (unless every expert is resident already).
        let n_res = store.store.n_res();
        if n_res < N_EXPERT {
            let per_slot = if n_res > 0 { fast / n_res as u64 } else {
                let one = StoreOptions { budget: FastBudget::Slots(1), ..StoreOptions::default() };
                Store::new(&one, true).expect("store").store.fast_bytes()
            };
            prop_assert!(fast + per_slot > budget);
        }
        run(&mut store, &seq)?;
    }

    #[test]
    fn decode_steps_serve_as_the_policy_replays((opts, il) in options(), seq in steps(1, 32)) {
        let mut store = Store::new(&opts, il).expect("store");
        let report = run(&mut store, &seq)?;
        let mut hits = 0u64;
        let mut out = Vec::new();
        for layer in 0..3 {
            let Some(mut p) = reference_policy(&opts, layer) else { continue };
            for (_, s) in &seq {
                let ids: Vec<u32> = s[layer].iter().map(|&e| e as u32).collect();
                p.access_step(&ids, &mut out).expect("access");
                hits += out.iter().filter(|a| **a == Access::Hit).count() as u64;
            }
        }
        prop_assert_eq!(report.fast_hits, hits);
    }

    #[test]
    fn exact_reset_returns_to_boot((opts, il) in options(), a in steps(4, 16), b in steps(4, 16)) {
        let mut fresh = Store::new(&opts, il).expect("store");
        let boot = state(&fresh);
        let want = run(&mut fresh, &b)?;

        let mut store = Store::new(&opts, il).expect("store");
        run(&mut store, &a)?;
        store.reset().expect("reset");
        prop_assert_eq!(state(&store), boot);
        prop_assert_eq!(store.store.report().routed, 0);
        let got = run(&mut store, &b)?;
        prop_assert_eq!(
            (got.fast_hits, got.routed, got.promotions),
            (want.fast_hits, want.routed, want.promotions)
        );
    }

    #[test]
    fn none_reset_keeps_the_state((opts, il) in options(), a in steps(4, 16)) {
        let opts = StoreOptions { reset: ResetMode::None, ..opts };
        let mut store = Store::new(&opts, il).expect("store");
        run(&mut store, &a)?;
        let before = state(&store);
        let ms = store.reset().expect("reset");
        prop_assert_eq!(ms, 0.0);
        prop_assert_eq!(state(&store), before);
        prop_assert_eq!(store.store.report().routed, 0);
    }
}

#[test]
fn bad_options_are_errors() {
    let too_many = StoreOptions {
        budget: FastBudget::Slots(17),
        ..StoreOptions::default()
    };
    let e = Store::new(&too_many, true)
        .map(|_| ())
        .expect_err("17 > 16");
    assert_eq!(
        e.to_string(),
        "--n-res 17 exceeds the 16 experts of a layer"
    );
    let min = StoreOptions {
        policy: PolicyKind::Min,
        ..StoreOptions::default()
    };
    assert!(Store::new(&min, true)
        .map(|_| ())
        .expect_err("min")
        .to_string()
        .contains("offline"));
    let hot = StoreOptions {
        resident_set: Some(HotSet {
            layers: vec![vec![0]; 2],
        }),
        ..StoreOptions::default()
    };
    assert!(Store::new(&hot, true)
        .map(|_| ())
        .expect_err("2 layers")
        .to_string()
        .contains("2 layers"));
    let mut ok = Store::new(&StoreOptions::default(), true).expect("store");
    let bad = vec![vec![0, 1, 2, 16], vec![0, 1, 2, 3], vec![0, 1, 2, 3]];
    assert!(ok.observe(&bad, 1).is_err());
    let twice = vec![vec![0, 1, 2, 2], vec![0, 1, 2, 3], vec![0, 1, 2, 3]];
    let two_slots = StoreOptions {
        budget: FastBudget::Slots(2),
        ..StoreOptions::default()
    };
    let mut s = Store::new(&two_slots, true).expect("store");
    assert!(s.observe(&twice, 1).is_err());
}
