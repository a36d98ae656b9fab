//! `aubier synth`: writes a synthetic `mistral4` GGUF with the real Mistral Small 4 dimensions
//! (`MODEL.md` §1, §2.6), as many layers and routed experts as asked, random but valid quant
//! blocks, and the tokenizer and chat template of a vocab GGUF (by default the tekken v15 vocab of
//! `tests/data/tokenizer`, 131 072 tokens, written by llama.cpp's converter).
//!
//! Steps.
//! 1. Metadata: the keys llama.cpp's `convert_hf_to_gguf.py` writes for this architecture
//!    (`MODEL.md` §4.1; the `mistral4.*` keys of the vocab GGUF are that converter's output for
//!    the real model and are checked against these in a test), then every `tokenizer.*` key of
//!    the vocab GGUF.
//! 2. Tensor list (`MODEL.md` §4.2): `token_embd`, per layer the MLA attention tensors, the F32
//!    router, the fused `ffn_gate_up_exps`, `ffn_down_exps` and the shared expert, then
//!    `output_norm` and `output`.
//! 3. Tensor types: what llama.cpp's `llama-quantize` picks for the chosen mix
//!    (`src/llama-quant.cpp`, `llama_tensor_get_type_impl` and `tensor_type_fallback`, read at
//!    ggml-org/llama.cpp 007dbbf): see [`mix_type`].
//! 4. Values (the recipe of the fixture models, `tests/data/models/README.md`): linear weights
//!    RMS 1/√fan_in, embeddings 1, router 2/√hidden (F32), output 4/√hidden, norms 1 + 0.1·N(0,1);
//!    quant blocks from `aubier_runtime::gguf::quant::random`, so activations stay O(1) through
//!    every layer.
//! 5. Streaming: the header is written first, then each tensor in chunks of rows generated in
//!    parallel (rayon), each chunk from its own ChaCha8 stream seeded by (seed, tensor, chunk), so
//!    the file is a pure function of the arguments and only a few chunks are in memory.

use anyhow::{bail, Context};
use aubier_runtime::ggml_type::GgmlType;
use aubier_runtime::gguf::quant::random::BlockSampler;
use aubier_runtime::gguf::write::{GgufWriter, StreamedTensor};
use aubier_runtime::gguf::{GgufFile, MetaValue};
use clap::{Args, ValueEnum};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

/// The llama-quantize file types `synth` reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QuantMix {
    /// `LLAMA_FTYPE_MOSTLY_Q2_K` (file type 10).
    #[value(name = "Q2_K")]
    Q2K,
    /// `LLAMA_FTYPE_MOSTLY_IQ2_XXS` (19).
    #[value(name = "IQ2_XXS")]
    Iq2Xxs,
    /// `LLAMA_FTYPE_MOSTLY_IQ2_XS` (20).
    #[value(name = "IQ2_XS")]
    Iq2Xs,
    /// `LLAMA_FTYPE_MOSTLY_Q4_K_M` (15).
    #[value(name = "Q4_K_M", alias = "Q4_K")]
    Q4KM,
}

impl QuantMix {
    /// `general.file_type` (llama.cpp `enum llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            QuantMix::Q2K => 10,
            QuantMix::Iq2Xxs => 19,
            QuantMix::Iq2Xs => 20,
            QuantMix::Q4KM => 15,
        }
    }

    /// The mix's name as `--quant` spells it.
    pub fn name(self) -> &'static str {
        match self {
            QuantMix::Q2K => "Q2_K",
            QuantMix::Iq2Xxs => "IQ2_XXS",
            QuantMix::Iq2Xs => "IQ2_XS",
            QuantMix::Q4KM => "Q4_K_M",
        }
    }

    /// The mix's default tensor type (`llama_ftype_get_default_type`).
    fn default_type(self) -> GgmlType {
        match self {
            QuantMix::Q2K => GgmlType::Q2_K,
            QuantMix::Iq2Xxs => GgmlType::IQ2_XXS,
            QuantMix::Iq2Xs => GgmlType::IQ2_XS,
            QuantMix::Q4KM => GgmlType::Q4_K,
        }
    }

    fn is_iq2(self) -> bool {
        matches!(self, QuantMix::Iq2Xxs | QuantMix::Iq2Xs)
    }
}

