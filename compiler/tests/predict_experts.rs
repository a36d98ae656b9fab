//! The opt-in `predict_experts` pass on the model's graph: for every layer `L ≥ 1` the plan gets
//! `predicted_ids.L`, layer `L`'s routing ops (same weights and attributes) over the residual that
//! enters layer `L`'s attention norm, scheduled before that norm; every other step is unchanged.

mod common;

use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Plan, Step};
use aubier_compiler::types::Attrs;
use aubier_compiler::{compile, dump_after, CompileOptions, DumpFormat, Target};
use common::*;

fn opts(target: Target, predict: bool) -> CompileOptions {
    CompileOptions {
        target,
        predict_experts: predict,
        ..CompileOptions::default()
    }
}

/// Index of the step that writes value `v`.
fn producer(plan: &Plan, v: usize) -> usize {
    plan.steps
        .iter()
        .position(|s| s.out == v)
        .unwrap_or_else(|| panic!("no step writes value {v}"))
}

fn weight<'p>(plan: &'p Plan, s: &Step, i: usize) -> &'p str {
    match s.args[i] {
        Operand::Weight(w) => &plan.weights[w].name,
        Operand::Value(v) => panic!("operand {i} of {:?} is value {v}", s.op),
    }
}

fn value(s: &Step, i: usize) -> usize {
    match s.args[i] {
        Operand::Value(v) => v,
        Operand::Weight(w) => panic!("operand {i} of {:?} is weight {w}", s.op),
    }
}

/// The index of the `rms_norm` step by weight `name`.
fn norm_by(plan: &Plan, name: &str) -> usize {
    let found: Vec<usize> = (0..plan.steps.len())
        .filter(|&i| plan.steps[i].op == Op::RmsNorm && weight(plan, &plan.steps[i], 1) == name)
        .collect();
    assert_eq!(found.len(), 1, "rms_norm steps by {name}: {found:?}");
    found[0]
}

#[test]
fn each_layer_after_the_first_gets_its_router_before_its_attention() {
    let (cfg, w) = (tiny256_config(), tiny256_q2k_weights());
    for target in [Target::Oracle, Target::Cpu, Target::Gpu] {
        let plan = compile(&cfg, &w, &opts(target, true)).unwrap();
        assert!(plan.stages.iter().any(|s| s == "predict_experts"));
        let pred = plan.predicted_ids();
        let layers: Vec<usize> = pred.iter().map(|&(l, _)| l).collect();
        assert_eq!(layers, (1..cfg.n_layer).collect::<Vec<_>>(), "{target:?}");
        for &(l, v) in &pred {
            let top_k = producer(&plan, v);
            let s = &plan.steps[top_k];
            assert_eq!(s.op, Op::TopK);
            assert_eq!(
                s.attrs,
                Attrs::TopK {
                    k: cfg.n_expert_used
                }
            );
            let ty = &plan.values[v];
            assert_eq!(format!("{:?}", ty.dtype), "I32");
            let softmax = producer(&plan, value(s, 0));
            assert_eq!(plan.steps[softmax].op, Op::Softmax);
            let mm = producer(&plan, value(&plan.steps[softmax], 0));
            let s = &plan.steps[mm];
            assert_eq!(s.op, Op::MatMul);
            assert_eq!(weight(&plan, s, 0), format!("blk.{l}.ffn_gate_inp.weight"));
            let norm = producer(&plan, value(s, 1));
            let s = &plan.steps[norm];
            assert_eq!(s.op, Op::RmsNorm);
            assert_eq!(weight(&plan, s, 1), format!("blk.{l}.ffn_norm.weight"));
            // Same attributes as layer l's own routing norm (the one `moe_ffn` reads).
            let moe = plan
                .steps
                .iter()
                .find(|m| matches!(m.attrs, Attrs::Moe { layer, .. } if layer == l))
                .unwrap();
            let own = &plan.steps[producer(&plan, value(moe, 0))];
            assert_eq!(own.attrs, s.attrs);
            assert_eq!(weight(&plan, own, 1), format!("blk.{l}.ffn_norm.weight"));
            // Over the residual entering layer l's attention, and before that attention.
            let attn = norm_by(&plan, &format!("blk.{l}.attn_norm.weight"));
            assert_eq!(value(s, 0), value(&plan.steps[attn], 0));
            assert!(norm < mm && mm < softmax && softmax < top_k && top_k < attn);
        }
    }
}

