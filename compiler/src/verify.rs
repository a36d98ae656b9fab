//! The IR verifier, run after every stage of the pipeline.
//!
//! Algorithm note. One walk over the nodes in id order, then one over the input and output
//! lists; the first broken rule is returned (each rule has its own [`VerifyError`] variant and a
//! test that breaks exactly it):
//! 1. the graph is acyclic;
//! 2. inputs and weights have no operands; an op's operand positions are exactly `0..n`;
//! 3. a fixed-arity op has exactly `arity` operands;
//! 4. every op's rule (`infer::infer_node`) accepts its operands, and the type stored on the node
//!    equals the one re-inferred (a pass that rewires a node must re-infer it);
//! 5. `Graph::inputs` lists exactly the input nodes, once each, under distinct names;
//! 6. outputs name existing activation nodes (not weights), under distinct names;
//! 7. at most one writer (`cache_write` or `phase`) per latent-cache layer (two would race on
//!    the same rows);
//! 8. every `kqkv` of layer l reads that layer's cache after it is written: either its third
//!    operand is the `cache_write` of layer l, or it has two operands and the `phase` of layer l
//!    is one of its ancestors (the data dependency phase → wkb → kqkv is what orders the write
//!    before the read, since the fused read takes no cache operand).

use crate::infer::{infer_node, InferError};
use crate::ir::{Graph, NodeId, NodeKind, TensorType};
use crate::ops::Op;
use crate::types::Attrs;
use petgraph::Direction;
use std::collections::{BTreeMap, BTreeSet};

/// A broken structural rule, naming the node, input, output or layer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    /// Rule 1.
    #[error("the graph has a cycle through {nodes}")]
    Cycle {
        /// Labels of the nodes left on cycles.
        nodes: String,
    },
    /// Rule 2: an input or weight with operands.
    #[error("`{node}` is an input or weight but has operands")]
    SourceWithOperands {
        /// Node label.
        node: String,
    },
    /// Rule 2: operand positions with gaps or repeats.
    #[error("`{node}` has operand positions {found:?}, expected 0..{}", found.len())]
    OperandPositions {
        /// Node label.
        node: String,
        /// The positions on its incoming edges, sorted.
        found: Vec<usize>,
    },
    /// Rule 3.
    #[error("`{node}`: `{op}` takes {expected} operands, found {found}")]
    Arity {
        /// Node label.
        node: String,
        /// Op name.
        op: &'static str,
        /// The op's arity.
        expected: usize,
        /// Operands present.
        found: usize,
    },
    /// Rule 4: the op's rule rejects its operands.
    #[error("`{node}`: {source}")]
    Type {
        /// Node label.
        node: String,
        /// The rule's complaint.
        #[source]
        source: InferError,
    },
    /// Rule 4: the stored type is not the inferred one.
    #[error("`{node}` stores type {stored} but its operands give {inferred}")]
    StaleType {
        /// Node label.
        node: String,
        /// Type on the node (`none` when unset).
        stored: String,
        /// Type re-inferred (`none` for weights).
        inferred: String,
    },
    /// Rule 5: an input node missing from, or repeated in, `Graph::inputs`, or a listed node that
    /// is not an input.
    #[error("input list is inconsistent at `{node}`")]
    InputList {
        /// Node label.
        node: String,
    },
    /// Rules 5 and 6: a repeated input or output name.
    #[error("{kind} name `{name}` is used twice")]
    DuplicateName {
        /// `input` or `output`.
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// Rule 6: an output naming a removed node.
    #[error("output `{name}` refers to missing node %{index}")]
    DanglingOutput {
        /// Output name.
        name: String,
        /// The missing node index.
        index: usize,
    },
    /// Rule 6: an output naming a weight.
    #[error("output `{name}` is the weight `{weight}`, not an activation")]
    OutputIsWeight {
        /// Output name.
        name: String,
        /// The weight's GGUF name.
        weight: String,
    },
    /// Rule 7.
    #[error("latent-cache layer {layer} is written by both `{first}` and `{second}`")]
    DuplicateCacheWrite {
        /// Cache layer.
        layer: usize,
        /// Label of the first writer.
        first: String,
        /// Label of the second writer.
        second: String,
    },
    /// Rule 8: a `kqkv` that could be scheduled before its layer's cache write.
    #[error(
        "`{node}` reads latent-cache layer {layer} but is not ordered after its write: {detail}"
    )]
    KqkvBeforeWrite {
        /// Label of the `kqkv`.
        node: String,
        /// Its cache layer.
        layer: usize,
        /// What is missing.
        detail: String,
    },
}

