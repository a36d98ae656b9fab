//! `aubier run`: one prompt through the model on a backend (`--backend`), from the command line.
//! It drives the same `Session` and decode loop (`aubier_runtime::generate`) as the server.

use anyhow::{bail, Context};
use aubier_runtime::backend::cpu::CpuNumerics;
use aubier_runtime::backend::vulkan::DeviceChoice;
use aubier_runtime::backend::BackendKind;
use aubier_runtime::engine::Model;
use aubier_runtime::generate::{generate, FinishReason, GenerateParams};
use aubier_runtime::placement::hotset::HotSet;
use aubier_runtime::placement::policy::PolicyKind;
use aubier_runtime::sampler::SamplingParams;
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::expert_store::{FastBudget, ResetMode, StoreOptions};
use aubier_runtime::text::tokenizer::Tokenizer;
use clap::Args;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

/// The model and prompt of `aubier run` and `aubier trace`.
#[derive(Args, Debug)]
pub struct PromptArgs {
    /// GGUF file to run.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt as comma-separated token ids (no BOS is added).
    #[arg(long, conflicts_with = "prompt", value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Prompt as text, tokenized with the file's tokenizer (BOS added when the file says so).
    #[arg(long)]
    pub prompt: Option<String>,
}

/// A loaded model, its tokenizer (when the file has one) and the prompt ids.
pub struct Loaded {
    /// The compiled model.
    pub model: Arc<Model>,
    /// The file's tokenizer, if it carries `tokenizer.ggml.*`.
    pub tokenizer: Option<Tokenizer>,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
}

impl PromptArgs {
    /// Loads the model for `backend` and resolves the prompt. Errors: the file, the binding,
    /// the tokenizer, or no prompt.
    pub fn load(&self, backend: BackendKind) -> anyhow::Result<Loaded> {
        let model = Model::load_with(&self.model, backend)
            .with_context(|| format!("loading {}", self.model.display()))?;
        let tokenizer = Tokenizer::from_gguf(&model.file).ok();
        let prompt: Vec<u32> = match (&self.prompt_ids, &self.prompt) {
            (Some(ids), _) => ids.clone(),
            (None, Some(text)) => {
                let tok = tokenizer.as_ref().context(
                    "--prompt needs the file's tokenizer, and this file has none; use --prompt-ids",
                )?;
                let mut ids = Vec::new();
                if add_bos(&model) {
                    ids.push(tok.bos_id());
                }
                ids.extend(tok.encode(text)?);
                ids
            }
            (None, None) => bail!("give the prompt with --prompt-ids 1,2,3 or --prompt TEXT"),
        };
        Ok(Loaded {
            model,
            tokenizer,
            prompt,
        })
    }
}

/// The backend and its options, shared by `aubier run`, `serve`, `bench` and the configurations
/// of `aubier quality` (`#[command(flatten)]`); [`BackendArgs::kind`] resolves them.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct BackendArgs {
    /// Backend: `auto` (default: `vulkan` on a hardware GPU when the machine has one, else
    /// `cpu`; a software Vulkan device such as lavapipe only when `vulkan` is named), `cpu` (SIMD
    /// kernels over Q8_K activations, latent attention fused — `aubier quality` EQUIVALENT to
    /// the oracle under q8x2, see docs/BENCHMARKS.md), `vulkan` (the generated GPU kernels,
    /// PHASE / WKB / KQKV fused, on a Vulkan device: `aubier devices` lists them) or `oracle`
    /// (the cranelift lowering of the unfused plan, f32 activations: the numerics reference).
    #[arg(long, value_enum)]
    pub backend: Option<BackendName>,
    /// The Vulkan device of `--backend vulkan`, by its index in `aubier devices` (default: the
    /// first hardware GPU, else a software device).
    #[arg(long)]
    pub device: Option<usize>,
    /// Numerics of the cpu backend: `q8x2` (default: each activation as two Q8_K planes, value
    /// and residual) or `q8` (one plane, as llama.cpp's CPU backend: faster, measurably less
    /// exact).
    #[arg(long, value_parser = parse_cpu_numerics)]
    pub cpu_numerics: Option<CpuNumerics>,
    /// Deprecated alias: `oracle` = `--backend oracle`, `q8x2` / `q8` = `--backend cpu
    /// --cpu-numerics q8x2 / q8`.
    #[arg(long, value_name = "oracle|q8x2|q8", conflicts_with_all = ["backend", "cpu_numerics"])]
    pub cpu_kernels: Option<String>,
    /// Most prompt tokens per forward pass (llama.cpp's `--ubatch-size`): a longer prompt runs
    /// in equal passes of at most this many tokens, which bounds its activation memory; the
    /// logits do not change. 0 runs a prompt in one pass.
    #[arg(long, default_value_t = DEFAULT_UBATCH)]
    pub ubatch: usize,
}