#[test]
fn the_other_steps_are_those_of_the_plan_without_the_pass() {
    let (cfg, w) = (tiny256_config(), tiny256_q2k_weights());
    for target in [Target::Oracle, Target::Cpu, Target::Gpu] {
        let off = compile(&cfg, &w, &opts(target, false)).unwrap();
        assert!(off.predicted_ids().is_empty());
        assert!(!off.stages.iter().any(|s| s == "predict_experts"));
        let on = compile(&cfg, &w, &opts(target, true)).unwrap();
        let added: Vec<usize> = on
            .values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.name.contains(".pred_") || v.name.starts_with("predicted_ids."))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(added.len(), 4 * (cfg.n_layer - 1));
        let kept = |p: &Plan, skip: &[usize]| -> Vec<(Op, Attrs, Vec<String>)> {
            p.steps
                .iter()
                .filter(|s| !skip.contains(&s.out))
                .map(|s| {
                    let w = s.weights().map(|i| p.weights[i].name.clone()).collect();
                    (s.op, s.attrs.clone(), w)
                })
                .collect()
        };
        assert_eq!(kept(&on, &added), kept(&off, &[]), "{target:?}");
        assert_eq!(on.steps.len(), off.steps.len() + added.len());
        let outputs = |p: &Plan| -> Vec<String> {
            p.outputs
                .iter()
                .map(|(n, _)| n.clone())
                .filter(|n| !n.starts_with("predicted_ids."))
                .collect()
        };
        assert_eq!(outputs(&on), outputs(&off));
        assert_eq!(on.output_head.is_some(), off.output_head.is_some());
    }
}

#[test]
fn the_default_options_serialize_as_before_and_the_stage_dumps() {
    let json = serde_json::to_string(&CompileOptions::default()).unwrap();
    assert!(!json.contains("predict_experts"), "{json}");
    let on = serde_json::to_string(&opts(Target::Oracle, true)).unwrap();
    assert!(on.contains("\"predict_experts\":true"), "{on}");
    let (cfg, w) = (tiny256_config(), tiny256_q2k_weights());
    let text = dump_after(
        &cfg,
        &w,
        &opts(Target::Oracle, true),
        "predict_experts",
        DumpFormat::Text,
    )
    .unwrap();
    assert!(text.contains("output predicted_ids.2 = %"), "{text}");
}

#[test]
fn a_lead_outside_one_to_the_layer_count_is_refused_and_lead_two_serializes() {
    let (cfg, w) = (tiny256_config(), tiny256_q2k_weights());
    for lead in [0, cfg.n_layer + 1] {
        let o = CompileOptions {
            prefetch_lead: lead,
            ..opts(Target::Cpu, true)
        };
        let e = compile(&cfg, &w, &o).unwrap_err().to_string();
        assert!(e.contains(&format!("prefetch lead {lead}")), "{e}");
        assert!(e.contains(&format!("1 to {} layers", cfg.n_layer)), "{e}");
    }
    let o = CompileOptions {
        prefetch_lead: cfg.n_layer,
        ..opts(Target::Cpu, true)
    };
    let plan = compile(&cfg, &w, &o).unwrap();
    let layers: Vec<usize> = plan.predicted_ids().iter().map(|&(l, _)| l).collect();
    assert_eq!(layers, (1..cfg.n_layer).collect::<Vec<_>>());
    let json = serde_json::to_string(&o).unwrap();
    assert!(
        json.contains(&format!("\"prefetch_lead\":{}", cfg.n_layer)),
        "{json}"
    );
    let one = serde_json::to_string(&opts(Target::Cpu, true)).unwrap();
    assert!(!one.contains("prefetch_lead"), "{one}");
}
