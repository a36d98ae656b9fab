//! `aubier run`: one prompt through the model on a backend (`--backend`), from the command line.
//! It drives the same `Session` and decode loop (`aubier_runtime::generate`) as the server.

use anyhow::{bail, Context};
use aubier_compiler::Target;
use aubier_runtime::backend::registry::{self, BackendSpec};
use aubier_runtime::engine::Model;
use aubier_runtime::generate::{generate, FinishReason, GenerateParams};
use aubier_runtime::placement::hotset::HotSet;
use aubier_runtime::placement::policy::{Admission, PolicyKind, TwoQParams};
use aubier_runtime::sampler::SamplingParams;
use aubier_runtime::session::SessionOptions;
use aubier_runtime::store::expert_store::{PageAhead, ReadAheadMode, ResetMode, StoreOptions};
use aubier_runtime::store::FastBudget;
use aubier_runtime::text::tokenizer::Tokenizer;
use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};
use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The model and prompt of `aubier run` and `aubier trace`.
#[derive(Args, Debug)]
pub struct PromptArgs {
    /// GGUF file to run (default: $AUBIER_MODEL, else the bundled models/ms4-tiny256-q2k.gguf
    /// of the binary's workspace, else ./models).
    #[arg(long)]
    pub model: Option<PathBuf>,
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
    /// The file's tokenizer, if it carries `tokenizer.ggml.*` ([`file_tokenizer`]).
    pub tokenizer: Option<Tokenizer>,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// The read-ahead chosen for the model ([`StoreArgs::read_ahead`]).
    pub read_ahead: ReadAhead,
}

impl PromptArgs {
    /// Loads the model ([`crate::model_file::resolve_model`]) for the backend `spec` names and
    /// resolves the prompt. With `store` (`None`: the backend's fast store, no read-ahead, no
    /// prediction): its fast-store budget, the read-ahead it chooses for the file
    /// ([`StoreArgs::read_ahead`], its note printed on stderr), and the plan's expert predictor
    /// when `predict` (`--predict-experts`) or the read-ahead asks for it
    /// ([`Model::load_predicting`]). Errors: no model file, the backend, the file, the binding,
    /// the load, the tokenizer, or no prompt.
    pub fn load(
        &self,
        spec: &BackendSpec,
        store: Option<&StoreArgs>,
        predict: bool,
    ) -> anyhow::Result<Loaded> {
        let path = crate::model_file::resolve_model(self.model.as_deref())?;
        let backend = spec.make()?;
        let (budget, read_ahead, prediction) = match store {
            Some(store) => {
                let ahead = store.read_ahead(&path, backend.target());
                let prediction = store.prediction(predict, &ahead);
                (store.budget(), ahead, prediction)
            }
            None => (FastBudget::Auto, ReadAhead::OFF, None),
        };
        if let Some(note) = &read_ahead.note {
            eprintln!("{note}");
        }
        let mut progress = crate::progress::Steps::load(&path);
        let model = Model::load_predicting(&path, backend, budget, prediction, &mut progress)
            .with_context(|| format!("loading {}", path.display()))?;
        progress.done("loaded");
        let tokenizer = file_tokenizer(&model.file).context("the file's tokenizer")?;
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
            read_ahead,
        })
    }
}

/// The tokenizer of a file that carries `tokenizer.ggml.*` keys, `None` for one that carries
/// none (a weights-only file, run with `--prompt-ids`). Errors: keys that do not make a
/// tokenizer (a BOS or EOS id outside the vocabulary, a missing merges list, …): such a file's
/// text and stop tokens cannot be trusted, as `serve` also refuses it.
pub fn file_tokenizer(
    file: &aubier_runtime::gguf::GgufFile,
) -> Result<Option<Tokenizer>, aubier_runtime::text::tokenizer::TokenizerError> {
    if !file
        .metadata()
        .iter()
        .any(|(k, _)| k.starts_with("tokenizer.ggml."))
    {
        return Ok(None);
    }
    Tokenizer::from_gguf(file).map(Some)
}

