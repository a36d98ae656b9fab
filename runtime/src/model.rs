//! Model binding: a validated [`GgufFile`] → [`Mistral4Config`] and the tensor map the compiler
//! builds its graph from.
//!
//! Follows llama.cpp `src/models/deepseek2.cpp` (`load_arch_hparams`, `load_arch_tensors`) and
//! `MODEL.md` §4.1 (keys) and §4.2 (tensors). [`read_config`] reads every hyper-parameter under the
//! `{arch}.` prefix (`mistral4`, or `deepseek2` of the same shape), derives
//! qk_nope = key_length_mla − rope.dimension_count and v_head = value_length_mla, and checks the
//! absorbed-MLA identities key_length = kv_lora_rank + rope dims, value_length = kv_lora_rank. It
//! refuses what the engine does not implement (a legacy `attn_kv_b`-only file, dense leading
//! layers, non-softmax gating, an expert bias `exp_probs_b`, grouped routing), each with its own
//! error. [`weight_refs`] then maps every tensor name to a [`WeightRef`], checking each `ne`
//! against the config and refusing missing or unexpected tensors.

use std::collections::BTreeMap;

use aubier_compiler::config::{ExpertLayout, Mistral4Config, QueryTemperature, YarnParams};
use aubier_compiler::types::WeightRef;
use tracing::{info, warn};

use crate::ggml_type::GgmlType;
use crate::gguf::{GgufFile, MetaValue, TensorInfo};

/// Why a GGUF file cannot be bound to the Mistral Small 4 graph. Every variant names the key or
/// tensor concerned.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `general.architecture` is missing or not `mistral4` / `deepseek2`.
    #[error("general.architecture is {found}; supported: \"mistral4\", \"deepseek2\"")]
    UnsupportedArch {
        /// The value found, quoted, or `absent` / `a <type>` when it is not a string.
        found: String,
    },
    /// A required key is absent.
    #[error("missing metadata key {key:?}")]
    MissingKey {
        /// The full key (`"mistral4.block_count"`).
        key: String,
    },
    /// A key has a type this reader cannot use.
    #[error("metadata key {key:?} is a {found}, expected {expected}")]
    WrongType {
        /// The full key.
        key: String,
        /// What was expected (`"a non-negative integer"`).
        expected: &'static str,
        /// The GGUF type found.
        found: &'static str,
    },
    /// A key's value is out of range or inconsistent with other keys.
    #[error("metadata key {key:?} = {value}: {reason}")]
    BadValue {
        /// The full key.
        key: String,
        /// The value read, printed.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The file uses the legacy non-absorbed MLA layout.
    #[error(
        "legacy MLA file: {reason}. The absorbed MLA this engine runs needs attn_k_b / attn_v_b and \
         key_length_mla; re-convert the model with a current llama.cpp convert_hf_to_gguf.py"
    )]
    LegacyMla {
        /// What was found (a key missing, a tensor present or missing).
        reason: String,
    },
    /// A feature of the file that the engine does not implement.
    #[error("unsupported model feature: {what}")]
    Unsupported {
        /// The feature, naming the key or tensor.
        what: String,
    },
    /// A required tensor is absent.
    #[error("missing tensor {tensor:?}")]
    MissingTensor {
        /// The tensor name.
        tensor: String,
    },
    /// The file holds a tensor the model does not use.
    #[error("unexpected tensor {tensor:?}: not part of the {arch} tensor set")]
    UnexpectedTensor {
        /// The tensor name.
        tensor: String,
        /// The architecture.
        arch: String,
    },
    /// A tensor's `ne` disagrees with the config.
    #[error("tensor {tensor:?}: expected ne {expected:?}, found {found:?}")]
    WrongShape {
        /// The tensor name.
        tensor: String,
        /// `ne` the config implies (ggml order).
        expected: Vec<usize>,
        /// `ne` in the file.
        found: Vec<usize>,
    },
    /// A tensor that must be F32 (norms, the router) has another type.
    #[error("tensor {tensor:?}: type {found} where F32 is required")]
    WrongTensorType {
        /// The tensor name.
        tensor: String,
        /// The type in the file.
        found: GgmlType,
    },
}

