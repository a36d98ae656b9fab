//! The fusion passes PHASE, WKB and KQKV: what they make on the model's graph, that a pass set
//! `off` leaves the plan byte for byte that of a pipeline without it, how `auto` resolves, and
//! the inference / verification rules of the fused ops.

mod common;

use aubier_compiler::builder::Builder;
use aubier_compiler::config::{ExpertLayout, Mistral4Config, QueryTemperature};
use aubier_compiler::model::mistral4::build_graph;
use aubier_compiler::ops::Op;
use aubier_compiler::passes::{fuse_kqkv, PASSES};
use aubier_compiler::plan::{Operand, Plan, Step};
use aubier_compiler::schedule::schedule;
use aubier_compiler::types::{Attrs, DType, Dim, Shape, WeightRef};
use aubier_compiler::verify::{verify, VerifyError};
use aubier_compiler::{
    compile, dump_after, CompileError, CompileOptions, DumpFormat, Fusion, Target,
};
use common::*;
use std::collections::BTreeMap;

const FUSIONS: [&str; 3] = ["fuse_kqkv", "fuse_phase", "fuse_wkb"];

fn opts(target: Target, phase: Fusion, wkb: Fusion, kqkv: Fusion) -> CompileOptions {
    CompileOptions {
        target,
        fuse_phase: phase,
        fuse_wkb: wkb,
        fuse_kqkv: kqkv,
        ..CompileOptions::default()
    }
}

fn all(f: Fusion) -> CompileOptions {
    opts(Target::Oracle, f, f, f)
}

fn json(p: &Plan) -> String {
    serde_json::to_string(p).unwrap()
}

/// A compiler without the passes in `skip`: the build, then every other pass of the pipeline
/// but the opt-in ones, verified after each, then the scheduler — assembled here from the public
/// pieces, not through `compile` and its flags.
fn plan_without(cfg: &Mistral4Config, w: &BTreeMap<String, WeightRef>, skip: &[&str]) -> Plan {
    let mut g = build_graph(cfg, w).unwrap();
    let mut stages = vec!["build".to_string()];
    let default_on = PASSES.iter().filter(|p| p.opt_in.is_none());
    for pass in default_on.filter(|p| !skip.contains(&p.name)) {
        (pass.run)(&mut g, &CompileOptions::default()).unwrap();
        verify(&g).unwrap();
        stages.push(pass.name.to_string());
    }
    schedule(&g, cfg, stages).unwrap()
}

fn steps(plan: &Plan, op: Op) -> Vec<&Step> {
    plan.steps.iter().filter(|s| s.op == op).collect()
}

fn producer(plan: &Plan, v: usize) -> Option<&Step> {
    plan.steps.iter().find(|s| s.out == v)
}

fn value_arg(s: &Step, i: usize) -> usize {
    match s.args[i] {
        Operand::Value(v) => v,
        Operand::Weight(w) => panic!("operand {i} of {:?} is weight {w}", s.op),
    }
}

fn weight_name<'p>(plan: &'p Plan, s: &Step, i: usize) -> &'p str {
    match s.args[i] {
        Operand::Weight(w) => &plan.weights[w].name,
        Operand::Value(v) => panic!("operand {i} of {:?} is value {v}", s.op),
    }
}

