//! `Session`: one conversation's state on a shared [`Model`] — the latent KV cache, the position,
//! the executor's buffers — and the only way to run the model (`open` / `step` / `reset`,
//! ARCHITECTURE.md § runtime). `aubier run` and the server drive it through the same decode loop
//! (`crate::generate`).
//!
//! A step of `T` tokens runs the plan at positions `position .. position + T` over
//! `S = position + T` cached keys and returns one row of logits per token. Positions restart at 0
//! after [`Session::reset`]; cache rows of earlier requests are zeroed, and a step never reads a
//! row it did not write in the current request chain (rows `0..S` were all written since the
//! reset, by this request or by the prefix it kept).
//!
//! Prompt cache ([`Session::set_prompt_cache`], off by default; the server turns it on): the
//! session remembers the ids of the chain, rows `0..position` (the previous request's prompt
//! and the tokens stepped after it), and [`Session::start_request`] keeps the rows of the
//! longest prefix a new prompt shares with them, as llama.cpp's server does with
//! `cache_prompt`; the rows past it are zeroed and positions go on from there. Only rows whose
//! bits a cold prefill of the new prompt would write again are kept, so the logits are those of
//! a cold run, bit for bit: at most `prompt.len() − 1` tokens (one is stepped for the logits);
//! on a binding whose one-token runs compute other bits than a run of several tokens
//! ([`crate::backend::Binding::one_token_runs_match_prefill`]: the `cpu` backend), only rows
//! written by runs of two or more tokens (prompt rows, not decoded ones), with at least two
//! tokens left to step, and nothing with a pass size of 1 to 3 tokens ([`Session::set_ubatch`]),
//! which can make lone-token runs of a prompt. On the `oracle` and `vulkan` backends decoded rows
//! are kept too (the generated tokens a multi-turn prompt repeats).
//!
//! The steps run on the backend the model was loaded for, through its [`Run`] (the latent cache
//! and buffers of this session, in host or device memory); the plan's logits and routed ids are
//! read back after each step.
//!
//! Every session owns a split expert store ([`ExpertStore`], `crate::store::expert_store`) over
//! the model's slot memory: the step's `moe_ffn` kernels read resident experts from their slots
//! and the others from the host store; after each step the routed ids of every layer go to the
//! store, which counts the served fraction and rotates its slots; [`Session::reset`] resets it
//! per its [`crate::store::expert_store::ResetMode`]. The logits never depend on where an expert
//! lives.
//! A request that keeps a cached prefix resets the store the same way; the prefix's routing,
//! kept with its rows, goes to the policies before the first step's own tokens
//! ([`ExpertStore::observe_after`]), so the placement follows a cold prefill's access sequence,
//! while the counters count the tokens that were computed.
//!
//! Expert prediction (a plan compiled with `predict_experts`: [`Model::load_predicting`]): the
//! plan's `predicted_ids.L` outputs (layer `L`'s router applied before its attention, or before
//! an earlier layer's with a lead above 1: `CompileOptions::prefetch_lead`) are read
//! back with the routed ids, and [`Session::prediction_report`] counts their recall of the
//! routed top-k over the computed tokens since the last reset. With a read-ahead budget
//! ([`StoreOptions::prefetch_budget`]) the host backends also hand each one-token step's
//! predictions to the store mid-step, which loads predicted experts ahead of their layer.

use crate::backend::{ExecError, Experts, Output, Run, RunCounters, StepInput};
use crate::engine::Model;
use crate::error::EngineError;
use crate::progress::{Count, Progress, Quiet};
use crate::store::expert_store::{ExpertStore, StoreOptions, StoreReport};
use aubier_compiler::config::Mistral4Config;
use aubier_compiler::plan::ValueId;
use std::sync::Arc;

/// Logits of one step: `[T × n_vocab]` f32, row-major, one row per input token.
pub type Logits = Vec<f32>;

/// Options of [`Session::open`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// KV capacity in tokens: prompt plus generated tokens of one request.
    pub kv_max: usize,
}

impl SessionOptions {
    /// The default for a model: `min(context_length, 4096)` tokens.
    pub fn for_config(cfg: &Mistral4Config) -> Self {
        Self {
            kv_max: cfg.n_ctx_train.min(4096),
        }
    }
}

