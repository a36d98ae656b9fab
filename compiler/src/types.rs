//! Value types shared by the graph IR and the plan: dtypes, symbolic shapes, op attributes and
//! weight references.

use crate::config::{ExpertLayout, QueryTemperature, YarnParams};
use serde::{Deserialize, Serialize};

/// Element type of an activation value. Weights carry their ggml type instead ([`WeightRef`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// IEEE f32; every activation of the oracle.
    F32,
    /// i32: token ids, positions, expert ids.
    I32,
}

/// One axis of a shape. `Tokens` (`T`, tokens in this step) and `Keys` (`S`, cached keys after this
/// step's write, `pos_last + 1`) are bound at execution time; everything else is fixed at compile time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dim {
    /// A compile-time extent.
    Fixed(usize),
    /// `T`: tokens in this step.
    Tokens,
    /// `S`: keys in the latent cache after this step.
    Keys,
}

impl Dim {
    /// The extent for a step of `t` tokens over `s` cached keys.
    pub fn eval(self, t: usize, s: usize) -> usize {
        match self {
            Dim::Fixed(n) => n,
            Dim::Tokens => t,
            Dim::Keys => s,
        }
    }
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Tokens => f.write_str("T"),
            Dim::Keys => f.write_str("S"),
        }
    }
}

/// A row-major shape, outermost axis first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// Number of elements for a step of `t` tokens over `s` keys.
    pub fn numel(&self, t: usize, s: usize) -> usize {
        self.0.iter().map(|d| d.eval(t, s)).product()
    }

    /// Extent of the last (contiguous) axis, when fixed.
    pub fn last_fixed(&self) -> Option<usize> {
        match self.0.last() {
            Some(Dim::Fixed(n)) => Some(*n),
            _ => None,
        }
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// A GGUF tensor the graph reads, with its ggml type and `ne` (ggml order, `ne[0]` contiguous).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WeightRef {
    /// GGUF tensor name, e.g. `blk.0.attn_q_a.weight`.
    pub name: String,
    /// ggml type name as gguf-py spells it (`F32`, `Q2_K`, `IQ2_XXS`, …).
    pub ggml_type: String,
    /// ggml `ne`, `ne[0]` fastest.
    pub ne: Vec<usize>,
}

/// Per-op attributes. Equality and hashing go through one canonical serialised form, so CSE treats
/// `-0.0` and `0.0` as different constants (they are) and `Eq`/`Hash` agree.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Attrs {
    /// No attributes.
    None,
    /// `rms_norm`: epsilon inside the square root.
    Eps(f32),
    /// `slice`: `[offset, offset + len)` of the last axis.
    Slice { offset: usize, len: usize },
    /// `reshape`: the new shape (same element count).
    Reshape(Shape),
    /// `rope_yarn`.
    Rope(YarnParams),
    /// `attn_temperature`.
    Temperature(QueryTemperature),
    /// `scale`: the constant factor.
    Scale(f32),
    /// `cache_write`: layer index into the latent KV cache.
    CacheWrite { layer: usize },
    /// `weighted_sum`: leading columns of the value rows used.
    WeightedSum { len: usize },
    /// `top_k`: number of experts kept.
    TopK { k: usize },
    /// `gather_renorm`: renormalise the kept probabilities, then multiply by `scale`.
    GatherRenorm { renorm: bool, scale: f32 },
    /// `moe_ffn`: expert width and gate/up layout; `layer` names the store's expert slices.
    Moe {
        layer: usize,
        n_ff: usize,
        layout: ExpertLayout,
    },
    /// `phase` (made by `passes::fuse_phase`), the rotary phase of MLA for layer `layer`.
    /// H = `n_head`, N = `nope` (qk_nope_head_dim), R = `rope_dim` (qk_rope_head_dim),
    /// C = `kv_lora` (kv_lora_rank), T tokens. Operands, in order: q [T, H, N+R] f32 (the reshaped
    /// `attn_q_b` output), kv_a [T, C+R] f32 (the `attn_kv_a_mqa` output), the weight
    /// `attn_kv_a_norm` {C}, pos [T] i32. Output q2 [T, H, N+R] f32:
    /// `q2[t,h,:N] = q[t,h,:N]·f(pos[t])` and `q2[t,h,N:] = rope_yarn(q[t,h,N:], pos[t])·f(pos[t])`,
    /// f the Llama-4 temperature factor `1 + β·ln(1 + ⌊pos/L⌋)` (1 when `temperature` is `None`).
    /// Side effect: writes `[rms_norm(kv_a[t,:C])·w (eps), rope_yarn(kv_a[t,C:], pos[t])]` (C+R
    /// values) into row pos[t] of layer `layer`'s latent KV cache, exactly as `cache_write` does.
    /// Scaling q_nope by f before W_kb instead of after is a rounding-order change only.
    Phase {
        layer: usize,
        rope: YarnParams,
        temperature: Option<QueryTemperature>,
        eps: f32,
        n_head: usize,
        nope: usize,
        rope_dim: usize,
        kv_lora: usize,
    },
    /// `wkb` (made by `passes::fuse_wkb`): the absorbed per-head MLA projection, one matrix per
    /// head as `head_mat_mul` reads it (weight ne {in_dim, out_dim, n_head}).
    /// IN mode (`rope_tail` = R, weight `attn_k_b`): x = q2 [T, H, N+R] → q_abs [T, H, C+R] =
    /// `[W_kb[h]·q2[t,h,:N], q2[t,h,N:]]` (in_dim N, out_dim C).
    /// OUT mode (`rope_tail` = 0, weight `attn_v_b`): x = o_lat [T, H, C] → o [T, H, V] =
    /// `W_vb[h]·o_lat[t,h]` (in_dim C, out_dim V).
    Wkb {
        n_head: usize,
        in_dim: usize,
        out_dim: usize,
        rope_tail: usize,
    },
    /// `kqkv` (made by `passes::fuse_kqkv`): latent attention over layer `layer`'s latent KV cache.
    /// Operands: q_abs [T, H, C+R] f32, pos [T] i32 (and, only while that layer's cache is still
    /// written by an unfused `cache_write`, that write's view [S, C+R] as a third operand, which
    /// orders the read after the write). Reads keys K_j, j in 0..=max(pos); output o_lat
    /// [T, H, C] f32: `o_lat[t,h] = Σ_j softmax_j(mask_j(kq_scale · q_abs[t,h]·K_j)) · K_j[:C]`,
    /// key j visible iff j ≤ pos[t]. C = `kv_lora`, R = `rope_dim`, H = `n_head`.
    Kqkv {
        layer: usize,
        n_head: usize,
        kv_lora: usize,
        rope_dim: usize,
        kq_scale: f32,
    },
}

impl Attrs {
    /// The canonical form: serde_json writes each f32 as its shortest round-tripping decimal, so two
    /// attribute sets are equal exactly when their canonical strings are.
    fn canonical(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("unserialisable:{e}"))
    }
}

impl PartialEq for Attrs {
    fn eq(&self, other: &Self) -> bool {
        self.canonical() == other.canonical()
    }
}

impl Eq for Attrs {}

impl std::hash::Hash for Attrs {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.canonical().hash(state)
    }
}
