//! `aubier bench`: prefill and decode speed of one model on this machine, through the same loading
//! path (`run::PromptArgs::load`) and the same decode loop (`aubier_runtime::generate`) as
//! `aubier run` and the server.
//!
//! Method.
//! 1. Prompt: the text of `--prompt-file` (default: the bundled English text,
//!    `server/data/alice.txt`) tokenized with the model's tokenizer (BOS first when the file says
//!    so), then its text tokens repeated, or cut, to exactly `--n-prompt` tokens.
//! 2. One session with a KV capacity of `n_prompt + n_gen`; `--reps` times: `generate` greedy,
//!    `ignore_eos`, `max_tokens = n_gen`. Per rep: prefill tok/s and decode tok/s as `generate`
//!    measures them (prompt tokens ÷ prefill wall time; decode steps ÷ decode wall time), and
//!    the time to first token (call to the first sampled id). Reported: median, min and max over
//!    reps.
//!    The session's expert store takes the `aubier run` store flags; the served fraction is that
//!    of the last rep (`Session::store_report`).
//! 3. Peak RSS: `getrusage(RUSAGE_SELF).ru_maxrss` after the last rep (KiB on Linux).
//! 4. Weight bytes read per decoded token, from the plan: each step's weight operands, counted in
//!    full, except `embed` (one row of `token_embd` per token) and the routed-expert tensors of
//!    `moe_ffn` (`*_exps`, counted `n_expert_used / n_expert` of their bytes: the expected share
//!    of the experts one token selects). Split into attention, router, routed experts, shared
//!    expert, output head and embedding.
//! 5. Time by component: the backend's time per plan step (`Session::counters`: host wall time,
//!    or GPU time from timestamp queries on a device; summed separately for prefill and decode
//!    steps over all reps), each step assigned to a component
//!    by its first weight (weightless steps to the component of the step before them); reported
//!    as ms per prefill and ms per decoded token. The prefill runs the output head for the last
//!    position only (`Session::step_last`), as llama.cpp does.
//! 6. The cost of constrained decoding (`--json-schema FILE`: a `response_format` json_schema;
//!    `--tools FILE`: an OpenAI `tools` array, `tool_choice: required`, parallel calls): after the
//!    reps above, as many pairs of reps: one with the grammar's [`Constraint`], greedy, ending at
//!    EOS (the grammar's end) or `--n-gen`, then one without, greedy, `ignore_eos`, as many
//!    tokens (pairs, so that the load of a shared machine weighs on both alike). Reported: the
//!    time to build the [`GrammarCompiler`] and to compile the grammar; every mask's compute time
//!    (`Constraint::mask_times`, median and p99); the time the loop waited for a mask after its
//!    step had ended (`GenerateOutput::mask_wait`, the part not hidden behind the step) per
//!    token; decode ms/token with and without the constraint (medians over the pairs) and the
//!    median of the pairs' ratios.

use crate::receipt::{read_peer, Measured, ReceiptFile};
use crate::run::{BackendArgs, Loaded, PromptArgs, StoreArgs};
use anyhow::{bail, Context};
use aubier_compiler::ops::Op;
use aubier_runtime::backend::KernelTime;
use aubier_runtime::engine::Model;
use aubier_runtime::generate::{completion_room, generate, GenerateParams};
use aubier_runtime::sampler::SamplingParams;
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::text::grammar::{
    Constraint, ContentFormat, GrammarCompiler, GrammarSpec, ToolChoice, ToolSpec, ToolsSpec,
};
use aubier_runtime::text::tokenizer::Tokenizer;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The default prompt text (`server/data/alice.txt`, see its README), in the binary so that
/// `aubier bench` does not depend on the source tree it was built from.
const BUNDLED_TEXT: &str = include_str!("../data/alice.txt");

/// Arguments of `aubier bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// GGUF file to measure (default: $AUBIER_MODEL, else the bundled
    /// models/ms4-tiny256-q2k.gguf of the binary's workspace, else ./models).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Text file whose tokens make the prompt (default: the bundled English text,
    /// `server/data/alice.txt`, compiled into the binary).
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens to generate per rep, at least 2 (decode tok/s counts the steps after the first
    /// sampled token, which closes the prefill).
    #[arg(long, default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Print one JSON object instead of text (and no progress bar).
    #[arg(long)]
    pub json: bool,
    /// Also write a receipt of the measurement to this file (`--json`'s object as its figures,
    /// with the command, commit, host and time; `src/receipt.rs`), for docs/bench/.
    #[arg(long)]
    pub receipt: Option<PathBuf>,
    /// The peer engine's figures for the receipt: the JSON object `docs/llamacpp_bench.py`
    /// printed for the same model and shape.
    #[arg(long, requires = "receipt")]
    pub peer: Option<PathBuf>,
    /// Also measure constrained decoding to JSON valid against this JSON schema file (method
    /// step 6).
    #[arg(long, conflicts_with = "tools")]
    pub json_schema: Option<PathBuf>,
    /// Also measure constrained decoding to calls of these tools (a JSON file holding an OpenAI
    /// `tools` array; `tool_choice: required`, parallel calls; method step 6).
    #[arg(long)]
    pub tools: Option<PathBuf>,
    /// Run the expert predictor, as `aubier run --predict-experts` (its steps are timed with the
    /// rest) and report its recall.
    #[arg(long)]
    pub predict_experts: bool,
    /// The split expert store, as for `aubier run`.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The backend, as for `aubier run`.
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// What the store's read-ahead did in the last rep (`--prefetch-budget`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ReadAhead {
    /// Experts loaded into the fast store ahead of their layer.
    pub loads: u64,
    /// Bytes of those loads per decoded token.
    pub bytes_per_token: f64,
    /// Routed slots a load served.
    pub served: u64,
    /// Routed slots whose load was not done when their kernel read the layer.
    pub late: u64,
    /// Routed slots, in a later step than the load's, whose load was still not done when their
    /// kernel read the layer (`StoreReport::prefetch_pending`).
    pub pending: u64,
}