/// `--backend NAME` among the backend registry's (`aubier_runtime::backend::registry`) and
/// every option a registered backend parses (`--device`, `--cpu-numerics`, …), each refused
/// with any other backend ([`BackendSpec::make`]); shared by every command that takes a backend
/// (`#[command(flatten)]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendChoice {
    /// `--backend`: `auto` or a registered backend's name; `None` is `auto`.
    pub backend: Option<String>,
    /// The registered backends' options given, `(name, value)`.
    pub options: Vec<(String, String)>,
}

impl BackendChoice {
    /// The backend these flags name.
    pub fn spec(&self) -> BackendSpec {
        BackendSpec {
            name: self.backend.clone().unwrap_or_else(|| "auto".into()),
            options: self.options.clone(),
        }
    }
}

/// The registered backends' options, each once (the first registration's help), in order.
fn backend_options() -> Vec<registry::BackendOption> {
    let mut out: Vec<registry::BackendOption> = Vec::new();
    for e in registry::entries() {
        for o in e.options {
            if !out.iter().any(|x| x.name == o.name) {
                out.push(*o);
            }
        }
    }
    out
}

impl Args for BackendChoice {
    fn augment_args(cmd: Command) -> Command {
        let entries = registry::entries();
        let names: Vec<&'static str> = std::iter::once("auto")
            .chain(entries.iter().map(|e| e.name))
            .collect();
        let about: Vec<String> = std::iter::once(
            "auto (default): vulkan on a hardware GPU when the machine has one, else cpu; a \
             software Vulkan device such as lavapipe only when vulkan is named"
                .to_string(),
        )
        .chain(entries.iter().map(|e| format!("{}: {}", e.name, e.about)))
        .collect();
        let mut cmd = cmd.arg(
            Arg::new("backend")
                .long("backend")
                .value_name("NAME")
                .value_parser(clap::builder::PossibleValuesParser::new(names))
                .help(format!("Backend. {}", about.join("; "))),
        );
        for o in backend_options() {
            let takers: Vec<&str> = entries
                .iter()
                .filter(|e| e.options.iter().any(|x| x.name == o.name))
                .map(|e| e.name)
                .collect();
            cmd = cmd.arg(
                Arg::new(o.name)
                    .long(o.name)
                    .value_name(o.value)
                    .help(format!("{} (--backend {})", o.help, takers.join(" / "))),
            );
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for BackendChoice {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let options = backend_options()
            .iter()
            .filter_map(|o| {
                m.get_one::<String>(o.name)
                    .map(|v| (o.name.to_string(), v.clone()))
            })
            .collect();
        Ok(BackendChoice {
            backend: m.get_one::<String>("backend").cloned(),
            options,
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

/// The backend, its options and the prompt pass size, shared by `aubier run`, `serve`, `bench`,
/// `trace` and the configurations of `aubier quality` (`#[command(flatten)]`);
/// [`BackendArgs::spec`] gathers them.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct BackendArgs {
    /// The backend and its options.
    #[command(flatten)]
    pub choice: BackendChoice,
    /// Deprecated alias: `oracle` = `--backend oracle`, `q8x2` / `q8` = `--backend cpu
    /// --cpu-numerics q8x2 / q8`.
    #[arg(long, value_name = "oracle|q8x2|q8", conflicts_with_all = ["backend", "cpu-numerics"])]
    pub cpu_kernels: Option<String>,
    /// Most prompt tokens per forward pass (llama.cpp's `--ubatch-size`): a longer prompt runs
    /// in equal passes of at most this many tokens, which bounds its activation memory; the
    /// logits do not change. 0 runs a prompt in one pass.
    #[arg(long, default_value_t = DEFAULT_UBATCH)]
    pub ubatch: usize,
}

/// The command line's prompt pass size: llama.cpp's default `n_ubatch`.
const DEFAULT_UBATCH: usize = 512;

impl Default for BackendArgs {
    /// The default backend and [`DEFAULT_UBATCH`], as the command line.
    fn default() -> Self {
        BackendArgs {
            choice: BackendChoice::default(),
            cpu_kernels: None,
            ubatch: DEFAULT_UBATCH,
        }
    }
}

impl BackendArgs {
    /// The backend these flags name (`auto` when none), printing a warning on stderr for the
    /// deprecated `--cpu-kernels`.
    ///
    /// Errors: an unknown `--cpu-kernels` value.
    pub fn spec(&self) -> anyhow::Result<BackendSpec> {
        let Some(old) = &self.cpu_kernels else {
            return Ok(self.choice.spec());
        };
        let spec = match old.as_str() {
            "oracle" => BackendSpec::named("oracle"),
            "q8x2" | "q8" => BackendSpec::named("cpu").with("cpu-numerics", old),
            _ => bail!("--cpu-kernels: unknown value `{old}` (expected oracle, q8x2 or q8)"),
        };
        let new: Vec<String> = std::iter::once(format!("--backend {}", spec.name))
            .chain(spec.options.iter().map(|(n, v)| format!("--{n} {v}")))
            .collect();
        eprintln!(
            "warning: --cpu-kernels is deprecated; use {}",
            new.join(" ")
        );
        Ok(BackendSpec {
            options: spec
                .options
                .into_iter()
                .chain(self.choice.options.clone())
                .collect(),
            ..spec
        })
    }
}

/// The split expert store's flags, shared by `aubier run`, `aubier serve` and `aubier bench`
/// (`#[command(flatten)]`): the budget the model is loaded with ([`StoreArgs::budget`]) and the
/// options of the session's store ([`StoreArgs::options`]).
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Fast-store slots per MoE layer, 0..=n_expert (default: the backend's — on the host every
    /// expert when they fit in half the available memory, else as many as fit there).
    #[arg(long, conflicts_with = "fast_budget")]
    pub n_res: Option<usize>,
    /// Fast-store budget in bytes over all layers (suffixes K, M, G = 1024¹²³); the slots per
    /// layer are derived from each expert's bytes.
    #[arg(long, value_parser = parse_bytes)]
    pub fast_budget: Option<u64>,
    /// File of the seed membership, JSON {"layers": [[e, …], …]} hottest first (default:
    /// experts 0..n_res).
    #[arg(long)]
    pub resident_set: Option<PathBuf>,
    /// Placement policy: 2q, lru, lfu, arc, lrfu, lecar, or static (the seed set, never
    /// rotated).
    #[arg(long, default_value = "2q", value_parser = parse_online_policy)]
    pub policy: PolicyKind,
    /// 2Q A1in size (Kin) as a fraction of the slots.
    #[arg(long, default_value_t = TwoQParams::DEFAULT_A1IN)]
    pub a1in: f64,
    /// 2Q A1out ghost-queue size (Kout) as a fraction of the slots (default: 2 on demand
    /// paging, 0.25 with a read-ahead).
    #[arg(long)]
    pub a1out: Option<f64>,
    /// Most 2Q promotions per token per layer (default: no cap).
    #[arg(long)]
    pub max_promotions: Option<usize>,
    /// 2Q admission: `ghost` (promote on a re-reference while in A1out), `remembered` (while
    /// in A1in or A1out) or `frequency[:W]` (as remembered, when more frequent than the victim;
    /// counts halved every W × experts accesses, W default 2). Default: `frequency:2` on demand
    /// paging, `frequency:32` with a read-ahead.
    #[arg(long)]
    pub admission: Option<Admission>,
    /// Between requests: `exact` restores the boot membership and policy state (timed), `none`
    /// keeps them.
    #[arg(long, default_value = "exact")]
    pub reset: ResetMode,
    /// Read-ahead: per one-token step, load up to this many of each MoE layer's predicted
    /// experts (its router applied before its attention; the plan gains the prediction) into
    /// the fast store before its experts run (0: demand paging only; host backends). Default:
    /// 2 on a host backend when the model file is larger than the memory available at boot
    /// (MemAvailable), else 0.
    #[arg(long)]
    pub prefetch_budget: Option<usize>,
    /// How the read-ahead copies run: `background` (the loaded model's copy thread, beside the
    /// step and past its end, never waited for) or `sync` (in the step, before its next kernel:
    /// counts that do not depend on timing).
    #[arg(long, default_value = "background")]
    pub read_ahead: ReadAheadMode,
    /// How many layers ahead the expert prediction runs: layer L's router applied to the
    /// residual before layer max(L − N + 1, 1)'s attention, so that N layers run between a
    /// layer's prediction and its experts (1: the residual at the end of layer L − 1; at most
    /// the model's layer count). Used with --prefetch-budget or --predict-experts.
    #[arg(long, default_value_t = 1, value_parser = parse_lead)]
    pub prefetch_lead: usize,
    /// What the read-ahead also reads from the file into the page cache (MADV_WILLNEED, the
    /// disk reading them in parallel): `off` nothing; `host` the predicted experts beyond the
    /// budget and the routed experts not resident; `all` also each read-ahead copy's expert
    /// when the copy is queued. Changes no count; host backends. Default: `all` when the
    /// read-ahead's default is on (a file larger than the memory), else `host`.
    #[arg(long)]
    pub page_ahead: Option<PageAhead>,
}

/// The read-ahead of a run: `--prefetch-budget` and `--page-ahead` as given, else chosen for the
/// model file and the backend ([`StoreArgs::read_ahead`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadAhead {
    /// Predicted experts loaded per layer per one-token step ([`StoreOptions::prefetch_budget`]).
    pub budget: usize,
    /// What is also read into the page cache ([`StoreOptions::page_ahead`]).
    pub page_ahead: PageAhead,
    /// Why the defaults turned the read-ahead on, for the log; `None` when they did not.
    pub note: Option<String>,
}

impl ReadAhead {
    /// Demand paging: no read-ahead, the page cache read ahead for the host store's experts
    /// ([`StoreOptions::default`]'s).
    pub const OFF: ReadAhead = ReadAhead {
        budget: 0,
        page_ahead: PageAhead::Host,
        note: None,
    };
}

/// The read-ahead's budget when the model file is larger than the memory: the setting measured
/// fastest there (docs/BENCHMARKS.md, "Larger than RAM", with `--page-ahead all`).
pub const LARGER_THAN_MEMORY_BUDGET: usize = 2;

/// The read-ahead for flags `budget` and `page_ahead` (`None`: not given), a model file of
/// `file` bytes, `available` bytes of memory (`None`: unknown, taken as enough) and a host
/// backend (`host`; the GPU store does not read ahead): where the file is larger than the
/// memory, a host backend reads ahead [`LARGER_THAN_MEMORY_BUDGET`] experts with
/// [`PageAhead::All`]; otherwise demand paging with [`PageAhead::Host`]. Flags always win.
fn choose_read_ahead(
    budget: Option<usize>,
    page_ahead: Option<PageAhead>,
    file: Option<u64>,
    available: Option<u64>,
    host: bool,
) -> ReadAhead {
    let larger = match (file, available) {
        (Some(f), Some(a)) => host && f > a,
        _ => false,
    };
    let chosen_budget = budget.unwrap_or(if larger { LARGER_THAN_MEMORY_BUDGET } else { 0 });
    let reads_ahead = larger && chosen_budget > 0;
    let chosen_page = page_ahead.unwrap_or(if reads_ahead {
        PageAhead::All
    } else {
        PageAhead::Host
    });
    let defaulted = budget.is_none() || page_ahead.is_none();
    let gb = |b: Option<u64>| b.unwrap_or(0) as f64 / 1e9;
    ReadAhead {
        budget: chosen_budget,
        page_ahead: chosen_page,
        note: (reads_ahead && defaulted).then(|| {
            format!(
                "the model file ({:.1} GB) is larger than the available memory ({:.1} GB): \
                 reading ahead with --prefetch-budget {chosen_budget} --page-ahead {chosen_page}",
                gb(file),
                gb(available)
            )
        }),
    }
}

impl StoreArgs {
    /// The fast store's size the model is loaded with (`--n-res`, `--fast-budget`, else the
    /// backend's default).
    pub fn budget(&self) -> FastBudget {
        match (self.n_res, self.fast_budget) {
            (Some(n), _) => FastBudget::Slots(n),
            (None, Some(b)) => FastBudget::Bytes(b),
            (None, None) => FastBudget::Auto,
        }
    }

    /// The read-ahead for the model file `model` on a backend of `target`
    /// ([`choose_read_ahead`], with the file's size and `MemAvailable` now).
    pub fn read_ahead(&self, model: &Path, target: Target) -> ReadAhead {
        choose_read_ahead(
            self.prefetch_budget,
            self.page_ahead,
            std::fs::metadata(model).map(|m| m.len()).ok(),
            aubier_runtime::store::available_memory(),
            target != Target::Gpu,
        )
    }

    /// The options of a session's store: every slot the model was loaded with, the policy, its
    /// knobs (2Q's `Kout` and admission, when not given, those of demand paging or of a
    /// read-ahead: [`TwoQParams::default_knobs`]), the seed, the reset and the read-ahead
    /// `ahead`. Errors: the resident-set file cannot be read or parsed.
    pub fn options(&self, ahead: &ReadAhead) -> anyhow::Result<StoreOptions> {
        let resident_set = match &self.resident_set {
            Some(path) => Some(
                HotSet::read(path)
                    .with_context(|| format!("reading --resident-set {}", path.display()))?,
            ),
            None => None,
        };
        let (a1out, admission) = TwoQParams::default_knobs(ahead.budget > 0);
        Ok(StoreOptions {
            budget: FastBudget::Auto,
            resident_set,
            policy: self.policy,
            a1in: self.a1in,
            a1out: self.a1out.unwrap_or(a1out),
            max_promotions: self.max_promotions,
            admission: self.admission.unwrap_or(admission),
            reset: self.reset,
            prefetch_budget: ahead.budget,
            read_ahead: self.read_ahead,
            page_ahead: ahead.page_ahead,
        })
    }

    /// The expert prediction the plan is compiled with ([`Model::load_predicting`]):
    /// `--prefetch-lead` when `predict` (`--predict-experts`) or the read-ahead `ahead` asks for
    /// it, else none.
    pub fn prediction(&self, predict: bool, ahead: &ReadAhead) -> Option<usize> {
        (predict || ahead.budget > 0).then_some(self.prefetch_lead)
    }
}

/// `--prefetch-lead`: a whole number of layers, at least 1 (the model's layer count bounds it
/// when the plan is compiled).
fn parse_lead(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("the lead is at least 1 layer (1: the layer before)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("`{s}`: {e}")),
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
            "`min` is an offline oracle; use it with `aubier replay` (online: 2q, lru, lfu, arc, lrfu, \
             lecar, static)"
                .into(),
        ),
        Ok(k) => Ok(k),
        Err(e) => Err(e.to_string()),
    }
}

/// `--logit-bias ID=BIAS`: a token id (u32) and a finite bias.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not ID=BIAS"))?;
    let id = id
        .parse::<u32>()
        .map_err(|e| format!("token id `{id}`: {e}"))?;
    match bias.parse::<f32>() {
        Ok(b) if b.is_finite() => Ok((id, b)),
        _ => Err(format!("bias `{bias}` is not a finite number")),
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
    /// `ID=BIAS`: add BIAS (a finite number) to token ID's logit before the penalties (OpenAI's
    /// logit_bias; -100 effectively bans, 100 forces); repeatable.
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias, allow_hyphen_values = true)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Keep generating past EOS.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Tokens generated before EOS or a --stop-token-id may end the run (vLLM's min_tokens:
    /// their logits are -inf until then).
    #[arg(long, default_value_t = 0)]
    pub min_tokens: usize,
    /// A token id that ends the run as EOS does (vLLM's stop_token_ids); repeatable.
    #[arg(long = "stop-token-id", value_name = "ID")]
    pub stop_token_ids: Vec<u32>,
    /// KV cache capacity in tokens (default: min(context_length, 4096)).
    #[arg(long)]
    pub kv_max: Option<usize>,
    /// Write the logits of every prompt position as little-endian f32, row-major [n_prompt × n_vocab].
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Predict every MoE layer L ≥ 1's experts with its router applied --prefetch-lead layers
    /// ahead (a plan step) and report the recall of the routed top-k (`prediction` in --json).
    #[arg(long)]
    pub predict_experts: bool,
    /// The split expert store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The backend.
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Runs `aubier run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let Loaded {
        model,
        tokenizer,
        prompt,
        read_ahead,
    } = args.input.load(
        &args.backend.spec()?,
        Some(&args.store),
        args.predict_experts,
    )?;
    if let Some(choice) = model.loaded().fast_store_choice() {
        eprintln!("{choice}");
    }
    if let Some((i, id)) = prompt
        .iter()
        .enumerate()
        .find(|&(_, &id)| id as usize >= model.config.n_vocab)
    {
        bail!(
            "--prompt-ids: id {id} (position {i}) is outside the model's vocabulary of {} tokens",
            model.config.n_vocab
        );
    }
    let biased = args.logit_bias.iter().map(|&(id, _)| ("--logit-bias", id));
    let stops = args
        .stop_token_ids
        .iter()
        .map(|&id| ("--stop-token-id", id));
    if let Some((flag, id)) = biased
        .chain(stops)
        .find(|&(_, id)| id as usize >= model.config.n_vocab)
    {
        bail!(
            "{flag}: id {id} is outside the model's vocabulary of {} tokens",
            model.config.n_vocab
        );
    }
    let opts = match args.kv_max {
        Some(kv_max) => SessionOptions { kv_max },
        None => SessionOptions::for_config(&model.config),
    };
    let store = args.store.options(&read_ahead)?;
    let mut session = crate::progress::open_session(model.clone(), opts, &store)?;
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
            logit_bias: args.logit_bias.clone(),
        },
        min_tokens: args.min_tokens,
        stop_token_ids: args.stop_token_ids.clone(),
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
    // The cache, not --max-tokens, ended the generation: say so (after the text) rather than
    // stop short in silence.
    let kv_note =
        (out.finish == FinishReason::Length && out.ids.len() < args.max_tokens).then(|| {
            format!(
                "aubier run: stopped after {} of --max-tokens {}: the KV cache holds {} tokens \
             (prompt {} + generated {}); --kv-max raises it up to the model's context_length {}",
                out.ids.len(),
                args.max_tokens,
                opts.kv_max,
                prompt.len(),
                out.ids.len(),
                model.config.n_ctx_train
            )
        });
    if let (Some(path), Some(logits)) = (&args.logits_out, &out.prompt_logits) {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    let text = tokenizer.as_ref().map(|t| t.decode(&out.ids));
    let report = session.store_report();
    let counters = session.counters();
    let staged = serde_json::json!({
        "experts": counters.staged_experts,
        "bytes": counters.staged_bytes,
    });
    if args.json {
        let v = serde_json::json!({
            "prompt_ids": prompt,
            "generated_ids": out.ids,
            "text": text,
            "finish_reason": finish_name(out.finish),
            "prefill_tok_s": out.prefill_tok_s,
            "decode_tok_s": out.decode_tok_s,
            "store": report,
            "staged": staged,
            "prediction": session.prediction_report(),
            "prediction_lead": args.store.prediction(args.predict_experts, &read_ahead),
        });
        outln!("{v}");
        if let Some(note) = &kv_note {
            eprintln!("{note}");
        }
    } else {
        if let Some(d) = decoder.as_mut() {
            out!("{}", d.finish());
        }
        if tokenizer.is_none() {
            outln!("{:?}", out.ids);
        } else {
            outln!();
        }
        if let Some(note) = &kv_note {
            eprintln!("{note}");
        }
        eprintln!(
            "prefill {:.1} tok/s, decode {:.1} tok/s, finish {}",
            out.prefill_tok_s,
            out.decode_tok_s,
            finish_name(out.finish)
        );
        eprintln!(
            "experts: served fraction {:.4} ({} of {} routed from the fast store, n_res {}, {} \
             promotions, reset {:.3} ms); host store read {:.1} MB per token",
            report.served_fraction,
            report.fast_hits,
            report.routed,
            report.n_res,
            report.promotions,
            report.reset_ms,
            report.host_bytes as f64 / 1e6 / (prompt.len() + out.ids.len()).max(1) as f64
        );
        if report.prefetches > 0 {
            eprintln!(
                "read-ahead: {} experts loaded ahead of their layer ({:.1} MB per token), {} \
                 routed slots served by them, {} late and {} in later steps while still copying \
                 (read from the host store)",
                report.prefetches,
                report.prefetch_bytes as f64 / 1e6 / out.ids.len().max(1) as f64,
                report.prefetch_served,
                report.prefetch_late,
                report.prefetch_pending
            );
        }
        if let Some(p) = session.prediction_report() {
            eprintln!(
                "expert prediction: recall {:.4} ({} of {} routed slots of layers 1.. predicted \
                 {} layer(s) ahead)",
                p.recall, p.hits, p.slots, args.store.prefetch_lead
            );
        }
        if counters.staged_experts > 0 {
            eprintln!(
                "staged host store: {} experts uploaded during the steps, {:.1} MB per token",
                counters.staged_experts,
                counters.staged_bytes as f64 / 1e6 / (prompt.len() + out.ids.len()).max(1) as f64
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    #[test]
    fn logit_bias_flags_are_id_equals_bias() {
        assert_eq!(parse_logit_bias("5=-100"), Ok((5, -100.0)));
        assert_eq!(parse_logit_bias("4294967295=0.5"), Ok((u32::MAX, 0.5)));
        for bad in ["5", "x=1", "-1=1", "5=inf", "5=NaN", "5=x", "4294967296=1"] {
            assert!(parse_logit_bias(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_file_larger_than_the_memory_reads_ahead_on_a_host_backend_only() {
        let big = choose_read_ahead(None, None, Some(43 * GB), Some(22 * GB), true);
        assert_eq!(
            (big.budget, big.page_ahead),
            (LARGER_THAN_MEMORY_BUDGET, PageAhead::All)
        );
        let note = big.note.expect("the choice is logged");
        assert!(
            note.contains("43.0 GB") && note.contains("22.0 GB"),
            "{note}"
        );
        for (file, available, host) in [
            (Some(5 * GB), Some(22 * GB), true),
            (Some(43 * GB), Some(22 * GB), false),
            (Some(43 * GB), None, true),
            (None, Some(22 * GB), true),
        ] {
            let r = choose_read_ahead(None, None, file, available, host);
            assert_eq!(r, ReadAhead::OFF, "{file:?} {available:?} host {host}");
        }
    }

    #[test]
    fn flags_win_over_the_choice() {
        let (file, available) = (Some(43 * GB), Some(22 * GB));
        let off = choose_read_ahead(Some(0), None, file, available, true);
        assert_eq!(off, ReadAhead::OFF);
        let r = choose_read_ahead(None, Some(PageAhead::Off), file, available, true);
        assert_eq!((r.budget, r.page_ahead), (2, PageAhead::Off));
        assert!(r.note.is_some());
        let r = choose_read_ahead(Some(3), Some(PageAhead::Host), file, available, true);
        assert_eq!(
            r,
            ReadAhead {
                budget: 3,
                page_ahead: PageAhead::Host,
                note: None
            }
        );
        let r = choose_read_ahead(Some(1), None, Some(5 * GB), available, true);
        assert_eq!((r.budget, r.page_ahead, r.note), (1, PageAhead::Host, None));
    }

    #[test]
    fn two_q_takes_the_knobs_of_its_mode_unless_given() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            store: StoreArgs,
        }
        let knobs = |flags: &[&str], budget: usize| {
            let cli = <Cli as clap::Parser>::try_parse_from(
                std::iter::once("aubier").chain(flags.iter().copied()),
            )
            .expect("flags");
            let ahead = ReadAhead {
                budget,
                ..ReadAhead::OFF
            };
            let o = cli.store.options(&ahead).expect("options");
            (o.a1out, o.admission)
        };
        let frequency = |window| Admission::Frequency { window };
        assert_eq!(knobs(&[], 0), (2.0, frequency(2)));
        assert_eq!(knobs(&[], 2), (0.25, frequency(32)));
        let given = ["--a1out", "0.5", "--admission", "ghost"];
        assert_eq!(knobs(&given, 0), (0.5, Admission::Ghost));
        assert_eq!(knobs(&given, 2), (0.5, Admission::Ghost));
    }
}
