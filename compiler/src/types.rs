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
