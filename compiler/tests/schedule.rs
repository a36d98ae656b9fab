//! Buffer slots never hold two values whose live ranges overlap (property test over random DAGs),
//! reshapes share their input's slot, and cache views live in the latent cache. Live ranges are
//! recomputed here from the plan's steps alone, independently of the scheduler's own bookkeeping.

use aubier_compiler::builder::Builder;
use aubier_compiler::config::{ExpertLayout, Mistral4Config, YarnParams};
use aubier_compiler::ir::NodeId;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Plan, Storage};
use aubier_compiler::schedule::schedule;
use aubier_compiler::types::{DType, Dim, Shape, WeightRef};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn cfg() -> Mistral4Config {
    Mistral4Config {
        arch: "mistral4".into(),
        n_layer: 1,
        n_embd: 4,
        n_vocab: 4,
        n_ctx_train: 16,
        n_head: 1,
        q_lora_rank: 4,
        kv_lora_rank: 2,
        qk_nope_head_dim: 2,
        qk_rope_head_dim: 2,
        v_head_dim: 2,
        rms_norm_eps: 1e-6,
        n_expert: 2,
        n_expert_used: 1,
        n_expert_shared: 0,
        n_ff_exp: 4,
        expert_weights_scale: 1.0,
        expert_weights_norm: true,
        rope: YarnParams {
            n_rot: 2,
            freq_base: 10000.0,
            factor: 1.0,
            original_context: 16,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attn_factor: 1.0,
            log_multiplier: 0.1,
        },
        temperature: None,
        expert_layout: ExpertLayout::FusedGateUp,
    }
}

fn t4() -> Shape {
    Shape(vec![Dim::Tokens, Dim::Fixed(4)])
}

/// Value → representative of its reshape chain (from the plan's reshape steps).
fn alias_roots(plan: &Plan) -> Vec<usize> {
    let mut root: Vec<usize> = (0..plan.values.len()).collect();
    for s in &plan.steps {
        if s.op == Op::Reshape {
            if let Some(Operand::Value(src)) = s.args.first() {
                root[s.out] = root[*src];
            }
        }
    }
    root
}

/// Live range of each value in positions: inputs at 0, step k at k + 1, outputs to the end.
fn live_ranges(plan: &Plan) -> Vec<(usize, usize)> {
    let mut r = vec![(0, 0); plan.values.len()];
    for (k, s) in plan.steps.iter().enumerate() {
        r[s.out] = (k + 1, k + 1);
    }
    for (k, s) in plan.steps.iter().enumerate() {
        for a in &s.args {
            if let Operand::Value(v) = a {
                r[*v].1 = r[*v].1.max(k + 1);
            }
        }
    }
    for (_, v) in &plan.outputs {
        r[*v].1 = plan.steps.len() + 1;
    }
    r
}

/// The property: same slot ⇒ same reshape chain or disjoint live ranges; a reshape's output is
/// stored where its input is; every slot index is below `n_slots`.
fn check_slots(plan: &Plan) -> Result<(), String> {
    let root = alias_roots(plan);
    let live = live_ranges(plan);
    for (v, val) in plan.values.iter().enumerate() {
        if let Storage::Slot(s) = val.storage {
            if s >= plan.n_slots {
                return Err(format!("value {v} in slot {s} of {}", plan.n_slots));
            }
        }
        if val.storage != plan.values[root[v]].storage {
            return Err(format!("reshape {v} not stored with its input {}", root[v]));
        }
    }
    for a in 0..plan.values.len() {
        for b in a + 1..plan.values.len() {
            let (sa, sb) = (plan.values[a].storage, plan.values[b].storage);
            if !matches!(sa, Storage::Slot(_)) || sa != sb || root[a] == root[b] {
                continue;
            }
            let (ra, rb) = (live[a], live[b]);
            // Ranges of whole chains: a chain member keeps the chain's buffer alive.
            let chain = |r: usize| {
                (0..plan.values.len())
                    .filter(|&v| root[v] == root[r])
                    .fold((usize::MAX, 0), |(s, e), v| {
                        (s.min(live[v].0), e.max(live[v].1))
                    })
            };
            let (ca, cb) = (chain(a), chain(b));
            if ca.0 <= cb.1 && cb.0 <= ca.1 {
                return Err(format!(
                    "values {a} {ra:?} and {b} {rb:?} share {sa:?} with overlapping chains {ca:?} {cb:?}"
                ));
            }
        }
    }
    Ok(())
}