/// Median, minimum and maximum of one measure over the reps.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    /// Median (the mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `v`; all zeros when `v` is empty.
    pub fn of(v: &[f64]) -> Spread {
        if v.is_empty() {
            return Spread {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Spread {
            median,
            min: s[0],
            max: s[n - 1],
        }
    }
}

/// The parts of the model a figure is split into (method steps 4 and 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Component {
    Attention,
    Router,
    Experts,
    SharedExpert,
    OutputHead,
    Embedding,
}

impl Component {
    /// The component a weight of `op` named `name` belongs to.
    fn of_weight(op: Op, name: &str) -> Component {
        if op == Op::Embed {
            Component::Embedding
        } else if name.contains("_exps") {
            Component::Experts
        } else if name.contains("_shexp") {
            Component::SharedExpert
        } else if name.contains("ffn_gate_inp") || name.contains("ffn_norm") {
            Component::Router
        } else if name.starts_with("output") {
            Component::OutputHead
        } else {
            Component::Attention
        }
    }
}

/// One figure per component, and their sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ByComponent {
    /// MLA attention: `attn_*` tensors (q_a, q_b, kv_a_mqa, k_b, v_b, output) and their norms;
    /// for time also RoPE, the latent-cache write, scores, mask, softmax and the weighted sum.
    pub attention: f64,
    /// Router (`ffn_gate_inp`) and the FFN norm; for time also the router's softmax, top-k and
    /// renormalisation.
    pub router: f64,
    /// Routed experts: `*_exps` (bytes: × n_expert_used / n_expert).
    pub experts: f64,
    /// Shared expert (`*_shexp`); for time also its SiLU/product and the residual adds after it.
    pub shared_expert: f64,
    /// Output head (`output`, `output_norm`).
    pub output_head: f64,
    /// `token_embd` (bytes: one row).
    pub embedding: f64,
    /// The sum.
    pub total: f64,
}

impl ByComponent {
    fn add(&mut self, c: Component, x: f64) {
        *match c {
            Component::Attention => &mut self.attention,
            Component::Router => &mut self.router,
            Component::Experts => &mut self.experts,
            Component::SharedExpert => &mut self.shared_expert,
            Component::OutputHead => &mut self.output_head,
            Component::Embedding => &mut self.embedding,
        } += x;
        self.total += x;
    }

    fn scaled(mut self, f: f64) -> ByComponent {
        for x in [
            &mut self.attention,
            &mut self.router,
            &mut self.experts,
            &mut self.shared_expert,
            &mut self.output_head,
            &mut self.embedding,
            &mut self.total,
        ] {
            *x *= f;
        }
        self
    }
}

/// Weight bytes per decoded token of `model`'s plan (method step 4).
pub fn bytes_per_token(model: &Model) -> ByComponent {
    let mut b = ByComponent::default();
    let mut seen = vec![false; model.plan.weights.len()];
    for step in &model.plan.steps {
        for w in step.weights() {
            if std::mem::replace(&mut seen[w], true) {
                continue;
            }
            if let Some((c, bytes)) = weight_bytes(model, step.op, w) {
                b.add(c, bytes);
            }
        }
    }
    b
}

/// The bytes of plan weight `w` that one decoded token reads through a step of `op`, with its
/// component: one row of the embedding, the routed share (`n_expert_used / n_expert`) of
/// stacked experts, else the whole tensor. `None` for a weight the file lacks.
fn weight_bytes(model: &Model, op: Op, w: usize) -> Option<(Component, f64)> {
    let cfg = &model.config;
    let name = &model.plan.weights.get(w)?.name;
    let info = model.file.tensor(name)?;
    let c = Component::of_weight(op, name);
    let bytes = match c {
        Component::Embedding => info.row_bytes() as f64,
        Component::Experts => {
            info.n_bytes as f64 * cfg.n_expert_used as f64 / cfg.n_expert.max(1) as f64
        }
        _ => info.n_bytes as f64,
    };
    Some((c, bytes))
}

