//! Configs and GGUF weight maps for the compiler tests, written from the published tables (not
//! from our code): `tests/data/models/README.md` for the two tiny models, `MODEL.md` §1/§4 for the
//! real Mistral Small 4.

#![allow(dead_code)] // each test file uses a different subset

use aubier_compiler::config::{ExpertLayout, Mistral4Config, QueryTemperature, YarnParams};
use aubier_compiler::types::WeightRef;
use std::collections::BTreeMap;

/// ms4-tiny256 (the bundled 2-bit model): README table "The two models" and "Other keys"
/// (`context_length` 256 as in the fixture; the bundled copy says 4096, `models/README.md`, which
/// the graph does not read).
pub fn tiny256_config() -> Mistral4Config {
    Mistral4Config {
        arch: "mistral4".into(),
        n_layer: 3,
        n_embd: 256,
        n_vocab: 8192,
        n_ctx_train: 256,
        n_head: 4,
        q_lora_rank: 128,
        kv_lora_rank: 64,
        qk_nope_head_dim: 32,
        qk_rope_head_dim: 32,
        v_head_dim: 32,
        rms_norm_eps: 1e-6,
        n_expert: 16,
        n_expert_used: 4,
        n_expert_shared: 1,
        n_ff_exp: 256,
        expert_weights_scale: 1.0,
        expert_weights_norm: true,
        rope: YarnParams {
            n_rot: 32,
            freq_base: 10000.0,
            factor: 4.0,
            original_context: 64,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attn_factor: 1.0,
            log_multiplier: 0.1,
        },
        temperature: Some(QueryTemperature {
            scale: 0.1,
            length: 64,
        }),
        expert_layout: ExpertLayout::FusedGateUp,
    }
}

/// ms4-tiny (the F32 models; `-split` has separate gate/up experts): README "The two models".
pub fn tiny_config(layout: ExpertLayout) -> Mistral4Config {
    Mistral4Config {
        n_embd: 128,
        q_lora_rank: 64,
        n_ff_exp: 32,
        expert_layout: layout,
        ..tiny256_config()
    }
}

/// Real Mistral Small 4: MODEL.md §1 and §4.1.
pub fn real_config() -> Mistral4Config {
    Mistral4Config {
        arch: "mistral4".into(),
        n_layer: 36,
        n_embd: 4096,
        n_vocab: 131072,
        n_ctx_train: 1048576,
        n_head: 32,
        q_lora_rank: 1024,
        kv_lora_rank: 256,
        qk_nope_head_dim: 64,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        rms_norm_eps: 1e-6,
        n_expert: 128,
        n_expert_used: 4,
        n_expert_shared: 1,
        n_ff_exp: 2048,
        expert_weights_scale: 1.0,
        expert_weights_norm: true,
        rope: YarnParams {
            n_rot: 64,
            freq_base: 10000.0,
            factor: 128.0,
            original_context: 8192,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attn_factor: 1.0,
            log_multiplier: 0.1,
        },
        temperature: Some(QueryTemperature {
            scale: 0.1,
            length: 8192,
        }),
        expert_layout: ExpertLayout::FusedGateUp,
    }
}

fn put(m: &mut BTreeMap<String, WeightRef>, name: String, ty: &str, ne: &[usize]) {
    m.insert(
        name.clone(),
        WeightRef {
            name,
            ggml_type: ty.into(),
            ne: ne.to_vec(),
        },
    );
}

/// (GGUF base name, ggml type, ne) per layer, and the model-wide tensors.
type Table = (
    &'static [(&'static str, &'static str, &'static [usize])],
    &'static [(&'static str, &'static str, &'static [usize])],
);

fn from_table(n_layer: usize, (global, block): Table) -> BTreeMap<String, WeightRef> {
    let mut m = BTreeMap::new();
    for (name, ty, ne) in global {
        put(&mut m, format!("{name}.weight"), ty, ne);
    }
    for l in 0..n_layer {
        for (name, ty, ne) in block {
            put(&mut m, format!("blk.{l}.{name}.weight"), ty, ne);
        }
    }
    m
}