/// The architectures bound here: llama.cpp `LLM_ARCH_MISTRAL4` and `LLM_ARCH_DEEPSEEK2`.
const ARCHS: [&str; 2] = ["mistral4", "deepseek2"];

/// llama.cpp `LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX`.
const GATING_SOFTMAX: u64 = 1;

/// Mistral Small 4's Llama-4 query temperature β (`llama_4_scaling_beta`, `MODEL.md` §2.2), used
/// when a `mistral4` file lacks `attention.temperature_scale`.
const MISTRAL4_TEMPERATURE_SCALE: f32 = 0.1;

/// YaRN β_fast / β_slow defaults (YaRN paper §3.2; llama.cpp `llama_hparams` defaults), used with
/// a warning when the keys are absent.
const DEFAULT_BETA_FAST: f32 = 32.0;
const DEFAULT_BETA_SLOW: f32 = 1.0;

/// Typed access to the `{arch}.` keys of one file.
struct Keys<'f> {
    file: &'f GgufFile,
    arch: &'f str,
}

impl<'f> Keys<'f> {
    fn full(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    fn value(&self, key: &str) -> Option<(String, &'f MetaValue)> {
        let full = self.full(key);
        self.file.get(&full).map(|v| (full, v))
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>, ModelError> {
        self.value(key)
            .map(|(full, v)| {
                v.as_u64().ok_or(ModelError::WrongType {
                    key: full,
                    expected: "a non-negative integer",
                    found: v.type_name(),
                })
            })
            .transpose()
    }

    fn usize(&self, key: &str) -> Result<usize, ModelError> {
        let v = self.opt_u64(key)?.ok_or_else(|| ModelError::MissingKey {
            key: self.full(key),
        })?;
        usize::try_from(v).map_err(|_| ModelError::BadValue {
            key: self.full(key),
            value: v.to_string(),
            reason: "does not fit usize".into(),
        })
    }

    /// A required dimension: a positive integer.
    fn dim(&self, key: &str) -> Result<usize, ModelError> {
        let v = self.usize(key)?;
        if v == 0 {
            return Err(ModelError::BadValue {
                key: self.full(key),
                value: "0".into(),
                reason: "must be positive".into(),
            });
        }
        Ok(v)
    }

    fn opt_f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        self.value(key)
            .map(|(full, v)| {
                v.as_f32()
                    .filter(|x| x.is_finite())
                    .ok_or(ModelError::WrongType {
                        key: full,
                        expected: "a finite number",
                        found: v.type_name(),
                    })
            })
            .transpose()
    }

    fn f32(&self, key: &str) -> Result<f32, ModelError> {
        self.opt_f32(key)?.ok_or_else(|| ModelError::MissingKey {
            key: self.full(key),
        })
    }

    /// A required number that must be strictly positive.
    fn positive_f32(&self, key: &str) -> Result<f32, ModelError> {
        let v = self.f32(key)?;
        if v <= 0.0 {
            return Err(ModelError::BadValue {
                key: self.full(key),
                value: v.to_string(),
                reason: "must be positive".into(),
            });
        }
        Ok(v)
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        self.value(key)
            .map(|(full, v)| {
                v.as_bool().ok_or(ModelError::WrongType {
                    key: full,
                    expected: "a bool",
                    found: v.type_name(),
                })
            })
            .transpose()
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'f str>, ModelError> {
        self.value(key)
            .map(|(full, v)| {
                v.as_str().ok_or(ModelError::WrongType {
                    key: full,
                    expected: "a string",
                    found: v.type_name(),
                })
            })
            .transpose()
    }
}

/// Reads the hyper-parameters of a `mistral4` (or same-shaped `deepseek2`) file into a
/// [`Mistral4Config`] (`MODEL.md` §4.1; llama.cpp `llama_model_deepseek2::load_arch_hparams`).
///
/// Keys read, under `{arch}.`: `block_count`, `context_length`, `embedding_length`, `vocab_size`
/// (else the length of `tokenizer.ggml.tokens`), `leading_dense_block_count` (must be 0),
/// `attention.{head_count, head_count_kv (must be 1), key_length, value_length, key_length_mla,
/// value_length_mla, q_lora_rank, kv_lora_rank, layer_norm_rms_epsilon, temperature_scale,
/// temperature_length}`, `rope.{dimension_count, freq_base}`, `rope.scaling.{type (must be yarn),
/// factor, original_context_length, yarn_beta_fast, yarn_beta_slow, yarn_log_multiplier}`,
/// `expert_{count, used_count, shared_count, feed_forward_length, weights_scale, weights_norm,
/// gating_func (1 = softmax if present), group_count (≤ 1 if present)}`. The tensor table decides
/// [`ExpertLayout`] (`blk.0.ffn_gate_up_exps` → fused, `blk.0.ffn_gate_exps` → split).
///
/// Absent keys with a logged fallback (`tracing::warn!`): a `mistral4` file without
/// `attention.temperature_scale` / `temperature_length` gets 0.1 / `rope.scaling.original_context_length`
/// (`MODEL.md` §2.2; a `deepseek2` file gets `None`); absent `yarn_beta_fast` / `yarn_beta_slow`
/// get 32 / 1; absent `expert_weights_norm` gets false (llama.cpp's default). YaRN `attn_factor`
/// is 1.0 (`MODEL.md` §2.3).
///
/// Errors: [`ModelError::UnsupportedArch`], [`ModelError::MissingKey`], [`ModelError::WrongType`],
/// [`ModelError::BadValue`] naming the key; [`ModelError::LegacyMla`] when `key_length_mla` is
/// absent or the file has `attn_kv_b` without `attn_k_b` / `attn_v_b`;
/// [`ModelError::Unsupported`] for dense leading layers, non-softmax gating, `exp_probs_b`, more
/// than one expert group; [`ModelError::MissingTensor`] when neither expert layout is present.
pub fn read_config(file: &GgufFile) -> Result<Mistral4Config, ModelError> {
    let arch = file
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .filter(|a| ARCHS.contains(a))
        .ok_or_else(|| ModelError::UnsupportedArch {
            found: match file.get("general.architecture") {
                None => "absent".to_owned(),
                Some(MetaValue::String(a)) => format!("{a:?}"),
                Some(other) => format!("a {}", other.type_name()),
            },
        })?;
    let k = Keys { file, arch };

    check_legacy_mla(file, &k)?;
    check_unsupported(file, &k)?;

    let n_layer = k.dim("block_count")?;
    let n_ctx_train = k.dim("context_length")?;
    let n_embd = k.dim("embedding_length")?;
    let n_vocab = match k.opt_u64("vocab_size")? {
        Some(v) => {
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| ModelError::BadValue {
                    key: k.full("vocab_size"),
                    value: v.to_string(),
                    reason: "must be a positive usize".into(),
                })?
        }
        None => file
            .get("tokenizer.ggml.tokens")
            .and_then(MetaValue::as_strings)
            .map(<[String]>::len)
            .filter(|&n| n > 0)
            .ok_or_else(|| ModelError::MissingKey {
                key: format!("{arch}.vocab_size (or tokenizer.ggml.tokens)"),
            })?,
    };

