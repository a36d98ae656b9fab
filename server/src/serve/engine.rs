//! The single-flight engine: one dedicated OS thread owns the model and runs one request at a
//! time, so the tokio runtime is never blocked by a forward pass.
//!
//! Algorithm: a request first waits (async, up to `--queue-wait-ms`) for the one permit of a
//! semaphore; a request that does not get it in time is answered 503 with `Retry-After` before any
//! work is done. The holder sends a [`Job`] to the engine thread together with its permit and an
//! unbounded event channel, and the HTTP side reads [`Event`]s from that channel. The engine thread
//! calls [`Engine::generate`] (for the real engine: `aubier_runtime::generate::generate`, the one
//! decode loop shared with `aubier run`) with a callback that turns each token into text through the
//! shared [`TextPipeline`] (whole characters, reasoning split, stop strings held back) and sends the
//! released text. The callback returns `Break` when a stop string matched or when the receiving side
//! has gone (the client disconnected: axum dropped the response body, and with it the receiver), so
//! generation stops before the next engine step. The permit is released only after the engine has
//! returned, so the next request never overlaps the current one.
//!
//! A job of `n` choices runs them one after the other while it holds the engine, choice `i` with
//! the seed `seed + i`; each ends with its own [`Event::Done`]. With log-probabilities asked for,
//! each generated token's [`TokenEntry`] waits in a queue and rides on the first [`Chunk`] sent
//! after it at which the pipeline holds nothing back (so an entry never goes out before its
//! token's text); what is left goes with the choice's last chunk. A stop string cuts the text, not
//! the entries: every generated token has one, the stop string's too, as `usage` counts them.

pub use super::api::response::Finish;
use super::error::ApiError;
use super::metrics::Metrics;
use super::text::{Delta, TextMode, TextModel, TextPipeline};
use aubier_runtime::generate::{
    FinishReason, GenerateError, GenerateOutput, GenerateParams, GeneratedToken,
};
use aubier_runtime::sampler::TokenLogprobs;
use aubier_runtime::store::expert_store::StoreReport;
use aubier_runtime::text::grammar::{Constraint, GrammarError, GRAMMAR_STACK};
use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc as tmpsc, OwnedSemaphorePermit, Semaphore};

/// A model the server can run: the real `Session`-backed engine or the scripted fake.
///
/// Both are driven the same way: [`Engine::generate`] prefills `prompt`, then produces tokens and
/// calls `on_token` with each; `on_token` returning `Break` stops generation before the next step.
pub trait Engine: Send + 'static {
    /// KV cache capacity, in tokens (prompt + generated tokens a request can hold).
    fn kv_max(&self) -> usize;

    /// Runs one request (semantics of `aubier_runtime::generate::generate`; `constraint` limits
    /// the sampled ids to what a grammar allows).
    ///
    /// Errors: [`EngineFailure`]; the engine stays usable for the next request.
    fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        constraint: Option<&mut Constraint>,
        on_token: &mut dyn FnMut(&GeneratedToken) -> ControlFlow<()>,
    ) -> Result<GenerateOutput, EngineFailure>;

    /// Engine steps (prefill or decode forward passes) taken since the engine was created.
    fn steps_taken(&self) -> u64;

    /// Latent KV cache rows the engine holds now (at most [`Engine::kv_max`]): the positions the
    /// last request filled, which the next request may reuse; 0 before the first.
    fn kv_used(&self) -> usize;

    /// The expert store's counters of the last request; `None` for an engine without a store.
    fn store_report(&self) -> Option<StoreReport> {
        None
    }
}

/// Why a generation failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineFailure {
    /// The shared decode loop (or the session under it) failed.
    #[error(transparent)]
    Generate(#[from] GenerateError),
}

