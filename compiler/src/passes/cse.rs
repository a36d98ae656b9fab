//! Common-subexpression elimination.
//!
//! Algorithm note. Value numbering in topological order: a node's key is its kind (op and
//! attributes, or the full `WeightRef` of a weight) plus its operand ids in position order, with
//! the two operands of `add` and `mul` sorted (IEEE-754 addition and multiplication are
//! commutative, bit for bit). Operands are visited before their users, so by the time a node is
//! keyed its operands are already the canonical representatives, and one pass merges whole
//! duplicated chains. A node whose key was seen before has its uses (edges and outputs)
//! redirected to the first node, which keeps its name (or takes the duplicate's if it had none),
//! and is removed. Attributes compare through their canonical form (`types::Attrs`), so ops that
//! differ only in an attribute stay apart. Inputs are never merged (each is bound separately),
//! nor are `cache_write`s or `phase`s (each writes the cache). Returns the number of nodes merged away.

use crate::error::CompileError;
use crate::ir::{Graph, NodeId, NodeKind};
use crate::ops::Op;
use crate::types::{Attrs, WeightRef};
use std::collections::HashMap;

#[derive(PartialEq, Eq, Hash)]
enum Key {
    Weight(WeightRef),
    Op(Op, Attrs, Vec<NodeId>),
}

/// Merges duplicate nodes; returns how many were removed.
///
/// Errors: [`CompileError::Verify`] (stage `cse`) when the graph has a cycle.
pub fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let order = g.topo_order().map_err(|left| CompileError::Verify {
        stage: "cse".to_string(),
        source: crate::verify::VerifyError::Cycle {
            nodes: left
                .iter()
                .map(|&n| g.label(n))
                .collect::<Vec<_>>()
                .join(", "),
        },
    })?;
    let mut seen: HashMap<Key, NodeId> = HashMap::new();
    let mut merged = 0;
    for n in order {
        let Some(node) = g.node(n) else { continue };
        let key = match &node.kind {
            NodeKind::Input { .. } => continue,
            NodeKind::Weight(w) => Key::Weight(w.clone()),
            NodeKind::Op {
                op: Op::CacheWrite | Op::Phase,
                ..
            } => continue,
            NodeKind::Op { op, attrs } => {
                let mut args = g.operands(n);
                if matches!(op, Op::Add | Op::Mul) {
                    args.sort();
                }
                Key::Op(*op, attrs.clone(), args)
            }
        };
        match seen.get(&key) {
            Some(&first) => {
                let name = node.name.clone();
                g.replace_uses(n, first);
                if let Some(f) = g.g.node_weight_mut(first) {
                    if f.name.is_empty() {
                        f.name = name;
                    }
                }
                g.g.remove_node(n);
                merged += 1;
            }
            None => {
                seen.insert(key, n);
            }
        }
    }
    Ok(merged)
}