/// One kernel's share of a bench run ([`BenchReport::kernels`]), over every step that runs it.
#[derive(Clone, Debug, Serialize)]
pub struct KernelReport {
    /// The kernel (the host binding's kernel name, or the device pipeline's).
    pub name: String,
    /// Milliseconds per prefill.
    pub prefill_ms: f64,
    /// Milliseconds per decoded token.
    pub decode_ms_per_token: f64,
    /// Runs of it over the whole bench.
    pub launches: u64,
    /// Weight bytes its launches read per decoded token ([`weight_bytes`] of the weights bound
    /// to it, summed over its steps).
    pub decode_weight_bytes_per_token: f64,
    /// Its share per plan step, in plan order: what each step's launches took and the weights
    /// they read, so a tool can match the kernel's time to a tensor (scripts/vk-vs-llamacpp.sh
    /// matches it to llama.cpp's per-op times by the weight's role, type and shape).
    pub steps: Vec<KernelStepReport>,
}

/// One plan step's share of a kernel ([`KernelReport::steps`]).
#[derive(Clone, Debug, Serialize)]
pub struct KernelStepReport {
    /// The plan step's index.
    pub step: usize,
    /// The step's op (`mat_mul`, `moe_ffn`, `kqkv`, …).
    pub op: String,
    /// The weights bound to the kernel in this step, in binding order; a plan weight the file
    /// lacks is left out.
    pub weights: Vec<WeightShape>,
    /// Milliseconds per prefill.
    pub prefill_ms: f64,
    /// Milliseconds per decoded token.
    pub decode_ms_per_token: f64,
    /// Weight bytes these launches read per decoded token ([`weight_bytes`]; 0 when the step
    /// ran no decode launch of this kernel).
    pub decode_weight_bytes_per_token: f64,
}

/// A weight tensor as the GGUF file stores it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WeightShape {
    /// The tensor name (`blk.0.attn_q_a.weight`).
    pub name: String,
    /// Its ggml type as ggml prints it (`Q2_K`).
    pub ggml_type: String,
    /// Its dimensions in ggml order (`ne[0]`, the row length, first).
    pub ne: Vec<usize>,
}

impl KernelReport {
    /// Weight GB/s (10⁹ bytes per second) of its decode launches; `None` when it reads no
    /// weight or took no time.
    pub fn decode_gb_s(&self) -> Option<f64> {
        (self.decode_weight_bytes_per_token > 0.0 && self.decode_ms_per_token > 0.0)
            .then(|| self.decode_weight_bytes_per_token / (self.decode_ms_per_token * 1e6))
    }
}

/// Aggregates the backend's time per (step, kernel) by kernel, most decode time first:
/// `per_prefill` and `per_token` turn seconds into milliseconds per prefill and per decoded token.
fn kernel_reports(
    model: &Model,
    times: &[KernelTime],
    per_prefill: f64,
    per_token: f64,
) -> Vec<KernelReport> {
    let mut kernels: Vec<KernelReport> = Vec::new();
    for k in times {
        let op = model.plan.steps[k.step].op;
        let bytes: f64 = k
            .weights
            .iter()
            .filter_map(|&w| weight_bytes(model, op, w))
            .fold(0.0, |sum, (_, b)| sum + b);
        let decode_bytes = if k.decode_s > 0.0 { bytes } else { 0.0 };
        let (p, d) = (k.prefill_s * per_prefill, k.decode_s * per_token);
        let step = KernelStepReport {
            step: k.step,
            op: op.name().to_owned(),
            weights: k
                .weights
                .iter()
                .filter_map(|&w| weight_shape(model, w))
                .collect(),
            prefill_ms: p,
            decode_ms_per_token: d,
            decode_weight_bytes_per_token: decode_bytes,
        };
        match kernels.iter_mut().find(|e| e.name == k.kernel) {
            Some(e) => {
                e.prefill_ms += p;
                e.decode_ms_per_token += d;
                e.launches += k.launches;
                e.decode_weight_bytes_per_token += decode_bytes;
                e.steps.push(step);
            }
            None => kernels.push(KernelReport {
                name: k.kernel.clone(),
                prefill_ms: p,
                decode_ms_per_token: d,
                launches: k.launches,
                decode_weight_bytes_per_token: decode_bytes,
                steps: vec![step],
            }),
        }
    }
    for k in &mut kernels {
        k.steps.sort_by_key(|s| s.step);
    }
    kernels.sort_by(|a, b| b.decode_ms_per_token.total_cmp(&a.decode_ms_per_token));
    kernels
}

/// Plan weight `w`'s name, type and dimensions from the file's tensor table; `None` for a weight
/// the file lacks.
fn weight_shape(model: &Model, w: usize) -> Option<WeightShape> {
    let info = model.file.tensor(&model.plan.weights.get(w)?.name)?;
    Some(WeightShape {
        name: info.name.clone(),
        ggml_type: info.ggml_type.name().to_owned(),
        ne: info.ne.clone(),
    })
}

