//! The Mistral Small 4 description compiles for the tiny fixture models and for the real dims,
//! and its graph has the structure of MODEL.md §2; plans are deterministic.

mod common;

use aubier_compiler::config::ExpertLayout;
use aubier_compiler::ir::NodeKind;
use aubier_compiler::model::mistral4::build_graph;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, Storage};
use aubier_compiler::types::{DType, Dim, Shape};
use aubier_compiler::{
    compile, compile_stages, dump_after, CompileError, CompileOptions, DumpFormat,
};
use common::*;

fn shape(dims: &[Dim]) -> Shape {
    Shape(dims.to_vec())
}

#[test]
fn tiny256_plan_has_the_contracted_inputs_outputs_and_cache() {
    let cfg = tiny256_config();
    let plan = compile(&cfg, &tiny256_q2k_weights(), &CompileOptions::default()).unwrap();
    assert_eq!(plan.stages, ["build", "cse", "dce", "mark_head"]);
    // `mark_head` marks the `mat_mul` of `output.weight` that makes the logits.
    let head = plan.output_head.expect("an output head");
    let logits = plan.outputs.iter().find(|(n, _)| n == "logits").unwrap().1;
    assert_eq!(head.value, logits);
    let step = &plan.steps[head.step];
    assert_eq!((step.op, step.out), (Op::MatMul, logits));
    match step.args[0] {
        Operand::Weight(w) => assert_eq!(plan.weights[w].name, "output.weight"),
        a => panic!("{a:?}"),
    }
    let no_mark = CompileOptions {
        disable: vec!["mark_head".into()],
        ..CompileOptions::default()
    };
    let unmarked = compile(&cfg, &tiny256_q2k_weights(), &no_mark).unwrap();
    assert_eq!(unmarked.output_head, None);
    assert_eq!(unmarked.steps, plan.steps);

    let names: Vec<&str> = plan.inputs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["tokens", "pos"]);
    for (_, v) in &plan.inputs {
        assert_eq!(plan.values[*v].dtype, DType::I32);
        assert_eq!(plan.values[*v].shape, shape(&[Dim::Tokens]));
    }

    let outs: Vec<&str> = plan.outputs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        outs,
        ["router_ids.0", "router_ids.1", "router_ids.2", "logits"]
    );
    let (_, logits) = plan.outputs[3];
    assert_eq!(plan.values[logits].dtype, DType::F32);
    assert_eq!(
        plan.values[logits].shape,
        shape(&[Dim::Tokens, Dim::Fixed(8192)])
    );
    for (_, ids) in &plan.outputs[..3] {
        assert_eq!(plan.values[*ids].dtype, DType::I32);
        assert_eq!(
            plan.values[*ids].shape,
            shape(&[Dim::Tokens, Dim::Fixed(4)])
        );
    }

    // One cache_write per layer, its view in that layer's latent cache, 64 + 32 wide.
    let writes: Vec<_> = plan
        .steps
        .iter()
        .filter(|s| s.op == Op::CacheWrite)
        .collect();
    assert_eq!(writes.len(), 3);
    for (l, s) in writes.iter().enumerate() {
        let v = &plan.values[s.out];
        assert_eq!(v.storage, Storage::KvCache { layer: l });
        assert_eq!(v.shape, shape(&[Dim::Keys, Dim::Fixed(96)]));
    }
    // Every weight of the file is read exactly once (nothing dead, nothing twice).
    assert_eq!(plan.weights.len(), tiny256_q2k_weights().len());
    let mut read = vec![0; plan.weights.len()];
    for s in &plan.steps {
        for a in &s.args {
            if let Operand::Weight(w) = a {
                read[*w] += 1;
            }
        }
    }
    assert!(read.iter().all(|&n| n == 1), "{read:?}");
}

