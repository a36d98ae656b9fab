//! Mistral Small 4 (llama.cpp arch `mistral4`, a `deepseek2` of the same shape): one step of `T`
//! tokens at positions `pos`, exactly `MODEL.md` §2, at the level of primitive ops so that the
//! fusion passes (PHASE, WKB, KQKV) have real subgraphs to match.
//!
//! Sources followed: transformers `models/mistral4/modeling_mistral4.py` (`Mistral4Attention`,
//! `Mistral4MoE`, `Mistral4DecoderLayer`) and llama.cpp `src/models/deepseek2.cpp` (the absorbed
//! MLA branch: `wk_b` on q_nope, attention over the latent cache, `wv_b` on the output). Per layer:
//! - attention: RMSNorm; q-LoRA (`attn_q_a`, RMSNorm, `attn_q_b`) split per head into q_nope and
//!   q_pe; `attn_kv_a_mqa` split into the latent c_kv and the shared k_pe; YaRN RoPE on q_pe and
//!   k_pe; `[RMSNorm(c_kv), k_pe]` written to the latent cache; the absorbed query
//!   `[W_kb·q_nope, q_pe]` times the Llama-4 temperature (when the file states it); scores against
//!   the cache times `kq_scale`, causal mask, softmax, weighted sum of the cached c_kv rows;
//!   `W_vb` per head, `attn_output`, residual add;
//! - MoE: RMSNorm; router softmax over `ffn_gate_inp`, top-k, renormalised and scaled weights;
//!   routed SwiGLU experts plus, when `expert_shared_count` > 0, the shared expert
//!   `down(silu(gate·h) ⊙ up·h)` (its width is that of its weights); residual add.
//!
//! Then the output RMSNorm and the `output.weight` logits. Every extent comes from
//! [`Mistral4Config`]; graph inputs are `tokens` [T] i32 and `pos` [T] i32; outputs are `logits`
//! [T, n_vocab] and `router_ids.{l}` [T, n_expert_used] i32 per layer.

use crate::config::{ExpertLayout, Mistral4Config};
use crate::model;

model! {
    /// The Mistral Small 4 graph for `cfg` over the GGUF weights `w` (tensor name → ggml type and
    /// `ne`, as `aubier_runtime::model::weight_refs` returns them).
    ///
    /// Errors: `CompileError::MissingWeight` naming the first tensor the file lacks;
    /// `CompileError::Infer` naming the node whose weight has the wrong `ne`.
    pub fn build_graph(cfg: &Mistral4Config, w: weights) {
        input tokens: [T] i32;
        input pos: [T] i32;
        let x = embed(w.token_embd, tokens);
        for l in 0..cfg.n_layer {
            // MLA attention, absorbed form (MODEL.md §2.2).
            let h = rms_norm(x, w.blk[l].attn_norm; cfg.rms_norm_eps);
            let q_a = rms_norm(mat_mul(w.blk[l].attn_q_a, h), w.blk[l].attn_q_a_norm; cfg.rms_norm_eps);
            let q = reshape(mat_mul(w.blk[l].attn_q_b, q_a); [T, cfg.n_head, cfg.q_head_dim()]);
            let (q_nope, q_pe) = split(q; [cfg.qk_nope_head_dim, cfg.qk_rope_head_dim]);
            let (c_kv, k_pe) = split(mat_mul(w.blk[l].attn_kv_a_mqa, h); [cfg.kv_lora_rank, cfg.qk_rope_head_dim]);
            let q_pe = rope_yarn(q_pe, pos; &cfg.rope);
            let k_pe = reshape(k_pe; [T, 1, cfg.qk_rope_head_dim]);
            let k_pe = reshape(rope_yarn(k_pe, pos; &cfg.rope); [T, cfg.qk_rope_head_dim]);
            let kv = concat(rms_norm(c_kv, w.blk[l].attn_kv_a_norm; cfg.rms_norm_eps), k_pe);
            let cache = cache_write(kv, pos; l);
            let q_abs = concat(head_mat_mul(w.blk[l].attn_k_b, q_nope), q_pe);
            let q_abs = match &cfg.temperature {
                Some(t) => attn_temperature(q_abs, pos; t),
                None => q_abs,
            };
            let scores = causal_mask(scale(scores_qk(q_abs, cache); cfg.kq_scale()), pos);
            let o_lat = weighted_sum(softmax(scores), cache; cfg.kv_lora_rank);
            let o = reshape(head_mat_mul(w.blk[l].attn_v_b, o_lat); [T, cfg.n_head * cfg.v_head_dim]);
            x = x + mat_mul(w.blk[l].attn_output, o);

            // Mixture of experts (MODEL.md §2.4).
            let h = rms_norm(x, w.blk[l].ffn_norm; cfg.rms_norm_eps);
            let probs = softmax(mat_mul(w.blk[l].ffn_gate_inp, h));
            let ids = top_k(probs; cfg.n_expert_used);
            let wts = gather_renorm(probs, ids; cfg.expert_weights_norm, cfg.expert_weights_scale);
            let routed = match cfg.expert_layout {
                ExpertLayout::FusedGateUp => moe_ffn(h, ids, wts, w.blk[l].ffn_gate_up_exps, w.blk[l].ffn_down_exps;
                                                     l, cfg.n_ff_exp, cfg.expert_layout),
                ExpertLayout::SplitGateUp => moe_ffn(h, ids, wts, w.blk[l].ffn_gate_exps, w.blk[l].ffn_up_exps,
                                                     w.blk[l].ffn_down_exps; l, cfg.n_ff_exp, cfg.expert_layout),
            };
            let ffn = match cfg.n_expert_shared {
                0 => routed,
                _ => routed + mat_mul(w.blk[l].ffn_down_shexp,
                                      silu(mat_mul(w.blk[l].ffn_gate_shexp, h)) * mat_mul(w.blk[l].ffn_up_shexp, h)),
            };
            x = x + ffn;
            output "router_ids.{l}" = ids;
        }
        let x = rms_norm(x, w.output_norm; cfg.rms_norm_eps);
        output "logits" = mat_mul(w.output, x);
    }
}