/// `--backend`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendName {
    /// `vulkan` on a hardware GPU when there is one, else `cpu` (the product path).
    Auto,
    /// The cpu backend.
    Cpu,
    /// The generated GPU kernels on a Vulkan device.
    Vulkan,
    /// The cranelift oracle.
    Oracle,
}

/// The command line's prompt pass size: llama.cpp's default `n_ubatch`.
const DEFAULT_UBATCH: usize = 512;

impl Default for BackendArgs {
    /// The default backend and [`DEFAULT_UBATCH`], as the command line.
    fn default() -> Self {
        BackendArgs {
            backend: None,
            device: None,
            cpu_numerics: None,
            cpu_kernels: None,
            ubatch: DEFAULT_UBATCH,
        }
    }
}

impl BackendArgs {
    /// The backend these flags name ([`BackendKind::default`], `auto`, when none), `auto`
    /// resolved on this machine ([`BackendKind::resolve`]), printing a warning on stderr for the
    /// deprecated `--cpu-kernels`.
    ///
    /// Errors: `--cpu-numerics` with a backend other than cpu; `--device` with a backend other
    /// than vulkan; an unknown `--cpu-kernels` value.
    pub fn kind(&self) -> anyhow::Result<BackendKind> {
        if let Some(old) = &self.cpu_kernels {
            let (kind, new) = match old.as_str() {
                "oracle" => (BackendKind::Oracle, "--backend oracle".to_string()),
                other => {
                    let n: CpuNumerics = other.parse().map_err(|_| {
                        anyhow::anyhow!(
                            "--cpu-kernels: unknown value `{old}` (expected oracle, q8x2 or q8)"
                        )
                    })?;
                    (
                        BackendKind::Cpu(n),
                        format!("--backend cpu --cpu-numerics {n}"),
                    )
                }
            };
            eprintln!("warning: --cpu-kernels is deprecated; use {new}");
            return Ok(kind);
        }
        let name = self.backend.unwrap_or(BackendName::Auto);
        if let (Some(d), false) = (self.device, name == BackendName::Vulkan) {
            bail!("--device {d} applies to --backend vulkan")
        }
        let kind = match (name, self.cpu_numerics) {
            (BackendName::Cpu, n) => BackendKind::Cpu(n.unwrap_or_default()),
            (_, Some(n)) => bail!("--cpu-numerics {n} applies to --backend cpu"),
            (BackendName::Oracle, None) => BackendKind::Oracle,
            (BackendName::Vulkan, None) => BackendKind::Vulkan(DeviceChoice { index: self.device }),
            (BackendName::Auto, None) => BackendKind::Auto,
        };
        Ok(kind.resolve())
    }
}

fn parse_cpu_numerics(s: &str) -> Result<CpuNumerics, String> {
    s.parse()
}

