//! Output head: marks the step a backend may treat as the model's output head.
//!
//! Algorithm note. The head is the one graph output computed by a `mat_mul` of a weight and a
//! `[T, n]` value whose result no other op reads. A `mat_mul` computes row `t` of its output from
//! row `t` of its input alone, so a caller that samples from the last position only may run the
//! head for that row alone (the plan's `last_position_only` fact), and a backend may choose a
//! cheaper numerics for it, its rounding reaching the outputs without passing through another
//! step. The pass sets [`Graph::output_head`] (none when no output, or more than one, fits) and
//! changes no node; it returns 1 when it marked a head, else 0.

use super::{args_of, weight_of};
use crate::error::CompileError;
use crate::ir::{Graph, NodeId};
use crate::ops::Op;
use crate::types::Dim;

/// Sets [`Graph::output_head`]; returns 1 when a head was marked, else 0.
///
/// Errors: none (the signature is that of every pass).
pub fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let heads: Vec<NodeId> = g
        .outputs
        .iter()
        .map(|&(_, n)| n)
        .filter(|&n| is_head(g, n))
        .collect();
    g.output_head = match heads.as_slice() {
        [n] => Some(*n),
        _ => None,
    };
    Ok(usize::from(g.output_head.is_some()))
}

/// Whether `n` is a `mat_mul(weight, x)` with `x` shaped `[T, n]` and no reader.
fn is_head(g: &Graph, n: NodeId) -> bool {
    let Some((_, args)) = args_of(g, n, Op::MatMul, 2) else {
        return false;
    };
    let rows = g
        .node(args[1])
        .and_then(|x| x.ty.as_ref())
        .is_some_and(|ty| matches!(ty.shape.0.as_slice(), [Dim::Tokens, Dim::Fixed(_)]));
    weight_of(g, args[0]).is_some() && rows && g.users(n).is_empty()
}