/// Arguments of `aubier synth`.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// GGUF file to write: replaced once the new file is whole (a failed run leaves it as it was).
    #[arg(long)]
    pub out: PathBuf,
    /// Transformer layers (the real model has 36).
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Routed experts per layer (the real model has 128); top-4 are used.
    #[arg(long, default_value_t = 128)]
    pub experts: usize,
    /// The llama-quantize mix whose per-tensor types to reproduce.
    #[arg(long, value_enum, default_value = "Q2_K")]
    pub quant: QuantMix,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Small dimensions for tests instead of the real ones: those of the fixture model
    /// ms4-tiny256 (hidden 256, 4 heads, q_lora 128, kv_lora 64, rope/nope/v 32, expert ff 256).
    #[arg(long)]
    pub tiny: bool,
    /// GGUF whose `tokenizer.*` keys (vocab, merges, special ids, chat template) to copy. The
    /// default is the tekken v15 vocab in the source tree this binary was built from (its path
    /// at build time): a binary copied elsewhere needs `--vocab` (a missing file is an error
    /// naming the path).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tokenizer/tekken-v15-vocab.gguf"))]
    pub vocab: PathBuf,
}

/// Model dimensions of a synthetic file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dims {
    /// `embedding_length`.
    pub hidden: usize,
    /// `attention.head_count`.
    pub heads: usize,
    /// `attention.q_lora_rank`.
    pub q_lora: usize,
    /// `attention.kv_lora_rank`.
    pub kv_lora: usize,
    /// `rope.dimension_count` (qk_rope_head_dim).
    pub rope: usize,
    /// qk_nope_head_dim.
    pub nope: usize,
    /// v_head_dim (`attention.value_length_mla`).
    pub v: usize,
    /// `expert_feed_forward_length` (also the shared expert's width).
    pub ff_exp: usize,
    /// `block_count`.
    pub layers: usize,
    /// `expert_count`.
    pub experts: usize,
    /// `vocab_size`.
    pub vocab: usize,
    /// `context_length`.
    pub context: usize,
    /// `rope.scaling.original_context_length`.
    pub original_context: usize,
    /// `rope.scaling.factor`.
    pub rope_factor: f32,
}

impl Dims {
    /// Mistral Small 4 (`MODEL.md` §1) with `layers` layers, `experts` routed experts and a
    /// vocabulary of `vocab` tokens.
    pub fn real(layers: usize, experts: usize, vocab: usize) -> Dims {
        Dims {
            hidden: 4096,
            heads: 32,
            q_lora: 1024,
            kv_lora: 256,
            rope: 64,
            nope: 64,
            v: 128,
            ff_exp: 2048,
            layers,
            experts,
            vocab,
            context: 1_048_576,
            original_context: 8192,
            rope_factor: 128.0,
        }
    }

    /// The fixture model ms4-tiny256's dimensions (`tests/data/models/README.md`).
    pub fn tiny(layers: usize, experts: usize, vocab: usize) -> Dims {
        Dims {
            hidden: 256,
            heads: 4,
            q_lora: 128,
            kv_lora: 64,
            rope: 32,
            nope: 32,
            v: 32,
            ff_exp: 256,
            layers,
            experts,
            vocab,
            context: 4096,
            original_context: 64,
            rope_factor: 4.0,
        }
    }
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Mean 0, this RMS.
    Rms(f32),
    /// An RMSNorm weight: 1 + 0.1·N(0, 1).
    NormWeight,
}

/// One tensor of the synthetic file.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthTensor {
    /// Name, `ne` (ggml order) and type.
    pub info: StreamedTensor,
    /// Values.
    pub init: Init,
}