/// A conversation on a [`Model`].
#[derive(Debug)]
pub struct Session {
    model: Arc<Model>,
    run: Box<dyn Run>,
    kv_max: usize,
    position: usize,
    steps: u64,
    /// Most tokens per executor run (0: no limit); see [`Session::set_ubatch`].
    ubatch: usize,
    logits: ValueId,
    /// `router_ids.{l}` output of each layer.
    router_outputs: Vec<ValueId>,
    router_ids: Vec<Vec<i32>>,
    /// `(L, predicted_ids.L)` outputs of the plan ([`aubier_compiler::plan::Plan::predicted_ids`]).
    predicted_outputs: Vec<(usize, ValueId)>,
    /// The last step's `(L, [T × n_expert_used])` predicted ids, one entry per output.
    predicted_ids: Vec<(usize, Vec<i32>)>,
    /// Predicted and routed slots since the last reset.
    prediction: PredictionReport,
    /// Per-token routing since the last [`Session::take_routing`], when recording.
    routing_log: Option<Vec<TokenRouting>>,
    store: ExpertStore,
    /// Whether [`Session::start_request`] keeps a shared prefix.
    prompt_cache: bool,
    /// Whether a one-token run computes the bits of a longer run
    /// ([`crate::backend::Binding::one_token_runs_match_prefill`]).
    one_token_is_prefill: bool,
    /// The ids at positions `0..position` (the request chain).
    chain: Vec<u32>,
    /// Per chain position: whether a one-token run wrote its row.
    one_token_rows: Vec<bool>,
    /// Per layer, the chain positions' routed ids (`[position × n_expert_used]`).
    chain_routing: Vec<Vec<i32>>,
    /// Whether the rows kept by the last [`Session::start_request`] still have to go to the
    /// store's policies (with the next step).
    prefix_unseen: bool,
}

/// Recall of the plan's expert predictions ([`Session::prediction_report`]) since the last
/// reset: over every predicted layer `L ≥ 1` and computed token, how many of its `k` routed
/// experts the prediction (layer `L`'s router applied to the residual before layer `L`'s
/// attention, or an earlier layer's with a lead above 1) named.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct PredictionReport {
    /// `hits ÷ slots`: the mean over (token, layer) of |predicted ∩ routed| ÷ k (0 when nothing
    /// was predicted).
    pub recall: f64,
    /// Routed (token, layer, expert) slots of the predicted layers whose expert was predicted.
    pub hits: u64,
    /// Routed (token, layer, expert) slots of the predicted layers (tokens × layers × k).
    pub slots: u64,
}

/// The routing of one token: its position and, per layer, the routed expert ids in descending
/// router probability (`[n_layer][n_expert_used]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRouting {
    /// Position of the token in its request (0-based).
    pub pos: usize,
    /// `[n_layer][n_expert_used]` expert ids.
    pub layers: Vec<Vec<u32>>,
}

impl Session {
    /// Opens a session with an empty latent cache of `opts.kv_max` tokens
    /// (`n_layer · kv_max · (kv_lora_rank + qk_rope_head_dim) · 4` bytes).
    ///
    /// Errors: [`EngineError::BadKvMax`] for 0, more than the model's `context_length`, or more
    /// than `i32::MAX`; [`EngineError::MissingOutput`] when the plan lacks `logits` or a
    /// `router_ids.{l}`; [`EngineError::KvCache`]; [`EngineError::Exec`] for a malformed plan.
    pub fn open(model: Arc<Model>, opts: SessionOptions) -> Result<Session, EngineError> {
        Session::open_with_store(model, opts, &StoreOptions::default())
    }

    /// [`Session::open`] with the expert store built from `store` (the default: every slot the
    /// model was loaded with, 2Q, exact reset).
    ///
    /// Errors: those of [`Session::open`], and [`EngineError::Store`] when the store cannot be
    /// built (more slots than the model has, a resident set that does not fit, `min`, bad 2Q
    /// fractions); [`EngineError::Backend`] when the backend cannot open a run.
    pub fn open_with_store(
        model: Arc<Model>,
        opts: SessionOptions,
        store: &StoreOptions,
    ) -> Result<Session, EngineError> {
        Session::open_observed(model, opts, store, &mut Quiet)
    }

