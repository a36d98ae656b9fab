//! The split expert store on the `vulkan` backend, on a real Vulkan device — lavapipe in CI,
//! which installs it (it imports host memory: `VK_EXT_external_memory_host`), so a machine
//! without a Vulkan device fails these tests instead of skipping them — on the bundled 2-bit
//! model (3 MoE layers of 16 experts, top-4):
//! * the logits of two requests (a prefill, decode steps, then a prompt that keeps a cached
//!   prefix) are bitwise identical whatever the placement — no slot, every expert resident, a
//!   static seeded set, 2Q rotating, LRU rotating — and not vacuously: each rotating case
//!   promotes, evicts, reads from the host store and serves a fraction strictly between 0 and 1;
//! * every resident expert's slot holds the file's bytes; `--reset exact` serves a second
//!   request as a fresh boot, `none` does not;
//! * the host store is the file imported, with no device copy of the experts; the forced host
//!   copy (`--host-store copy`) gives the same logits and reports its bytes; the forced staging
//!   (`--host-store stage`: nothing imported) gives the same logits while rotating, and uploads
//!   exactly the distinct routed experts of each step and layer when none is resident;
//! * over random budgets and routings the fast store's device memory never exceeds the budget,
//!   counted from the backend's own allocation records, while the experts exceed it.

use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::backend::{MemoryUse, Obtained, RunCounters};
use aubier_runtime::engine::Model;
use aubier_runtime::placement::hotset::HotSet;
use aubier_runtime::placement::policy::PolicyKind;
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::expert_store::{ResetMode, StoreOptions, StoreReport};
use aubier_runtime::store::FastBudget;
use aubier_tests::{models_dir, shared_prompt, slots};
use proptest::prelude::*;
use std::sync::{Arc, OnceLock};

/// The bundled model on the vulkan backend, its host store reached as `host`, with a fast store
/// of `budget`.
fn load(host: &str, budget: FastBudget) -> Arc<Model> {
    let spec = BackendSpec::named("vulkan").with("host-store", host);
    let path = models_dir().join("ms4-tiny256-q2k.gguf");
    let backend = spec
        .make()
        .unwrap_or_else(|e| panic!("these tests need a Vulkan device (CI installs lavapipe): {e}"));
    Model::load_backend(&path, backend, budget)
        .unwrap_or_else(|e| panic!("the bundled model on the vulkan backend: {e}"))
}

/// The model with a slot for every expert, its host store imported; loaded once.
fn model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| load("import", FastBudget::Slots(16))))
}

/// Two requests with the prompt cache on: a 12-token prefill and 8 decode steps, then a prompt
/// of the first 16 ids (it keeps a cached prefix) and 4 decode steps. The logits' bits and the
/// two requests' store reports, summed.
fn requests(model: Arc<Model>, store: &StoreOptions) -> (Vec<u32>, StoreReport) {
    let (logits, report, _) = counted_requests(model, store);
    (logits, report)
}

/// [`requests`], with the session's run counters.
fn counted_requests(
    model: Arc<Model>,
    store: &StoreOptions,
) -> (Vec<u32>, StoreReport, RunCounters) {
    let ids = shared_prompt();
    let mut s =
        Session::open_with_store(model, SessionOptions { kv_max: 64 }, store).expect("session");
    s.set_prompt_cache(true);
    let mut logits = Vec::new();
    let mut served = StoreReport::default();
    for (prompt, decode) in [(&ids[..12], &ids[12..20]), (&ids[..16], &ids[16..20])] {
        let kept = s.start_request(prompt);
        logits.extend(s.step(&prompt[kept..]).expect("prefill"));
        for &id in decode {
            logits.extend(s.step(&[id]).expect("decode"));
        }
        let r = s.store_report();
        served.routed += r.routed;
        served.fast_hits += r.fast_hits;
        served.promotions += r.promotions;
        served.evictions += r.evictions;
        served.host_bytes += r.host_bytes;
    }
    served.served_fraction = served.fast_hits as f64 / served.routed.max(1) as f64;
    let bits = logits.iter().map(|x| x.to_bits()).collect();
    (bits, served, s.counters())
}