#[test]
fn tiny256_graph_follows_model_md_section_2() {
    let cfg = tiny256_config();
    let g = build_graph(&cfg, &tiny256_q2k_weights()).unwrap();
    let per_layer = |op: Op, n: usize| assert_eq!(g.count_op(op), 3 * n, "{op:?}");
    // attn_norm, q_a_norm, kv_a_norm, ffn_norm per layer, plus output_norm.
    assert_eq!(g.count_op(Op::RmsNorm), 3 * 4 + 1);
    // q_a, q_b, kv_a, o, router, shexp gate/up/down per layer, plus the logits.
    assert_eq!(g.count_op(Op::MatMul), 3 * 8 + 1);
    per_layer(Op::HeadMatMul, 2);
    per_layer(Op::RopeYarn, 2);
    per_layer(Op::AttnTemperature, 1);
    per_layer(Op::CacheWrite, 1);
    per_layer(Op::ScoresQk, 1);
    per_layer(Op::CausalMask, 1);
    per_layer(Op::WeightedSum, 1);
    per_layer(Op::Softmax, 2);
    per_layer(Op::TopK, 1);
    per_layer(Op::GatherRenorm, 1);
    per_layer(Op::MoeFfn, 1);
    per_layer(Op::Silu, 1);
    per_layer(Op::Mul, 1);
    per_layer(Op::Add, 3);
    per_layer(Op::Slice, 4);
    per_layer(Op::Concat, 2);
    per_layer(Op::Scale, 1);
    assert_eq!(g.count_op(Op::Embed), 1);

    // Attributes come from the config.
    for n in g.g.node_indices() {
        if let NodeKind::Op { op, attrs } = &g.g[n].kind {
            use aubier_compiler::types::Attrs;
            match (op, attrs) {
                (Op::RmsNorm, Attrs::Eps(e)) => assert_eq!(*e, 1e-6),
                (Op::Scale, Attrs::Scale(c)) => assert_eq!(*c, cfg.kq_scale()),
                (Op::RopeYarn, Attrs::Rope(y)) => assert_eq!(y, &cfg.rope),
                (Op::TopK, Attrs::TopK { k }) => assert_eq!(*k, 4),
                (Op::WeightedSum, Attrs::WeightedSum { len }) => assert_eq!(*len, 64),
                (Op::GatherRenorm, Attrs::GatherRenorm { renorm, scale }) => {
                    assert!(*renorm);
                    assert_eq!(*scale, 1.0);
                }
                (Op::MoeFfn, Attrs::Moe { n_ff, layout, .. }) => {
                    assert_eq!(*n_ff, 256);
                    assert_eq!(*layout, ExpertLayout::FusedGateUp);
                }
                _ => {}
            }
        }
    }
}

#[test]
fn query_temperature_is_skipped_when_the_file_has_none() {
    let mut cfg = tiny256_config();
    cfg.temperature = None;
    let g = build_graph(&cfg, &tiny256_q2k_weights()).unwrap();
    assert_eq!(g.count_op(Op::AttnTemperature), 0);
    assert_eq!(g.count_op(Op::ScoresQk), 3);
}

#[test]
fn both_expert_layouts_compile_with_their_operands() {
    for layout in [ExpertLayout::FusedGateUp, ExpertLayout::SplitGateUp] {
        let cfg = tiny_config(layout);
        let plan = compile(&cfg, &tiny_f32_weights(layout), &CompileOptions::default()).unwrap();
        let moe: Vec<_> = plan.steps.iter().filter(|s| s.op == Op::MoeFfn).collect();
        assert_eq!(moe.len(), 3);
        let want = match layout {
            ExpertLayout::FusedGateUp => 5,
            ExpertLayout::SplitGateUp => 6,
        };
        for s in moe {
            assert_eq!(s.args.len(), want);
        }
    }
}

#[test]
fn real_dims_compile() {
    let cfg = real_config();
    let plan = compile(&cfg, &real_weights(), &CompileOptions::default()).unwrap();
    assert_eq!(
        plan.steps.iter().filter(|s| s.op == Op::CacheWrite).count(),
        36
    );
    assert_eq!(plan.outputs.len(), 37);
    let (_, logits) = plan.outputs.last().unwrap();
    assert_eq!(
        plan.values[*logits].shape,
        shape(&[Dim::Tokens, Dim::Fixed(131072)])
    );
    // The absorbed query and the latent cache are 320 wide; o_lat is 256 per head (MODEL.md §2.6).
    let scores = plan.steps.iter().find(|s| s.op == Op::ScoresQk).unwrap();
    let Operand::Value(q) = scores.args[0] else {
        panic!()
    };
    assert_eq!(
        plan.values[q].shape,
        shape(&[Dim::Tokens, Dim::Fixed(32), Dim::Fixed(320)])
    );
    let ws = plan.steps.iter().find(|s| s.op == Op::WeightedSum).unwrap();
    assert_eq!(
        plan.values[ws.out].shape,
        shape(&[Dim::Tokens, Dim::Fixed(32), Dim::Fixed(256)])
    );
}

#[test]
fn plans_are_byte_identical_across_compiles() {
    let cfg = tiny256_config();
    let w = tiny256_q2k_weights();
    let a = serde_json::to_string(&compile(&cfg, &w, &CompileOptions::default()).unwrap()).unwrap();
    let b = serde_json::to_string(&compile(&cfg, &w, &CompileOptions::default()).unwrap()).unwrap();
    assert_eq!(a, b);
    let back: aubier_compiler::plan::Plan = serde_json::from_str(&a).unwrap();
    assert_eq!(serde_json::to_string(&back).unwrap(), a);
}