    /// [`Session::open_with_store`], reporting its long steps to `progress`: the run's memory
    /// (the latent cache), then the writes of the store's seed experts into the fast store's
    /// slots, counted in bytes.
    ///
    /// Errors: those of [`Session::open_with_store`].
    pub fn open_observed(
        model: Arc<Model>,
        opts: SessionOptions,
        store: &StoreOptions,
        progress: &mut dyn Progress,
    ) -> Result<Session, EngineError> {
        let cfg = &model.config;
        let kv_max = opts.kv_max;
        let bad = |reason: String| EngineError::BadKvMax { kv_max, reason };
        if kv_max == 0 {
            return Err(bad("the KV cache needs at least one token".into()));
        }
        if kv_max > cfg.n_ctx_train {
            return Err(bad(format!(
                "the model's context_length is {}",
                cfg.n_ctx_train
            )));
        }
        if i32::try_from(kv_max).is_err() {
            return Err(bad("positions are i32".into()));
        }
        let output = |name: &str| {
            model
                .plan
                .outputs
                .iter()
                .find(|(n, _)| n == name)
                .map(|&(_, id)| id)
                .ok_or_else(|| EngineError::MissingOutput(name.to_string()))
        };
        let logits = output("logits")?;
        let router_outputs = (0..cfg.n_layer)
            .map(|l| output(&format!("router_ids.{l}")))
            .collect::<Result<Vec<_>, _>>()?;
        let predicted_outputs = model.plan.predicted_ids();
        if let Some(&(l, _)) = predicted_outputs.iter().find(|(l, _)| *l >= cfg.n_layer) {
            return Err(EngineError::MissingOutput(format!(
                "router_ids.{l} for the plan's predicted_ids.{l}"
            )));
        }
        progress.step("allocating the latent cache", Count::Time);
        let run = Arc::clone(model.loaded()).open(kv_max)?;
        let store =
            ExpertStore::new_observed(&model.plan, store, &mut model.slots().lock(), progress)?;
        Ok(Session {
            store,
            prompt_cache: false,
            one_token_is_prefill: model.binding().one_token_runs_match_prefill(),
            chain: Vec::new(),
            one_token_rows: Vec::new(),
            chain_routing: vec![Vec::new(); router_outputs.len()],
            prefix_unseen: false,
            run,
            kv_max,
            position: 0,
            steps: 0,
            ubatch: 0,
            logits,
            router_ids: vec![Vec::new(); router_outputs.len()],
            router_outputs,
            predicted_ids: Vec::new(),
            predicted_outputs,
            prediction: PredictionReport::default(),
            routing_log: None,
            model,
        })
    }

    /// Runs `tokens` at the current position and appends them to the cache; returns
    /// `[T × n_vocab]` logits (row `i` predicts the token after `tokens[i]`).
    ///
    /// Errors (the session is unchanged by the first three): [`EngineError::EmptyStep`];
    /// [`EngineError::TokenOutOfRange`] for an id ≥ n_vocab; [`EngineError::ContextFull`] when
    /// `position + T > kv_max`; [`EngineError::Exec`] when execution fails (e.g. the router
    /// selected no valid expert: NaN activations) — the position does not advance.
    pub fn step(&mut self, tokens: &[u32]) -> Result<Logits, EngineError> {
        self.run_chunks(tokens, false)
    }

    /// [`Session::step`] returning only the last token's row of logits (`[n_vocab]`): the output
    /// head, the final norm and the last layer's FFN run for that token only
    /// (`Plan::last_rows`; the cheaper call when the caller samples from it alone). The routing
    /// of every token is still computed (the store and the routing log read it), and the
    /// latent cache is written for every token. Its row is the last row of [`Session::step`]'s
    /// bit for bit where the binding's one-token runs compute a prefill's bits; the cpu
    /// backend's F32 products take another summation order at one token (`set_ubatch`), so on a
    /// model with F32 FFN or head weights the two may differ in the last bits.
    ///
    /// Errors: as [`Session::step`].
    pub fn step_last(&mut self, tokens: &[u32]) -> Result<Logits, EngineError> {
        self.run_chunks(tokens, true)
    }

    /// Runs later steps in executor runs of at most `n` tokens each (llama.cpp's `n_ubatch`;
    /// 0, the default, runs a step whole). A step of `T > n` tokens is split into
    /// `⌈T / n⌉` runs of equal size (±1), so that no run is a lone token when `n ≥ 4`. The
    /// activation buffers are sized for the largest run, so a long prompt's peak memory stays
    /// bounded. The logits are those of the whole step when every run has at least two tokens:
    /// every kernel computes a token's row independently of the others in its run, except that a
    /// one-token run takes the decode kernels of the f32 products (`attn_k_b`, the router: the
    /// oracle's dot instead of a GEMM, another f32 summation order). An execution error in a
    /// later run leaves the earlier runs' tokens in the cache (the position past them).
    pub fn set_ubatch(&mut self, n: usize) {
        self.ubatch = n;
    }