/// The metadata of a synthetic file without the tokenizer keys, in the order llama.cpp's
/// converter writes them (`MODEL.md` §4.1).
pub fn arch_metadata(d: &Dims, mix: QuantMix) -> Vec<(String, MetaValue)> {
    use MetaValue::{Bool, String as S, F32, U32};
    let u = |v: usize| U32(v as u32);
    let a = |k: &str| format!("mistral4.{k}");
    vec![
        ("general.architecture".into(), S("mistral4".into())),
        ("general.type".into(), S("model".into())),
        (
            "general.name".into(),
            S("aubier synth (random weights)".into()),
        ),
        (a("block_count"), u(d.layers)),
        (a("context_length"), u(d.context)),
        (a("embedding_length"), u(d.hidden)),
        (a("feed_forward_length"), u(3 * d.hidden)),
        (a("attention.head_count"), u(d.heads)),
        (a("attention.head_count_kv"), U32(1)),
        (a("rope.scaling.type"), S("yarn".into())),
        (a("rope.scaling.factor"), F32(d.rope_factor)),
        (
            a("rope.scaling.original_context_length"),
            u(d.original_context),
        ),
        (a("rope.scaling.yarn_beta_fast"), F32(32.0)),
        (a("rope.scaling.yarn_beta_slow"), F32(1.0)),
        (a("rope.freq_base"), F32(10000.0)),
        (a("attention.layer_norm_rms_epsilon"), F32(1e-6)),
        (a("expert_count"), u(d.experts)),
        (a("expert_used_count"), U32(4)),
        (a("expert_group_count"), U32(1)),
        (a("expert_group_used_count"), U32(1)),
        (a("attention.key_length"), u(d.kv_lora + d.rope)),
        (a("attention.value_length"), u(d.kv_lora)),
        ("general.file_type".into(), U32(mix.file_type())),
        (a("leading_dense_block_count"), U32(0)),
        (a("vocab_size"), u(d.vocab)),
        (a("attention.q_lora_rank"), u(d.q_lora)),
        (a("attention.kv_lora_rank"), u(d.kv_lora)),
        (a("attention.key_length_mla"), u(d.nope + d.rope)),
        (a("attention.value_length_mla"), u(d.v)),
        (a("expert_feed_forward_length"), u(d.ff_exp)),
        (a("expert_shared_count"), U32(1)),
        (a("expert_weights_scale"), F32(1.0)),
        (a("expert_weights_norm"), Bool(true)),
        (a("rope.dimension_count"), u(d.rope)),
        (a("rope.scaling.yarn_log_multiplier"), F32(0.1)),
        ("general.quantization_version".into(), U32(2)),
    ]
}