/// The component of each plan step (method step 5): that of its first weight operand; a step
/// without weights belongs to the component of the step before it (RoPE, scores and softmax
/// follow attention's projections; softmax / top-k follow the router's; SiLU and the product
/// follow the shared expert's gate and up).
fn step_components(model: &Model) -> Vec<Component> {
    let mut last = Component::Embedding;
    model
        .plan
        .steps
        .iter()
        .map(|step| {
            if let Some(w) = step.weights().next() {
                last = Component::of_weight(step.op, &model.plan.weights[w].name);
            }
            last
        })
        .collect()
}

/// Wall seconds by component: `(prefill, decode)` sums of `times` (per step).
/// Time per plan step: the kernel times of each step summed.
fn step_times(model: &Model, times: &[KernelTime]) -> Vec<StepTime> {
    let mut out = vec![StepTime::default(); model.plan.steps.len()];
    for k in times {
        if let Some(t) = out.get_mut(k.step) {
            t.prefill_s += k.prefill_s;
            t.decode_s += k.decode_s;
        }
    }
    out
}

/// Seconds in one plan step.
#[derive(Clone, Copy, Debug, Default)]
struct StepTime {
    prefill_s: f64,
    decode_s: f64,
}

fn time_by_component(model: &Model, times: &[StepTime]) -> (ByComponent, ByComponent) {
    let (mut p, mut d) = (ByComponent::default(), ByComponent::default());
    for (c, t) in step_components(model).into_iter().zip(times) {
        p.add(c, t.prefill_s);
        d.add(c, t.decode_s);
    }
    (p, d)
}

/// The `--json` report.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// The model path.
    pub model: String,
    /// Prompt tokens per rep.
    pub n_prompt: usize,
    /// Generated tokens per rep.
    pub n_gen: usize,
    /// Repetitions.
    pub reps: usize,
    /// Rayon worker threads.
    pub threads: usize,
    /// Prefill tok/s.
    pub prefill_tok_s: Spread,
    /// Decode tok/s.
    pub decode_tok_s: Spread,
    /// Time to first token, ms.
    pub ttft_ms: Spread,
    /// Peak resident set, bytes.
    pub peak_rss_bytes: u64,
    /// Weight bytes read per decoded token.
    pub weight_bytes_per_token: ByComponent,
    /// Milliseconds per prefill of `n_prompt` tokens by component (mean over the reps; the
    /// backend's time per plan step, `Session::counters`: host wall time, or GPU time from
    /// timestamps on a device).
    pub prefill_ms_by_component: ByComponent,
    /// Milliseconds per decoded token by component (mean over all decode steps of the reps).
    pub decode_ms_per_token_by_component: ByComponent,
    /// The backend (`cpu (q8x2)`, `oracle`, …).
    pub backend: String,
    /// The ISA tier of the cpu backend's kernels on this host (`amx`, `avx512-vnni`, `avx2`,
    /// `scalar`).
    pub isa: String,
    /// The twenty plan steps that took the most prefill time: op, first weight (or output value)
    /// name, ms per prefill.
    pub slowest_prefill_steps: Vec<(String, String, f64)>,
    /// The twenty plan steps that took the most decode time: op, first weight (or output value)
    /// name, ms per decoded token.
    pub slowest_decode_steps: Vec<(String, String, f64)>,
    /// Routed (token, layer, expert) slots of the last rep served from the fast expert store ÷
    /// all routed slots (`Session::store_report`).
    pub served_fraction: f64,
    /// Bytes of routed experts read from the host store per computed token of the last rep
    /// (over the bus on a GPU; `Session::store_report`).
    pub host_bytes_per_token: f64,
    /// With `--prefetch-budget`: the read-ahead's loads of the last rep
    /// (`StoreReport::prefetches`, `prefetch_served`, `prefetch_late`, `prefetch_pending`);
    /// absent without.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_ahead: Option<ReadAhead>,
    /// With `--predict-experts`: the predictor's recall of the routed experts over the last rep
    /// (`Session::prediction_report`); absent without.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction_recall: Option<f64>,
    /// With the predictor: how many layers ahead it ran (`--prefetch-lead`); absent without.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction_lead: Option<usize>,
    /// The device the backend runs on (`None` on the host).
    pub device: Option<String>,
    /// Time per kernel (host wall time, or GPU time from timestamp queries), most decode time
    /// first.
    pub kernels: Vec<KernelReport>,
    /// The cost of constrained decoding, with `--json-schema` or `--tools` (method step 6).
    pub grammar: Option<GrammarReport>,
}