/// What a request asks the engine thread to do.
#[derive(Debug)]
pub struct JobSpec {
    /// Prompt token ids (already rendered / tokenized, already checked to fit the KV cache).
    pub prompt: Vec<u32>,
    /// Generation settings (`max_tokens` already clamped to the KV capacity).
    pub params: GenerateParams,
    /// How produced tokens become text.
    pub mode: TextMode,
    /// The grammar each choice's output must follow (`tools`, `response_format`): one fresh
    /// matcher per choice, in choice order; empty = unconstrained.
    pub constraints: Vec<Constraint>,
    /// When the request's head arrived (the time to first token is measured from it).
    pub received: Instant,
    /// Choices to generate, one after the other (`n`, at least 1); choice `i` samples with the
    /// seed `params.sampling.seed + i`.
    pub choices: usize,
}

/// The log-probability data of one generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEntry {
    /// The token.
    pub id: u32,
    /// Its raw log-probability and the top ones asked for.
    pub logprobs: TokenLogprobs,
    /// Characters the choice's earlier tokens decode to (control tokens dropped): where this
    /// token's text starts in a completion's text (the legacy `text_offset`).
    pub text_offset: usize,
}

/// Text one choice released at once, with the entries of the tokens it accounts for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chunk {
    /// The choice (0-based).
    pub choice: usize,
    /// The released text (whole characters; never part of a stop string).
    pub delta: Delta,
    /// Entries of the tokens generated up to this chunk and not sent before (module note);
    /// always empty without log-probabilities.
    pub logprobs: Vec<TokenEntry>,
}

/// The end of one successful choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// The choice (0-based).
    pub choice: usize,
    /// Why it ended.
    pub finish: Finish,
    /// Every generated id (EOS excluded), including those after which a stop string matched.
    pub ids: Vec<u32>,
    /// Prompt length, tokens.
    pub prompt_tokens: usize,
    /// Leading prompt tokens reused from the engine's cache instead of prefilled (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`).
    pub cached_tokens: usize,
    /// Prefill rate, tok/s.
    pub prefill_tok_s: f64,
    /// Decode rate, tok/s.
    pub decode_tok_s: f64,
    /// Generated ids inside the reasoning (`[THINK]` … `[/THINK]`, markers included).
    pub reasoning_tokens: usize,
}

/// What the engine thread sends back for a job, in order: for each choice in turn, any number of
/// `Chunk`s then its `Done`; a `Failed` ends the job early.
#[derive(Clone, Debug)]
pub enum Event {
    /// Newly released text of a choice.
    Chunk(Chunk),
    /// A choice finished.
    Done(Summary),
    /// Generation failed after it started.
    Failed(ApiError),
}

struct Job {
    spec: JobSpec,
    events: tmpsc::UnboundedSender<Event>,
    _permit: OwnedSemaphorePermit,
}

/// The HTTP side's handle on the engine thread.
#[derive(Debug)]
pub struct EngineHandle {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    gate: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    kv_max: usize,
}

/// Decrements the queue-depth gauge when a waiting request stops waiting (also when cancelled).
struct Waiting<'a>(&'a Metrics);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.queue_depth.fetch_sub(1, Ordering::Relaxed);
    }
}

