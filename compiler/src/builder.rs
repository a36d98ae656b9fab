//! The graph builder: what the `model!` DSL expands into, and the Rust API for building graphs by
//! hand (tests, tools).
//!
//! Algorithm note. One typed method per op of the op table, named exactly as the op
//! (`Op::name()`), taking the operands in the table's order and then the op's attributes. This is
//! where each op's attribute signature lives (the op table holds names, arity and properties, not
//! attribute types), so the DSL checks names and arity against the table and leaves attribute
//! types to rustc through these signatures. Every method adds the node and runs its inference
//! rule at once, so a weight of the wrong shape fails at the node that reads it, with the
//! operands' names in the message. Weights are looked up by GGUF name in the map the caller
//! supplies and added once each.

use crate::config::{ExpertLayout, QueryTemperature, YarnParams};
use crate::error::CompileError;
use crate::infer::infer_node;
use crate::ir::{Graph, NodeId, TensorType};
use crate::ops::Op;
use crate::types::{Attrs, DType, Shape, WeightRef};
use crate::verify::verify;
use std::collections::BTreeMap;

/// Builds a [`Graph`] node by node; see the module note.
#[derive(Debug)]
pub struct Builder<'w> {
    graph: Graph,
    weights: &'w BTreeMap<String, WeightRef>,
    weight_nodes: BTreeMap<String, NodeId>,
}

type Res = Result<NodeId, CompileError>;

impl<'w> Builder<'w> {
    /// A builder whose weights come from `weights` (GGUF tensor name → [`WeightRef`], as
    /// `aubier_runtime::model::weight_refs` returns).
    pub fn new(weights: &'w BTreeMap<String, WeightRef>) -> Self {
        Builder {
            graph: Graph::new(),
            weights,
            weight_nodes: BTreeMap::new(),
        }
    }

    /// The graph built so far.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Declares a graph input of the given dtype and row-major shape.
    ///
    /// Errors: [`CompileError::DuplicateName`] when an input of that name exists.
    pub fn input(&mut self, name: &str, dtype: DType, shape: Shape) -> Res {
        let taken = self
            .graph
            .inputs
            .iter()
            .any(|&n| self.graph.node(n).is_some_and(|x| x.name == name));
        if taken {
            return Err(CompileError::DuplicateName {
                kind: "input",
                name: name.to_string(),
            });
        }
        Ok(self.graph.add_input(name, TensorType { dtype, shape }))
    }

    /// The weight node of GGUF tensor `name` (`blk.0.attn_q_a.weight`), added on first use.
    ///
    /// Errors: [`CompileError::MissingWeight`] when the map has no such tensor.
    pub fn weight(&mut self, name: &str) -> Res {
        if let Some(&n) = self.weight_nodes.get(name) {
            return Ok(n);
        }
        let w = self
            .weights
            .get(name)
            .ok_or_else(|| CompileError::MissingWeight {
                name: name.to_string(),
            })?;
        let n = self.graph.add_weight(w.clone());
        self.weight_nodes.insert(name.to_string(), n);
        Ok(n)
    }

    /// Declares `v` as the graph output `name`.
    ///
    /// Errors: [`CompileError::DuplicateName`] when an output of that name exists.
    pub fn output(&mut self, name: impl Into<String>, v: NodeId) -> Result<(), CompileError> {
        let name = name.into();
        if self.graph.outputs.iter().any(|(o, _)| *o == name) {
            return Err(CompileError::DuplicateName {
                kind: "output",
                name,
            });
        }
        self.graph.outputs.push((name, v));
        Ok(())
    }

    /// Names `v` for dumps, unless it already has a name (a value bound twice keeps its first).
    pub fn name(&mut self, v: NodeId, name: impl Into<String>) {
        if let Some(node) = self.graph.g.node_weight_mut(v) {
            if node.name.is_empty() {
                node.name = name.into();
            }
        }
    }

    /// Adds `op` over `args` with `attrs` and infers its type.
    ///
    /// Errors: [`CompileError::Infer`] naming the op and its operands when the rule rejects them
    /// (the node is not kept).
    pub fn op(&mut self, op: Op, attrs: Attrs, args: &[NodeId]) -> Res {
        let n = self.graph.add_op(op, attrs, args);
        match infer_node(&self.graph, n) {
            Ok(ty) => {
                if let Some(node) = self.graph.g.node_weight_mut(n) {
                    node.ty = ty;
                }
                Ok(n)
            }
            Err(source) => {
                let operands: Vec<String> = args.iter().map(|&a| self.graph.label(a)).collect();
                let node = format!("%{} {}({})", n.index(), op.name(), operands.join(", "));
                self.graph.g.remove_node(n);
                Err(CompileError::Infer { node, source })
            }
        }
    }

    /// `embed`: table W{D, V}, ids [T] i32 → [T, D].
    pub fn embed(&mut self, table: NodeId, ids: NodeId) -> Res {
        self.op(Op::Embed, Attrs::None, &[table, ids])
    }

    /// `rms_norm`: x [.., n], w{n} → [.., n]; `eps` inside the square root.
    pub fn rms_norm(&mut self, x: NodeId, w: NodeId, eps: f32) -> Res {
        self.op(Op::RmsNorm, Attrs::Eps(eps), &[x, w])
    }

    /// `mat_mul`: W{in, out}, x [T, in] → [T, out].
    pub fn mat_mul(&mut self, w: NodeId, x: NodeId) -> Res {
        self.op(Op::MatMul, Attrs::None, &[w, x])
    }