/// The tensors of a synthetic file, in file order, with llama-quantize's types for `mix`.
pub fn tensors(d: &Dims, mix: QuantMix) -> Vec<SynthTensor> {
    let h = d.hidden;
    let lin = |fan_in: usize| Init::Rms(1.0 / (fan_in as f32).sqrt());
    let mut out: Vec<(String, Vec<usize>, Init)> =
        vec![("token_embd.weight".into(), vec![h, d.vocab], Init::Rms(1.0))];
    for l in 0..d.layers {
        let b = |n: &str| format!("blk.{l}.{n}.weight");
        let qk = d.nope + d.rope;
        out.extend([
            (b("attn_norm"), vec![h], Init::NormWeight),
            (b("attn_q_a"), vec![h, d.q_lora], lin(h)),
            (b("attn_q_a_norm"), vec![d.q_lora], Init::NormWeight),
            (b("attn_q_b"), vec![d.q_lora, d.heads * qk], lin(d.q_lora)),
            (b("attn_kv_a_mqa"), vec![h, d.kv_lora + d.rope], lin(h)),
            (b("attn_kv_a_norm"), vec![d.kv_lora], Init::NormWeight),
            (b("attn_k_b"), vec![d.nope, d.kv_lora, d.heads], lin(d.nope)),
            (b("attn_v_b"), vec![d.kv_lora, d.v, d.heads], lin(d.kv_lora)),
            (b("attn_output"), vec![d.heads * d.v, h], lin(d.heads * d.v)),
            (b("ffn_norm"), vec![h], Init::NormWeight),
            (
                b("ffn_gate_inp"),
                vec![h, d.experts],
                Init::Rms(2.0 / (h as f32).sqrt()),
            ),
            (
                b("ffn_gate_up_exps"),
                vec![h, 2 * d.ff_exp, d.experts],
                lin(h),
            ),
            (
                b("ffn_down_exps"),
                vec![d.ff_exp, h, d.experts],
                lin(d.ff_exp),
            ),
            (b("ffn_gate_shexp"), vec![h, d.ff_exp], lin(h)),
            (b("ffn_up_shexp"), vec![h, d.ff_exp], lin(h)),
            (b("ffn_down_shexp"), vec![d.ff_exp, h], lin(d.ff_exp)),
        ]);
    }
    out.push(("output_norm.weight".into(), vec![h], Init::NormWeight));
    out.push((
        "output.weight".into(),
        vec![h, d.vocab],
        Init::Rms(4.0 / (h as f32).sqrt()),
    ));
    // llama-quantize visits tensors in name order (`weights_map` is a std::map) and counts
    // ffn_down tensors as it goes.
    let mut names: Vec<&str> = out.iter().map(|(n, _, _)| n.as_str()).collect();
    names.sort_unstable();
    let down_order: std::collections::HashMap<&str, usize> = names
        .into_iter()
        .filter(|n| n.contains("ffn_down"))
        .enumerate()
        .map(|(i, n)| (n, i))
        .collect();
    let ctx = MixContext {
        mix,
        n_layer: d.layers,
        n_expert: d.experts,
    };
    out.iter()
        .map(|(name, ne, init)| {
            let i_ffn_down = down_order.get(name.as_str()).copied().unwrap_or(0);
            SynthTensor {
                info: StreamedTensor {
                    name: name.clone(),
                    ne: ne.iter().map(|&x| x as u64).collect(),
                    ggml_type: mix_type(&ctx, name, ne, i_ffn_down),
                },
                init: *init,
            }
        })
        .collect()
}

/// Bytes of one routed expert (its rows of `ffn_gate_up_exps` and `ffn_down_exps`) of a file
/// with dimensions `d` in llama-quantize's `mix`; for Mistral Small 4 in the Q2_K mix (gate/up
/// Q2_K, down Q3_K) 9,109,504 bytes. `None` for a model without routed experts.
pub fn routed_expert_bytes(d: &Dims, mix: QuantMix) -> Option<u64> {
    let layer = Dims { layers: 1, ..*d };
    let experts: Option<u64> = tensors(&layer, mix)
        .iter()
        .filter(|t| t.info.name.ends_with("_exps.weight"))
        .map(|t| t.info.n_bytes())
        .sum();
    experts?.checked_div(d.experts as u64)
}

/// What [`mix_type`] needs beyond the tensor itself.
struct MixContext {
    mix: QuantMix,
    n_layer: usize,
    n_expert: usize,
}

