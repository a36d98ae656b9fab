//! The one op table of the IR (STYLE.md §1): every op's enum variant, text name, arity and
//! properties come from one line of [`op_table!`].
//!
//! Shapes are row-major with the token axis first (`T` = tokens in this step, `S` = keys in the
//! latent cache after this step's write, i.e. `pos_last + 1`). Weights are GGUF tensors addressed in
//! ggml `ne` order (`ne[0]` contiguous). Semantics of each op (inputs in order → output):
//!
//! | op | inputs | output | notes |
//! |---|---|---|---|
//! | `embed` | table W{D, V}, ids [T] i32 | [T, D] | row lookup |
//! | `rms_norm` | x [.., n], w [n] | [.., n] | `x / sqrt(mean(x²) + eps) * w`, attr eps |
//! | `mat_mul` | W{in, out}, x [T, in] | [T, out] | `y = W·x` per token, any ggml type |
//! | `head_mat_mul` | W{in, out, H}, x [T, H, in] | [T, H, out] | one matrix per head (attn_k_b / attn_v_b) |
//! | `slice` | x [.., n] | [.., len] | last axis, attrs offset, len |
//! | `concat` | a [.., n1], b [.., n2] | [.., n1 + n2] | last axis |
//! | `reshape` | x | same data | attr shape |
//! | `rope_yarn` | x [T, H, d], pos [T] i32 | [T, H, d] | YaRN RoPE on adjacent pairs of the first n_rot dims |
//! | `attn_temperature` | x [T, ..], pos [T] i32 | same | `x * (1 + β ln(1 + floor(pos / L)))` |
//! | `scale` | x | same | `x * c` |
//! | `add`, `mul` | a, b (same shape) | same | elementwise |
//! | `silu` | x | same | `x / (1 + exp(-x))` |
//! | `softmax` | x [.., n] | [.., n] | last axis, max-subtracted |
//! | `cache_write` | kv [T, w], pos [T] i32 | [S, w] | writes rows at `pos`, returns layer `layer`'s cache view |
//! | `scores_qk` | q [T, H, w], k [S, w] | [T, H, S] | `q·k` (MQA: one key head) |
//! | `causal_mask` | s [T, H, S], pos [T] i32 | same | key j > pos[t] → −inf |
//! | `weighted_sum` | p [T, H, S], v [S, w] | [T, H, len] | `Σ_j p_j v_j[0..len]`, attr len |
//! | `top_k` | p [T, E] | [T, k] i32 | descending, ties to the lower id |
//! | `gather_renorm` | p [T, E], ids [T, k] i32 | [T, k] | `p[ids] / Σ p[ids] * scale` (renorm optional) |
//! | `moe_ffn` | h [T, D], ids [T, k] i32, wts [T, k], W_gate_up or (W_gate, W_up), W_down | [T, D] | `Σ_k w_k down_e(silu(gate_e h) ⊙ up_e h)` |
//! | `phase`, `wkb`, `kqkv` | (fused) | | made only by the fusion passes; never lowered by the oracle |

use serde::{Deserialize, Serialize};

macro_rules! op_table {
    ($( $variant:ident => $name:literal, arity: $arity:expr, elementwise: $ew:literal, fused: $fused:literal, oracle: $oracle:literal; )*) => {
        /// Every operation of the IR. Closed, `Eq + Hash`; see the module table for semantics.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Op { $( $variant, )* }

        impl Op {
            /// Every op, in table order.
            pub const ALL: &'static [Op] = &[$( Op::$variant, )*];

            /// The op's text name (as written in the DSL and in dumps).
            pub fn name(self) -> &'static str {
                match self { $( Op::$variant => $name, )* }
            }

            /// Number of operands: `Some(n)` when fixed, `None` when variadic (`moe_ffn`).
            pub fn arity(self) -> Option<usize> {
                match self { $( Op::$variant => $arity, )* }
            }

            /// Elementwise over its first operand's shape.
            pub fn is_elementwise(self) -> bool {
                match self { $( Op::$variant => $ew, )* }
            }

            /// Produced only by a fusion pass.
            pub fn is_fused(self) -> bool {
                match self { $( Op::$variant => $fused, )* }
            }

            /// The CPU oracle has a lowering for this op.
            pub fn has_oracle(self) -> bool {
                match self { $( Op::$variant => $oracle, )* }
            }

            /// Looks an op up by its text name.
            pub fn from_name(name: &str) -> Option<Op> {
                match name { $( $name => Some(Op::$variant), )* _ => None }
            }
        }
    };
}

// The rows live in `op_table.in` so that `aubier-dsl` reads the very same table (STYLE.md §1).
include!("op_table.in");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_fused_ops_have_no_oracle() {
        for &op in Op::ALL {
            assert_eq!(Op::from_name(op.name()), Some(op));
            assert!(!(op.is_fused() && op.has_oracle()), "{op:?}");
        }
        assert_eq!(Op::from_name("attention"), None);
    }
}