    /// [`Session::run_step`] over runs of at most `ubatch` tokens; the input is checked whole
    /// first (empty, ids, context), so those errors leave the session unchanged.
    fn run_chunks(&mut self, tokens: &[u32], last_only: bool) -> Result<Logits, EngineError> {
        if self.ubatch == 0 || tokens.len() <= self.ubatch {
            return self.run_step(tokens, last_only);
        }
        self.check_step(tokens)?;
        let runs = tokens.len().div_ceil(self.ubatch);
        let (base, extra) = (tokens.len() / runs, tokens.len() % runs);
        let mut logits = Vec::new();
        let mut at = 0;
        for i in 0..runs {
            let len = base + usize::from(i < extra);
            let rows = self.run_step(&tokens[at..at + len], last_only)?;
            if !last_only || i + 1 == runs {
                logits.extend_from_slice(&rows);
            }
            at += len;
        }
        Ok(logits)
    }

    /// Starts (`true`: the counters zeroed) or stops timing kernels ([`Run::profile`]: host
    /// backends time every step always, a device only while profiling).
    ///
    /// Errors: [`EngineError::Backend`] when the device cannot time launches.
    pub fn profile(&mut self, on: bool) -> Result<(), EngineError> {
        Ok(self.run.profile(on)?)
    }

    /// Kernel times and counters since the session opened or profiling started.
    pub fn counters(&self) -> RunCounters {
        self.run.counters()
    }