/// The split expert store's flags, shared by `aubier run`, `aubier serve` and `aubier bench`
/// (`#[command(flatten)]`); [`StoreArgs::options`] turns them into the runtime's [`StoreOptions`].
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Fast-store slots per MoE layer, 0..=n_expert (default: every expert when they fit in half
    /// the available memory, else as many as fit there).
    #[arg(long, conflicts_with = "fast_budget")]
    pub n_res: Option<usize>,
    /// Fast-store budget in bytes over all layers (suffixes K, M, G = 1024¹²³); the slots per
    /// layer are derived from each expert's bytes.
    #[arg(long, value_parser = parse_bytes)]
    pub fast_budget: Option<u64>,
    /// Seed membership, {"layers": [[e, …], …]} hottest first (default: experts 0..n_res).
    #[arg(long)]
    pub resident_set: Option<PathBuf>,
    /// Placement policy: 2q, lru, lfu, or static (the seed set, never rotated).
    #[arg(long, default_value = "2q", value_parser = parse_online_policy)]
    pub policy: PolicyKind,
    /// 2Q A1in size (Kin) as a fraction of the slots.
    #[arg(long, default_value_t = 0.25)]
    pub a1in: f64,
    /// 2Q A1out ghost-queue size (Kout) as a fraction of the slots.
    #[arg(long, default_value_t = 0.5)]
    pub a1out: f64,
    /// Most 2Q promotions per token per layer (default: no cap).
    #[arg(long)]
    pub max_promotions: Option<usize>,
    /// Between requests: `exact` restores the boot membership and policy state (timed), `none`
    /// keeps them.
    #[arg(long, default_value = "exact")]
    pub reset: ResetMode,
}

impl StoreArgs {
    /// The runtime options for `backend` (the experts' copies interleaved for the cpu
    /// backend's decode kernels, in the file's layout for the oracle). Errors: the resident-set
    /// file cannot be read or parsed.
    pub fn options(&self, backend: BackendKind) -> anyhow::Result<StoreOptions> {
        let budget = match (self.n_res, self.fast_budget) {
            (Some(n), _) => FastBudget::Slots(n),
            (None, Some(b)) => FastBudget::Bytes(b),
            (None, None) => FastBudget::Auto,
        };
        let resident_set = match &self.resident_set {
            Some(path) => Some(
                HotSet::read(path)
                    .with_context(|| format!("reading --resident-set {}", path.display()))?,
            ),
            None => None,
        };
        Ok(StoreOptions {
            budget,
            resident_set,
            policy: self.policy,
            a1in: self.a1in,
            a1out: self.a1out,
            max_promotions: self.max_promotions,
            reset: self.reset,
            interleave: matches!(backend, BackendKind::Cpu(_)),
        })
    }
}

/// `--fast-budget`: bytes, optionally with a K, M or G suffix (powers of 1024).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.eq_ignore_ascii_case(&'k') => (&t[..i], 1u64 << 10),
        Some((i, c)) if c.eq_ignore_ascii_case(&'m') => (&t[..i], 1 << 20),
        Some((i, c)) if c.eq_ignore_ascii_case(&'g') => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("`{s}` is not a byte count (e.g. 1048576, 512M, 4G)"))
}

/// `--policy`: an online policy (`min` needs the future and is refused).
fn parse_online_policy(s: &str) -> Result<PolicyKind, String> {
    match s.parse::<PolicyKind>() {
        Ok(PolicyKind::Min) => Err(
            "`min` is an offline oracle; use it with `aubier replay` (online: 2q, lru, lfu, static)"
                .into(),
        ),
        Ok(k) => Ok(k),
        Err(e) => Err(e.to_string()),
    }
}