/// Every layer has exactly one phase, two wkb (IN on attn_k_b, OUT on attn_v_b) and one kqkv,
/// wired phase → wkb IN → kqkv → wkb OUT, with the attributes of the config and of the unfused
/// plan (kq_scale is read from the unfused `scale` step, not recomputed).
fn check_fully_fused(cfg: &Mistral4Config, w: &BTreeMap<String, WeightRef>) {
    let plan = compile(cfg, w, &all(Fusion::On)).unwrap();
    assert_eq!(
        plan.stages,
        [
            "build",
            "cse",
            "fuse_kqkv",
            "fuse_phase",
            "fuse_wkb",
            "dce",
            "mark_head"
        ]
    );
    let unfused = compile(cfg, w, &CompileOptions::default()).unwrap();
    let kq_scale = match &steps(&unfused, Op::Scale)[0].attrs {
        Attrs::Scale(c) => *c,
        a => panic!("{a:?}"),
    };
    let n = cfg.n_layer;
    let (phases, wkbs, kqkvs) = (
        steps(&plan, Op::Phase),
        steps(&plan, Op::Wkb),
        steps(&plan, Op::Kqkv),
    );
    assert_eq!((phases.len(), wkbs.len(), kqkvs.len()), (n, 2 * n, n));
    for gone in [
        Op::CacheWrite,
        Op::ScoresQk,
        Op::CausalMask,
        Op::WeightedSum,
        Op::RopeYarn,
        Op::AttnTemperature,
        Op::HeadMatMul,
    ] {
        assert!(steps(&plan, gone).is_empty(), "{gone:?} left");
    }
    // The router's softmax is all that is left of the softmaxes.
    assert_eq!(steps(&plan, Op::Softmax).len(), n);
    let (h, c, r) = (cfg.n_head, cfg.kv_lora_rank, cfg.qk_rope_head_dim);
    let (nope, v) = (cfg.qk_nope_head_dim, cfg.v_head_dim);
    for (l, k) in kqkvs.iter().enumerate() {
        assert_eq!(
            k.attrs,
            Attrs::Kqkv {
                layer: l,
                n_head: h,
                kv_lora: c,
                rope_dim: r,
                kq_scale,
            }
        );
        assert_eq!(k.args.len(), 2);
        let shape = Shape(vec![Dim::Tokens, Dim::Fixed(h), Dim::Fixed(c)]);
        assert_eq!(plan.values[k.out].shape, shape);
        let w_in = producer(&plan, value_arg(k, 0)).unwrap();
        assert_eq!(w_in.op, Op::Wkb);
        assert_eq!(
            w_in.attrs,
            Attrs::Wkb {
                n_head: h,
                in_dim: nope,
                out_dim: c,
                rope_tail: r,
            }
        );
        assert_eq!(
            weight_name(&plan, w_in, 1),
            format!("blk.{l}.attn_k_b.weight")
        );
        let phase = producer(&plan, value_arg(w_in, 0)).unwrap();
        assert_eq!(
            phase.attrs,
            Attrs::Phase {
                layer: l,
                rope: cfg.rope.clone(),
                temperature: cfg.temperature.clone(),
                eps: cfg.rms_norm_eps,
                n_head: h,
                nope,
                rope_dim: r,
                kv_lora: c,
            }
        );
        assert_eq!(
            weight_name(&plan, phase, 2),
            format!("blk.{l}.attn_kv_a_norm.weight")
        );
        let q = producer(&plan, value_arg(phase, 0)).unwrap();
        assert_eq!(q.op, Op::Reshape);
        let kv_a = producer(&plan, value_arg(phase, 1)).unwrap();
        assert_eq!(
            weight_name(&plan, kv_a, 0),
            format!("blk.{l}.attn_kv_a_mqa.weight")
        );
        assert_eq!(value_arg(phase, 3), value_arg(k, 1), "one pos");
        // The phase precedes its kqkv in the schedule.
        let at = |s: &Step| plan.steps.iter().position(|x| x.out == s.out).unwrap();
        assert!(at(phase) < at(k));
        let w_out: Vec<_> = wkbs
            .iter()
            .filter(|s| s.args[0] == Operand::Value(k.out))
            .collect();
        assert_eq!(w_out.len(), 1);
        assert_eq!(
            w_out[0].attrs,
            Attrs::Wkb {
                n_head: h,
                in_dim: c,
                out_dim: v,
                rope_tail: 0,
            }
        );
        assert_eq!(
            weight_name(&plan, w_out[0], 1),
            format!("blk.{l}.attn_v_b.weight")
        );
    }
    let layers: Vec<usize> = phases
        .iter()
        .map(|p| match p.attrs {
            Attrs::Phase { layer, .. } => layer,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(layers, (0..n).collect::<Vec<_>>());
    // Every weight of the file is still read exactly once.
    assert_eq!(plan.weights.len(), w.len());
}

#[test]
fn all_on_fuses_every_layer_once_on_the_bundled_model() {
    check_fully_fused(&tiny256_config(), &tiny256_q2k_weights());
}

#[test]
fn all_on_fuses_the_f32_models_and_the_real_dims() {
    for layout in [ExpertLayout::FusedGateUp, ExpertLayout::SplitGateUp] {
        check_fully_fused(&tiny_config(layout), &tiny_f32_weights(layout));
    }
    check_fully_fused(&real_config(), &real_weights());
}

#[test]
fn a_graph_edit_without_temperature_still_fuses() {
    let mut cfg = tiny256_config();
    cfg.temperature = None;
    check_fully_fused(&cfg, &tiny256_q2k_weights());
    // And a different temperature reaches the phase's attributes.
    cfg.temperature = Some(QueryTemperature {
        scale: 0.25,
        length: 16,
    });
    check_fully_fused(&cfg, &tiny256_q2k_weights());
}

#[test]
fn off_plans_are_byte_identical_to_a_pipeline_without_the_pass() {
    let cfg = tiny256_config();
    let w = tiny256_q2k_weights();
    use Fusion::{Auto, Off, On};
    let none = json(&plan_without(&cfg, &w, &FUSIONS));
    for target in [Target::Oracle, Target::Gpu] {
        assert_eq!(
            json(&compile(&cfg, &w, &opts(target, Off, Off, Off)).unwrap()),
            none
        );
    }
    // Per flag, against the plan of the pipeline that ran only the other passes. KQKV off turns
    // PHASE (auto) off too: a phase needs its kqkv.
    let cases: [(CompileOptions, &[&str]); 4] = [
        (opts(Target::Gpu, Off, On, On), &["fuse_phase"]),
        (opts(Target::Gpu, On, Off, On), &["fuse_wkb"]),
        (
            opts(Target::Gpu, Auto, On, Off),
            &["fuse_kqkv", "fuse_phase"],
        ),
        (opts(Target::Gpu, Off, Off, On), &["fuse_phase", "fuse_wkb"]),
    ];
    for (o, skip) in cases {
        let plan = compile(&cfg, &w, &o).unwrap();
        assert_eq!(json(&plan), json(&plan_without(&cfg, &w, skip)), "{o:?}");
        assert!(plan.stages.iter().all(|s| !skip.contains(&s.as_str())));
        assert_ne!(json(&plan), none, "{o:?} fused nothing");
    }
    // And all on is the pipeline with every pass.
    let on = compile(&cfg, &w, &all(On)).unwrap();
    assert_eq!(json(&on), json(&plan_without(&cfg, &w, &[])));
}

#[test]
fn auto_is_off_for_the_cpu_oracle_and_on_for_gpu() {
    let cfg = tiny256_config();
    let w = tiny256_q2k_weights();
    let default = compile(&cfg, &w, &CompileOptions::default()).unwrap();
    assert_eq!(default.stages, ["build", "cse", "dce", "mark_head"]);
    assert_eq!(
        json(&compile(&cfg, &w, &all(Fusion::Auto)).unwrap()),
        json(&default)
    );
    assert_eq!(
        json(&compile(&cfg, &w, &all(Fusion::Off)).unwrap()),
        json(&default)
    );
    let gpu = CompileOptions {
        target: Target::Gpu,
        ..CompileOptions::default()
    };
    assert_eq!(
        json(&compile(&cfg, &w, &gpu).unwrap()),
        json(&compile(&cfg, &w, &all(Fusion::On)).unwrap())
    );
    // The cpu backend's target fuses latent attention only.
    let cpu = CompileOptions {
        target: Target::Cpu,
        ..CompileOptions::default()
    };
    let kqkv_alone = opts(Target::Oracle, Fusion::Off, Fusion::Off, Fusion::On);
    assert_eq!(
        json(&compile(&cfg, &w, &cpu).unwrap()),
        json(&compile(&cfg, &w, &kqkv_alone).unwrap())
    );
    // Each fusion can run alone where it stands alone.
    let wkb_only = opts(Target::Oracle, Fusion::Auto, Fusion::On, Fusion::Auto);
    let plan = compile(&cfg, &w, &wkb_only).unwrap();
    assert_eq!(
        plan.stages,
        ["build", "cse", "fuse_wkb", "dce", "mark_head"]
    );
    assert_eq!(steps(&plan, Op::Wkb).len(), 2 * cfg.n_layer);
    assert_eq!(steps(&plan, Op::CacheWrite).len(), cfg.n_layer);
    let kqkv_only = opts(Target::Oracle, Fusion::Off, Fusion::Off, Fusion::On);
    let plan = compile(&cfg, &w, &kqkv_only).unwrap();
    for k in steps(&plan, Op::Kqkv) {
        // The unfused write's view orders the read after the write.
        let cache = producer(&plan, value_arg(k, 2)).unwrap();
        assert_eq!(cache.op, Op::CacheWrite);
    }
    // Options round-trip through serde with their defaults.
    let o: CompileOptions = serde_json::from_str(r#"{"fuse_wkb":"on","target":"gpu"}"#).unwrap();
    assert_eq!(
        (o.fuse_wkb, o.fuse_phase, o.target),
        (Fusion::On, Fusion::Auto, Target::Gpu)
    );
}

#[test]
fn conflicting_fusion_options_are_refused_by_name() {
    let cfg = tiny256_config();
    let w = tiny256_q2k_weights();
    let phase_alone = opts(Target::Gpu, Fusion::On, Fusion::Auto, Fusion::Off);
    match compile(&cfg, &w, &phase_alone) {
        Err(e @ CompileError::FusionOptions { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("fuse_phase") && msg.contains("fuse_kqkv"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    let on_and_disabled = CompileOptions {
        disable: vec!["fuse_wkb".into()],
        ..all(Fusion::On)
    };
    match compile(&cfg, &w, &on_and_disabled) {
        Err(e @ CompileError::FusionOptions { .. }) => {
            assert!(e.to_string().contains("fuse_wkb"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // Disabling a fusion stage under auto is the same as off.
    let disabled = CompileOptions {
        disable: vec!["fuse_wkb".into()],
        target: Target::Gpu,
        ..CompileOptions::default()
    };
    let off = opts(Target::Gpu, Fusion::Auto, Fusion::Off, Fusion::Auto);
    assert_eq!(
        json(&compile(&cfg, &w, &disabled).unwrap()),
        json(&compile(&cfg, &w, &off).unwrap())
    );
}

#[test]
fn fusion_stages_dump_their_nodes() {
    let cfg = tiny256_config();
    let w = tiny256_q2k_weights();
    let gpu = CompileOptions {
        target: Target::Gpu,
        ..CompileOptions::default()
    };
    let kqkv = dump_after(&cfg, &w, &gpu, "fuse_kqkv", DumpFormat::Text).unwrap();
    assert!(
        kqkv.contains("= kqkv(") && kqkv.contains("cache_write("),
        "{kqkv}"
    );
    assert!(!kqkv.contains("= phase("));
    let phase = dump_after(&cfg, &w, &gpu, "fuse_phase", DumpFormat::Text).unwrap();
    assert!(
        phase.contains("= phase(") && !phase.contains("cache_write("),
        "{phase}"
    );
    assert!(phase.contains("temperature=(0.1, 64)"), "{phase}");
    let wkb = dump_after(&cfg, &w, &gpu, "fuse_wkb", DumpFormat::Text).unwrap();
    assert!(
        wkb.contains("rope_tail=32") && wkb.contains("rope_tail=0"),
        "{wkb}"
    );
    assert!(!wkb.contains("head_mat_mul("), "{wkb}");
    // Stages that did not run cannot be dumped.
    assert!(matches!(
        dump_after(
            &cfg,
            &w,
            &CompileOptions::default(),
            "fuse_wkb",
            DumpFormat::Text
        ),
        Err(CompileError::UnknownStage { .. })
    ));
}

/// A pass finds nothing when the legality condition fails: here the mask reads other positions
/// than the cache write (and the graph is left as it was).
#[test]
fn kqkv_needs_one_pos_for_write_and_mask() {
    let ws = BTreeMap::new();
    let mut b = Builder::new(&ws);
    let t = |d: &[usize]| {
        let mut s = vec![Dim::Tokens];
        s.extend(d.iter().map(|&n| Dim::Fixed(n)));
        Shape(s)
    };
    let pos = b.input("pos", DType::I32, t(&[])).unwrap();
    let pos2 = b.input("pos2", DType::I32, t(&[])).unwrap();
    let kv = b.input("kv", DType::F32, t(&[6])).unwrap();
    let q = b.input("q", DType::F32, t(&[2, 6])).unwrap();
    let cache = b.cache_write(kv, pos, 0).unwrap();
    let s = b.scores_qk(q, cache).unwrap();
    let s = b.scale(s, 0.5).unwrap();
    let m = b.causal_mask(s, pos2).unwrap();
    let p = b.softmax(m).unwrap();
    let o = b.weighted_sum(p, cache, 4).unwrap();
    b.output("o", o).unwrap();
    let mut g = b.finish().unwrap();
    let before = g.to_text();
    assert_eq!(fuse_kqkv::run(&mut g).unwrap(), 0);
    assert_eq!(g.to_text(), before);
    // With one pos it fuses, keeping the write's view as the ordering operand.
    let mut b = Builder::new(&ws);
    let pos = b.input("pos", DType::I32, t(&[])).unwrap();
    let kv = b.input("kv", DType::F32, t(&[6])).unwrap();
    let q = b.input("q", DType::F32, t(&[2, 6])).unwrap();
    let cache = b.cache_write(kv, pos, 0).unwrap();
    let s = b.scores_qk(q, cache).unwrap();
    let s = b.scale(s, 0.5).unwrap();
    let m = b.causal_mask(s, pos).unwrap();
    let p = b.softmax(m).unwrap();
    let o = b.weighted_sum(p, cache, 4).unwrap();
    b.output("o", o).unwrap();
    let mut g = b.finish().unwrap();
    assert_eq!(fuse_kqkv::run(&mut g).unwrap(), 1);
    verify(&g).unwrap();
    let text = g.to_text();
    assert!(
        text.contains("kqkv(") && text.contains("kv_lora=4, rope_dim=2, kq_scale=0.5"),
        "{text}"
    );
    assert!(!text.contains("softmax("), "{text}");
}

// ------------------------------------------------------------ rules of the fused ops

fn f32_in(b: &mut Builder<'_>, name: &str, d: &[usize]) -> aubier_compiler::ir::NodeId {
    let mut s = vec![Dim::Tokens];
    s.extend(d.iter().map(|&n| Dim::Fixed(n)));
    b.input(name, DType::F32, Shape(s)).unwrap()
}

fn small_weights() -> BTreeMap<String, WeightRef> {
    let mut m = BTreeMap::new();
    for (name, ne) in [
        ("norm", vec![4]),
        ("k_b", vec![2, 4, 3]),
        ("v_b", vec![4, 5, 3]),
    ] {
        m.insert(
            name.to_string(),
            WeightRef {
                name: name.into(),
                ggml_type: "F32".into(),
                ne,
            },
        );
    }
    m
}

/// H 3, N 2, R 2, C 4, V 5; `n_rot` rotated dims.
fn phase_attrs(layer: usize, n_rot: usize) -> Attrs {
    let mut rope = tiny256_config().rope;
    rope.n_rot = n_rot;
    Attrs::Phase {
        layer,
        rope,
        temperature: None,
        eps: 1e-6,
        n_head: 3,
        nope: 2,
        rope_dim: 2,
        kv_lora: 4,
    }
}

fn kqkv_attrs(layer: usize) -> Attrs {
    Attrs::Kqkv {
        layer,
        n_head: 3,
        kv_lora: 4,
        rope_dim: 2,
        kq_scale: 0.5,
    }
}

fn wkb_in() -> Attrs {
    Attrs::Wkb {
        n_head: 3,
        in_dim: 2,
        out_dim: 4,
        rope_tail: 2,
    }
}

#[test]
fn fused_ops_infer_the_contract_shapes() {
    let ws = small_weights();
    let mut b = Builder::new(&ws);
    let pos = b
        .input("pos", DType::I32, Shape(vec![Dim::Tokens]))
        .unwrap();
    let q = f32_in(&mut b, "q", &[3, 4]);
    let kv_a = f32_in(&mut b, "kv_a", &[6]);
    let norm = b.weight("norm").unwrap();
    let k_b = b.weight("k_b").unwrap();
    let v_b = b.weight("v_b").unwrap();
    let q2 = b
        .op(Op::Phase, phase_attrs(0, 2), &[q, kv_a, norm, pos])
        .unwrap();
    let q_abs = b.op(Op::Wkb, wkb_in(), &[q2, k_b]).unwrap();
    let o_lat = b.op(Op::Kqkv, kqkv_attrs(0), &[q_abs, pos]).unwrap();
    let out = Attrs::Wkb {
        n_head: 3,
        in_dim: 4,
        out_dim: 5,
        rope_tail: 0,
    };
    let o = b.op(Op::Wkb, out, &[o_lat, v_b]).unwrap();
    b.output("o", o).unwrap();
    let g = b.finish().unwrap();
    let ty = |n| g.node(n).unwrap().ty.clone().unwrap().to_string();
    assert_eq!(ty(q2), "f32[T, 3, 4]");
    assert_eq!(ty(q_abs), "f32[T, 3, 6]");
    assert_eq!(ty(o_lat), "f32[T, 3, 4]");
    assert_eq!(ty(o), "f32[T, 3, 5]");
}

#[test]
fn fused_ops_reject_bad_operands_naming_the_node() {
    let ws = small_weights();
    let mut b = Builder::new(&ws);
    let pos = b
        .input("pos", DType::I32, Shape(vec![Dim::Tokens]))
        .unwrap();
    let q = f32_in(&mut b, "q", &[3, 4]);
    let kv_a = f32_in(&mut b, "kv_a", &[6]);
    let norm = b.weight("norm").unwrap();
    let k_b = b.weight("k_b").unwrap();
    let v_b = b.weight("v_b").unwrap();
    let msg = |r: Result<_, CompileError>| r.unwrap_err().to_string();
    // phase: q where kv_a should be, the norm weight where q should be, no pos, bad n_rot.
    let e = msg(b.op(Op::Phase, phase_attrs(0, 2), &[q, q, norm, pos]));
    assert!(
        e.contains("phase(") && e.contains("operand 1 must have rank 2"),
        "{e}"
    );
    let e = msg(b.op(Op::Phase, phase_attrs(0, 2), &[norm, kv_a, norm, pos]));
    assert!(
        e.contains("phase(") && e.contains("must be an activation"),
        "{e}"
    );
    let e = msg(b.op(Op::Phase, phase_attrs(0, 2), &[q, kv_a, norm]));
    assert!(e.contains("`phase` takes 4 operands, found 3"), "{e}");
    let e = msg(b.op(Op::Phase, phase_attrs(0, 4), &[q, kv_a, norm, pos]));
    assert!(e.contains("n_rot 4"), "{e}");
    // wkb: the OUT weight under IN attributes.
    let e = msg(b.op(Op::Wkb, wkb_in(), &[q, v_b]));
    assert!(e.contains("wkb") && e.contains("v_b"), "{e}");
    let e = msg(b.op(Op::Wkb, Attrs::None, &[q, k_b]));
    assert!(e.contains("`wkb` cannot take attributes"), "{e}");
    // kqkv: q_abs of the wrong width; a cache operand of the wrong shape.
    let e = msg(b.op(Op::Kqkv, kqkv_attrs(0), &[q, pos]));
    assert!(e.contains("kqkv") && e.contains("q_abs last axis"), "{e}");
    let q_abs = b.op(Op::Wkb, wkb_in(), &[q, k_b]).unwrap();
    let e = msg(b.op(Op::Kqkv, kqkv_attrs(0), &[q_abs, pos, kv_a]));
    assert!(e.contains("kqkv") && e.contains("cache rows"), "{e}");
    let e = msg(b.op(Op::Kqkv, kqkv_attrs(0), &[q_abs]));
    assert!(e.contains("takes 2 or 3 operands, found 1"), "{e}");
}

/// Rule 8 of the verifier: a kqkv must read its layer's cache after the write.
#[test]
fn verifier_orders_every_kqkv_after_its_layers_write() {
    let ws = small_weights();
    let setup = || {
        let mut b = Builder::new(&ws);
        let pos = b
            .input("pos", DType::I32, Shape(vec![Dim::Tokens]))
            .unwrap();
        let q = f32_in(&mut b, "q", &[3, 4]);
        let kv_a = f32_in(&mut b, "kv_a", &[6]);
        let q_other = f32_in(&mut b, "q_other", &[3, 6]);
        (b, pos, q, kv_a, q_other)
    };
    let rule8 = |r: Result<(), VerifyError>, layer: usize| match r {
        Err(VerifyError::KqkvBeforeWrite { layer: l, .. }) => assert_eq!(l, layer),
        other => panic!("{other:?}"),
    };

    // No writer at all.
    let (mut b, pos, _, _, q_other) = setup();
    let k = b.op(Op::Kqkv, kqkv_attrs(0), &[q_other, pos]).unwrap();
    b.output("o", k).unwrap();
    rule8(verify(b.graph()), 0);

    // A phase of layer 0 that the kqkv does not depend on.
    let (mut b, pos, q, kv_a, q_other) = setup();
    let norm = b.weight("norm").unwrap();
    b.op(Op::Phase, phase_attrs(0, 2), &[q, kv_a, norm, pos])
        .unwrap();
    let k = b.op(Op::Kqkv, kqkv_attrs(0), &[q_other, pos]).unwrap();
    b.output("o", k).unwrap();
    rule8(verify(b.graph()), 0);

    // Through the phase of another layer.
    let (mut b, pos, q, kv_a, _) = setup();
    let norm = b.weight("norm").unwrap();
    let k_b = b.weight("k_b").unwrap();
    let q2 = b
        .op(Op::Phase, phase_attrs(1, 2), &[q, kv_a, norm, pos])
        .unwrap();
    let q_abs = b.op(Op::Wkb, wkb_in(), &[q2, k_b]).unwrap();
    let k = b.op(Op::Kqkv, kqkv_attrs(0), &[q_abs, pos]).unwrap();
    b.output("o", k).unwrap();
    rule8(verify(b.graph()), 0);

    // A cache operand that is not the layer's write (layer 1's write, read as layer 0).
    let (mut b, pos, _, kv_a, q_other) = setup();
    let cache = b.cache_write(kv_a, pos, 1).unwrap();
    let k = b
        .op(Op::Kqkv, kqkv_attrs(0), &[q_other, pos, cache])
        .unwrap();
    b.output("o", k).unwrap();
    rule8(verify(b.graph()), 0);

    // The two legal forms.
    let (mut b, pos, q, kv_a, _) = setup();
    let norm = b.weight("norm").unwrap();
    let k_b = b.weight("k_b").unwrap();
    let q2 = b
        .op(Op::Phase, phase_attrs(0, 2), &[q, kv_a, norm, pos])
        .unwrap();
    let q_abs = b.op(Op::Wkb, wkb_in(), &[q2, k_b]).unwrap();
    let k = b.op(Op::Kqkv, kqkv_attrs(0), &[q_abs, pos]).unwrap();
    b.output("o", k).unwrap();
    assert_eq!(verify(b.graph()), Ok(()));
    let (mut b, pos, _, kv_a, q_other) = setup();
    let cache = b.cache_write(kv_a, pos, 0).unwrap();
    let k = b
        .op(Op::Kqkv, kqkv_attrs(0), &[q_other, pos, cache])
        .unwrap();
    b.output("o", k).unwrap();
    assert_eq!(verify(b.graph()), Ok(()));

    // And a phase counts as its layer's cache writer (rule 7).
    let (mut b, pos, q, kv_a, _) = setup();
    let norm = b.weight("norm").unwrap();
    b.cache_write(kv_a, pos, 0).unwrap();
    b.op(Op::Phase, phase_attrs(0, 2), &[q, kv_a, norm, pos])
        .unwrap();
    assert!(matches!(
        verify(b.graph()),
        Err(VerifyError::DuplicateCacheWrite { layer: 0, .. })
    ));
}