    let n_head = k.dim("attention.head_count")?;
    let n_head_kv = k.dim("attention.head_count_kv")?;
    if n_head_kv != 1 {
        return Err(ModelError::BadValue {
            key: k.full("attention.head_count_kv"),
            value: n_head_kv.to_string(),
            reason: "absorbed MLA stores one latent KV head (MQA); expected 1".into(),
        });
    }
    let q_lora_rank = k.dim("attention.q_lora_rank")?;
    let kv_lora_rank = k.dim("attention.kv_lora_rank")?;
    let key_length = k.dim("attention.key_length")?;
    let value_length = k.dim("attention.value_length")?;
    let key_length_mla = k.dim("attention.key_length_mla")?;
    let v_head_dim = k.dim("attention.value_length_mla")?;
    let n_rot = k.dim("rope.dimension_count")?;
    if n_rot % 2 != 0 {
        return Err(ModelError::BadValue {
            key: k.full("rope.dimension_count"),
            value: n_rot.to_string(),
            reason: "RoPE rotates pairs; must be even".into(),
        });
    }
    let qk_nope_head_dim = key_length_mla
        .checked_sub(n_rot)
        .filter(|&d| d > 0)
        .ok_or_else(|| ModelError::BadValue {
            key: k.full("attention.key_length_mla"),
            value: key_length_mla.to_string(),
            reason: format!("must exceed rope.dimension_count ({n_rot})"),
        })?;
    if Some(key_length) != kv_lora_rank.checked_add(n_rot) {
        return Err(ModelError::BadValue {
            key: k.full("attention.key_length"),
            value: key_length.to_string(),
            reason: format!(
                "absorbed MLA needs kv_lora_rank + rope.dimension_count = {kv_lora_rank} + {n_rot}"
            ),
        });
    }
    if value_length != kv_lora_rank {
        return Err(ModelError::BadValue {
            key: k.full("attention.value_length"),
            value: value_length.to_string(),
            reason: format!("absorbed MLA needs kv_lora_rank = {kv_lora_rank}"),
        });
    }
    let rms_norm_eps = k.positive_f32("attention.layer_norm_rms_epsilon")?;

