//! Typed hyper-parameters of a Mistral Small 4 (`mistral4`, or `deepseek2` of the same shape) model.
//!
//! The compiler knows nothing of files: `aubier_runtime::model` fills this struct from the GGUF
//! metadata keys of `MODEL.md` §4.1 (llama.cpp `src/models/deepseek2.cpp` `load_arch_hparams`).
//! Every dimension the graph uses comes from here; nothing model-specific is hard-coded.

use serde::{Deserialize, Serialize};

/// YaRN RoPE parameters (`MODEL.md` §2.3; ggml `ggml_rope_yarn_corr_dims`, HF `_compute_yarn_parameters`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct YarnParams {
    /// Rotated dims per head (`rope.dimension_count`, = qk_rope_head_dim), even.
    pub n_rot: usize,
    /// `rope.freq_base` (θ base, 10000 on the real model).
    pub freq_base: f32,
    /// `rope.scaling.factor` s (128 on the real model). 1.0 means no YaRN interpolation.
    pub factor: f32,
    /// `rope.scaling.original_context_length` L0, in tokens (8192 on the real model).
    pub original_context: usize,
    /// `rope.scaling.yarn_beta_fast` (32).
    pub beta_fast: f32,
    /// `rope.scaling.yarn_beta_slow` (1).
    pub beta_slow: f32,
    /// Magnitude multiplier on cos/sin (1.0 for Mistral Small 4; see `MODEL.md` §2.3).
    pub attn_factor: f32,
    /// `rope.scaling.yarn_log_multiplier` (0.1·mscale_all_dim = 0.1): mscale = 1 + this·ln(factor).
    pub log_multiplier: f32,
}

/// Llama-4 query temperature: `q *= 1 + scale·ln(1 + floor(pos / length))` (`MODEL.md` §2.2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryTemperature {
    /// `attention.temperature_scale` β (0.1).
    pub scale: f32,
    /// `attention.temperature_length` L, in tokens (8192 on the real model).
    pub length: usize,
}

/// Layout of the routed experts' gate and up projections in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ExpertLayout {
    /// `blk.N.ffn_gate_up_exps` ne {n_embd, 2·n_ff_exp, n_expert}: gate rows first, then up rows.
    FusedGateUp,
    /// `blk.N.ffn_gate_exps` + `blk.N.ffn_up_exps`, each ne {n_embd, n_ff_exp, n_expert}.
    SplitGateUp,
}

/// Hyper-parameters of one Mistral Small 4 file (real-model values in `MODEL.md` §1, §4.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mistral4Config {
    /// `general.architecture`: `mistral4` or `deepseek2`.
    pub arch: String,
    /// `block_count` (36).
    pub n_layer: usize,
    /// `embedding_length` (4096).
    pub n_embd: usize,
    /// `vocab_size`, or the length of `tokenizer.ggml.tokens` (131072).
    pub n_vocab: usize,
    /// `context_length`, in tokens.
    pub n_ctx_train: usize,
    /// `attention.head_count` (32).
    pub n_head: usize,
    /// `attention.q_lora_rank` (1024).
    pub q_lora_rank: usize,
    /// `attention.kv_lora_rank` (256).
    pub kv_lora_rank: usize,
    /// qk_nope_head_dim = `key_length_mla` − `rope.dimension_count` (64).
    pub qk_nope_head_dim: usize,
    /// qk_rope_head_dim = `rope.dimension_count` (64).
    pub qk_rope_head_dim: usize,
    /// v_head_dim = `value_length_mla` (128).
    pub v_head_dim: usize,
    /// `attention.layer_norm_rms_epsilon`.
    pub rms_norm_eps: f32,
    /// `expert_count` (128).
    pub n_expert: usize,
    /// `expert_used_count`, top-k (4).
    pub n_expert_used: usize,
    /// `expert_shared_count` (1).
    pub n_expert_shared: usize,
    /// `expert_feed_forward_length` (2048).
    pub n_ff_exp: usize,
    /// `expert_weights_scale` (routed_scaling_factor, 1.0).
    pub expert_weights_scale: f32,
    /// `expert_weights_norm` (renormalise the top-k weights; true).
    pub expert_weights_norm: bool,
    /// YaRN RoPE.
    pub rope: YarnParams,
    /// Query temperature; `None` only for a `deepseek2` file without the keys.
    pub temperature: Option<QueryTemperature>,
    /// Routed-expert gate/up layout found in the file.
    pub expert_layout: ExpertLayout,
}

impl Mistral4Config {
    /// Width of one cached latent row: kv_lora_rank + qk_rope_head_dim (320 on the real model).
    pub fn kv_cache_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Width of the absorbed query per head, equal to [`Self::kv_cache_width`].
    pub fn q_abs_width(&self) -> usize {
        self.kv_cache_width()
    }

    /// Per-head q width before absorption: qk_nope + qk_rope (128).
    pub fn q_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// YaRN magnitude correction `mscale = 1 + log_multiplier·ln(factor)` (1.0 when factor ≤ 1).
    pub fn yarn_mscale(&self) -> f32 {
        if self.rope.factor <= 1.0 {
            1.0
        } else {
            1.0 + self.rope.log_multiplier * self.rope.factor.ln()
        }
    }

    /// Attention score scale `mscale² / sqrt(qk_nope + qk_rope)` (`MODEL.md` §2.2; llama.cpp
    /// `src/models/deepseek2.cpp`). 0.194975 on the real model.
    pub fn kq_scale(&self) -> f32 {
        let m = self.yarn_mscale();
        m * m / (self.q_head_dim() as f32).sqrt()
    }
}