/// `ms4-tiny256-q2k.gguf`, README tables "GGUF files" and "Tensor types that llama-quantize
/// chose" (norms and router F32).
pub fn tiny256_q2k_weights() -> BTreeMap<String, WeightRef> {
    from_table(
        3,
        (
            &[
                ("token_embd", "Q2_K", &[256, 8192]),
                ("output_norm", "F32", &[256]),
                ("output", "Q6_K", &[256, 8192]),
            ],
            &[
                ("attn_norm", "F32", &[256]),
                ("attn_q_a", "Q2_K", &[256, 128]),
                ("attn_q_a_norm", "F32", &[128]),
                ("attn_q_b", "Q4_0", &[128, 256]),
                ("attn_kv_a_mqa", "Q2_K", &[256, 96]),
                ("attn_kv_a_norm", "F32", &[64]),
                ("attn_k_b", "Q4_0", &[32, 64, 4]),
                ("attn_v_b", "Q4_0", &[64, 32, 4]),
                ("attn_output", "Q4_0", &[128, 256]),
                ("ffn_norm", "F32", &[256]),
                ("ffn_gate_inp", "F32", &[256, 16]),
                ("ffn_gate_up_exps", "Q2_K", &[256, 512, 16]),
                ("ffn_down_exps", "Q3_K", &[256, 256, 16]),
                ("ffn_gate_shexp", "Q2_K", &[256, 256]),
                ("ffn_up_shexp", "Q2_K", &[256, 256]),
                ("ffn_down_shexp", "Q3_K", &[256, 256]),
            ],
        ),
    )
}

/// `ms4-tiny-f32.gguf` (fused) or `ms4-tiny-f32-split.gguf` (split): README "GGUF files"
/// (experts {128, 64, 16} fused, {128, 32, 16} each split) with the ms4-tiny dims.
pub fn tiny_f32_weights(layout: ExpertLayout) -> BTreeMap<String, WeightRef> {
    let mut m = from_table(
        3,
        (
            &[
                ("token_embd", "F32", &[128, 8192]),
                ("output_norm", "F32", &[128]),
                ("output", "F32", &[128, 8192]),
            ],
            &[
                ("attn_norm", "F32", &[128]),
                ("attn_q_a", "F32", &[128, 64]),
                ("attn_q_a_norm", "F32", &[64]),
                ("attn_q_b", "F32", &[64, 256]),
                ("attn_kv_a_mqa", "F32", &[128, 96]),
                ("attn_kv_a_norm", "F32", &[64]),
                ("attn_k_b", "F32", &[32, 64, 4]),
                ("attn_v_b", "F32", &[64, 32, 4]),
                ("attn_output", "F32", &[128, 128]),
                ("ffn_norm", "F32", &[128]),
                ("ffn_gate_inp", "F32", &[128, 16]),
                ("ffn_down_exps", "F32", &[32, 128, 16]),
                ("ffn_gate_shexp", "F32", &[128, 32]),
                ("ffn_up_shexp", "F32", &[128, 32]),
                ("ffn_down_shexp", "F32", &[32, 128]),
            ],
        ),
    );
    for l in 0..3 {
        match layout {
            ExpertLayout::FusedGateUp => put(
                &mut m,
                format!("blk.{l}.ffn_gate_up_exps.weight"),
                "F32",
                &[128, 64, 16],
            ),
            ExpertLayout::SplitGateUp => {
                put(
                    &mut m,
                    format!("blk.{l}.ffn_gate_exps.weight"),
                    "F32",
                    &[128, 32, 16],
                );
                put(
                    &mut m,
                    format!("blk.{l}.ffn_up_exps.weight"),
                    "F32",
                    &[128, 32, 16],
                );
            }
        }
    }
    m
}

/// The real model's tensors, MODEL.md §4.2 (types as a Q2_K mix would pick them; the compiler
/// does not look at types).
pub fn real_weights() -> BTreeMap<String, WeightRef> {
    from_table(
        36,
        (
            &[
                ("token_embd", "Q2_K", &[4096, 131072]),
                ("output_norm", "F32", &[4096]),
                ("output", "Q6_K", &[4096, 131072]),
            ],
            &[
                ("attn_norm", "F32", &[4096]),
                ("attn_q_a", "Q2_K", &[4096, 1024]),
                ("attn_q_a_norm", "F32", &[1024]),
                ("attn_q_b", "Q2_K", &[1024, 4096]),
                ("attn_kv_a_mqa", "Q2_K", &[4096, 320]),
                ("attn_kv_a_norm", "F32", &[256]),
                ("attn_k_b", "Q4_0", &[64, 256, 32]),
                ("attn_v_b", "Q2_K", &[256, 128, 32]),
                ("attn_output", "Q2_K", &[4096, 4096]),
                ("ffn_norm", "F32", &[4096]),
                ("ffn_gate_inp", "F32", &[4096, 128]),
                ("ffn_gate_up_exps", "Q2_K", &[4096, 4096, 128]),
                ("ffn_down_exps", "Q3_K", &[2048, 4096, 128]),
                ("ffn_gate_shexp", "Q2_K", &[4096, 2048]),
                ("ffn_up_shexp", "Q2_K", &[4096, 2048]),
                ("ffn_down_shexp", "Q3_K", &[2048, 4096]),
            ],
        ),
    )
}