impl EngineHandle {
    /// Starts the engine thread, which owns `engine` and decodes text with `text`.
    ///
    /// Errors: the OS refused to create the thread.
    pub fn spawn(
        engine: Box<dyn Engine>,
        text: Arc<TextModel>,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<EngineHandle> {
        let kv_max = engine.kv_max();
        let (tx, rx) = mpsc::channel::<Job>();
        let m = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("aubier-engine".to_owned())
            // The decode loop advances llguidance's matcher, which recurses over the grammar.
            .stack_size(GRAMMAR_STACK)
            .spawn(move || engine_thread(engine, &text, &m, rx))?;
        Ok(EngineHandle {
            jobs: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            gate: Arc::new(Semaphore::new(1)),
            metrics,
            kv_max,
        })
    }

    /// KV cache capacity of the engine, tokens.
    pub fn kv_max(&self) -> usize {
        self.kv_max
    }

    /// Whether the engine still takes requests (false once [`EngineHandle::shutdown`] began).
    pub fn accepting(&self) -> bool {
        !self.gate.is_closed()
    }

    /// Waits up to `queue_wait` for the engine, then starts `spec` on it and returns the channel
    /// its [`Event`]s arrive on. Dropping the receiver cancels the generation within one step.
    ///
    /// Errors: 503 with `Retry-After` when the engine stayed busy for `queue_wait`; 503 when the
    /// engine has shut down.
    pub async fn submit(
        &self,
        spec: JobSpec,
        queue_wait: Duration,
    ) -> Result<tmpsc::UnboundedReceiver<Event>, ApiError> {
        self.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(&self.metrics);
        let permit = tokio::time::timeout(queue_wait, self.gate.clone().acquire_owned()).await;
        drop(waiting);
        let retry_after_s = queue_wait.as_secs().max(1);
        let permit = match permit {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Err(ApiError::busy("The engine has shut down.", retry_after_s)),
            Err(_) => {
                return Err(ApiError::busy(
                    format!(
                        "The engine is busy with another request; waited {} ms (--queue-wait-ms).",
                        queue_wait.as_millis()
                    ),
                    retry_after_s,
                ))
            }
        };
        let (tx, rx) = tmpsc::unbounded_channel();
        let job = Job {
            spec,
            events: tx,
            _permit: permit,
        };
        let sent = match self.jobs.lock() {
            Ok(guard) => guard.as_ref().map(|jobs| jobs.send(job).is_ok()),
            Err(_) => None,
        };
        match sent {
            Some(true) => Ok(rx),
            _ => Err(ApiError::busy("The engine has shut down.", retry_after_s)),
        }
    }

    /// Stops accepting jobs, lets the running one finish and joins the engine thread.
    pub fn shutdown(&self) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.take();
        }
        self.gate.close();
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

fn engine_thread(
    mut engine: Box<dyn Engine>,
    text: &TextModel,
    metrics: &Metrics,
    rx: mpsc::Receiver<Job>,
) {
    while let Ok(mut job) = rx.recv() {
        metrics.running.store(1, Ordering::Relaxed);
        let events = job.events.clone();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            run_job(engine.as_mut(), text, &mut job.spec, &job.events, metrics)
        }));
        if outcome.is_err() {
            tracing::error!("the engine panicked; the request failed");
            let _ = events.send(Event::Failed(ApiError::internal(
                "The engine panicked while running this request.",
            )));
        }
        // Again after a panic, which skips run_job's update.
        publish_engine_state(engine.as_ref(), metrics);
        metrics.running.store(0, Ordering::Relaxed);
        drop(job);
    }
}

/// Publishes the engine's step counter and KV cache usage.
fn publish_engine_state(engine: &dyn Engine, metrics: &Metrics) {
    metrics.set_engine_steps(engine.steps_taken());
    metrics.set_kv_usage(engine.kv_used(), engine.kv_max());
}

fn run_job(
    engine: &mut dyn Engine,
    text: &TextModel,
    spec: &mut JobSpec,
    events: &tmpsc::UnboundedSender<Event>,
    metrics: &Metrics,
) {
    let mut first = true;
    let mut constraints = std::mem::take(&mut spec.constraints).into_iter();
    let spec: &JobSpec = spec;
    for choice in 0..spec.choices.max(1) {
        let mut params = spec.params.clone();
        params.sampling.seed = params.sampling.seed.wrapping_add(choice as u64);
        let job = ChoiceJob {
            spec,
            params: &params,
            choice,
            events,
            metrics,
        };
        let mut constraint = constraints.next();
        if run_choice(engine, text, &job, constraint.as_mut(), &mut first).is_break() {
            break;
        }
    }
}

/// One choice of a job.
struct ChoiceJob<'a> {
    spec: &'a JobSpec,
    params: &'a GenerateParams,
    choice: usize,
    events: &'a tmpsc::UnboundedSender<Event>,
    metrics: &'a Metrics,
}

