//! The verifier catches each malformed-graph rule (one test per rule, each breaking only it),
//! and accepts the well-formed graph they all start from.

use aubier_compiler::builder::Builder;
use aubier_compiler::ir::{Graph, NodeId, TensorType, Use};
use aubier_compiler::ops::Op;
use aubier_compiler::types::{Attrs, DType, Dim, Shape, WeightRef};
use aubier_compiler::verify::{verify, VerifyError};
use std::collections::BTreeMap;

fn weights() -> BTreeMap<String, WeightRef> {
    let mut m = BTreeMap::new();
    m.insert(
        "norm.weight".to_string(),
        WeightRef {
            name: "norm.weight".into(),
            ggml_type: "F32".into(),
            ne: vec![4],
        },
    );
    m
}

fn t4() -> Shape {
    Shape(vec![Dim::Tokens, Dim::Fixed(4)])
}

/// x [T, 4] f32, pos [T] i32, norm{4}; h = rms_norm(x); y = silu(h); output y.
struct Base {
    g: Graph,
    x: NodeId,
    pos: NodeId,
    w: NodeId,
    h: NodeId,
    y: NodeId,
}

fn base() -> Base {
    let ws = weights();
    let mut b = Builder::new(&ws);
    let x = b.input("x", DType::F32, t4()).unwrap();
    let pos = b
        .input("pos", DType::I32, Shape(vec![Dim::Tokens]))
        .unwrap();
    let w = b.weight("norm.weight").unwrap();
    let h = b.rms_norm(x, w, 1e-6).unwrap();
    let y = b.silu(h).unwrap();
    b.output("y", y).unwrap();
    let g = b.finish().unwrap();
    Base { g, x, pos, w, h, y }
}

fn err(g: &Graph) -> VerifyError {
    verify(g).expect_err("verifier accepted a malformed graph")
}

#[test]
fn well_formed_graph_passes() {
    assert_eq!(verify(&base().g), Ok(()));
}

#[test]
fn rule1_cycle() {
    let Base { mut g, h, y, .. } = base();
    // h = rms_norm(x, w) now also reads y at a third position: h → y → h.
    g.g.add_edge(y, h, Use { pos: 2 });
    assert!(matches!(err(&g), VerifyError::Cycle { .. }));
}

#[test]
fn rule2_source_with_operands() {
    let Base { mut g, x, w, .. } = base();
    g.g.add_edge(x, w, Use { pos: 0 });
    assert!(matches!(err(&g), VerifyError::SourceWithOperands { .. }));
}

#[test]
fn rule2_operand_positions() {
    let Base { mut g, x, .. } = base();
    let n = g.add_op(Op::Add, Attrs::None, &[]);
    g.g.add_edge(x, n, Use { pos: 0 });
    g.g.add_edge(x, n, Use { pos: 2 });
    g.g[n].ty = Some(TensorType::f32(t4()));
    assert!(matches!(
        err(&g),
        VerifyError::OperandPositions { found, .. } if found == vec![0, 2]
    ));
}

#[test]
fn rule3_arity() {
    let Base { mut g, x, .. } = base();
    let n = g.add_op(Op::Silu, Attrs::None, &[x, x]);
    g.g[n].ty = Some(TensorType::f32(t4()));
    assert!(matches!(
        err(&g),
        VerifyError::Arity {
            expected: 1,
            found: 2,
            ..
        }
    ));
}

#[test]
fn rule4_operands_rejected_by_the_op_rule() {
    let Base { mut g, x, pos, .. } = base();
    let n = g.add_op(Op::Add, Attrs::None, &[x, pos]);
    g.g[n].ty = Some(TensorType::f32(t4()));
    assert!(matches!(err(&g), VerifyError::Type { .. }));
}

#[test]
fn rule4_wrong_attrs_for_the_op() {
    let Base { mut g, h, .. } = base();
    if let aubier_compiler::ir::NodeKind::Op { attrs, .. } = &mut g.g[h].kind {
        *attrs = Attrs::TopK { k: 2 };
    }
    assert!(matches!(err(&g), VerifyError::Type { .. }));
}

#[test]
fn rule4_stale_type() {
    let Base { mut g, y, .. } = base();
    g.g[y].ty = Some(TensorType::f32(Shape(vec![Dim::Tokens, Dim::Fixed(5)])));
    assert!(matches!(err(&g), VerifyError::StaleType { .. }));
}

#[test]
fn rule5_input_not_listed() {
    let Base { mut g, .. } = base();
    g.inputs.pop();
    assert!(matches!(err(&g), VerifyError::InputList { .. }));
}

#[test]
fn rule5_listed_node_is_not_an_input() {
    let Base { mut g, w, .. } = base();
    g.inputs.push(w);
    assert!(matches!(err(&g), VerifyError::InputList { .. }));
}

#[test]
fn rule5_duplicate_input_name() {
    let Base { mut g, .. } = base();
    g.add_input("x", TensorType::f32(t4()));
    assert!(matches!(
        err(&g),
        VerifyError::DuplicateName { kind: "input", .. }
    ));
}

#[test]
fn rule6_dangling_output() {
    let Base { mut g, x, .. } = base();
    let n = g.add_op(Op::Silu, Attrs::None, &[x]);
    g.outputs.push(("gone".into(), n));
    g.g.remove_node(n);
    assert!(matches!(err(&g), VerifyError::DanglingOutput { .. }));
}

#[test]
fn rule6_output_is_a_weight() {
    let Base { mut g, w, .. } = base();
    g.outputs.push(("w".into(), w));
    assert!(matches!(err(&g), VerifyError::OutputIsWeight { .. }));
}

#[test]
fn rule6_duplicate_output_name() {
    let Base { mut g, h, .. } = base();
    g.outputs.push(("y".into(), h));
    assert!(matches!(
        err(&g),
        VerifyError::DuplicateName { kind: "output", .. }
    ));
}

#[test]
fn rule7_two_cache_writes_to_one_layer() {
    let Base { mut g, x, pos, .. } = base();
    for _ in 0..2 {
        let n = g.add_op(Op::CacheWrite, Attrs::CacheWrite { layer: 3 }, &[x, pos]);
        g.g[n].ty = Some(TensorType::f32(Shape(vec![Dim::Keys, Dim::Fixed(4)])));
    }
    assert!(matches!(
        err(&g),
        VerifyError::DuplicateCacheWrite { layer: 3, .. }
    ));
}