/// One random node: an op kind and two operand picks (taken modulo the values so far).
fn node() -> impl Strategy<Value = (u8, usize, usize)> {
    (0u8..6, any::<usize>(), any::<usize>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn slots_never_hold_overlapping_live_ranges(
        nodes in prop::collection::vec(node(), 1..60),
        outs in prop::collection::vec(any::<usize>(), 1..6),
    ) {
        let ws: BTreeMap<String, WeightRef> = BTreeMap::new();
        let mut b = Builder::new(&ws);
        let mut vals: Vec<NodeId> = vec![
            b.input("x", DType::F32, t4()).unwrap(),
            b.input("z", DType::F32, t4()).unwrap(),
        ];
        for (kind, i, j) in nodes {
            let (a, c) = (vals[i % vals.len()], vals[j % vals.len()]);
            let n = match kind {
                0 => b.add(a, c),
                1 => b.mul(a, c),
                2 => b.silu(a),
                3 => b.scale(a, 0.5),
                4 => b.reshape(a, t4()),
                _ => {
                    let r = b.reshape(a, Shape(vec![Dim::Tokens, Dim::Fixed(2), Dim::Fixed(2)])).unwrap();
                    b.reshape(r, t4())
                }
            }
            .unwrap();
            vals.push(n);
        }
        let mut named = std::collections::BTreeSet::new();
        for o in outs {
            let v = vals[o % vals.len()];
            if named.insert(v) {
                b.output(format!("o{}", named.len()), v).unwrap();
            }
        }
        let g = b.finish().unwrap();
        let plan = schedule(&g, &cfg(), vec!["build".into()]).unwrap();
        prop_assert_eq!(plan.steps.len() + 2, plan.values.len());
        if let Err(e) = check_slots(&plan) {
            prop_assert!(false, "{}", e);
        }
    }
}

#[test]
fn a_value_read_by_a_step_never_shares_a_slot_with_its_output() {
    let ws = BTreeMap::new();
    let mut b = Builder::new(&ws);
    let x = b.input("x", DType::F32, t4()).unwrap();
    let mut v = x;
    for _ in 0..5 {
        v = b.silu(v).unwrap();
    }
    b.output("y", v).unwrap();
    let plan = schedule(&b.finish().unwrap(), &cfg(), vec![]).unwrap();
    for s in &plan.steps {
        for a in &s.args {
            if let Operand::Value(a) = a {
                assert_ne!(plan.values[*a].storage, plan.values[s.out].storage);
            }
        }
    }
    // A chain of unary steps ping-pongs between two buffers.
    assert_eq!(plan.n_slots, 2);
    check_slots(&plan).unwrap();
}

#[test]
fn cache_views_live_in_the_latent_cache_and_reshape_shares_storage() {
    let ws = BTreeMap::new();
    let mut b = Builder::new(&ws);
    let x = b.input("x", DType::F32, t4()).unwrap();
    let pos = b
        .input("pos", DType::I32, Shape(vec![Dim::Tokens]))
        .unwrap();
    let c0 = b.cache_write(x, pos, 0).unwrap();
    let c1 = b.cache_write(x, pos, 1).unwrap();
    let r = b
        .reshape(c1, Shape(vec![Dim::Keys, Dim::Fixed(2), Dim::Fixed(2)]))
        .unwrap();
    let y = b
        .reshape(x, Shape(vec![Dim::Tokens, Dim::Fixed(2), Dim::Fixed(2)]))
        .unwrap();
    b.output("c0", c0).unwrap();
    b.output("r", r).unwrap();
    b.output("y", y).unwrap();
    let plan = schedule(&b.finish().unwrap(), &cfg(), vec![]).unwrap();
    let out = |name: &str| plan.outputs.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(
        plan.values[out("c0")].storage,
        Storage::KvCache { layer: 0 }
    );
    assert_eq!(plan.values[out("r")].storage, Storage::KvCache { layer: 1 });
    let x_v = plan.inputs[0].1;
    assert_eq!(plan.values[out("y")].storage, plan.values[x_v].storage);
    check_slots(&plan).unwrap();
}