    /// `head_mat_mul`: W{in, out, H}, x [T, H, in] → [T, H, out].
    pub fn head_mat_mul(&mut self, w: NodeId, x: NodeId) -> Res {
        self.op(Op::HeadMatMul, Attrs::None, &[w, x])
    }

    /// `slice`: x [.., n] → [.., len], last-axis elements `offset..offset + len`.
    pub fn slice(&mut self, x: NodeId, offset: usize, len: usize) -> Res {
        self.op(Op::Slice, Attrs::Slice { offset, len }, &[x])
    }

    /// `concat`: a [.., n1], b [.., n2] → [.., n1 + n2] along the last axis.
    pub fn concat(&mut self, a: NodeId, b: NodeId) -> Res {
        self.op(Op::Concat, Attrs::None, &[a, b])
    }

    /// `reshape`: the same elements under row-major `shape`.
    pub fn reshape(&mut self, x: NodeId, shape: Shape) -> Res {
        self.op(Op::Reshape, Attrs::Reshape(shape), &[x])
    }

    /// `rope_yarn`: x [T, H, d], pos [T] i32 → [T, H, d] (YaRN RoPE on adjacent pairs).
    pub fn rope_yarn(&mut self, x: NodeId, pos: NodeId, rope: &YarnParams) -> Res {
        self.op(Op::RopeYarn, Attrs::Rope(rope.clone()), &[x, pos])
    }

    /// `attn_temperature`: x [T, ..], pos [T] i32 → x·(1 + β ln(1 + ⌊pos / L⌋)).
    pub fn attn_temperature(&mut self, x: NodeId, pos: NodeId, t: &QueryTemperature) -> Res {
        self.op(
            Op::AttnTemperature,
            Attrs::Temperature(t.clone()),
            &[x, pos],
        )
    }

    /// `scale`: x · c.
    pub fn scale(&mut self, x: NodeId, c: f32) -> Res {
        self.op(Op::Scale, Attrs::Scale(c), &[x])
    }

    /// `add`: a + b, same shape.
    pub fn add(&mut self, a: NodeId, b: NodeId) -> Res {
        self.op(Op::Add, Attrs::None, &[a, b])
    }

    /// `mul`: a ⊙ b, same shape.
    pub fn mul(&mut self, a: NodeId, b: NodeId) -> Res {
        self.op(Op::Mul, Attrs::None, &[a, b])
    }

    /// `silu`: x / (1 + e^−x).
    pub fn silu(&mut self, x: NodeId) -> Res {
        self.op(Op::Silu, Attrs::None, &[x])
    }

    /// `softmax` over the last axis.
    pub fn softmax(&mut self, x: NodeId) -> Res {
        self.op(Op::Softmax, Attrs::None, &[x])
    }

    /// `cache_write`: kv [T, w] written at rows `pos` of latent-cache layer `layer` → the cache
    /// view [S, w].
    pub fn cache_write(&mut self, kv: NodeId, pos: NodeId, layer: usize) -> Res {
        self.op(Op::CacheWrite, Attrs::CacheWrite { layer }, &[kv, pos])
    }

    /// `scores_qk`: q [T, H, w], k [S, w] → [T, H, S].
    pub fn scores_qk(&mut self, q: NodeId, k: NodeId) -> Res {
        self.op(Op::ScoresQk, Attrs::None, &[q, k])
    }

    /// `causal_mask`: s [T, H, S], pos [T] i32 → s with keys j > pos[t] at −∞.
    pub fn causal_mask(&mut self, s: NodeId, pos: NodeId) -> Res {
        self.op(Op::CausalMask, Attrs::None, &[s, pos])
    }

    /// `weighted_sum`: p [T, H, S], v [S, w] → [T, H, len] over the first `len` columns of v.
    pub fn weighted_sum(&mut self, p: NodeId, v: NodeId, len: usize) -> Res {
        self.op(Op::WeightedSum, Attrs::WeightedSum { len }, &[p, v])
    }

    /// `top_k`: p [T, E] → ids [T, k] i32, descending, ties to the lower id.
    pub fn top_k(&mut self, p: NodeId, k: usize) -> Res {
        self.op(Op::TopK, Attrs::TopK { k }, &[p])
    }

    /// `gather_renorm`: p [T, E], ids [T, k] i32 → p[ids] (÷ Σ p[ids] when `renorm`) · `scale`.
    pub fn gather_renorm(&mut self, p: NodeId, ids: NodeId, renorm: bool, scale: f32) -> Res {
        self.op(
            Op::GatherRenorm,
            Attrs::GatherRenorm { renorm, scale },
            &[p, ids],
        )
    }

    /// `moe_ffn`: `args` = h [T, D], ids [T, k] i32, wts [T, k], then W_gate_up (fused layout) or
    /// W_gate, W_up (split layout), then W_down → [T, D]. `layer` names the expert store's slices.
    pub fn moe_ffn(
        &mut self,
        args: &[NodeId],
        layer: usize,
        n_ff: usize,
        layout: ExpertLayout,
    ) -> Res {
        self.op(
            Op::MoeFfn,
            Attrs::Moe {
                layer,
                n_ff,
                layout,
            },
            args,
        )
    }

    /// The finished graph, verified.
    ///
    /// Errors: [`CompileError::Verify`] (stage `build`) when a structural rule is broken.
    pub fn finish(self) -> Result<Graph, CompileError> {
        verify(&self.graph).map_err(|source| CompileError::Verify {
            stage: "build".to_string(),
            source,
        })?;
        Ok(self.graph)
    }
}
