//! The graph IR: a petgraph `StableDiGraph` whose nodes are graph inputs, GGUF weights and ops
//! of the op table, and whose edges run operand → user, carrying the operand's position.
//!
//! Algorithm note. A node's operands are its incoming edges sorted by [`Use::pos`]; the same
//! operand may appear at two positions (two edges). Stable indices survive node removal, so a
//! pass can delete nodes while holding ids of others, and ids double as the deterministic
//! tie-break of [`Graph::topo_order`] (Kahn's algorithm, smallest ready id first, which keeps
//! the description's program order wherever the data dependencies allow). Types live on the
//! nodes ([`Node::ty`]): set by `infer` when a node is built, re-derived and compared by
//! `verify` after every stage. Weights carry their ggml type and `ne` instead of a type.
//! Dumps ([`Graph::to_text`], [`Graph::to_dot`]) walk that same order, so they are reproducible.

use crate::ops::Op;
use crate::types::{Attrs, DType, Shape, WeightRef};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;

/// Index of a node; stable across removals of other nodes.
pub type NodeId = NodeIndex;

/// Element type and row-major shape of an activation value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Row-major shape, outermost axis first.
    pub shape: Shape,
}

impl TensorType {
    /// An f32 value of the given shape.
    pub fn f32(shape: Shape) -> Self {
        TensorType {
            dtype: DType::F32,
            shape,
        }
    }

    /// An i32 value of the given shape.
    pub fn i32(shape: Shape) -> Self {
        TensorType {
            dtype: DType::I32,
            shape,
        }
    }
}

/// Text name of a dtype as dumps print it (`f32`, `i32`).
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::I32 => "i32",
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", dtype_name(self.dtype), self.shape)
    }
}

/// What a node is.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    /// A graph input bound by the executor before the first step (`tokens`, `pos`); its declared
    /// type is [`Node::ty`].
    Input {
        /// The input's name.
        name: String,
    },
    /// A GGUF tensor read by ops (never an activation value).
    Weight(WeightRef),
    /// An op of the op table with its attributes.
    Op {
        /// The operation.
        op: Op,
        /// Its attributes.
        attrs: Attrs,
    },
}

/// One node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Input, weight or op.
    pub kind: NodeKind,
    /// Inferred (ops) or declared (inputs) type; `None` for weights and for ops not yet inferred.
    pub ty: Option<TensorType>,
    /// Readable name for dumps (`blk.3.q_pe`); empty when anonymous.
    pub name: String,
}

impl Node {
    /// The op, when the node is an op.
    pub fn op(&self) -> Option<Op> {
        match self.kind {
            NodeKind::Op { op, .. } => Some(op),
            _ => None,
        }
    }
}

/// Edge weight: the operand position the source node fills in the target node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Use {
    /// 0-based operand position.
    pub pos: usize,
}