/// Arguments of `aubier run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Model and prompt.
    #[command(flatten)]
    pub input: PromptArgs,
    /// Tokens to generate; 0 runs the prompt only.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Drop tokens below min-p × the top probability (after temperature); 0 = off.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// OpenAI's presence penalty, subtracted once from each generated token's logit (the
    /// server takes [-2, 2], as OpenAI).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty, subtracted per time a token was generated (the server
    /// takes [-2, 2]).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// The repetition penalty over the prompt and the generated tokens (llama.cpp's
    /// --repeat-penalty, vLLM's repetition_penalty); 1 = off.
    #[arg(long, alias = "repeat-penalty", default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep generating past EOS.
    #[arg(long)]
    pub ignore_eos: bool,
    /// KV cache capacity in tokens (default: min(context_length, 4096)).
    #[arg(long)]
    pub kv_max: Option<usize>,
    /// Write the logits of every prompt position as little-endian f32, row-major [n_prompt × n_vocab].
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// The split expert store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The backend.
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Runs `aubier run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let backend = args.backend.kind()?;
    let Loaded {
        model,
        tokenizer,
        prompt,
    } = args.input.load(backend)?;
    let opts = match args.kv_max {
        Some(kv_max) => SessionOptions { kv_max },
        None => SessionOptions::for_config(&model.config),
    };
    let store = args.store.options(backend)?;
    let mut session = Session::open_with_store(model.clone(), opts, &store)?;
    session.set_ubatch(args.backend.ubatch);
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            min_p: args.min_p,
            presence_penalty: args.presence_penalty,
            frequency_penalty: args.frequency_penalty,
            repetition_penalty: args.repetition_penalty,
            seed: args.seed,
        },
        ignore_eos: args.ignore_eos,
        eos_ids: tokenizer
            .as_ref()
            .map(|t| vec![t.eos_id()])
            .unwrap_or_default(),
        keep_prompt_logits: args.logits_out.is_some(),
        logprobs: None,
    };
    let stream_text = !args.json && tokenizer.is_some();
    let mut decoder = tokenizer.as_ref().map(|t| t.stream_decoder());
    let mut stdout = std::io::stdout();
    let out = generate(&mut session, &prompt, &params, None, &mut |token| {
        if stream_text {
            if let Some(d) = decoder.as_mut() {
                let _ = write!(stdout, "{}", d.push(token.id));
                let _ = stdout.flush();
            }
        }
        ControlFlow::Continue(())
    })?;
    if let (Some(path), Some(logits)) = (&args.logits_out, &out.prompt_logits) {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    let text = tokenizer.as_ref().map(|t| t.decode(&out.ids));
    let report = session.store_report();
    if args.json {
        let v = serde_json::json!({
            "prompt_ids": prompt,
            "generated_ids": out.ids,
            "text": text,
            "finish_reason": finish_name(out.finish),
            "prefill_tok_s": out.prefill_tok_s,
            "decode_tok_s": out.decode_tok_s,
            "store": report,
        });
        outln!("{v}");
    } else {
        if let Some(d) = decoder.as_mut() {
            out!("{}", d.finish());
        }
        if tokenizer.is_none() {
            outln!("{:?}", out.ids);
        } else {
            outln!();
        }
        eprintln!(
            "prefill {:.1} tok/s, decode {:.1} tok/s, finish {}",
            out.prefill_tok_s,
            out.decode_tok_s,
            finish_name(out.finish)
        );
        eprintln!(
            "experts: served fraction {:.4} ({} of {} routed from the fast store, n_res {}, {} \
             promotions, reset {:.3} ms)",
            report.served_fraction,
            report.fast_hits,
            report.routed,
            report.n_res,
            report.promotions,
            report.reset_ms
        );
    }
    Ok(())
}

/// `tokenizer.ggml.add_bos_token`; a file without the key gets BOS, as llama.cpp does for the
/// `tekken` pre-tokenizer (`src/llama-vocab.cpp`).
fn add_bos(model: &Model) -> bool {
    match model
        .file
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_bool())
    {
        Some(b) => b,
        None => {
            tracing::info!(
                "tokenizer.ggml.add_bos_token absent: adding BOS as llama.cpp does for tekken"
            );
            true
        }
    }
}

fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "cancelled",
    }
}