/// llama-quantize's type for one tensor (`src/llama-quant.cpp` at ggml-org/llama.cpp 007dbbf):
/// `tensor_allows_quantization` (1-D tensors, `*_norm.weight` and `ffn_gate_inp` stay F32),
/// `llama_tensor_get_type_impl` for the mix, then `tensor_type_fallback` when `ne[0]` is not a
/// multiple of the type's block. `i_ffn_down` is the tensor's index among the `ffn_down`
/// tensors in name order. The categories match by substring as llama.cpp does: `attn_output`,
/// `ffn_down*`, `ffn_gate*` (this includes `ffn_gate_up_exps`) and `ffn_up*`; the MLA tensors
/// (`attn_q_a`, `attn_q_b`, `attn_kv_a_mqa`, `attn_k_b`, `attn_v_b`) fall in no category.
fn mix_type(c: &MixContext, name: &str, ne: &[usize], i_ffn_down: usize) -> GgmlType {
    use GgmlType as T;
    if ne.len() < 2 || name.contains("_norm.weight") || name.contains("ffn_gate_inp") {
        return T::F32;
    }
    let mix = c.mix;
    let mut ty = mix.default_type();
    let use_more_bits =
        |i: usize, n: usize| i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2;
    let layer = || -> usize {
        name.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    if name == "output.weight" {
        ty = if mix.is_iq2() { T::Q5_K } else { T::Q6_K };
    } else if name == "token_embd.weight" {
        if mix.is_iq2() {
            ty = T::Q2_K;
        }
    } else if mix.is_iq2() {
        if name.contains("ffn_down") {
            if i_ffn_down < c.n_layer / 8 {
                ty = T::Q2_K;
            }
        } else if name.contains("attn_output") && c.n_expert == 8 {
            ty = T::Q5_K;
        }
    } else if name.contains("ffn_down") {
        match mix {
            QuantMix::Q2K => ty = T::Q3_K,
            QuantMix::Q4KM if use_more_bits(layer(), c.n_layer) => ty = T::Q6_K,
            _ => {}
        }
    } else if name.contains("attn_output") {
        if c.n_expert == 8 {
            ty = T::Q5_K;
        } else if mix == QuantMix::Q2K {
            ty = T::Q3_K;
        }
    }
    if !ne[0].is_multiple_of(ty.block_size()) {
        ty = match ty {
            T::IQ2_XXS | T::IQ2_XS => T::IQ4_NL,
            T::Q2_K | T::Q3_K => T::Q4_0,
            T::Q4_K => T::Q5_0,
            T::Q6_K => T::Q8_0,
            T::Q5_K => T::Q5_1,
            other => other,
        };
        if !ne[0].is_multiple_of(ty.block_size()) {
            ty = T::F16;
        }
    }
    ty
}

/// Rows generated per parallel chunk: about 4 MiB of output.
const CHUNK_BYTES: usize = 4 << 20;

/// llama.cpp's `LLAMA_MAX_LAYERS` (`src/llama-hparams.h`): a file with more layers is one
/// llama.cpp refuses, so no comparison can use it.
const MAX_LAYERS: usize = 512;

/// Refuses to start a file of `bytes` tensor bytes that the file system holding `out` has no
/// room for (`statvfs`'s blocks available to this user): `--layers 100000` would otherwise
/// write until the disk is full and only then fail. Where the free space cannot be read the
/// write goes ahead, and a full disk is the write's error.
fn check_free_space(out: &std::path::Path, bytes: u64) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let Ok(c_dir) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return Ok(());
    };
    // SAFETY: statvfs is plain old data, for which all zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_dir` is a NUL-terminated path and `st` a valid statvfs to write.
    if unsafe { libc::statvfs(c_dir.as_ptr(), &mut st) } != 0 {
        return Ok(());
    }
    let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
    if bytes > free {
        bail!(
            "--out {}: the file needs {:.2} GB and its file system has {:.2} GB free",
            out.display(),
            bytes as f64 / 1e9,
            free as f64 / 1e9
        );
    }
    Ok(())
}

/// The partial file [`remove_on_signal`] removes; set once, before the handlers are installed.
static PARTIAL: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();

