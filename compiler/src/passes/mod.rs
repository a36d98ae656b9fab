//! The passes of the pipeline, one file each (each opens with its algorithm note), and the
//! ordered list of named stages that `compile` runs and `aubier gen --dump-after` names.

pub mod cse;
pub mod dce;
pub mod fuse_kqkv;
pub mod fuse_phase;
pub mod fuse_wkb;
pub mod mark_head;
pub mod predict_experts;

use crate::error::CompileError;
use crate::infer::infer_node;
use crate::ir::{Graph, NodeId, NodeKind};
use crate::ops::Op;
use crate::types::{Attrs, WeightRef};
use crate::{CompileOptions, FusionFlag};

/// A named rewrite of the graph. `run` returns how many nodes it changed or removed.
#[derive(Clone, Copy, Debug)]
pub struct Pass {
    /// Stage name (`cse`, `fuse_kqkv`, …), as `--dump-after` takes it.
    pub name: &'static str,
    /// The fusion flag that turns the pass on (`None`: the pass always runs unless disabled or
    /// opt-in).
    pub flag: Option<FusionFlag>,
    /// For an opt-in pass, the compile option that turns it on (off by default).
    pub opt_in: Option<fn(&CompileOptions) -> bool>,
    /// The rewrite, given the compile options.
    pub run: fn(&mut Graph, &CompileOptions) -> Result<usize, CompileError>,
}

/// The passes after `build`, in pipeline order: CSE first (merging can leave nodes dead), then
/// the fusions, then DCE (which removes what the fusions left unread). KQKV runs before PHASE
/// because a `phase` replaces a `cache_write` only once every reader of that write is a `kqkv`
/// (the fused node has no cache-view output for unfused readers); WKB runs last so that it sees
/// the absorbed query whether or not PHASE rebuilt it. `predict_experts` (opt-in:
/// [`CompileOptions::predict_experts`], its lead [`CompileOptions::prefetch_lead`]) runs after DCE on the fused graph and adds steps only;
/// `mark_head` runs on the final graph.
pub const PASSES: &[Pass] = &[
    Pass {
        name: "cse",
        flag: None,
        opt_in: None,
        run: |g, _| cse::run(g),
    },
    Pass {
        name: "fuse_kqkv",
        flag: Some(FusionFlag::Kqkv),
        opt_in: None,
        run: |g, _| fuse_kqkv::run(g),
    },
    Pass {
        name: "fuse_phase",
        flag: Some(FusionFlag::Phase),
        opt_in: None,
        run: |g, _| fuse_phase::run(g),
    },
    Pass {
        name: "fuse_wkb",
        flag: Some(FusionFlag::Wkb),
        opt_in: None,
        run: |g, _| fuse_wkb::run(g),
    },
    Pass {
        name: "dce",
        flag: None,
        opt_in: None,
        run: |g, _| dce::run(g),
    },
    Pass {
        name: "predict_experts",
        flag: None,
        opt_in: Some(|o: &CompileOptions| o.predict_experts),
        run: |g, o| predict_experts::run(g, o.prefetch_lead),
    },
    Pass {
        name: "mark_head",
        flag: None,
        opt_in: None,
        run: |g, _| mark_head::run(g),
    },
];

/// Adds `op` over `args` to `g` under `name`, with its inferred type, for a pass building a
/// replacement subgraph.
///
/// Errors: [`CompileError::Verify`] (stage `stage`) when the rule rejects the operands (a pass
/// bug: patterns are matched on types first); the node is not kept.
pub(crate) fn add_typed(
    g: &mut Graph,
    stage: &str,
    op: Op,
    attrs: Attrs,
    args: &[NodeId],
    name: String,
) -> Result<NodeId, CompileError> {
    let n = g.add_op(op, attrs, args);
    match infer_node(g, n) {
        Ok(ty) => {
            if let Some(node) = g.g.node_weight_mut(n) {
                node.ty = ty;
                node.name = name;
            }
            Ok(n)
        }
        Err(source) => {
            let node = g.label(n);
            g.g.remove_node(n);
            Err(CompileError::Verify {
                stage: stage.to_string(),
                source: crate::verify::VerifyError::Type { node, source },
            })
        }
    }
}

/// The op and attributes of `n`, when it is an op node.
pub(crate) fn op_of(g: &Graph, n: NodeId) -> Option<(Op, &Attrs)> {
    match &g.node(n)?.kind {
        NodeKind::Op { op, attrs } => Some((*op, attrs)),
        _ => None,
    }
}

/// `n`'s operands when it is an op `op` with `arity` operands.
pub(crate) fn args_of(g: &Graph, n: NodeId, op: Op, arity: usize) -> Option<(&Attrs, Vec<NodeId>)> {
    let (o, attrs) = op_of(g, n)?;
    let args = g.operands(n);
    (o == op && args.len() == arity).then_some((attrs, args))
}

/// `Some((x, offset, len))` when `n` is `slice(x)` of `[offset, offset + len)`.
pub(crate) fn slice_of(g: &Graph, n: NodeId) -> Option<(NodeId, usize, usize)> {
    match args_of(g, n, Op::Slice, 1)? {
        (Attrs::Slice { offset, len }, a) => Some((a[0], *offset, *len)),
        _ => None,
    }
}

/// The weight of node `n`, when it is one.
pub(crate) fn weight_of(g: &Graph, n: NodeId) -> Option<&WeightRef> {
    match &g.node(n)?.kind {
        NodeKind::Weight(w) => Some(w),
        _ => None,
    }
}

/// Name of `n` for dumps (empty when anonymous or missing).
pub(crate) fn name_of(g: &Graph, n: NodeId) -> String {
    g.node(n).map(|x| x.name.clone()).unwrap_or_default()
}

/// Last-axis extent of `n`'s value, when its type is known and that axis fixed.
pub(crate) fn last_of(g: &Graph, n: NodeId) -> Option<usize> {
    g.node(n)?.ty.as_ref()?.shape.last_fixed()
}

/// Removes each op node of `nodes`, in the order given (readers before their operands), that
/// has no reader left, is not a graph output and has no side effect (`cache_write`, `phase`);
/// returns how many it removed. Inputs and weights are left to DCE.
pub(crate) fn remove_dead(g: &mut Graph, nodes: &[NodeId]) -> usize {
    let mut removed = 0;
    for &n in nodes {
        let pure_op = g
            .node(n)
            .and_then(|x| x.op())
            .is_some_and(|op| !matches!(op, Op::CacheWrite | Op::Phase));
        let is_output = g.outputs.iter().any(|(_, o)| *o == n);
        if pure_op && g.users(n).is_empty() && !is_output {
            g.g.remove_node(n);
            removed += 1;
        }
    }
    removed
}