#[test]
fn a_missing_weight_is_named() {
    let mut w = tiny256_q2k_weights();
    w.remove("blk.1.attn_kv_a_norm.weight");
    let err = compile(&tiny256_config(), &w, &CompileOptions::default()).unwrap_err();
    assert!(
        matches!(&err, CompileError::MissingWeight { name } if name == "blk.1.attn_kv_a_norm.weight"),
        "{err}"
    );
}

#[test]
fn a_weight_of_the_wrong_shape_is_named() {
    let mut w = tiny256_q2k_weights();
    w.get_mut("blk.2.attn_q_b.weight").unwrap().ne = vec![128, 250];
    let err = compile(&tiny256_config(), &w, &CompileOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, CompileError::Infer { .. }), "{msg}");
    assert!(
        msg.contains("blk.2.attn_q_b.weight") || msg.contains("reshape"),
        "{msg}"
    );
}

#[test]
fn stages_options_and_dumps() {
    let cfg = tiny256_config();
    let w = tiny256_q2k_weights();
    let gpu = CompileOptions {
        target: aubier_compiler::Target::Gpu,
        predict_experts: true,
        ..CompileOptions::default()
    };
    let stages = compile_stages(&cfg, &w, &gpu).unwrap();
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, aubier_compiler::stage_names());

    let opts = CompileOptions {
        disable: vec!["cse".into()],
        ..CompileOptions::default()
    };
    let plan = compile(&cfg, &w, &opts).unwrap();
    assert_eq!(plan.stages, ["build", "dce", "mark_head"]);
    let bad = CompileOptions {
        disable: vec!["fuse_everything".into()],
        ..CompileOptions::default()
    };
    assert!(matches!(
        compile(&cfg, &w, &bad),
        Err(CompileError::UnknownStage { .. })
    ));
    let build = CompileOptions {
        disable: vec!["build".into()],
        ..CompileOptions::default()
    };
    assert!(matches!(
        compile(&cfg, &w, &build),
        Err(CompileError::MandatoryStage { .. })
    ));

    let text = dump_after(
        &cfg,
        &w,
        &CompileOptions::default(),
        "dce",
        DumpFormat::Text,
    )
    .unwrap();
    assert!(text.contains("= input tokens : i32[T]"), "{text}");
    assert!(
        text.contains("cache_write(") && text.contains("{layer=2}"),
        "{text}"
    );
    assert!(text.contains("// blk.0.q_pe"), "{text}");
    assert!(text.ends_with("output logits = %") || text.contains("output logits = %"));
    let dot = dump_after(
        &cfg,
        &w,
        &CompileOptions::default(),
        "build",
        DumpFormat::Dot,
    )
    .unwrap();
    assert!(dot.starts_with("digraph aubier {"));
    assert!(dot.contains("label=\"logits\""));
    assert!(matches!(
        dump_after(
            &cfg,
            &w,
            &CompileOptions::default(),
            "nope",
            DumpFormat::Text
        ),
        Err(CompileError::UnknownStage { .. })
    ));
}

#[test]
fn no_shared_expert_when_the_file_states_none() {
    let mut cfg = tiny256_config();
    cfg.n_expert_shared = 0;
    let mut w = tiny256_q2k_weights();
    w.retain(|name, _| !name.contains("shexp"));
    let g = build_graph(&cfg, &w).unwrap();
    assert_eq!(g.count_op(Op::Silu), 0);
    assert_eq!(g.count_op(Op::MatMul), 3 * 5 + 1);
    // And the shared expert's weights are required when it is stated.
    assert!(matches!(
        build_graph(&tiny256_config(), &w),
        Err(CompileError::MissingWeight { .. })
    ));
}

/// The attention scores of every layer ([T, H, S], the largest values of a prefill) pass through
/// scale → causal_mask → softmax; each step reads one and writes the next, so two buffers are
/// the fewest the chain can use, and the slot assignment uses no more for all layers together.
#[test]
fn attention_scores_of_every_layer_share_two_slots() {
    let plan = compile(
        &tiny256_config(),
        &tiny256_q2k_weights(),
        &CompileOptions::default(),
    )
    .unwrap();
    let mut slots = std::collections::BTreeSet::new();
    for v in &plan.values {
        if v.shape.0.len() == 3 && v.shape.0[0] == Dim::Tokens && v.shape.0[2] == Dim::Keys {
            let Storage::Slot(s) = v.storage else {
                panic!("{} is not in a slot", v.name)
            };
            slots.insert(s);
        }
    }
    assert_eq!(slots.len(), 2, "score slots {slots:?}");
}