/// SIGINT / SIGTERM / SIGHUP handler: removes the partial file, then dies of the signal.
extern "C" fn remove_partial_and_die(sig: libc::c_int) {
    // SAFETY: unlink, signal and raise are async-signal-safe; PARTIAL was set before the
    // handler was installed and is only read here.
    unsafe {
        if let Some(path) = PARTIAL.get() {
            libc::unlink(path.as_ptr());
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// An interrupted write (Ctrl-C, `kill`, `timeout`) removes `partial` instead of leaving a
/// hidden file as large as what was written so far beside `--out`. A signal the process was
/// started ignoring (`nohup` ignores SIGHUP; a shell's background job, SIGINT) stays ignored:
/// the write goes on, as it did before these handlers.
fn remove_on_signal(partial: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(partial.as_os_str().as_bytes()) else {
        return;
    };
    if PARTIAL.set(c).is_err() {
        return;
    }
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: sigaction is plain old data (all zero bytes are valid); with a null new
        // action, sigaction(2) only reads the current one into `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let read = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == 0;
        if read && old.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        // SAFETY: installs a handler that only makes async-signal-safe calls.
        unsafe {
            libc::signal(
                sig,
                remove_partial_and_die as *const () as libc::sighandler_t,
            );
        }
    }
}

/// Runs `aubier synth`.
pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    if args.layers == 0 {
        bail!("--layers must be at least 1");
    }
    if args.layers > MAX_LAYERS {
        bail!(
            "--layers {} is more than the {MAX_LAYERS} layers llama.cpp loads \
             (LLAMA_MAX_LAYERS; the real model has 36)",
            args.layers
        );
    }
    if args.experts < 4 {
        bail!("--experts must be at least 4 (the model routes each token to 4)");
    }
    if u32::try_from(args.experts).is_err() || u32::try_from(args.layers).is_err() {
        bail!("--layers and --experts must fit u32");
    }
    let vocab = GgufFile::open(&args.vocab)
        .with_context(|| format!("reading the vocab GGUF {}", args.vocab.display()))?;
    let tokenizer_keys: Vec<&(String, MetaValue)> = vocab
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect();
    let n_vocab = vocab
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_strings)
        .map(<[String]>::len)
        .filter(|&n| n > 0)
        .with_context(|| format!("{} has no tokenizer.ggml.tokens", args.vocab.display()))?;
    let dims = if args.tiny {
        Dims::tiny(args.layers, args.experts, n_vocab)
    } else {
        Dims::real(args.layers, args.experts, n_vocab)
    };
    let mut writer = GgufWriter::new();
    for (k, v) in arch_metadata(&dims, args.quant) {
        writer.kv(&k, &v);
    }
    for (k, v) in tokenizer_keys {
        writer.kv(k, v);
    }
    let list = tensors(&dims, args.quant);
    let infos: Vec<StreamedTensor> = list.iter().map(|t| t.info.clone()).collect();
    if std::fs::metadata(&args.out).is_ok_and(|m| !m.is_file()) {
        bail!(
            "--out {} exists and is not a regular file",
            args.out.display()
        );
    }
    let total = infos
        .iter()
        .try_fold(0u64, |acc, t| acc.checked_add(t.n_bytes()?))
        .with_context(|| {
            format!(
                "--layers {} --experts {}: the tensor data's size overflows u64",
                args.layers, args.experts
            )
        })?;
    check_free_space(&args.out, total)?;
    let samplers = list
        .iter()
        .map(|t| BlockSampler::new(t.info.ggml_type))
        .collect::<Result<Vec<_>, _>>()?;
    // Written beside `--out` and renamed over it once whole: a failed run (disk full, an
    // interrupted write) leaves neither a truncated file nor a destroyed old one.
    let name = args
        .out
        .file_name()
        .with_context(|| format!("--out {} names no file", args.out.display()))?;
    let partial = args.out.with_file_name(format!(
        ".{}.partial-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    // Before the file exists, so that no signal finds it there without the handler (unlinking
    // a file not yet made is harmless).
    remove_on_signal(&partial);
    let written = (|| -> anyhow::Result<u64> {
        let file = std::fs::File::create(&partial).with_context(|| {
            format!(
                "creating {} (written first as {})",
                args.out.display(),
                partial.display()
            )
        })?;
        let mut out = BufWriter::with_capacity(8 << 20, file);
        let mut progress =
            crate::progress::ByteProgress::new(&format!("writing {}", args.out.display()), total);
        let bytes = writer
            .write_streamed(&mut out, &infos, |i, sink| {
                write_tensor(&list[i], &samplers[i], args.seed, i as u64, sink)?;
                progress.add(infos[i].n_bytes().unwrap_or(0));
                Ok(())
            })
            .with_context(|| format!("writing {}", partial.display()))?;
        out.flush()
            .with_context(|| format!("writing {}", partial.display()))?;
        std::fs::rename(&partial, &args.out)
            .with_context(|| format!("renaming {} to {}", partial.display(), args.out.display()))?;
        Ok(bytes)
    })();
    let bytes = written.inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })?;
    eprintln!(
        "wrote {} ({} tensors, {:.2} GB, {} layers, {} experts, {})",
        args.out.display(),
        infos.len(),
        bytes as f64 / 1e9,
        dims.layers,
        dims.experts,
        args.quant.name()
    );
    Ok(())
}