    let n_expert = k.dim("expert_count")?;
    let n_expert_used = k.dim("expert_used_count")?;
    if n_expert_used > n_expert {
        return Err(ModelError::BadValue {
            key: k.full("expert_used_count"),
            value: n_expert_used.to_string(),
            reason: format!("exceeds expert_count {n_expert}"),
        });
    }
    let n_expert_shared = k.dim("expert_shared_count")?;
    let n_ff_exp = k.dim("expert_feed_forward_length")?;
    let expert_weights_scale = k.positive_f32("expert_weights_scale")?;
    let expert_weights_norm = match k.opt_bool("expert_weights_norm")? {
        Some(b) => b,
        None => {
            warn!(
                key = %k.full("expert_weights_norm"),
                "absent; using false (llama.cpp default): top-k weights not renormalised"
            );
            false
        }
    };

    let rope = read_yarn(&k, n_rot)?;
    let temperature = read_temperature(&k, rope.original_context)?;
    let expert_layout = expert_layout(file)?;

    Ok(Mistral4Config {
        arch: arch.to_owned(),
        n_layer,
        n_embd,
        n_vocab,
        n_ctx_train,
        n_head,
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim,
        qk_rope_head_dim: n_rot,
        v_head_dim,
        rms_norm_eps,
        n_expert,
        n_expert_used,
        n_expert_shared,
        n_ff_exp,
        expert_weights_scale,
        expert_weights_norm,
        rope,
        temperature,
        expert_layout,
    })
}

fn check_legacy_mla(file: &GgufFile, k: &Keys<'_>) -> Result<(), ModelError> {
    let has = |name: &str| file.tensor(name).is_some();
    if has("blk.0.attn_kv_b.weight")
        && !(has("blk.0.attn_k_b.weight") && has("blk.0.attn_v_b.weight"))
    {
        return Err(ModelError::LegacyMla {
            reason: "blk.0.attn_kv_b.weight is present without blk.0.attn_k_b.weight / \
                     blk.0.attn_v_b.weight"
                .into(),
        });
    }
    if k.value("attention.key_length_mla").is_none() {
        return Err(ModelError::LegacyMla {
            reason: format!("key {} is absent", k.full("attention.key_length_mla")),
        });
    }
    Ok(())
}