#[test]
fn logits_on_the_device_do_not_depend_on_placement() {
    let (want, none) = requests(model(), &slots(0));
    assert_eq!((none.fast_hits, none.promotions), (0, 0));
    assert!(none.host_bytes > 0);
    let (all, every) = requests(model(), &slots(16));
    assert!(all == want, "every expert resident");
    assert_eq!(every.fast_hits, every.routed);
    let seeded = StoreOptions {
        resident_set: Some(HotSet {
            layers: vec![
                vec![15, 9, 3, 7, 1],
                vec![2, 4, 6, 8, 10],
                vec![11, 0, 5, 13, 14],
            ],
        }),
        policy: PolicyKind::Static,
        ..slots(5)
    };
    let (got, r) = requests(model(), &seeded);
    assert!(got == want, "a static seeded set");
    assert!(r.fast_hits > 0 && r.fast_hits < r.routed, "{r:?}");
    for (name, opts) in [
        (
            "2q",
            StoreOptions {
                a1in: 0.0,
                a1out: 1.0,
                ..slots(4)
            },
        ),
        (
            "lru",
            StoreOptions {
                policy: PolicyKind::Lru,
                ..slots(4)
            },
        ),
    ] {
        let (got, r) = requests(model(), &opts);
        assert!(got == want, "{name}: the logits changed with the placement");
        assert!(r.promotions > 0 && r.evictions > 0, "{name}: {r:?}");
        assert!(
            r.host_bytes > 0,
            "{name}: no read from the host store: {r:?}"
        );
        assert!(
            r.served_fraction > 0.0 && r.served_fraction < 1.0,
            "{name}: {r:?}"
        );
    }
}

#[test]
fn resident_slots_hold_the_files_bytes_and_reset_exact_is_a_fresh_boot() {
    let m = model();
    let ids = shared_prompt();
    let rotating = |reset| StoreOptions {
        a1in: 0.0,
        a1out: 1.0,
        reset,
        ..slots(4)
    };
    let run = |s: &mut Session, ids: &[u32]| {
        s.reset();
        let mut out = s.step(&ids[..8]).expect("prefill");
        for &id in &ids[8..14] {
            out.extend(s.step(&[id]).expect("decode"));
        }
        (
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            s.store_report(),
        )
    };
    let open = |opts: &StoreOptions| {
        Session::open_with_store(Arc::clone(&m), SessionOptions { kv_max: 64 }, opts)
            .expect("session")
    };
    let (_, fresh) = run(&mut open(&rotating(ResetMode::Exact)), &ids[40..]);
    for reset in [ResetMode::Exact, ResetMode::None] {
        let mut s = open(&rotating(reset));
        let (_, first) = run(&mut s, &ids);
        assert!(first.promotions > 0, "{first:?}");
        let (_, second) = run(&mut s, &ids[40..]);
        let same = (second.fast_hits, second.promotions) == (fresh.fast_hits, fresh.promotions);
        assert_eq!(
            same,
            reset == ResetMode::Exact,
            "{reset}: {second:?} vs {fresh:?}"
        );
        let moe = m.plan.moe_layers().expect("moe layers");
        let store = s.expert_store();
        for (i, layer) in moe.iter().enumerate() {
            let copies = store
                .copies(i, &mut m.slots().lock(), layer.tensors.len())
                .expect("read back");
            assert_eq!(copies.len(), store.resident(i).len() * layer.tensors.len());
            for (e, t, bytes) in copies {
                let tensor = layer.tensors[t];
                let view = m.weight_view(tensor.weight).expect("view");
                let at = e as usize * tensor.expert_bytes;
                assert!(
                    bytes == view[at..at + tensor.expert_bytes],
                    "layer {i} expert {e} tensor {t}: the slot differs from the file"
                );
            }
        }
    }
}

/// Bytes of the memory uses whose name starts with `what`, obtained as `how`.
fn memory(m: &Model, what: &str, how: Obtained) -> u64 {
    let uses: Vec<MemoryUse> = m.loaded().memory();
    uses.iter()
        .filter(|u| u.what.starts_with(what) && u.obtained == how)
        .map(|u| u.bytes)
        .sum()
}

/// Bytes of every stacked expert tensor of `m`.
fn expert_bytes(m: &Model) -> u64 {
    let moe = m.plan.moe_layers().expect("moe layers");
    moe.iter()
        .flat_map(|l| &l.tensors)
        .map(|t| m.weight_view(t.weight).expect("view").len() as u64)
        .sum()
}

#[test]
fn the_host_store_is_the_file_imported_and_the_forced_copy_works() {
    let imported = load("import", FastBudget::Slots(0));
    let experts = expert_bytes(&imported);
    let host = memory(&imported, "host store (import)", Obtained::Imported);
    assert!(
        host >= experts,
        "{host} bytes imported for {experts} of experts"
    );
    let allocated = memory(&imported, "all device allocations", Obtained::Allocated);
    let dense = memory(&imported, "dense weights", Obtained::Allocated);
    assert!(
        allocated < dense + experts / 4,
        "{allocated} bytes allocated with {dense} of dense weights: a device copy of the experts"
    );
    assert_eq!(memory(&imported, "host copy", Obtained::Allocated), 0);
    let (want, _) = requests(imported, &slots(0));

    let copied = load("copy", FastBudget::Slots(4));
    assert!(memory(&copied, "host copy of the experts", Obtained::Allocated) >= experts);
    assert!(memory(&copied, "host store (copy)", Obtained::Imported) >= experts);
    let (got, r) = requests(copied, &slots(4));
    assert!(got == want, "the host copy changed the logits");
    assert!(r.promotions > 0 && r.host_bytes > 0, "{r:?}");
}