    /// The checks of [`Session::step`] before anything runs: the position after `tokens`.
    fn check_step(&self, tokens: &[u32]) -> Result<usize, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyStep);
        }
        let n_vocab = self.model.config.n_vocab;
        if let Some((index, &id)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= n_vocab)
        {
            return Err(EngineError::TokenOutOfRange { index, id, n_vocab });
        }
        let t = tokens.len();
        self.position
            .checked_add(t)
            .filter(|&e| e <= self.kv_max)
            .ok_or(EngineError::ContextFull {
                tokens: t,
                position: self.position,
                kv_max: self.kv_max,
            })
    }

    fn run_step(&mut self, tokens: &[u32], last_only: bool) -> Result<Logits, EngineError> {
        let end = self.check_step(tokens)?;
        let (t, n_vocab) = (tokens.len(), self.model.config.n_vocab);
        // Ids < n_vocab and positions ≤ kv_max ≤ i32::MAX (checked at open) fit i32.
        let ids: Vec<i32> = tokens.iter().map(|&id| id as i32).collect();
        let pos: Vec<i32> = (self.position..end).map(|p| p as i32).collect();
        let model = Arc::clone(&self.model);
        // The head, and the steps only it needs (`Plan::last_rows`), run for the last position
        // alone when the plan marks the logits as its output (`Plan::output_head`); else every
        // row is computed and the last one kept.
        let head = model.plan.output_head.map(|h| h.value);
        let keep = head.filter(|&v| last_only && v == self.logits);
        let inputs: [(&str, &[i32]); 2] = [("tokens", &ids), ("pos", &pos)];
        let mut wanted = vec![self.logits];
        wanted.extend(&self.router_outputs);
        wanted.extend(self.predicted_outputs.iter().map(|&(_, v)| v));
        let input = StepInput {
            inputs: &inputs,
            tokens: t,
            keys: end,
            outputs: &wanted,
            last_only: keep,
        };
        let mut slots = model.slots().lock();
        self.store.claim(&mut slots)?;
        let experts = Experts {
            store: &self.store,
            slots: slots.memory(),
        };
        let mut out = self.run.step(&input, &experts)?.into_iter();
        let mut logits = match out.next() {
            Some(Output::F32(v)) => v,
            _ => return Err(EngineError::MissingOutput("logits (f32)".into())),
        };
        let i32s = |o: Option<Output>, what: &str| match o {
            Some(Output::I32(v)) => Ok(v),
            _ => Err(EngineError::MissingOutput(format!("{what} (i32)"))),
        };
        for dst in self.router_ids.iter_mut() {
            *dst = i32s(out.next(), "router_ids")?;
        }
        check_expert_ids(&self.router_ids, model.config.n_expert)?;
        self.predicted_ids.clear();
        for &(l, _) in &self.predicted_outputs {
            let ids = i32s(out.next(), "predicted_ids")?;
            let k = model.config.n_expert_used;
            self.prediction.hits += predicted_hits(&ids, &self.router_ids[l], k);
            self.prediction.slots += (t * k) as u64;
            self.predicted_ids.push((l, ids));
        }
        let rows = if keep.is_some() { 1 } else { t };
        if logits.len() != rows * n_vocab {
            return Err(EngineError::MissingOutput(format!(
                "logits of {rows} × {n_vocab} (the plan's has {} values)",
                logits.len()
            )));
        }
        if last_only && keep.is_none() {
            logits.drain(..(t - 1) * n_vocab);
        }
        let reused: &[Vec<i32>] = if self.prefix_unseen {
            &self.chain_routing
        } else {
            &[]
        };
        self.store
            .observe_after(reused, &self.router_ids, t, &mut slots)?;
        drop(slots);
        self.prefix_unseen = false;
        self.chain.extend_from_slice(tokens);
        self.one_token_rows.extend(std::iter::repeat_n(t == 1, t));
        for (dst, ids) in self.chain_routing.iter_mut().zip(&self.router_ids) {
            dst.extend_from_slice(ids);
        }
        if let Some(log) = &mut self.routing_log {
            let k = self.model.config.n_expert_used;
            for (i, pos) in (self.position..end).enumerate() {
                let layers = self
                    .router_ids
                    .iter()
                    .map(|ids| {
                        ids.get(i * k..(i + 1) * k)
                            .unwrap_or_default()
                            .iter()
                            .map(|&e| e as u32)
                            .collect()
                    })
                    .collect();
                log.push(TokenRouting { pos, layers });
            }
        }
        self.position = end;
        self.steps += 1;
        Ok(logits)
    }

    /// Tokens in the cache: the position the next step starts at.
    pub fn position(&self) -> usize {
        self.position
    }

    /// KV capacity in tokens.
    pub fn kv_max(&self) -> usize {
        self.kv_max
    }

    /// The model this session runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Starts a new request: position 0, latent cache rows zeroed, router trace cleared, the
    /// expert store's request counters zeroed and, with `--reset exact`, its membership and
    /// policies back to the boot state (the time it took is in [`Session::store_report`]).
    pub fn reset(&mut self) {
        self.restart(0);
    }

    /// Turns the prompt cache of [`Session::start_request`] on or off (off when the session
    /// opens).
    pub fn set_prompt_cache(&mut self, on: bool) {
        self.prompt_cache = on;
    }

    /// Starts a new request for `prompt`: [`Session::reset`], except that with the prompt cache
    /// on ([`Session::set_prompt_cache`]) the cache rows of the longest prefix `prompt` shares
    /// with the request chain (the ids at positions `0..position`: the previous prompt and the
    /// tokens stepped after it) are kept when a cold prefill of `prompt` would write the same
    /// bits into them (the module note: at most `prompt.len() − 1` tokens; on a binding whose
    /// one-token runs differ, only rows of longer runs and at least two tokens left). Returns
    /// `n`, the prefix kept: the position is `n`, the next step takes `prompt[n..]`, and its
    /// logits are those of a cold run of `prompt`, bit for bit. The store is reset as by
    /// [`Session::reset`]; the kept rows' routing goes to its policies with the next step.
    pub fn start_request(&mut self, prompt: &[u32]) -> usize {
        let keep = self.reusable(prompt);
        self.restart(keep);
        keep
    }

    /// The prefix of `prompt` [`Session::start_request`] keeps.
    fn reusable(&self, prompt: &[u32]) -> usize {
        let lone_runs = (1..4).contains(&self.ubatch);
        if !self.prompt_cache || (!self.one_token_is_prefill && lone_runs) {
            return 0;
        }
        let shared = self
            .chain
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = shared.min(prompt.len().saturating_sub(1));
        if self.one_token_is_prefill {
            return keep;
        }
        let batched = self
            .one_token_rows
            .iter()
            .position(|&one| one)
            .unwrap_or(keep);
        keep.min(batched).min(prompt.len().saturating_sub(2))
    }

    /// Keeps the first `keep` positions of the chain (cache rows, ids, routing) and drops the
    /// rest; resets the router trace and the store.
    fn restart(&mut self, keep: usize) {
        self.position = keep;
        if let Err(e) = self.run.truncate(keep) {
            tracing::error!("zeroing the latent cache: {e}");
        }
        for r in &mut self.router_ids {
            r.clear();
        }
        self.predicted_ids.clear();
        self.prediction = PredictionReport::default();
        let k = self.model.config.n_expert_used;
        self.chain.truncate(keep);
        self.one_token_rows.truncate(keep);
        for r in &mut self.chain_routing {
            r.truncate(keep * k);
        }
        self.prefix_unseen = keep > 0;
        if let Err(e) = self.store.reset(&mut self.model.slots().lock()) {
            tracing::error!("expert store reset: {e}");
        }
    }

    /// The expert store's counters since the last [`Session::reset`] (the current request).
    pub fn store_report(&self) -> StoreReport {
        self.store.report()
    }

    /// The recall of the plan's expert predictions over the tokens computed since the last
    /// [`Session::reset`] (the current request); `None` when the plan has none (a model loaded
    /// without [`Model::load_predicting`]'s `predict_experts`).
    pub fn prediction_report(&self) -> Option<PredictionReport> {
        let p = self.prediction;
        (!self.predicted_outputs.is_empty()).then(|| PredictionReport {
            recall: if p.slots == 0 {
                0.0
            } else {
                p.hits as f64 / p.slots as f64
            },
            ..p
        })
    }

    /// The last step's expert predictions: `(L, [T × n_expert_used])` per predicted layer
    /// `L ≥ 1`, in layer order, row-major, each token's ids in descending predicted probability
    /// (empty before the first step, after a reset, or without predictions).
    pub fn predicted_ids(&self) -> &[(usize, Vec<i32>)] {
        &self.predicted_ids
    }

    /// The session's expert store (for tests and reports).
    pub fn expert_store(&self) -> &ExpertStore {
        &self.store
    }

    /// Steps run successfully since the session opened (never reset; the server proves that a
    /// cancelled request stopped stepping with it).
    pub fn steps_taken(&self) -> u64 {
        self.steps
    }

    /// Starts (`true`) or stops recording every token's routing for [`Session::take_routing`].
    pub fn record_routing(&mut self, on: bool) {
        self.routing_log = on.then(Vec::new);
    }

    /// The routing recorded since recording started or since the last call, in step order (across
    /// resets); empty when not recording. Only computed tokens are recorded: the prefix a
    /// request keeps ([`Session::start_request`]) was recorded when it was computed.
    pub fn take_routing(&mut self) -> Vec<TokenRouting> {
        self.routing_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The last step's routed expert ids: `[n_layer][T × n_expert_used]`, row-major per layer,
    /// each token's ids in descending router probability (empty before the first step and after a
    /// reset).
    pub fn router_ids(&self) -> &[Vec<i32>] {
        &self.router_ids
    }

    /// Row `pos` of latent-cache layer `layer` (for traces and tests), read back from where
    /// the backend keeps it.
    ///
    /// Errors: [`EngineError::Backend`] outside the cache or when it cannot be read back.
    pub fn cache_row(&self, layer: usize, pos: usize) -> Result<Vec<f32>, EngineError> {
        Ok(self.run.cache_row(layer, pos)?)
    }
}