fn check_unsupported(file: &GgufFile, k: &Keys<'_>) -> Result<(), ModelError> {
    let dense = k.usize("leading_dense_block_count")?;
    if dense > 0 {
        return Err(ModelError::Unsupported {
            what: format!(
                "{} = {dense}: dense FFN layers are not implemented (every layer must be MoE)",
                k.full("leading_dense_block_count")
            ),
        });
    }
    if let Some(g) = k.opt_u64("expert_gating_func")? {
        if g != GATING_SOFTMAX {
            return Err(ModelError::Unsupported {
                what: format!(
                    "{} = {g}: only softmax routing (1) is implemented",
                    k.full("expert_gating_func")
                ),
            });
        }
    }
    if let Some(g) = k.opt_u64("expert_group_count")? {
        if g > 1 {
            return Err(ModelError::Unsupported {
                what: format!(
                    "{} = {g}: grouped routing (n_group > 1) is not implemented",
                    k.full("expert_group_count")
                ),
            });
        }
    }
    if let Some(t) = file
        .tensors()
        .iter()
        .find(|t| t.name.ends_with(".exp_probs_b.bias"))
    {
        return Err(ModelError::Unsupported {
            what: format!(
                "tensor {}: an expert selection bias (noaux_tc routing) is not implemented",
                t.name
            ),
        });
    }
    Ok(())
}

fn read_yarn(k: &Keys<'_>, n_rot: usize) -> Result<YarnParams, ModelError> {
    let scaling = k
        .opt_str("rope.scaling.type")?
        .ok_or_else(|| ModelError::MissingKey {
            key: k.full("rope.scaling.type"),
        })?;
    if scaling != "yarn" {
        return Err(ModelError::Unsupported {
            what: format!(
                "{} = {scaling:?}: only YaRN RoPE scaling is implemented",
                k.full("rope.scaling.type")
            ),
        });
    }
    let beta = |key: &str, default: f32| -> Result<f32, ModelError> {
        Ok(match k.opt_f32(key)? {
            Some(v) => v,
            None => {
                warn!(key = %k.full(key), default, "absent; using the YaRN default");
                default
            }
        })
    };
    Ok(YarnParams {
        n_rot,
        freq_base: k.positive_f32("rope.freq_base")?,
        factor: k.positive_f32("rope.scaling.factor")?,
        original_context: k.dim("rope.scaling.original_context_length")?,
        beta_fast: beta("rope.scaling.yarn_beta_fast", DEFAULT_BETA_FAST)?,
        beta_slow: beta("rope.scaling.yarn_beta_slow", DEFAULT_BETA_SLOW)?,
        attn_factor: 1.0,
        log_multiplier: k.f32("rope.scaling.yarn_log_multiplier")?,
    })
}

fn read_temperature(
    k: &Keys<'_>,
    original_context: usize,
) -> Result<Option<QueryTemperature>, ModelError> {
    let scale = k.opt_f32("attention.temperature_scale")?;
    let length = k.opt_u64("attention.temperature_length")?;
    let length = length
        .map(|l| {
            usize::try_from(l)
                .ok()
                .filter(|&l| l > 0)
                .ok_or_else(|| ModelError::BadValue {
                    key: k.full("attention.temperature_length"),
                    value: l.to_string(),
                    reason: "must be a positive usize".into(),
                })
        })
        .transpose()?;
    match (scale, length, k.arch) {
        (Some(scale), Some(length), _) => Ok(Some(QueryTemperature { scale, length })),
        (None, None, "deepseek2") => Ok(None),
        (_, _, "deepseek2") => Err(ModelError::MissingKey {
            key: k.full(if scale.is_none() {
                "attention.temperature_scale"
            } else {
                "attention.temperature_length"
            }),
        }),
        (scale, length, _) => {
            let scale = scale.unwrap_or_else(|| {
                warn!(
                    key = %k.full("attention.temperature_scale"),
                    default = MISTRAL4_TEMPERATURE_SCALE,
                    "absent; using Mistral Small 4's llama_4_scaling_beta"
                );
                MISTRAL4_TEMPERATURE_SCALE
            });
            let length = length.unwrap_or_else(|| {
                warn!(
                    key = %k.full("attention.temperature_length"),
                    default = original_context,
                    "absent; using rope.scaling.original_context_length"
                );
                original_context
            });
            Ok(Some(QueryTemperature { scale, length }))
        }
    }
}

