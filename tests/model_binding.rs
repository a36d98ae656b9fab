//! Model binding: every fixture model binds with the dimensions of `tests/data/models/README.md`;
//! files with a wrong shape, a missing tensor or key, the legacy `attn_kv_b` layout or an
//! unsupported feature are refused with the error naming it (built by editing a real fixture
//! with the test writer).

use aubier_compiler::config::{ExpertLayout, Mistral4Config, QueryTemperature};
use aubier_runtime::gguf::write::{tensor_specs, GgufWriter, TensorSpec};
use aubier_runtime::gguf::{GgufFile, MetaValue};
use aubier_runtime::model::{read_config, weight_refs, ModelError};
use aubier_tests::{data_dir, model_path};

fn open(file: &str) -> GgufFile {
    let path = model_path(file);
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn bind(file: &GgufFile) -> Result<Mistral4Config, ModelError> {
    let cfg = read_config(file)?;
    weight_refs(file, &cfg)?;
    Ok(cfg)
}

/// The README's "ms4-tiny" column, or the "ms4-tiny256" one, with `context_length` `n_ctx`
/// (256 in `tests/data/models/README.md`; 4096 for the bundled model, `models/README.md`).
fn assert_readme_dims(cfg: &Mistral4Config, tiny256: bool, n_ctx: usize) {
    let (n_embd, q_lora, n_ff_exp) = if tiny256 {
        (256, 128, 256)
    } else {
        (128, 64, 32)
    };
    assert_eq!(cfg.arch, "mistral4");
    assert_eq!(cfg.n_layer, 3);
    assert_eq!(cfg.n_embd, n_embd);
    assert_eq!(cfg.n_vocab, 8192);
    assert_eq!(cfg.n_ctx_train, n_ctx);
    assert_eq!(cfg.n_head, 4);
    assert_eq!(cfg.q_lora_rank, q_lora);
    assert_eq!(cfg.kv_lora_rank, 64);
    assert_eq!(
        (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim),
        (32, 32, 32)
    );
    assert_eq!(cfg.kv_cache_width(), 96);
    assert_eq!(cfg.rms_norm_eps, 1e-6);
    assert_eq!(
        (cfg.n_expert, cfg.n_expert_used, cfg.n_expert_shared),
        (16, 4, 1)
    );
    assert_eq!(cfg.n_ff_exp, n_ff_exp);
    assert_eq!(cfg.expert_weights_scale, 1.0);
    assert!(cfg.expert_weights_norm);
    assert_eq!(cfg.rope.n_rot, 32);
    assert_eq!(cfg.rope.freq_base, 10000.0);
    assert_eq!(cfg.rope.factor, 4.0);
    assert_eq!(cfg.rope.original_context, 64);
    assert_eq!((cfg.rope.beta_fast, cfg.rope.beta_slow), (32.0, 1.0));
    assert_eq!(cfg.rope.attn_factor, 1.0);
    assert_eq!(cfg.rope.log_multiplier, 0.1);
    assert_eq!(
        cfg.temperature,
        Some(QueryTemperature {
            scale: 0.1,
            length: 64
        })
    );
}

#[test]
fn f32_fused_binds() {
    let f = open("ms4-tiny-f32.gguf");
    let cfg = read_config(&f).expect("config");
    assert_readme_dims(&cfg, false, 256);
    assert_eq!(cfg.expert_layout, ExpertLayout::FusedGateUp);
    let refs = weight_refs(&f, &cfg).expect("weights");
    assert_eq!(refs.len(), 51);
    let w = &refs["blk.2.ffn_gate_up_exps.weight"];
    assert_eq!(
        (w.ggml_type.as_str(), w.ne.clone()),
        ("F32", vec![128, 64, 16])
    );
    assert_eq!(refs["output.weight"].name, "output.weight");
}

#[test]
fn f32_split_binds_as_split_gate_up() {
    let f = open("ms4-tiny-f32-split.gguf");
    let cfg = read_config(&f).expect("config");
    assert_readme_dims(&cfg, false, 256);
    assert_eq!(cfg.expert_layout, ExpertLayout::SplitGateUp);
    let refs = weight_refs(&f, &cfg).expect("weights");
    assert_eq!(refs.len(), 54);
    assert_eq!(refs["blk.0.ffn_gate_exps.weight"].ne, vec![128, 32, 16]);
    assert_eq!(refs["blk.0.ffn_up_exps.weight"].ne, vec![128, 32, 16]);
    assert!(!refs.contains_key("blk.0.ffn_gate_up_exps.weight"));
}

#[test]
fn quantized_files_bind_with_readme_types() {
    for (file, gate_up, k_b, output, n_ctx) in [
        ("ms4-tiny256-q2k.gguf", "Q2_K", "Q4_0", "Q6_K", 4096),
        ("ms4-tiny256-iq2xxs.gguf", "IQ2_XXS", "IQ4_NL", "Q5_K", 256),
    ] {
        let f = open(file);
        let cfg = read_config(&f).expect("config");
        assert_readme_dims(&cfg, true, n_ctx);
        assert_eq!(cfg.expert_layout, ExpertLayout::FusedGateUp);
        let refs = weight_refs(&f, &cfg).expect("weights");
        assert_eq!(refs.len(), 51);
        assert_eq!(refs["blk.1.ffn_gate_up_exps.weight"].ggml_type, gate_up);
        assert_eq!(refs["blk.1.ffn_gate_up_exps.weight"].ne, vec![256, 512, 16]);
        assert_eq!(refs["blk.1.attn_k_b.weight"].ggml_type, k_b);
        assert_eq!(refs["output.weight"].ggml_type, output);
        assert_eq!(refs["blk.1.ffn_gate_inp.weight"].ggml_type, "F32");
    }
}

#[test]
fn vocab_only_file_is_refused_for_missing_tensors() {
    // tekken-v15-vocab.gguf has the real model's keys but no tensors.
    let f = GgufFile::open(data_dir().join("tokenizer/tekken-v15-vocab.gguf")).expect("fixture");
    let err = read_config(&f).expect_err("no tensors");
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err:?}");
    assert!(err.to_string().contains("ffn_gate_up_exps"), "{err}");
}