/// What constrained decoding cost (method step 6).
#[derive(Debug, Serialize)]
pub struct GrammarReport {
    /// `json_schema FILE` or `tools FILE`.
    pub grammar: String,
    /// Building the [`GrammarCompiler`] over the vocabulary (once per server), ms.
    pub compiler_build_ms: f64,
    /// Compiling the grammar (once per request), ms, over the reps.
    pub compile_ms: Spread,
    /// Tokens generated under the constraint, all reps.
    pub tokens: usize,
    /// Masks computed, all reps (one per sampled token).
    pub masks: usize,
    /// Mask compute time, median over all masks, ms.
    pub mask_ms_median: f64,
    /// Mask compute time, 99th percentile, ms.
    pub mask_ms_p99: f64,
    /// Mask compute time, largest, ms.
    pub mask_ms_max: f64,
    /// Decode ms per token without a constraint (median over the pairs).
    pub step_ms: f64,
    /// Decode ms per token with the constraint (median over the pairs).
    pub constrained_step_ms: f64,
    /// Constrained ÷ unconstrained decode ms per token, median over the pairs.
    pub slowdown: f64,
    /// Waiting for the mask after the step had ended, ms per generated token (the part of the
    /// mask not hidden behind the step).
    pub exposed_ms_per_token: f64,
}