/// A model graph: nodes, the ordered list of inputs and the named outputs.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// The nodes and operand edges.
    pub g: StableDiGraph<Node, Use>,
    /// Input nodes, in binding order.
    pub inputs: Vec<NodeId>,
    /// Named outputs read after the last step, in declaration order.
    pub outputs: Vec<(String, NodeId)>,
    /// The output head, once the `mark_head` pass has found it ([`crate::passes::mark_head`]).
    pub output_head: Option<NodeId>,
    /// Scheduling anchors: node `n` ↦ `a` orders `n` in [`Graph::topo_order`] as if it came just
    /// before node `a` (set by [`crate::passes::predict_experts`]; empty otherwise).
    pub schedule_before: BTreeMap<NodeId, NodeId>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an input node of the declared type and lists it in [`Graph::inputs`].
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> NodeId {
        let n = self.g.add_node(Node {
            kind: NodeKind::Input {
                name: name.to_string(),
            },
            ty: Some(ty),
            name: name.to_string(),
        });
        self.inputs.push(n);
        n
    }

    /// Adds a weight node.
    pub fn add_weight(&mut self, w: WeightRef) -> NodeId {
        let name = w.name.clone();
        self.g.add_node(Node {
            kind: NodeKind::Weight(w),
            ty: None,
            name,
        })
    }

    /// Adds an op node reading `args` in order. Its type is left unset (see `infer::infer_node`).
    pub fn add_op(&mut self, op: Op, attrs: Attrs, args: &[NodeId]) -> NodeId {
        let n = self.g.add_node(Node {
            kind: NodeKind::Op { op, attrs },
            ty: None,
            name: String::new(),
        });
        for (pos, &a) in args.iter().enumerate() {
            self.g.add_edge(a, n, Use { pos });
        }
        n
    }

    /// The node, if it exists.
    pub fn node(&self, n: NodeId) -> Option<&Node> {
        self.g.node_weight(n)
    }

    /// Operands of `n`, ordered by position (empty for a missing node).
    pub fn operands(&self, n: NodeId) -> Vec<NodeId> {
        let mut edges: Vec<(usize, NodeId)> = self
            .g
            .edges_directed(n, Direction::Incoming)
            .map(|e| (e.weight().pos, e.source()))
            .collect();
        edges.sort();
        edges.into_iter().map(|(_, s)| s).collect()
    }

    /// Operand positions of `n` as stored on its edges, sorted (the verifier checks they are
    /// exactly `0..n`).
    pub fn operand_positions(&self, n: NodeId) -> Vec<usize> {
        let mut p: Vec<usize> = self
            .g
            .edges_directed(n, Direction::Incoming)
            .map(|e| e.weight().pos)
            .collect();
        p.sort_unstable();
        p
    }

    /// Distinct users of `n`, in id order.
    pub fn users(&self, n: NodeId) -> Vec<NodeId> {
        let mut u: Vec<NodeId> = self.g.neighbors_directed(n, Direction::Outgoing).collect();
        u.sort();
        u.dedup();
        u
    }

    /// Redirects every use of `old` (operand edges and outputs) to `new`; `old` keeps no users.
    pub fn replace_uses(&mut self, old: NodeId, new: NodeId) {
        let uses: Vec<(NodeId, Use, petgraph::stable_graph::EdgeIndex)> = self
            .g
            .edges_directed(old, Direction::Outgoing)
            .map(|e| (e.target(), *e.weight(), e.id()))
            .collect();
        for (target, u, id) in uses {
            self.g.remove_edge(id);
            self.g.add_edge(new, target, u);
        }
        for (_, o) in self.outputs.iter_mut() {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Dump label of a node: `%12` or `%12 (blk.0.q)`.
    pub fn label(&self, n: NodeId) -> String {
        match self.node(n) {
            Some(node) if !node.name.is_empty() => format!("%{} ({})", n.index(), node.name),
            _ => format!("%{}", n.index()),
        }
    }

    /// Nodes in a deterministic topological order (Kahn, smallest ready key first), or `Err` with
    /// the nodes left on a cycle. A node's key is its id, except that a node anchored in
    /// [`Graph::schedule_before`] to `a` takes the key just below `a`'s (ties between anchored
    /// nodes by id); without anchors this is smallest ready id first.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, Vec<NodeId>> {
        let key = |n: NodeId| match self.schedule_before.get(&n) {
            Some(&a) => (a, 0u8, n),
            None => (n, 1, n),
        };
        let mut indegree: std::collections::BTreeMap<NodeId, usize> = self
            .g
            .node_indices()
            .map(|n| (n, self.g.edges_directed(n, Direction::Incoming).count()))
            .collect();
        let mut ready: BinaryHeap<Reverse<(NodeId, u8, NodeId)>> = indegree
            .iter()
            .filter(|(_, &d)| d == 0)
            .map(|(&n, _)| Reverse(key(n)))
            .collect();
        let mut order = Vec::with_capacity(indegree.len());
        while let Some(Reverse((_, _, n))) = ready.pop() {
            order.push(n);
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                if let Some(d) = indegree.get_mut(&e.target()) {
                    *d -= 1;
                    if *d == 0 {
                        ready.push(Reverse(key(e.target())));
                    }
                }
            }
        }
        if order.len() == indegree.len() {
            Ok(order)
        } else {
            let done: std::collections::BTreeSet<NodeId> = order.into_iter().collect();
            Err(indegree.into_keys().filter(|n| !done.contains(n)).collect())
        }
    }

    /// Number of op nodes of kind `op`.
    pub fn count_op(&self, op: Op) -> usize {
        self.g.node_weights().filter(|n| n.op() == Some(op)).count()
    }

    /// The graph as text, one node per line in [`Graph::topo_order`] (node id order if cyclic):
    /// `%7 = rms_norm(%5, %6) {eps=1e-6} : f32[T, 256]  // blk.0.h`, then one `output` line each.
    pub fn to_text(&self) -> String {
        let order = self
            .topo_order()
            .unwrap_or_else(|_| self.g.node_indices().collect());
        let mut s = String::new();
        for n in order {
            let Some(node) = self.node(n) else { continue };
            let _ = write!(s, "%{} = ", n.index());
            match &node.kind {
                NodeKind::Input { name } => {
                    let _ = write!(s, "input {name}");
                }
                NodeKind::Weight(w) => {
                    let _ = write!(s, "weight {} {}{}", w.name, w.ggml_type, fmt_ne(&w.ne));
                }
                NodeKind::Op { op, attrs } => {
                    let args: Vec<String> = self
                        .operands(n)
                        .iter()
                        .map(|a| format!("%{}", a.index()))
                        .collect();
                    let _ = write!(s, "{}({})", op.name(), args.join(", "));
                    let a = fmt_attrs(attrs);
                    if !a.is_empty() {
                        let _ = write!(s, " {{{a}}}");
                    }
                }
            }
            if let Some(ty) = &node.ty {
                let _ = write!(s, " : {ty}");
            }
            if !node.name.is_empty() && !matches!(node.kind, NodeKind::Weight(_)) {
                let _ = write!(s, "  // {}", node.name);
            }
            s.push('\n');
        }
        for (name, n) in &self.outputs {
            let _ = writeln!(s, "output {name} = %{}", n.index());
        }
        if let Some(n) = self.output_head {
            let _ = writeln!(s, "output head = %{}", n.index());
        }
        s
    }

    /// The graph in Graphviz DOT: one box per node (weights grey), operand edges labelled with
    /// their position, one ellipse per output. Same order as [`Graph::to_text`].
    pub fn to_dot(&self) -> String {
        let order = self
            .topo_order()
            .unwrap_or_else(|_| self.g.node_indices().collect());
        let mut s = String::from("digraph aubier {\n  node [shape=box, fontname=\"monospace\"];\n");
        for &n in &order {
            let Some(node) = self.node(n) else { continue };
            let (head, style) = match &node.kind {
                NodeKind::Input { name } => (format!("input {name}"), ""),
                NodeKind::Weight(w) => (
                    format!("{} {}{}", w.name, w.ggml_type, fmt_ne(&w.ne)),
                    ", style=filled, fillcolor=lightgrey",
                ),
                NodeKind::Op { op, attrs } => {
                    let a = fmt_attrs(attrs);
                    if a.is_empty() {
                        (op.name().to_string(), "")
                    } else {
                        (format!("{} {{{a}}}", op.name()), "")
                    }
                }
            };
            let mut label = format!("%{} {head}", n.index());
            if let Some(ty) = &node.ty {
                let _ = write!(label, "\n{ty}");
            }
            if !node.name.is_empty() && !matches!(node.kind, NodeKind::Weight(_)) {
                let _ = write!(label, "\n{}", node.name);
            }
            let _ = writeln!(
                s,
                "  n{} [label=\"{}\"{style}];",
                n.index(),
                dot_escape(&label)
            );
        }
        for &n in &order {
            let mut edges: Vec<(usize, NodeId)> = self
                .g
                .edges_directed(n, Direction::Incoming)
                .map(|e| (e.weight().pos, e.source()))
                .collect();
            edges.sort();
            for (pos, src) in edges {
                let _ = writeln!(s, "  n{} -> n{} [label=\"{pos}\"];", src.index(), n.index());
            }
        }
        for (i, (name, n)) in self.outputs.iter().enumerate() {
            let _ = writeln!(
                s,
                "  out{i} [shape=ellipse, label=\"{}\"];\n  n{} -> out{i};",
                dot_escape(name),
                n.index()
            );
        }
        s.push_str("}\n");
        s
    }
}

