//! What the macro knows about the compiler without depending on it: the op table (names, arity,
//! elementwise and fused flags), read from the very file `aubier-compiler` generates `enum Op`
//! from, and the GGUF tensor names of the `mistral4` / `deepseek2` architecture.

/// One row of the op table, as the macro needs it.
pub struct OpSig {
    /// Text name (`Op::name()`), also the builder method the macro calls.
    pub name: &'static str,
    /// Fixed operand count, or `None` when variadic.
    pub arity: Option<usize>,
    /// Elementwise over its first operand's shape (all operands are activations).
    pub elementwise: bool,
    /// Made only by fusion passes; not writable in a description.
    pub fused: bool,
}

macro_rules! op_table {
    ($( $variant:ident => $name:literal, arity: $arity:expr, elementwise: $ew:literal, fused: $fused:literal, oracle: $oracle:literal; )*) => {
        /// Every op of the compiler's table, in table order.
        pub const OPS: &[OpSig] = &[$( OpSig { name: $name, arity: $arity, elementwise: $ew, fused: $fused }, )*];
    };
}

include!("../../../compiler/src/op_table.in");

/// The op named `name`.
pub fn op(name: &str) -> Option<&'static OpSig> {
    OPS.iter().find(|o| o.name == name)
}

/// Model-wide GGUF tensors, written `w.NAME` (the file's tensor is `NAME.weight`).
pub const GLOBAL_WEIGHTS: &[&str] = &["token_embd", "output_norm", "output"];

/// Per-layer GGUF tensors, written `w.blk[l].NAME` (the file's tensor is `blk.{l}.NAME.weight`);
/// `MODEL.md` §4.2 (gguf-py `MODEL_TENSORS[MODEL_ARCH.MISTRAL4]`).
pub const BLOCK_WEIGHTS: &[&str] = &[
    "attn_norm",
    "attn_q_a",
    "attn_q_a_norm",
    "attn_q_b",
    "attn_kv_a_mqa",
    "attn_kv_a_norm",
    "attn_k_b",
    "attn_v_b",
    "attn_kv_b",
    "attn_output",
    "ffn_norm",
    "ffn_gate_inp",
    "ffn_gate_up_exps",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
    "ffn_gate_shexp",
    "ffn_up_shexp",
    "ffn_down_shexp",
];

/// The candidate closest to `name` by edit distance, when it is close enough to be a typo.
pub fn suggest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(name, c), c))
        .filter(|&(d, c)| d <= 2.max(c.len() / 4))
        .min()
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}