/// The f32 fixture with its metadata and tensor list edited.
fn edited(
    edit_meta: impl FnOnce(&mut Vec<(String, MetaValue)>),
    edit_tensors: impl FnOnce(&mut Vec<TensorSpec>),
) -> GgufFile {
    let f = open("ms4-tiny-f32.gguf");
    let mut meta = f.metadata().to_vec();
    edit_meta(&mut meta);
    let mut tensors = tensor_specs(&f);
    edit_tensors(&mut tensors);
    let mut w = GgufWriter::new();
    w.alignment = f.alignment();
    for (k, v) in &meta {
        w.kv(k, v);
    }
    w.tensors = tensors;
    GgufFile::from_bytes(w.finish()).expect("edited file is valid GGUF")
}

fn drop_key(key: &'static str) -> impl FnOnce(&mut Vec<(String, MetaValue)>) {
    move |m| m.retain(|(k, _)| k != key)
}

fn set_key(key: &'static str, v: MetaValue) -> impl FnOnce(&mut Vec<(String, MetaValue)>) {
    move |m| {
        m.retain(|(k, _)| k != key);
        m.push((key.to_owned(), v));
    }
}

fn drop_tensor(name: &'static str) -> impl FnOnce(&mut Vec<TensorSpec>) {
    move |t| t.retain(|s| s.name != name.as_bytes())
}

fn keep_tensors(_: &mut Vec<TensorSpec>) {}

fn refused(f: &GgufFile, names: &str) -> ModelError {
    let err = bind(f).expect_err("edited file was accepted");
    assert!(
        err.to_string().contains(names),
        "{err} does not name {names}"
    );
    err
}

#[test]
fn unedited_rebuild_binds() {
    let f = edited(|_| {}, keep_tensors);
    assert_readme_dims(&bind(&f).expect("binds"), false, 256);
}