fn expert_layout(file: &GgufFile) -> Result<ExpertLayout, ModelError> {
    if file.tensor("blk.0.ffn_gate_up_exps.weight").is_some() {
        Ok(ExpertLayout::FusedGateUp)
    } else if file.tensor("blk.0.ffn_gate_exps.weight").is_some() {
        Ok(ExpertLayout::SplitGateUp)
    } else {
        Err(ModelError::MissingTensor {
            tensor: "blk.0.ffn_gate_up_exps.weight (or blk.0.ffn_gate_exps.weight + \
                     blk.0.ffn_up_exps.weight)"
                .into(),
        })
    }
}

/// Every tensor the graph of `cfg` uses, by GGUF tensor name, each with its ggml type and `ne`
/// (ggml order) (`MODEL.md` §4.2; llama.cpp `llama_model_deepseek2::load_arch_tensors`).
///
/// Expected `ne`: `token_embd` / `output` {n_embd, n_vocab}; `output_norm`, `attn_norm`,
/// `ffn_norm` {n_embd}; `attn_q_a` {n_embd, q_lora}; `attn_q_a_norm` {q_lora}; `attn_q_b`
/// {q_lora, n_head·(qk_nope + qk_rope)}; `attn_kv_a_mqa` {n_embd, kv_lora + qk_rope};
/// `attn_kv_a_norm` {kv_lora}; `attn_k_b` {qk_nope, kv_lora, n_head}; `attn_v_b` {kv_lora,
/// v_head, n_head}; `attn_output` {n_head·v_head, n_embd}; `ffn_gate_inp` {n_embd, n_expert};
/// `ffn_gate_up_exps` {n_embd, 2·n_ff_exp, n_expert} or `ffn_gate_exps` + `ffn_up_exps` {n_embd,
/// n_ff_exp, n_expert} (per `cfg.expert_layout`); `ffn_down_exps` {n_ff_exp, n_embd, n_expert};
/// `ffn_gate_shexp` / `ffn_up_shexp` {n_embd, n_ff_exp·n_shared}; `ffn_down_shexp`
/// {n_ff_exp·n_shared, n_embd}. Norms and `ffn_gate_inp` must be F32.
///
/// When `output.weight` is absent, the `"output.weight"` entry refers to `token_embd.weight` (tied
/// embeddings, as llama.cpp does), and this is logged.
///
/// Errors: [`ModelError::MissingTensor`], [`ModelError::WrongShape`] (tensor, expected, found),
/// [`ModelError::WrongTensorType`], and [`ModelError::UnexpectedTensor`] for a tensor outside this
/// set (llama.cpp also refuses unused tensors).
pub fn weight_refs(
    file: &GgufFile,
    cfg: &Mistral4Config,
) -> Result<BTreeMap<String, WeightRef>, ModelError> {
    let mut refs = BTreeMap::new();
    // Saturating: a saturated extent (usize::MAX) can never equal a validated ne (≤ 2^63 − 1), so
    // an absurd config fails as WrongShape instead of overflowing.
    let mul = usize::saturating_mul;
    let q_width = mul(
        cfg.n_head,
        cfg.qk_nope_head_dim.saturating_add(cfg.qk_rope_head_dim),
    );
    let ff_sh = mul(cfg.n_ff_exp, cfg.n_expert_shared);
    let top: [(&str, Vec<usize>, bool); 2] = [
        ("token_embd.weight", vec![cfg.n_embd, cfg.n_vocab], false),
        ("output_norm.weight", vec![cfg.n_embd], true),
    ];
    for (name, ne, f32_only) in top {
        bind(file, &mut refs, name, name, &ne, f32_only)?;
    }
    let output_ne = [cfg.n_embd, cfg.n_vocab];
    if file.tensor("output.weight").is_some() {
        bind(
            file,
            &mut refs,
            "output.weight",
            "output.weight",
            &output_ne,
            false,
        )?;
    } else {
        info!("output.weight absent: the logits use token_embd.weight (tied embeddings)");
        bind(
            file,
            &mut refs,
            "output.weight",
            "token_embd.weight",
            &output_ne,
            false,
        )?;
    }
    for l in 0..cfg.n_layer {
        let mut layer: Vec<(&str, Vec<usize>, bool)> = vec![
            ("attn_norm", vec![cfg.n_embd], true),
            ("attn_q_a", vec![cfg.n_embd, cfg.q_lora_rank], false),
            ("attn_q_a_norm", vec![cfg.q_lora_rank], true),
            ("attn_q_b", vec![cfg.q_lora_rank, q_width], false),
            (
                "attn_kv_a_mqa",
                vec![
                    cfg.n_embd,
                    cfg.kv_lora_rank.saturating_add(cfg.qk_rope_head_dim),
                ],
                false,
            ),
            ("attn_kv_a_norm", vec![cfg.kv_lora_rank], true),
            (
                "attn_k_b",
                vec![cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.n_head],
                false,
            ),
            (
                "attn_v_b",
                vec![cfg.kv_lora_rank, cfg.v_head_dim, cfg.n_head],
                false,
            ),
            (
                "attn_output",
                vec![mul(cfg.n_head, cfg.v_head_dim), cfg.n_embd],
                false,
            ),
            ("ffn_norm", vec![cfg.n_embd], true),
            ("ffn_gate_inp", vec![cfg.n_embd, cfg.n_expert], true),
            (
                "ffn_down_exps",
                vec![cfg.n_ff_exp, cfg.n_embd, cfg.n_expert],
                false,
            ),
            ("ffn_gate_shexp", vec![cfg.n_embd, ff_sh], false),
            ("ffn_up_shexp", vec![cfg.n_embd, ff_sh], false),
            ("ffn_down_shexp", vec![ff_sh, cfg.n_embd], false),
        ];
        match cfg.expert_layout {
            ExpertLayout::FusedGateUp => layer.push((
                "ffn_gate_up_exps",
                vec![cfg.n_embd, mul(2, cfg.n_ff_exp), cfg.n_expert],
                false,
            )),
            ExpertLayout::SplitGateUp => {
                let ne = vec![cfg.n_embd, cfg.n_ff_exp, cfg.n_expert];
                layer.push(("ffn_gate_exps", ne.clone(), false));
                layer.push(("ffn_up_exps", ne, false));
            }
        }
        for (short, ne, f32_only) in layer {
            let name = format!("blk.{l}.{short}.weight");
            bind(file, &mut refs, &name, &name, &ne, f32_only)?;
        }
    }
    let used: std::collections::HashSet<&str> =
        refs.values().map(|w: &WeightRef| w.name.as_str()).collect();
    if let Some(extra) = file
        .tensors()
        .iter()
        .find(|t| !used.contains(t.name.as_str()))
    {
        return Err(ModelError::UnexpectedTensor {
            tensor: extra.name.clone(),
            arch: cfg.arch.clone(),
        });
    }
    Ok(refs)
}

/// Checks tensor `name` against `expected` and records it under `key`.
fn bind(
    file: &GgufFile,
    refs: &mut BTreeMap<String, WeightRef>,
    key: &str,
    name: &str,
    expected: &[usize],
    f32_only: bool,
) -> Result<(), ModelError> {
    let t: &TensorInfo = file.tensor(name).ok_or_else(|| ModelError::MissingTensor {
        tensor: name.to_owned(),
    })?;
    if t.ne != expected {
        return Err(ModelError::WrongShape {
            tensor: name.to_owned(),
            expected: expected.to_vec(),
            found: t.ne.clone(),
        });
    }
    if f32_only && t.ggml_type != GgmlType::F32 {
        return Err(ModelError::WrongTensorType {
            tensor: name.to_owned(),
            found: t.ggml_type,
        });
    }
    refs.insert(
        key.to_owned(),
        WeightRef {
            name: t.name.clone(),
            ggml_type: t.ggml_type.name().to_owned(),
            ne: t.ne.clone(),
        },
    );
    Ok(())
}
