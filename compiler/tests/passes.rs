//! DCE and CSE on small graphs: what they remove, merge and keep. The verifier runs after each.

use aubier_compiler::builder::Builder;
use aubier_compiler::ir::{Graph, NodeKind, TensorType};
use aubier_compiler::ops::Op;
use aubier_compiler::passes::{cse, dce};
use aubier_compiler::types::{DType, Dim, Shape, WeightRef};
use aubier_compiler::verify::verify;
use std::collections::BTreeMap;

fn t4() -> Shape {
    Shape(vec![Dim::Tokens, Dim::Fixed(4)])
}

fn weights() -> BTreeMap<String, WeightRef> {
    let mut m = BTreeMap::new();
    for name in ["a.weight", "b.weight"] {
        m.insert(
            name.to_string(),
            WeightRef {
                name: name.into(),
                ggml_type: "F32".into(),
                ne: vec![4],
            },
        );
    }
    m
}

fn run(
    g: &mut Graph,
    pass: fn(&mut Graph) -> Result<usize, aubier_compiler::CompileError>,
) -> usize {
    let n = pass(g).unwrap();
    verify(g).unwrap();
    n
}

#[test]
fn dce_removes_a_dead_node_and_its_weight() {
    let ws = weights();
    let mut b = Builder::new(&ws);
    let x = b.input("x", DType::F32, t4()).unwrap();
    let live = b.silu(x).unwrap();
    let wb = b.weight("b.weight").unwrap();
    let dead = b.rms_norm(x, wb, 1e-6).unwrap();
    b.output("y", live).unwrap();
    let mut g = b.finish().unwrap();
    assert_eq!(run(&mut g, dce::run), 2);
    assert!(g.node(dead).is_none());
    assert!(g.node(wb).is_none());
    assert!(g.node(live).is_some() && g.node(x).is_some());
    // Idempotent.
    assert_eq!(run(&mut g, dce::run), 0);
}

#[test]
fn dce_keeps_inputs_and_cache_writes_nobody_reads() {
    let ws = weights();
    let mut b = Builder::new(&ws);
    let x = b.input("x", DType::F32, t4()).unwrap();
    let pos = b
        .input("pos", DType::I32, Shape(vec![Dim::Tokens]))
        .unwrap();
    let unused = b.input("unused", DType::F32, t4()).unwrap();
    let kv = b.silu(x).unwrap();
    let cache = b.cache_write(kv, pos, 0).unwrap();
    let y = b.scale(x, 2.0).unwrap();
    b.output("y", y).unwrap();
    let mut g = b.finish().unwrap();
    assert_eq!(run(&mut g, dce::run), 0);
    for n in [x, pos, unused, kv, cache, y] {
        assert!(g.node(n).is_some());
    }
}

#[test]
fn cse_merges_duplicates_and_whole_duplicated_chains() {
    let ws = weights();
    let mut b = Builder::new(&ws);
    let x = b.input("x", DType::F32, t4()).unwrap();
    let a1 = b.silu(x).unwrap();
    let a2 = b.scale(a1, 0.5).unwrap();
    let b1 = b.silu(x).unwrap();
    let b2 = b.scale(b1, 0.5).unwrap();
    let y = b.add(a2, b2).unwrap();
    b.output("y", y).unwrap();
    b.output("b2", b2).unwrap();
    let mut g = b.finish().unwrap();
    assert_eq!(run(&mut g, cse::run), 2);
    assert_eq!(g.count_op(Op::Silu), 1);
    assert_eq!(g.count_op(Op::Scale), 1);
    assert_eq!(g.operands(y), vec![a2, a2]);
    assert_eq!(g.outputs[1].1, a2, "outputs follow the merge");
}

#[test]
fn cse_does_not_merge_different_attrs() {
    let ws = weights();
    let mut b = Builder::new(&ws);
    let x = b.input("x", DType::F32, t4()).unwrap();
    let w = b.weight("a.weight").unwrap();
    let outs = [
        b.scale(x, 2.0).unwrap(),
        b.scale(x, 3.0).unwrap(),
        b.scale(x, 0.0).unwrap(),
        b.scale(x, -0.0).unwrap(),
        b.rms_norm(x, w, 1e-6).unwrap(),
        b.rms_norm(x, w, 1e-5).unwrap(),
        b.slice(x, 0, 2).unwrap(),
        b.slice(x, 2, 2).unwrap(),
    ];
    for (i, o) in outs.iter().enumerate() {
        b.output(format!("o{i}"), *o).unwrap();
    }
    let mut g = b.finish().unwrap();
    assert_eq!(run(&mut g, cse::run), 0);
    for o in outs {
        assert!(g.node(o).is_some());
    }
}

#[test]
fn cse_merges_commuted_add_and_mul_but_not_inputs() {
    let ws = weights();
    let mut b = Builder::new(&ws);
    let x = b.input("x", DType::F32, t4()).unwrap();
    let z = b.input("z", DType::F32, t4()).unwrap();
    let s1 = b.add(x, z).unwrap();
    let s2 = b.add(z, x).unwrap();
    let m1 = b.mul(s1, s2).unwrap();
    b.output("m", m1).unwrap();
    let mut g = b.finish().unwrap();
    assert_eq!(run(&mut g, cse::run), 1);
    assert_eq!(g.count_op(Op::Add), 1);
    assert!(g.node(x).is_some() && g.node(z).is_some());
}

#[test]
fn cse_merges_weight_nodes_of_the_same_tensor() {
    let ws = weights();
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::f32(t4()));
    let w1 = g.add_weight(ws["a.weight"].clone());
    let w2 = g.add_weight(ws["a.weight"].clone());
    let mut outs = Vec::new();
    for (i, w) in [w1, w2].into_iter().enumerate() {
        let n = g.add_op(
            Op::RmsNorm,
            aubier_compiler::types::Attrs::Eps(1e-6),
            &[x, w],
        );
        g.g[n].ty = Some(TensorType::f32(t4()));
        g.outputs.push((format!("o{i}"), n));
        outs.push(n);
    }
    verify(&g).unwrap();
    // The two weights merge, then the two norms over them.
    assert_eq!(run(&mut g, cse::run), 2);
    let weights =
        g.g.node_weights()
            .filter(|n| matches!(n.kind, NodeKind::Weight(_)))
            .count();
    assert_eq!(weights, 1);
    assert_eq!(g.count_op(Op::RmsNorm), 1);
}