/// How many of the routed ids `routed` (`[T × k]`) the predictions `predicted` (`[T × k]`) name,
/// row by row: the sum over tokens of |predicted row ∩ routed row| (a top-k row has no repeats).
fn predicted_hits(predicted: &[i32], routed: &[i32], k: usize) -> u64 {
    predicted
        .chunks(k)
        .zip(routed.chunks(k))
        .map(|(p, r)| p.iter().filter(|e| r.contains(e)).count() as u64)
        .sum()
}

/// `Err` when a routed expert id is outside `0..n_expert` (a NaN router selects none: `−1`): the
/// host executor's index check refuses it before the experts run, a device's kernels do not.
fn check_expert_ids(router_ids: &[Vec<i32>], n_expert: usize) -> Result<(), EngineError> {
    for (layer, ids) in router_ids.iter().enumerate() {
        if let Some((index, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| usize::try_from(id).map_or(true, |e| e >= n_expert))
        {
            return Err(ExecError::Index {
                step: layer,
                op: "top_k",
                what: "expert id of layer",
                index,
                id: i64::from(id),
                bound: n_expert,
            }
            .into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::registry::BackendSpec;
    use std::path::PathBuf;

    fn data(rel: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/models")
            .join(rel)
    }

    /// The first 200 ids of `prompt-shared.json` (mistral-common's tokenization).
    fn prompt() -> Vec<u32> {
        let text = std::fs::read_to_string(data("prompt-shared.json")).expect("prompt fixture");
        let v: serde_json::Value = serde_json::from_str(&text).expect("prompt json");
        v["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    }

    /// The bundled 2-bit model of the repository.
    fn bundled(file: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models")
            .join(file)
    }

    #[test]
    fn predicted_hits_count_each_rows_overlap() {
        // Two tokens, k = 3: {1, 2, 3} vs {3, 2, 9} share 2; {4, 5, 6} vs {7, 8, 0} share 0.
        assert_eq!(
            predicted_hits(&[1, 2, 3, 4, 5, 6], &[3, 2, 9, 7, 8, 0], 3),
            2
        );
        // Same ids in another row do not count.
        assert_eq!(predicted_hits(&[1, 2], &[3, 4, 1, 2], 2), 0);
        assert_eq!(predicted_hits(&[5, 6], &[6, 5], 2), 2);
    }

    /// A session on the oracle, whose properties these tests check.
    fn open_path(path: &std::path::Path, kv_max: usize) -> Session {
        let model = Model::load_with(path, &BackendSpec::named("oracle")).expect("model loads");
        Session::open(model, SessionOptions { kv_max }).expect("session opens")
    }

    fn open(file: &str, kv_max: usize) -> Session {
        open_path(&data(file), kv_max)
    }

    /// Whole pages of `view` present in this process's page table (bit 63 of each
    /// `/proc/self/pagemap` entry), 4 KiB pages.
    fn mapped_pages(view: &[u8]) -> usize {
        use std::io::{Read, Seek, SeekFrom};
        let page = 4096;
        let first = (view.as_ptr() as usize).div_ceil(page);
        let end = (view.as_ptr() as usize + view.len()) / page;
        let mut f = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
        f.seek(SeekFrom::Start(first as u64 * 8)).expect("seek");
        let mut entries = vec![0u8; (end - first) * 8];
        f.read_exact(&mut entries).expect("read pagemap");
        entries
            .chunks_exact(8)
            .filter(|e| u64::from_le_bytes((*e).try_into().expect("8 bytes")) >> 63 == 1)
            .count()
    }

    /// Opening a session maps the pages of the weights every token reads in full (the output
    /// head here), and not those of the embedding table (but for the kernel's fault-around
    /// window, 16 pages, at the ends next to populated tensors).
    #[test]
    fn opening_a_session_maps_the_dense_weights() {
        let s = open_path(&bundled("ms4-tiny256-q2k.gguf"), 256);
        let model = Arc::clone(s.model());
        let view = |name: &str| {
            let w = model.plan.weights.iter().position(|w| w.name == name);
            model.weight_view(w.expect(name)).expect("its bytes")
        };
        let head = view("output.weight");
        let whole =
            (head.as_ptr() as usize + head.len()) / 4096 - (head.as_ptr() as usize).div_ceil(4096);
        assert!(whole > 16, "{} bytes", head.len());
        assert_eq!(mapped_pages(head), whole);
        let embd = view("token_embd.weight");
        assert!(embd.len() > 128 * 4096, "{} bytes", embd.len());
        assert!(mapped_pages(embd) <= 2 * 16, "{}", mapped_pages(embd));
    }

    /// The executor reads the embedding table's rows from the file, not through the map: a
    /// prompt and decoded tokens leave its mapped pages as opening the session left them (the
    /// rows' bits are those of the table read in place: the executor's
    /// `embedding_rows_read_from_the_file_give_the_in_place_bits`).
    #[test]
    fn the_embedding_table_stays_unmapped() {
        let path = bundled("ms4-tiny256-q2k.gguf");
        let mut s = open_path(&path, 256);
        let model = Arc::clone(s.model());
        let w = model
            .plan
            .weights
            .iter()
            .position(|w| w.name == "token_embd.weight")
            .expect("an embedding table");
        let view = model.weight_view(w).expect("its bytes");
        assert!(view.len() > 64 * 4096, "{} bytes", view.len());
        let before = mapped_pages(view);
        let ids = prompt();
        s.step(&ids[..60]).expect("prompt");
        for &id in &ids[60..80] {
            s.step(&[id]).expect("decode");
        }
        assert_eq!(mapped_pages(view), before);
        let mid = view.len() / 2;
        let sum: u64 = view[mid..mid + 8192].iter().map(|&b| u64::from(b)).sum();
        std::hint::black_box(sum);
        assert!(mapped_pages(view) > before, "rows read in place map pages");
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn decoding_token_by_token_gives_the_prefill_bits() {
        let ids = prompt();
        let mut s = open("ms4-tiny-f32.gguf", 64);
        let prefill = s.step(&ids[..24]).expect("prefill");
        let n_vocab = s.model().config.n_vocab;
        s.reset();
        let mut rows = s.step(&ids[..10]).expect("first chunk");
        for &id in &ids[10..24] {
            rows.extend(s.step(&[id]).expect("decode"));
        }
        assert_eq!(s.position(), 24);
        assert_eq!(rows.len(), 24 * n_vocab);
        assert_eq!(bits(&rows), bits(&prefill));
    }

    #[test]
    fn reset_forgets_the_previous_request() {
        let ids = prompt();
        let mut fresh = open("ms4-tiny-f32.gguf", 64);
        let want = fresh.step(&ids[100..108]).expect("fresh");
        let mut s = open("ms4-tiny-f32.gguf", 64);
        s.step(&ids[..40]).expect("long request");
        s.reset();
        assert_eq!(s.position(), 0);
        assert!(s.router_ids().iter().all(Vec::is_empty));
        for pos in 0..40 {
            let row = s.cache_row(0, pos).expect("a cache row");
            assert!(row.iter().all(|&v| v == 0.0), "row {pos}");
        }
        let got = s.step(&ids[100..108]).expect("second request");
        assert_eq!(bits(&got), bits(&want));
        assert_eq!(s.steps_taken(), 2);
    }

    #[test]
    fn thread_count_does_not_change_the_logits() {
        let ids = prompt();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            pool.install(|| {
                let mut s = open_path(&bundled("ms4-tiny256-q2k.gguf"), 32);
                let mut l = s.step(&ids[..12]).expect("prefill");
                l.extend(s.step(&ids[12..13]).expect("decode"));
                (bits(&l), s.router_ids().to_vec())
            })
        };
        assert_eq!(run(1), run(2));
    }

    #[test]
    fn router_ids_match_transformers() {
        // transformers' top-4 experts per layer and position, sorted by weight (the trace
        // fixture); the smallest top-4 / top-5 router-logit gap is 5.4e-4, far above f32 noise.
        let ids = prompt();
        let mut s = open("ms4-tiny-f32.gguf", 256);
        s.step(&ids[..200]).expect("prefill");
        let raw = std::fs::read(data("ms4-tiny.transformers.router_ids.i32")).expect("fixture");
        let want: Vec<i32> = raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let k = s.model().config.n_expert_used;
        assert_eq!(s.router_ids().len(), 3);
        for (l, got) in s.router_ids().iter().enumerate() {
            assert_eq!(got.len(), 200 * k);
            assert_eq!(got[..], want[l * 200 * k..(l + 1) * 200 * k], "layer {l}");
        }
    }

    #[test]
    fn bad_steps_are_errors_that_leave_the_session_unchanged() {
        let mut s = open("ms4-tiny-f32.gguf", 8);
        assert!(matches!(s.step(&[]), Err(EngineError::EmptyStep)));
        assert!(matches!(
            s.step(&[1, 8192]),
            Err(EngineError::TokenOutOfRange {
                index: 1,
                id: 8192,
                n_vocab: 8192
            })
        ));
        s.step(&[1, 2, 3, 4, 5, 6]).expect("fits");
        assert!(matches!(
            s.step(&[1, 2, 3]),
            Err(EngineError::ContextFull {
                tokens: 3,
                position: 6,
                kv_max: 8
            })
        ));
        assert_eq!((s.position(), s.steps_taken()), (6, 1));
        s.step(&[7, 8]).expect("exactly full");
        assert_eq!(s.position(), 8);

        let model = Arc::clone(s.model());
        for kv_max in [0, 257] {
            assert!(matches!(
                Session::open(Arc::clone(&model), SessionOptions { kv_max }),
                Err(EngineError::BadKvMax { .. })
            ));
        }
        assert_eq!(SessionOptions::for_config(&model.config).kv_max, 256);
    }
}