/// Generates tensor `index` chunk by chunk (in parallel within a batch of chunks) into `sink`.
fn write_tensor(
    t: &SynthTensor,
    sampler: &BlockSampler,
    seed: u64,
    index: u64,
    sink: &mut dyn Write,
) -> std::io::Result<()> {
    let ty = t.info.ggml_type;
    let row_len = t.info.ne[0] as usize;
    let n_rows: usize = t.info.ne[1..].iter().map(|&d| d as usize).product();
    let row_bytes = ty
        .row_size(row_len)
        .ok_or_else(|| std::io::Error::other(format!("{}: bad row", t.info.name)))?;
    let rows_per_chunk = (CHUNK_BYTES / row_bytes).max(1);
    let n_chunks = n_rows.div_ceil(rows_per_chunk);
    let batch = rayon::current_num_threads().max(1) * 2;
    let (rms, offset) = match t.init {
        Init::Rms(r) => (r, 0.0),
        Init::NormWeight => (0.1, 1.0),
    };
    for first in (0..n_chunks).step_by(batch) {
        let chunks: Vec<Vec<u8>> = (first..(first + batch).min(n_chunks))
            .into_par_iter()
            .map(|c| -> std::io::Result<Vec<u8>> {
                let rows = rows_per_chunk.min(n_rows - c * rows_per_chunk);
                let mut buf = vec![0u8; rows * row_bytes];
                let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(seed, index, c as u64));
                for row in buf.chunks_exact_mut(row_bytes) {
                    sampler
                        .fill_row(&mut rng, rms, row_len, row)
                        .map_err(|e| std::io::Error::other(format!("{}: {e}", t.info.name)))?;
                }
                if offset != 0.0 {
                    for v in buf.chunks_exact_mut(4) {
                        let x = f32::from_le_bytes([v[0], v[1], v[2], v[3]]) + offset;
                        v.copy_from_slice(&x.to_le_bytes());
                    }
                }
                Ok(buf)
            })
            .collect::<std::io::Result<_>>()?;
        for c in chunks {
            sink.write_all(&c)?;
        }
    }
    Ok(())
}