/// Runs one choice; `Break` when the job must not go on (failure, or the client is gone).
fn run_choice(
    engine: &mut dyn Engine,
    text: &TextModel,
    job: &ChoiceJob<'_>,
    constraint: Option<&mut Constraint>,
    first: &mut bool,
) -> ControlFlow<()> {
    let (spec, events, metrics, choice) = (job.spec, job.events, job.metrics, job.choice);
    let mut pipe = TextPipeline::new(text, &spec.mode, spec.params.min_tokens);
    let mut pending: Vec<TokenEntry> = Vec::new();
    let mut offsets = text.tokenizer().stream_decoder();
    let mut offset = 0;
    let result = engine.generate(&spec.prompt, job.params, constraint, &mut |token| {
        if std::mem::take(first) {
            metrics.observe_first_token(spec.received.elapsed());
        }
        if events.is_closed() {
            return ControlFlow::Break(());
        }
        if let Some(logprobs) = &token.logprobs {
            pending.push(TokenEntry {
                id: token.id,
                logprobs: logprobs.clone(),
                text_offset: offset + offsets.resolved_before(token.id),
            });
            offset += offsets.push(token.id).chars().count();
        }
        let (delta, stopped) = pipe.push(token.id);
        if !delta.is_empty() {
            let logprobs = if pipe.holds_back() {
                Vec::new()
            } else {
                std::mem::take(&mut pending)
            };
            let chunk = Chunk {
                choice,
                delta,
                logprobs,
            };
            if events.send(Event::Chunk(chunk)).is_err() {
                return ControlFlow::Break(());
            }
        }
        if stopped {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    // Published before the last event, so a client that reads /metrics after its answer sees it.
    publish_engine_state(engine, metrics);
    match result {
        Ok(out) => {
            let tail = Chunk {
                choice,
                delta: pipe.finish(),
                logprobs: pending,
            };
            if !tail.delta.is_empty() || !tail.logprobs.is_empty() {
                let _ = events.send(Event::Chunk(tail));
            }
            let finish = match out.finish {
                _ if pipe.stopped() => Finish::Stop,
                FinishReason::Stop if pipe.tool_calls() > 0 => Finish::ToolCalls,
                FinishReason::Stop => Finish::Stop,
                FinishReason::Length => Finish::Length,
                FinishReason::Cancelled => Finish::Cancelled,
            };
            metrics.record_generation(
                spec.prompt.len(),
                out.ids.len(),
                out.prefill_tok_s,
                out.decode_tok_s,
            );
            if let Some(r) = engine.store_report() {
                tracing::info!(
                    served_fraction = r.served_fraction,
                    fast_hits = r.fast_hits,
                    routed = r.routed,
                    promotions = r.promotions,
                    n_res = r.n_res,
                    fast_bytes = r.fast_bytes,
                    reset_ms = r.reset_ms,
                    prefetches = r.prefetches,
                    prefetch_served = r.prefetch_served,
                    prefetch_late = r.prefetch_late,
                    prefetch_pending = r.prefetch_pending,
                    "expert store, request done"
                );
                metrics.record_store(&r);
            }
            let sent = events.send(Event::Done(Summary {
                choice,
                finish,
                ids: out.ids,
                prompt_tokens: spec.prompt.len(),
                cached_tokens: out.cached_tokens,
                prefill_tok_s: out.prefill_tok_s,
                decode_tok_s: out.decode_tok_s,
                reasoning_tokens: pipe.reasoning_tokens(),
            }));
            if sent.is_err() || finish == Finish::Cancelled {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
        Err(e) => {
            tracing::warn!("generation failed: {e}");
            // The grammar comes from the request (its schemas): where the grammar engine gives
            // up mid-output (a schema past its limits), the request is at fault.
            let error = match &e {
                EngineFailure::Generate(GenerateError::Constraint(
                    g @ (GrammarError::Matcher(_) | GrammarError::TokenRejected { .. }),
                )) => ApiError::invalid(
                    None,
                    "grammar_limit",
                    format!(
                        "The output grammar of response_format / tools failed during generation \
                         ({g}); simplify the schema."
                    ),
                ),
                EngineFailure::Generate(_) => ApiError::internal(format!("Generation failed: {e}")),
            };
            let _ = events.send(Event::Failed(error));
            ControlFlow::Break(())
        }
    }
}