/// Checks every rule of the module note on `g`.
///
/// Errors: the first broken rule as a [`VerifyError`].
pub fn verify(g: &Graph) -> Result<(), VerifyError> {
    if let Err(left) = g.topo_order() {
        let nodes: Vec<String> = left.iter().map(|&n| g.label(n)).collect();
        return Err(VerifyError::Cycle {
            nodes: nodes.join(", "),
        });
    }
    let mut cache_writers: BTreeMap<usize, NodeId> = BTreeMap::new();
    for n in g.g.node_indices() {
        let Some(node) = g.node(n) else { continue };
        let positions = g.operand_positions(n);
        let op = match &node.kind {
            NodeKind::Input { .. } | NodeKind::Weight(_) => {
                if !positions.is_empty() {
                    return Err(VerifyError::SourceWithOperands { node: g.label(n) });
                }
                None
            }
            NodeKind::Op { op, attrs } => {
                if positions.iter().enumerate().any(|(i, &p)| i != p) {
                    return Err(VerifyError::OperandPositions {
                        node: g.label(n),
                        found: positions,
                    });
                }
                if let Some(arity) = op.arity() {
                    if positions.len() != arity {
                        return Err(VerifyError::Arity {
                            node: g.label(n),
                            op: op.name(),
                            expected: arity,
                            found: positions.len(),
                        });
                    }
                }
                if let (Op::CacheWrite, Attrs::CacheWrite { layer })
                | (Op::Phase, Attrs::Phase { layer, .. }) = (op, attrs)
                {
                    if let Some(&first) = cache_writers.get(layer) {
                        return Err(VerifyError::DuplicateCacheWrite {
                            layer: *layer,
                            first: g.label(first),
                            second: g.label(n),
                        });
                    }
                    cache_writers.insert(*layer, n);
                }
                Some(*op)
            }
        };
        let inferred = infer_node(g, n).map_err(|source| VerifyError::Type {
            node: g.label(n),
            source,
        })?;
        if op.is_some() && inferred != node.ty {
            return Err(VerifyError::StaleType {
                node: g.label(n),
                stored: fmt_ty(&node.ty),
                inferred: fmt_ty(&inferred),
            });
        }
    }
    verify_kqkv_order(g, &cache_writers)?;
    verify_inputs(g)?;
    verify_outputs(g)
}

/// Rule 8, given the cache writer of each layer (rule 7 made it unique).
fn verify_kqkv_order(g: &Graph, writers: &BTreeMap<usize, NodeId>) -> Result<(), VerifyError> {
    for n in g.g.node_indices() {
        let Some(NodeKind::Op {
            op: Op::Kqkv,
            attrs: Attrs::Kqkv { layer, .. },
        }) = g.node(n).map(|x| &x.kind)
        else {
            continue;
        };
        let fail = |detail: String| VerifyError::KqkvBeforeWrite {
            node: g.label(n),
            layer: *layer,
            detail,
        };
        let writer = writers
            .get(layer)
            .and_then(|&w| Some((w, g.node(w)?.op()?)));
        match (g.operands(n).get(2).copied(), writer) {
            (Some(cache), Some((w, Op::CacheWrite))) if cache == w => {}
            (Some(cache), _) => {
                return Err(fail(format!(
                    "its third operand `{}` is not the layer's `cache_write`",
                    g.label(cache)
                )))
            }
            (None, Some((w, Op::Phase))) => {
                if !is_ancestor(g, w, n) {
                    return Err(fail(format!(
                        "the layer's `phase` `{}` is not among its operands' ancestors",
                        g.label(w)
                    )));
                }
            }
            (None, _) => {
                return Err(fail(
                    "it has no cache operand and the layer has no `phase`".to_string(),
                ))
            }
        }
    }
    Ok(())
}

/// True when `a` reaches `n` along operand edges.
fn is_ancestor(g: &Graph, a: NodeId, n: NodeId) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![n];
    while let Some(x) = stack.pop() {
        for p in g.g.neighbors_directed(x, Direction::Incoming) {
            if p == a {
                return true;
            }
            if seen.insert(p) {
                stack.push(p);
            }
        }
    }
    false
}

fn verify_inputs(g: &Graph) -> Result<(), VerifyError> {
    let mut listed = BTreeSet::new();
    let mut names = BTreeSet::new();
    for &n in &g.inputs {
        let name = match g.node(n).map(|node| &node.kind) {
            Some(NodeKind::Input { name }) => name,
            _ => {
                return Err(VerifyError::InputList {
                    node: format!("%{}", n.index()),
                })
            }
        };
        if !listed.insert(n) {
            return Err(VerifyError::InputList { node: g.label(n) });
        }
        if !names.insert(name.clone()) {
            return Err(VerifyError::DuplicateName {
                kind: "input",
                name: name.clone(),
            });
        }
    }
    for n in g.g.node_indices() {
        if g.node(n)
            .is_some_and(|x| matches!(x.kind, NodeKind::Input { .. }))
            && !listed.contains(&n)
        {
            return Err(VerifyError::InputList { node: g.label(n) });
        }
    }
    Ok(())
}

fn verify_outputs(g: &Graph) -> Result<(), VerifyError> {
    let mut names = BTreeSet::new();
    for (name, n) in &g.outputs {
        match g.node(*n) {
            None => {
                return Err(VerifyError::DanglingOutput {
                    name: name.clone(),
                    index: n.index(),
                })
            }
            Some(node) => {
                if let NodeKind::Weight(w) = &node.kind {
                    return Err(VerifyError::OutputIsWeight {
                        name: name.clone(),
                        weight: w.name.clone(),
                    });
                }
            }
        }
        if !names.insert(name.as_str()) {
            return Err(VerifyError::DuplicateName {
                kind: "output",
                name: name.clone(),
            });
        }
    }
    Ok(())
}

fn fmt_ty(t: &Option<TensorType>) -> String {
    t.as_ref()
        .map_or_else(|| "none".to_string(), |t| t.to_string())
}