#[test]
fn the_staged_host_store_uploads_each_steps_misses() {
    let staged = load("stage", FastBudget::Slots(4));
    assert_eq!(memory(&staged, "host store", Obtained::Imported), 0);
    let moe = staged.plan.moe_layers().expect("moe layers");
    let n_expert = moe[0].n_expert;
    let per_layer: Vec<u64> = moe
        .iter()
        .map(|l| {
            l.tensors
                .iter()
                .map(|t| staged.weight_view(t.weight).expect("view").len() as u64)
                .sum::<u64>()
                / n_expert as u64
        })
        .collect();
    let largest = per_layer.iter().copied().max().expect("a MoE layer");
    assert!(
        memory(&staged, "stage area", Obtained::Allocated) >= (n_expert as u64 - 4) * largest,
        "{:?}",
        staged.loaded().memory()
    );
    let allocated = memory(&staged, "all device allocations", Obtained::Allocated);
    let slot_bytes = staged.slots().bytes();
    assert!(
        allocated
            < memory(&staged, "dense weights", Obtained::Allocated)
                + slot_bytes
                + memory(&staged, "stage area", Obtained::Allocated)
                + expert_bytes(&staged) / 4,
        "{allocated} bytes allocated: a device copy of the experts"
    );

    // Rotating: the logits of the imported host store, with promotions uploaded from the file.
    let (want, _) = requests(model(), &slots(4));
    let (got, r, c) = counted_requests(Arc::clone(&staged), &slots(4));
    assert!(got == want, "staging changed the logits");
    assert!(r.promotions > 0 && r.evictions > 0, "{r:?}");
    assert!(r.served_fraction > 0.0 && r.served_fraction < 1.0, "{r:?}");
    assert!(c.staged_experts > 0 && c.staged_bytes > 0, "{c:?}");

    // None resident: every step uploads each layer's distinct routed experts, counted from the
    // routing the session records.
    let ids = shared_prompt();
    let mut s = Session::open_with_store(
        Arc::clone(&staged),
        SessionOptions { kv_max: 32 },
        &slots(0),
    )
    .expect("session");
    s.record_routing(true);
    s.start_request(&ids[..10]);
    s.step(&ids[..10]).expect("prefill");
    for &id in &ids[10..14] {
        s.step(&[id]).expect("decode");
    }
    let routing = s.take_routing();
    assert_eq!(routing.len(), 14);
    let (mut experts, mut bytes) = (0, 0);
    for step in std::iter::once(&routing[..10]).chain(routing[10..].chunks(1)) {
        for (li, &b) in per_layer.iter().enumerate() {
            let mut distinct: Vec<u32> = step
                .iter()
                .flat_map(|t| t.layers[li].iter().copied())
                .collect();
            distinct.sort_unstable();
            distinct.dedup();
            experts += distinct.len() as u64;
            bytes += distinct.len() as u64 * b;
        }
    }
    let c = s.counters();
    assert_eq!((c.staged_experts, c.staged_bytes), (experts, bytes));
    assert_eq!(s.store_report().fast_hits, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Over random budgets below the experts' bytes and random prompts (so random routings), the
    /// slots' device memory never exceeds the budget, and a session's steps and promotions
    /// allocate nothing that outlives it (the backend's allocation records).
    #[test]
    fn the_budget_is_never_exceeded(
        share in 0.0f64..0.9,
        ids in prop::collection::vec(1u32..8000, 1..12),
    ) {
        let experts = expert_bytes(&model());
        let budget = (experts as f64 * share) as u64;
        let m = load("import", FastBudget::Bytes(budget));
        let slots_bytes = m.slots().bytes();
        prop_assert!(slots_bytes <= budget, "{slots_bytes} > {budget}");
        prop_assert!(experts > budget);
        let before = memory(&m, "all device allocations", Obtained::Allocated);
        let mut s = Session::open(Arc::clone(&m), SessionOptions { kv_max: 32 }).expect("session");
        s.step(&ids).expect("a step");
        for &id in &ids {
            s.step(&[id]).expect("decode");
        }
        let r = s.store_report();
        prop_assert!(r.fast_bytes <= budget, "{r:?}");
        drop(s);
        let after = memory(&m, "all device allocations", Obtained::Allocated);
        prop_assert_eq!(before, after, "the slots' memory grew");
    }
}