/// A 64-bit seed per (seed, tensor, chunk): SplitMix64's finaliser over a combination of the three.
fn stream_seed(seed: u64, tensor: u64, chunk: u64) -> u64 {
    let mut z = seed
        ^ tensor.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ chunk.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab_path() -> PathBuf {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/data/tokenizer/tekken-v15-vocab.gguf"
        ))
    }

    /// The vocab fixture was written by llama.cpp's `convert_hf_to_gguf.py --vocab-only` for the
    /// real model: with its layer and expert counts, every `mistral4.*` key synth writes has the
    /// converter's value and type.
    #[test]
    fn arch_metadata_matches_llama_cpp_converter_output_for_the_real_model() {
        let file = GgufFile::open(vocab_path()).unwrap();
        let ours = arch_metadata(&Dims::real(36, 128, 131_072), QuantMix::Q2K);
        let mut checked = 0;
        for (k, v) in &ours {
            if !k.starts_with("mistral4.") {
                continue;
            }
            assert_eq!(file.get(k), Some(v), "{k}");
            checked += 1;
        }
        let theirs = file
            .metadata()
            .iter()
            .filter(|(k, _)| k.starts_with("mistral4."))
            .count();
        assert_eq!(
            checked, theirs,
            "synth writes every mistral4.* key the converter writes"
        );
    }

    fn types(d: &Dims, mix: QuantMix) -> std::collections::BTreeMap<String, GgmlType> {
        tensors(d, mix)
            .into_iter()
            .map(|t| (t.info.name, t.info.ggml_type))
            .collect()
    }

    /// The types llama-quantize gave the fixture models (3 layers, 16 experts; inspected with
    /// `aubier inspect tests/data/models/ms4-tiny256-{q2k,iq2xxs}.gguf`), reproduced at their dims.
    #[test]
    fn tiny_dims_reproduce_the_fixture_types() {
        use GgmlType as T;
        let d = Dims::tiny(3, 16, 8192);
        for (mix, fixture) in [
            (QuantMix::Q2K, "ms4-tiny256-q2k.gguf"),
            (QuantMix::Iq2Xxs, "ms4-tiny256-iq2xxs.gguf"),
        ] {
            let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
            let bundled = root.join("models").join(fixture);
            let path = if bundled.exists() {
                bundled
            } else {
                root.join("tests/data/models").join(fixture)
            };
            let file = GgufFile::open(&path).unwrap();
            let ours = types(&d, mix);
            for t in file.tensors() {
                // The fixtures carry split gate/up; synth writes them fused like today's converter.
                if t.name.contains("ffn_gate_exps") || t.name.contains("ffn_up_exps") {
                    let fused = t
                        .name
                        .replace("ffn_gate_exps", "ffn_gate_up_exps")
                        .replace("ffn_up_exps", "ffn_gate_up_exps");
                    assert_eq!(ours.get(&fused), Some(&t.ggml_type), "{fixture} {}", t.name);
                    continue;
                }
                assert_eq!(
                    ours.get(&t.name),
                    Some(&t.ggml_type),
                    "{fixture} {}",
                    t.name
                );
            }
            assert_eq!(ours["token_embd.weight"], T::Q2_K, "{fixture}");
        }
    }

    #[test]
    fn real_dims_q2k_types() {
        use GgmlType as T;
        let t = types(&Dims::real(4, 128, 131_072), QuantMix::Q2K);
        assert_eq!(t["output.weight"], T::Q6_K);
        assert_eq!(t["token_embd.weight"], T::Q2_K);
        assert_eq!(t["blk.0.attn_k_b.weight"], T::Q4_0);
        assert_eq!(t["blk.0.attn_output.weight"], T::Q3_K);
        assert_eq!(t["blk.3.ffn_down_exps.weight"], T::Q3_K);
        assert_eq!(t["blk.3.ffn_down_shexp.weight"], T::Q3_K);
        assert_eq!(t["blk.0.ffn_gate_up_exps.weight"], T::Q2_K);
        assert_eq!(t["blk.0.ffn_gate_inp.weight"], T::F32);
        assert_eq!(t["blk.0.attn_v_b.weight"], T::Q2_K);
    }

    #[test]
    fn real_q2k_expert_bytes_follow_the_ggml_block_sizes() {
        // gate/up: 4096 rows of 4096 in Q2_K (16 blocks of 84 bytes); down: 4096 rows of 2048 in
        // Q3_K (8 blocks of 110 bytes); ggml's block sizes, MODEL.md §6.
        let want = 4096 * 16 * 84 + 4096 * 8 * 110;
        let d = Dims::real(36, 128, 131_072);
        assert_eq!(routed_expert_bytes(&d, QuantMix::Q2K), Some(want));
        assert_eq!(
            routed_expert_bytes(&Dims { experts: 0, ..d }, QuantMix::Q2K),
            None
        );
    }

    #[test]
    fn mix_names_are_the_cli_names() {
        for m in QuantMix::value_variants() {
            let pv = m.to_possible_value().unwrap();
            assert_eq!(pv.get_name(), m.name());
        }
    }

    #[test]
    fn stream_seeds_differ() {
        let s: std::collections::HashSet<u64> = (0..4)
            .flat_map(|t| (0..64).map(move |c| stream_seed(0, t, c)))
            .collect();
        assert_eq!(s.len(), 256);
    }
}
