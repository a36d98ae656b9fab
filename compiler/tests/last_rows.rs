//! `Plan::last_rows`: the steps a run that reads only the last position's logits computes for
//! that position alone. Expected from the model's forward pass (MODEL.md §3): in the last layer,
//! everything after its routing (the routing weights, the routed and shared experts, the
//! residual add), then the final norm and the head; nothing of an earlier layer, no step that
//! writes the latent cache, and nothing a plan output other than the logits reads.

mod common;

use aubier_compiler::config::ExpertLayout;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Plan};
use aubier_compiler::{compile, CompileOptions, Target};
use common::*;
use std::collections::BTreeSet;

fn opts(target: Target, predict: bool) -> CompileOptions {
    CompileOptions {
        target,
        predict_experts: predict,
        ..CompileOptions::default()
    }
}

/// Names of the weights the last-row steps read, and the ops of those steps.
fn region(plan: &Plan) -> (BTreeSet<String>, Vec<Op>) {
    let rows = plan.last_rows();
    assert_eq!(rows.steps.len(), plan.steps.len());
    let mut weights = BTreeSet::new();
    let mut ops = Vec::new();
    for (i, s) in plan.steps.iter().enumerate().filter(|(i, _)| rows.step(*i)) {
        ops.push(s.op);
        for w in s.weights() {
            weights.insert(plan.weights[w].name.clone());
        }
        assert!(
            rows.values[s.out],
            "step {i}'s output is not marked one row"
        );
    }
    (weights, ops)
}

#[test]
fn the_last_layers_ffn_and_the_head_run_for_the_last_position() {
    let cases = [
        (tiny256_config(), tiny256_q2k_weights(), "blk.2"),
        (
            tiny_config(ExpertLayout::SplitGateUp),
            tiny_f32_weights(ExpertLayout::SplitGateUp),
            "blk.2",
        ),
        (real_config(), real_weights(), "blk.35"),
    ];
    for (cfg, w, last) in cases {
        let experts: &[&str] = match cfg.expert_layout {
            ExpertLayout::FusedGateUp => &["ffn_gate_up_exps"],
            ExpertLayout::SplitGateUp => &["ffn_gate_exps", "ffn_up_exps"],
        };
        let mut expected: Vec<String> = experts
            .iter()
            .chain(&[
                "ffn_down_exps",
                "ffn_gate_shexp",
                "ffn_up_shexp",
                "ffn_down_shexp",
            ])
            .map(|t| format!("{last}.{t}.weight"))
            .collect();
        expected.extend(["output_norm.weight".into(), "output.weight".into()]);
        for target in [Target::Oracle, Target::Cpu, Target::Gpu] {
            for predict in [false, true] {
                let plan = compile(&cfg, &w, &opts(target, predict)).unwrap();
                let (weights, ops) = region(&plan);
                let expected: BTreeSet<String> = expected.iter().cloned().collect();
                assert_eq!(weights, expected, "{target:?} predict={predict}");
                // The routing weights (gather_renorm) run for the last row; the router itself,
                // softmax and top_k stay whole because `router_ids.L` is a plan output.
                for op in [Op::GatherRenorm, Op::MoeFfn, Op::Silu, Op::Mul, Op::RmsNorm] {
                    assert_eq!(
                        ops.iter().filter(|&&o| o == op).count(),
                        1,
                        "{op:?} in {ops:?} ({target:?})"
                    );
                }
                assert!(!ops.iter().any(|o| matches!(
                    o,
                    Op::CacheWrite | Op::Phase | Op::Kqkv | Op::TopK | Op::Softmax
                )));
                assert_eq!(ops.iter().filter(|&&o| o == Op::Add).count(), 2);
            }
        }
    }
}

#[test]
fn no_plan_output_but_the_logits_is_made_for_the_last_row_alone() {
    let (cfg, w) = (tiny256_config(), tiny256_q2k_weights());
    for target in [Target::Oracle, Target::Cpu, Target::Gpu] {
        let plan = compile(&cfg, &w, &opts(target, true)).unwrap();
        let rows = plan.last_rows();
        let head = plan.output_head.expect("the bundled model has a head");
        for (name, v) in &plan.outputs {
            assert_eq!(rows.values[*v], *v == head.value, "output {name}");
        }
        // Every value a whole-rows step reads is made whole: a last-row step's output is read
        // by last-row steps only.
        for (i, s) in plan.steps.iter().enumerate() {
            for a in &s.args {
                if let Operand::Value(v) = a {
                    if rows.values[*v] {
                        assert!(
                            rows.step(i),
                            "step {i} ({:?}) reads one-row value {v}",
                            s.op
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_plan_without_a_head_runs_every_step_for_every_row() {
    let (cfg, w) = (tiny256_config(), tiny256_q2k_weights());
    let mut plan = compile(&cfg, &w, &opts(Target::Gpu, false)).unwrap();
    plan.output_head = None;
    let rows = plan.last_rows();
    assert!(rows.steps.iter().all(|&s| !s));
    assert!(rows.values.iter().all(|&v| !v));
}

#[test]
fn a_last_row_step_reads_the_last_row_of_a_whole_value() {
    let (cfg, w) = (tiny256_config(), tiny256_q2k_weights());
    let plan = compile(&cfg, &w, &opts(Target::Gpu, false)).unwrap();
    let rows = plan.last_rows();
    let moe = (0..plan.steps.len())
        .find(|&i| plan.steps[i].op == Op::MoeFfn && rows.step(i))
        .expect("the last layer's moe_ffn runs for the last row");
    let Operand::Value(h) = plan.steps[moe].args[0] else {
        panic!("moe_ffn's first operand is its input");
    };
    // The FFN input [T, 256] is made for every row (the router reads it too).
    assert!(!rows.values[h]);
    assert_eq!(rows.operand_row(&plan, moe, h, 5), 4 * 256);
    assert_eq!(rows.operand_row(&plan, moe, h, 1), 0);
    // A step that runs for every row reads from the start.
    let router = plan.steps.iter().position(|s| s.op == Op::TopK).unwrap();
    assert_eq!(rows.operand_row(&plan, router, h, 5), 0);
}
