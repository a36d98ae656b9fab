//! Dead-code elimination.
//!
//! Algorithm note. Mark and sweep. The roots are the graph outputs, every input (the executor
//! binds them whether or not they are read) and every `cache_write` and `phase` (their effect,
//! the latent-cache rows at `pos`, is read by later steps even when nothing in this step reads
//! their value). Marking
//! walks operand edges backwards from the roots; every unmarked node (an op whose value reaches
//! no root, or a weight no live op reads) is removed. Removing a node that reaches no root cannot
//! change any output or cache row, so the pass is always legal. Returns the number removed.

use crate::error::CompileError;
use crate::ir::{Graph, NodeId};
use crate::ops::Op;
use petgraph::Direction;
use std::collections::BTreeSet;

/// Removes every node that reaches no output, input, `cache_write` or `phase`; returns how many.
///
/// Errors: none today (the signature is that of every pass).
pub fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut live: BTreeSet<NodeId> = BTreeSet::new();
    let mut stack: Vec<NodeId> = g.outputs.iter().map(|(_, n)| *n).collect();
    stack.extend(g.inputs.iter().copied());
    stack.extend(g.g.node_indices().filter(|&n| {
        matches!(
            g.node(n).and_then(|x| x.op()),
            Some(Op::CacheWrite | Op::Phase)
        )
    }));
    while let Some(n) = stack.pop() {
        if live.insert(n) {
            stack.extend(g.g.neighbors_directed(n, Direction::Incoming));
        }
    }
    let dead: Vec<NodeId> = g.g.node_indices().filter(|n| !live.contains(n)).collect();
    for &n in &dead {
        g.g.remove_node(n);
    }
    Ok(dead.len())
}