/// Runs `aubier bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.n_prompt == 0 || args.reps == 0 {
        bail!("--n-prompt and --reps must be at least 1");
    }
    if args.n_gen < 2 {
        bail!(
            "--n-gen must be at least 2: decode tok/s counts the steps after the first sampled \
             token, and --n-gen {} has none",
            args.n_gen
        );
    }
    let text = match &args.prompt_file {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        }
        None => BUNDLED_TEXT.to_owned(),
    };
    let spec = args.backend.spec()?;
    let path = crate::model_file::resolve_model(args.model.as_deref())?;
    let peer = args.peer.as_deref().map(read_peer).transpose()?;
    let receipt = args
        .receipt
        .as_deref()
        .map(ReceiptFile::create)
        .transpose()?;
    let grammar = grammar_spec(args.json_schema.as_deref(), args.tools.as_deref())?;
    let Loaded {
        model,
        prompt,
        tokenizer,
        read_ahead: ahead,
    } = PromptArgs {
        model: Some(path.clone()),
        prompt_ids: None,
        prompt: Some(text),
    }
    .load(&spec, Some(&args.store), args.predict_experts)?;
    let kv_max = check_context(args.n_prompt, args.n_gen, model.config.n_ctx_train)?;
    let prompt = fit_prompt(
        &prompt,
        args.n_prompt,
        model
            .file
            .get("tokenizer.ggml.add_bos_token")
            .and_then(|v| v.as_bool())
            .unwrap_or(true),
    )?;
    let store = args.store.options(&ahead)?;
    let mut session =
        crate::progress::open_session(model.clone(), SessionOptions { kv_max }, &store)?;
    session.set_ubatch(args.backend.ubatch);
    let params = GenerateParams {
        max_tokens: args.n_gen,
        sampling: SamplingParams::default(),
        min_tokens: 0,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
        eos_ids: Vec::new(),
        keep_prompt_logits: false,
        logprobs: None,
    };
    let bar = (!args.json && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new((args.reps * (args.n_gen + 1)) as u64);
        b.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} tokens {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_prefix("bench");
        b
    });
    let (mut prefill, mut decode, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
    session.profile(true)?;
    let mut decode_steps = 0usize;
    for rep in 0..args.reps {
        if let Some(b) = &bar {
            b.set_message(format!("rep {}/{}", rep + 1, args.reps));
        }
        let start = Instant::now();
        let mut first: Option<f64> = None;
        let out = generate(&mut session, &prompt, &params, None, &mut |_| {
            first.get_or_insert_with(|| start.elapsed().as_secs_f64() * 1e3);
            if let Some(b) = &bar {
                b.inc(1);
            }
            ControlFlow::Continue(())
        })?;
        decode_steps += out.ids.len().saturating_sub(1);
        prefill.push(out.prefill_tok_s);
        decode.push(out.decode_tok_s);
        ttft.push(first.unwrap_or(f64::NAN));
        if let Some(b) = &bar {
            b.inc(1);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let counters = session.counters();
    let times = step_times(&model, &counters.times);
    let (prefill_t, decode_t) = time_by_component(&model, &times);
    let per_token = 1e3 / decode_steps.max(1) as f64;
    let per_prefill = 1e3 / args.reps as f64;
    let slowest = |ms: &dyn Fn(&StepTime) -> f64| {
        let mut v: Vec<(String, String, f64)> = model
            .plan
            .steps
            .iter()
            .zip(&times)
            .map(|(step, t)| {
                let name = step
                    .weights()
                    .next()
                    .map(|w| model.plan.weights[w].name.clone())
                    .unwrap_or_else(|| model.plan.values[step.out].name.clone());
                (step.op.name().to_owned(), name, ms(t))
            })
            .collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v.truncate(20);
        v
    };
    let kernels = kernel_reports(&model, &counters.times, per_prefill, per_token);
    let mut report = BenchReport {
        grammar: None,
        device: model.device(),
        kernels,
        model: path.display().to_string(),
        n_prompt: prompt.len(),
        n_gen: args.n_gen,
        reps: args.reps,
        threads: rayon::current_num_threads(),
        prefill_tok_s: Spread::of(&prefill),
        decode_tok_s: Spread::of(&decode),
        ttft_ms: Spread::of(&ttft),
        peak_rss_bytes: peak_rss_bytes(),
        weight_bytes_per_token: bytes_per_token(&model),
        prefill_ms_by_component: prefill_t.scaled(per_prefill),
        decode_ms_per_token_by_component: decode_t.scaled(per_token),
        slowest_prefill_steps: slowest(&|t| t.prefill_s * per_prefill),
        slowest_decode_steps: slowest(&|t| t.decode_s * per_token),
        backend: model.backend_name().to_string(),
        isa: aubier_runtime::backend::cpu::isa().to_string(),
        served_fraction: session.store_report().served_fraction,
        host_bytes_per_token: session.store_report().host_bytes as f64
            / (prompt.len() + args.n_gen - 1) as f64,
        read_ahead: (ahead.budget > 0).then(|| {
            let r = session.store_report();
            ReadAhead {
                loads: r.prefetches,
                bytes_per_token: r.prefetch_bytes as f64 / args.n_gen.max(1) as f64,
                served: r.prefetch_served,
                late: r.prefetch_late,
                pending: r.prefetch_pending,
            }
        }),
        prediction_recall: session.prediction_report().map(|p| p.recall),
        prediction_lead: args.store.prediction(args.predict_experts, &ahead),
    };
    if let Some((name, spec)) = grammar {
        let tokenizer = tokenizer.context("the model file has no tokenizer for the grammar")?;
        let run = GrammarRun {
            session: &mut session,
            prompt: &prompt,
            tokenizer: &tokenizer,
            n_gen: args.n_gen,
            reps: args.reps,
        };
        report.grammar = Some(run.measure(name, &spec)?);
    }
    if args.json {
        outln!("{}", serde_json::to_string(&report)?);
    } else {
        print_text(&report)?;
    }
    if let Some(file) = receipt {
        file.write(&Measured {
            kind: "bench",
            backend: Some(report.backend.clone()),
            device: report.device.clone(),
            model: Some(report.model.clone()),
            peer,
            figures: serde_json::to_value(&report)?,
        })?;
    }
    Ok(())
}

/// The grammar of `--json-schema` / `--tools`, with its name for the report.
fn grammar_spec(
    json_schema: Option<&Path>,
    tools: Option<&Path>,
) -> anyhow::Result<Option<(String, GrammarSpec)>> {
    let read = |path: &Path| -> anyhow::Result<serde_json::Value> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    };
    if let Some(path) = json_schema {
        let spec = GrammarSpec {
            reasoning: false,
            content: ContentFormat::JsonSchema(read(path)?),
            tools: None,
        };
        return Ok(Some((format!("json_schema {}", path.display()), spec)));
    }
    let Some(path) = tools else {
        return Ok(None);
    };
    let list = read(path)?;
    let tools = list
        .as_array()
        .with_context(|| format!("{}: not a JSON array of tools", path.display()))?
        .iter()
        .map(|t| {
            let f = &t["function"];
            Ok(ToolSpec {
                name: f["name"]
                    .as_str()
                    .with_context(|| format!("{}: a tool without function.name", path.display()))?
                    .to_owned(),
                parameters: f.get("parameters").cloned(),
                strict: f["strict"].as_bool().unwrap_or(false),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let spec = GrammarSpec {
        reasoning: false,
        content: ContentFormat::Text,
        tools: Some(ToolsSpec {
            tools,
            choice: ToolChoice::Required,
            parallel: true,
        }),
    };
    Ok(Some((format!("tools {}", path.display()), spec)))
}

/// The constrained reps of method step 6.
struct GrammarRun<'a> {
    session: &'a mut Session,
    prompt: &'a [u32],
    tokenizer: &'a Tokenizer,
    n_gen: usize,
    reps: usize,
}

impl GrammarRun<'_> {
    /// Runs the pairs of reps under `spec` (method step 6).
    fn measure(self, name: String, spec: &GrammarSpec) -> anyhow::Result<GrammarReport> {
        let t = Instant::now();
        let compiler = GrammarCompiler::new(self.tokenizer)?;
        let compiler_build_ms = ms(t.elapsed());
        let params = GenerateParams {
            max_tokens: self.n_gen,
            sampling: SamplingParams::default(),
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            eos_ids: vec![self.tokenizer.eos_id()],
            keep_prompt_logits: false,
            logprobs: None,
        };
        let (mut compile, mut masks) = (Vec::new(), Vec::new());
        let (mut with, mut without, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        let (mut tokens, mut wait) = (0, Duration::ZERO);
        let per_token = |tok_s: f64| if tok_s > 0.0 { 1e3 / tok_s } else { 0.0 };
        for _ in 0..self.reps {
            let t = Instant::now();
            let mut c: Constraint = compiler.compile(spec)?;
            compile.push(ms(t.elapsed()));
            let out = generate(
                self.session,
                self.prompt,
                &params,
                Some(&mut c),
                &mut |_| ControlFlow::Continue(()),
            )?;
            tokens += out.ids.len();
            wait += out.mask_wait;
            masks.extend(c.mask_times().iter().map(|d| ms(*d)));
            let free = GenerateParams {
                max_tokens: out.ids.len().max(2),
                ignore_eos: true,
                ..params.clone()
            };
            let base = generate(self.session, self.prompt, &free, None, &mut |_| {
                ControlFlow::Continue(())
            })?;
            let (a, b) = (per_token(out.decode_tok_s), per_token(base.decode_tok_s));
            with.push(a);
            without.push(b);
            ratio.push(if b > 0.0 { a / b } else { 0.0 });
        }
        masks.sort_by(f64::total_cmp);
        let pct = |q: f64| {
            let i = ((q * masks.len() as f64).ceil() as usize).clamp(1, masks.len().max(1));
            masks.get(i - 1).copied().unwrap_or(0.0)
        };
        Ok(GrammarReport {
            grammar: name,
            compiler_build_ms,
            compile_ms: Spread::of(&compile),
            tokens,
            masks: masks.len(),
            mask_ms_median: Spread::of(&masks).median,
            mask_ms_p99: pct(0.99),
            mask_ms_max: masks.last().copied().unwrap_or(0.0),
            step_ms: Spread::of(&without).median,
            constrained_step_ms: Spread::of(&with).median,
            slowdown: Spread::of(&ratio).median,
            exposed_ms_per_token: ms(wait) / tokens.max(1) as f64,
        })
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `prompt` (BOS first when `bos`) with its text tokens repeated, or cut, to `n` tokens.
fn fit_prompt(prompt: &[u32], n: usize, bos: bool) -> anyhow::Result<Vec<u32>> {
    let (head, body) = if bos && !prompt.is_empty() {
        prompt.split_at(1)
    } else {
        (&prompt[..0], prompt)
    };
    if body.is_empty() {
        bail!("the prompt file has no tokens");
    }
    Ok(head
        .iter()
        .chain(body.iter().cycle())
        .take(n)
        .copied()
        .collect())
}

/// The KV capacity of a bench session, `n_prompt + n_gen` tokens, checked against the model's
/// `context_length` (`n_ctx`) by the rule `aubier run` and the server apply
/// ([`completion_room`]: the prompt and every generated token count), before the prompt is
/// built: a `--n-prompt` past the context had been fitted first (a capacity-overflow panic, or
/// gigabytes, for a large one).
///
/// Errors: `n_prompt + n_gen` tokens do not fit in `n_ctx`.
fn check_context(n_prompt: usize, n_gen: usize, n_ctx: usize) -> anyhow::Result<usize> {
    match completion_room(n_prompt, Some(n_gen), n_ctx) {
        Ok(room) if room == n_gen => Ok(n_prompt + n_gen),
        _ => bail!(
            "--n-prompt {n_prompt} + --n-gen {n_gen} exceed the model's context_length {n_ctx}: \
             the prompt and every generated token share it (as in `aubier run` and the server)"
        ),
    }
}

/// Peak resident set size of this process in bytes (`getrusage`; `ru_maxrss` is in KiB on Linux).
fn peak_rss_bytes() -> u64 {
    // SAFETY: getrusage writes a plain struct it is given; a zeroed rusage is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    u64::try_from(u.ru_maxrss).unwrap_or(0) * 1024
}

fn print_text(r: &BenchReport) -> anyhow::Result<()> {
    let s = |x: &Spread, unit: &str| {
        format!(
            "{:.2} {unit} (min {:.2}, max {:.2})",
            x.median, x.min, x.max
        )
    };
    outln!(
        "{}: {} prompt + {} generated tokens, {} reps, {} threads, backend {} ({} host)",
        r.model,
        r.n_prompt,
        r.n_gen,
        r.reps,
        r.threads,
        r.backend,
        r.isa
    );
    outln!("prefill  {}", s(&r.prefill_tok_s, "tok/s"));
    outln!("decode   {}", s(&r.decode_tok_s, "tok/s"));
    outln!("TTFT     {}", s(&r.ttft_ms, "ms"));
    outln!(
        "peak RSS {:.1} MiB",
        r.peak_rss_bytes as f64 / (1 << 20) as f64
    );
    let b = &r.weight_bytes_per_token;
    let mb = |x: f64| x / 1e6;
    outln!(
        "weights read per decoded token: {:.1} MB (attention {:.1}, router {:.2}, experts {:.1}, shared expert {:.1}, output head {:.1}, embedding {:.4})",
        mb(b.total),
        mb(b.attention),
        mb(b.router),
        mb(b.experts),
        mb(b.shared_expert),
        mb(b.output_head),
        mb(b.embedding)
    );
    print_times(r)?;
    outln!(
        "served fraction {:.4}, host store {:.1} MB per token (last rep)",
        r.served_fraction,
        r.host_bytes_per_token / 1e6
    );
    if let Some(a) = &r.read_ahead {
        outln!(
            "read-ahead {} loads ({:.1} MB per decoded token), {} routed slots served by them, {} \
             late, {} in later steps while still copying (last rep)",
            a.loads,
            a.bytes_per_token / 1e6,
            a.served,
            a.late,
            a.pending
        );
    }
    if let Some(recall) = r.prediction_recall {
        let lead = r.prediction_lead.unwrap_or(1);
        outln!("expert prediction recall {recall:.4} ({lead} layer(s) ahead, last rep)");
    }
    if let Some(g) = &r.grammar {
        outln!(
            "grammar {}: compiler {:.1} ms, compile {:.2} ms; {} tokens, {} masks: mask {:.3} ms median, {:.3} ms p99, {:.3} ms max; decode {:.2} ms/token unconstrained, {:.2} constrained (pairs' ratio {:.3}); mask wait {:.3} ms/token not hidden",
            g.grammar,
            g.compiler_build_ms,
            g.compile_ms.median,
            g.tokens,
            g.masks,
            g.mask_ms_median,
            g.mask_ms_p99,
            g.mask_ms_max,
            g.step_ms,
            g.constrained_step_ms,
            g.slowdown,
            g.exposed_ms_per_token
        );
    }
    if let Some(device) = &r.device {
        outln!("device {device}");
    }
    let kernels: Vec<String> = r
        .kernels
        .iter()
        .take(20)
        .map(|k| {
            let gb_s = k
                .decode_gb_s()
                .map_or(String::new(), |g| format!(", {g:.2} GB/s"));
            format!(
                "{} {:.2}/{:.3} ({}{gb_s})",
                k.name, k.prefill_ms, k.decode_ms_per_token, k.launches
            )
        })
        .collect();
    outln!(
        "time per kernel (ms/prefill / ms/token (launches, weight bytes read per decode second)): {}",
        kernels.join(", ")
    );
    Ok(())
}

/// Time per component and the slowest steps (the backend's time per plan step).
fn print_times(r: &BenchReport) -> anyhow::Result<()> {
    for (what, c) in [
        ("prefill ms", &r.prefill_ms_by_component),
        ("decode ms/token", &r.decode_ms_per_token_by_component),
    ] {
        outln!(
            "{what}: {:.1} (attention {:.1}, router {:.1}, experts {:.1}, shared expert {:.1}, output head {:.1}, embedding {:.2})",
            c.total, c.attention, c.router, c.experts, c.shared_expert, c.output_head, c.embedding
        );
    }
    for (what, list) in [
        ("prefill steps (ms/prefill)", &r.slowest_prefill_steps),
        ("decode steps (ms/token)", &r.slowest_decode_steps),
    ] {
        let steps: Vec<String> = list
            .iter()
            .map(|(op, name, ms)| format!("{op} {name} {ms:.2}"))
            .collect();
        outln!("slowest {what}: {}", steps.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_prompt_fitting() {
        assert_eq!(
            Spread::of(&[3.0, 1.0, 2.0]),
            Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0
            }
        );
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert_eq!(
            fit_prompt(&[1, 7, 8, 9], 8, true).unwrap(),
            [1, 7, 8, 9, 7, 8, 9, 7]
        );
        assert_eq!(fit_prompt(&[1, 7, 8, 9], 2, true).unwrap(), [1, 7]);
        assert_eq!(fit_prompt(&[7, 8], 3, false).unwrap(), [7, 8, 7]);
        assert!(fit_prompt(&[1], 3, true).is_err());
    }

    /// The context check is `completion_room`'s rule: the prompt and every generated token fit,
    /// with no overflow on a huge `--n-prompt` or `--n-gen`.
    #[test]
    fn the_context_check_counts_prompt_and_generated_tokens() {
        assert_eq!(check_context(4094, 2, 4096).unwrap(), 4096);
        for (n_prompt, n_gen) in [(4095, 2), (4097, 2), (usize::MAX, 2), (2, usize::MAX)] {
            assert!(
                check_context(n_prompt, n_gen, 4096).is_err(),
                "{n_prompt} {n_gen}"
            );
        }
    }

    /// The bundled grammar inputs of the benchmark parse and compile over the bundled model's
    /// tokenizer.
    #[test]
    fn bundled_grammar_inputs_compile() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let file =
            aubier_runtime::gguf::GgufFile::open(root.join("../models/ms4-tiny256-q2k.gguf"))
                .expect("bundled model");
        let compiler = GrammarCompiler::new(&Tokenizer::from_gguf(&file).expect("tokenizer"))
            .expect("compiler");
        let data = root.join("data/grammar");
        let schema = data.join("order.schema.json");
        let tools = data.join("tools.json");
        for (s, t) in [
            (Some(schema.as_path()), None),
            (None, Some(tools.as_path())),
        ] {
            let (name, spec) = grammar_spec(s, t).expect("read").expect("a grammar");
            compiler
                .compile(&spec)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let (_, spec) = grammar_spec(None, Some(&tools)).unwrap().unwrap();
        let names: Vec<String> = spec
            .tools
            .unwrap()
            .tools
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(
            names,
            ["get_weather", "search_web", "send_email", "create_event"]
        );
        assert!(grammar_spec(None, None).unwrap().is_none());
        assert!(grammar_spec(Some(&data.join("missing.json")), None).is_err());
    }
}