#[test]
fn wrong_shape_is_refused() {
    // attn_q_b {64, 256} relabelled {256, 64}: same bytes, wrong shape.
    let f = edited(
        |_| {},
        |t| {
            let s = t
                .iter_mut()
                .find(|s| s.name == b"blk.1.attn_q_b.weight")
                .expect("attn_q_b");
            s.ne = vec![256, 64];
        },
    );
    let err = refused(&f, "blk.1.attn_q_b.weight");
    match err {
        ModelError::WrongShape {
            expected, found, ..
        } => {
            assert_eq!(expected, vec![64, 256]);
            assert_eq!(found, vec![256, 64]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_tensor_is_refused() {
    let f = edited(|_| {}, drop_tensor("blk.2.ffn_down_shexp.weight"));
    let err = refused(&f, "blk.2.ffn_down_shexp.weight");
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err:?}");
}

#[test]
fn unexpected_tensor_is_refused() {
    let f = edited(
        |_| {},
        |t| {
            t.push(TensorSpec {
                name: b"blk.0.extra.weight".to_vec(),
                ne: vec![8],
                type_id: 0,
                offset: None,
                data: vec![0; 32],
            })
        },
    );
    let err = refused(&f, "blk.0.extra.weight");
    assert!(
        matches!(err, ModelError::UnexpectedTensor { .. }),
        "{err:?}"
    );
}

#[test]
fn missing_output_falls_back_to_token_embd() {
    let f = edited(|_| {}, drop_tensor("output.weight"));
    let cfg = read_config(&f).expect("config");
    let refs = weight_refs(&f, &cfg).expect("weights");
    assert_eq!(refs["output.weight"].name, "token_embd.weight");
}

#[test]
fn legacy_kv_b_file_is_refused() {
    // The pre-absorption layout: attn_kv_b {kv_lora, n_head·(qk_nope + v_head)} instead of k_b/v_b.
    let f = edited(
        |_| {},
        |t| {
            t.retain(|s| {
                !s.name.ends_with(b"attn_k_b.weight") && !s.name.ends_with(b"attn_v_b.weight")
            });
            for l in 0..3 {
                t.push(TensorSpec {
                    name: format!("blk.{l}.attn_kv_b.weight").into_bytes(),
                    ne: vec![64, 256],
                    type_id: 0,
                    offset: None,
                    data: vec![0; 64 * 256 * 4],
                });
            }
        },
    );
    let err = refused(&f, "attn_kv_b");
    assert!(matches!(err, ModelError::LegacyMla { .. }), "{err:?}");
    assert!(err.to_string().contains("re-convert"), "{err}");
}

#[test]
fn legacy_file_without_key_length_mla_is_refused() {
    let f = edited(drop_key("mistral4.attention.key_length_mla"), keep_tensors);
    let err = refused(&f, "mistral4.attention.key_length_mla");
    assert!(matches!(err, ModelError::LegacyMla { .. }), "{err:?}");
}

#[test]
fn missing_required_key_is_refused() {
    for key in [
        "mistral4.expert_count",
        "mistral4.attention.q_lora_rank",
        "mistral4.rope.scaling.yarn_log_multiplier",
        "mistral4.leading_dense_block_count",
    ] {
        let f = edited(drop_key(key), keep_tensors);
        let err = refused(&f, key);
        assert!(
            matches!(err, ModelError::MissingKey { .. }),
            "{key}: {err:?}"
        );
    }
}

#[test]
fn mistyped_key_is_refused() {
    let f = edited(
        set_key("mistral4.block_count", MetaValue::String("3".into())),
        keep_tensors,
    );
    let err = refused(&f, "mistral4.block_count");
    assert!(matches!(err, ModelError::WrongType { .. }), "{err:?}");
}

#[test]
fn inconsistent_key_length_is_refused() {
    let f = edited(
        set_key("mistral4.attention.key_length", MetaValue::U32(128)),
        keep_tensors,
    );
    let err = refused(&f, "mistral4.attention.key_length");
    assert!(matches!(err, ModelError::BadValue { .. }), "{err:?}");
    let f = edited(
        set_key("mistral4.attention.value_length", MetaValue::U32(32)),
        keep_tensors,
    );
    let err = refused(&f, "mistral4.attention.value_length");
    assert!(matches!(err, ModelError::BadValue { .. }), "{err:?}");
}

#[test]
fn absent_temperature_defaults_for_mistral4() {
    let f = edited(
        |m| m.retain(|(k, _)| !k.starts_with("mistral4.attention.temperature_")),
        keep_tensors,
    );
    let cfg = bind(&f).expect("binds");
    // MODEL.md §2.2: llama_4_scaling_beta 0.1, length original_max_position_embeddings (64 here).
    assert_eq!(
        cfg.temperature,
        Some(QueryTemperature {
            scale: 0.1,
            length: 64
        })
    );
}

#[test]
fn deepseek2_without_temperature_has_none() {
    let f = edited(
        |m| {
            m.retain(|(k, _)| !k.starts_with("mistral4.attention.temperature_"));
            for (k, v) in m.iter_mut() {
                if let Some(rest) = k.strip_prefix("mistral4.") {
                    *k = format!("deepseek2.{rest}");
                }
                if k == "general.architecture" {
                    *v = MetaValue::String("deepseek2".into());
                }
            }
        },
        keep_tensors,
    );
    let cfg = bind(&f).expect("binds");
    assert_eq!(cfg.arch, "deepseek2");
    assert_eq!(cfg.temperature, None);
    assert_eq!(cfg.n_embd, 128);
}

#[test]
fn unsupported_arch_is_refused() {
    let f = edited(
        set_key("general.architecture", MetaValue::String("llama".into())),
        keep_tensors,
    );
    let err = refused(&f, "llama");
    assert!(matches!(err, ModelError::UnsupportedArch { .. }), "{err:?}");
}

#[test]
fn unsupported_features_are_refused() {
    let cases: Vec<(&str, GgufFile)> = vec![
        (
            "mistral4.leading_dense_block_count",
            edited(
                set_key("mistral4.leading_dense_block_count", MetaValue::U32(1)),
                keep_tensors,
            ),
        ),
        (
            "mistral4.expert_gating_func",
            edited(
                set_key("mistral4.expert_gating_func", MetaValue::U32(2)),
                keep_tensors,
            ),
        ),
        (
            "mistral4.expert_group_count",
            edited(
                set_key("mistral4.expert_group_count", MetaValue::U32(8)),
                keep_tensors,
            ),
        ),
        (
            "blk.0.exp_probs_b.bias",
            edited(
                |_| {},
                |t| {
                    t.push(TensorSpec {
                        name: b"blk.0.exp_probs_b.bias".to_vec(),
                        ne: vec![16],
                        type_id: 0,
                        offset: None,
                        data: vec![0; 64],
                    })
                },
            ),
        ),
    ];
    for (names, f) in cases {
        let err = refused(&f, names);
        assert!(
            matches!(err, ModelError::Unsupported { .. }),
            "{names}: {err:?}"
        );
    }
    // Softmax gating (1) stated explicitly is fine.
    let f = edited(
        set_key("mistral4.expert_gating_func", MetaValue::U32(1)),
        keep_tensors,
    );
    assert!(bind(&f).is_ok());
}

#[test]
fn non_f32_norm_is_refused() {
    // The router relabelled F16 (half the bytes, still inside its slot): it must stay F32.
    let f = edited(
        |_| {},
        |t| {
            let s = t
                .iter_mut()
                .find(|s| s.name == b"blk.0.ffn_gate_inp.weight")
                .expect("router");
            s.type_id = 1;
        },
    );
    let err = refused(&f, "blk.0.ffn_gate_inp.weight");
    assert!(matches!(err, ModelError::WrongTensorType { .. }), "{err:?}");
}