/// `{256, 8192}`: a weight's ggml `ne`, `ne[0]` first.
fn fmt_ne(ne: &[usize]) -> String {
    let parts: Vec<String> = ne.iter().map(|d| d.to_string()).collect();
    format!("{{{}}}", parts.join(", "))
}

/// Attributes as `key=value` pairs; floats in `{:?}` so they round-trip.
pub fn fmt_attrs(a: &Attrs) -> String {
    match a {
        Attrs::None => String::new(),
        Attrs::Eps(e) => format!("eps={e:?}"),
        Attrs::Slice { offset, len } => format!("offset={offset}, len={len}"),
        Attrs::Reshape(s) => format!("shape={s}"),
        Attrs::Rope(y) => format!(
            "n_rot={}, freq_base={:?}, factor={:?}, original_context={}, beta_fast={:?}, \
             beta_slow={:?}, attn_factor={:?}, log_multiplier={:?}",
            y.n_rot,
            y.freq_base,
            y.factor,
            y.original_context,
            y.beta_fast,
            y.beta_slow,
            y.attn_factor,
            y.log_multiplier
        ),
        Attrs::Temperature(t) => format!("scale={:?}, length={}", t.scale, t.length),
        Attrs::Scale(c) => format!("c={c:?}"),
        Attrs::CacheWrite { layer } => format!("layer={layer}"),
        Attrs::WeightedSum { len } => format!("len={len}"),
        Attrs::TopK { k } => format!("k={k}"),
        Attrs::GatherRenorm { renorm, scale } => format!("renorm={renorm}, scale={scale:?}"),
        Attrs::Moe {
            layer,
            n_ff,
            layout,
        } => format!("layer={layer}, n_ff={n_ff}, layout={layout:?}"),
        Attrs::Phase {
            layer,
            rope,
            temperature,
            eps,
            n_head,
            nope,
            rope_dim,
            kv_lora,
        } => {
            let t = temperature.as_ref().map_or_else(
                || "none".to_string(),
                |t| format!("({:?}, {})", t.scale, t.length),
            );
            format!(
                "layer={layer}, n_head={n_head}, nope={nope}, rope_dim={rope_dim}, \
                 kv_lora={kv_lora}, eps={eps:?}, temperature={t}, {}",
                fmt_attrs(&Attrs::Rope(rope.clone()))
            )
        }
        Attrs::Wkb {
            n_head,
            in_dim,
            out_dim,
            rope_tail,
        } => format!("n_head={n_head}, in_dim={in_dim}, out_dim={out_dim}, rope_tail={rope_tail}"),
        Attrs::Kqkv {
            layer,
            n_head,
            kv_lora,
            rope_dim,
            kq_scale,
        } => format!(
            "layer={layer}, n_head={n_head}, kv_lora={kv_lora}, rope_dim={rope_dim}, \
             kq_scale={kq_scale:?}"
        ),
    }
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
