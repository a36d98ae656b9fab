//! The one decode loop (ARCHITECTURE.md § rules of the house): `aubier run` and the server both
//! drive a [`Session`] through [`generate`] with the same [`GenerateParams`]; there is no second loop.
//! Anything that turns tokens into logits ([`Stepper`]) runs under it — the server's scripted fake
//! engine too.
//!
//! Algorithm: start the request ([`Stepper::start`]: a reset to position 0, or, with the session's
//! prompt cache on, position `n` past the prefix the prompt shares with the cached request chain,
//! whose logits are those of a cold run — `crate::session`), prefill the rest of the prompt in one
//! step (`step_last`: the last row of logits only; the whole prompt from position 0 when its
//! logits are kept), sample from the last row, then decode one token per `step`. After each sampled token the
//! caller's `on_token` decides whether to go on, so a vanished client or a matched stop string stops
//! generation before the next step. EOS ends generation (unless `ignore_eos`) and is not reported.
//! `prompt + max_tokens` is clamped to the session's KV capacity; hitting that clamp or `max_tokens`
//! finishes with [`FinishReason::Length`].

use crate::sampler::{SampleError, Sampler, SamplingParams};
use crate::session::Session;
use std::ops::ControlFlow;
use std::time::Instant;

/// What the decode loop drives: tokens in at the next positions, one row of logits out per token.
pub trait Stepper {
    /// Starts a new request at position 0.
    fn reset(&mut self);
    /// Starts a new request for `prompt` (non-empty): returns `n < prompt.len()`, the leading
    /// prompt tokens already in the cache and kept there (the next step runs at position `n` on
    /// `prompt[n..]`, with a cold run's logits). The default keeps none: [`Stepper::reset`].
    fn start(&mut self, _prompt: &[u32]) -> usize {
        self.reset();
        0
    }
    /// KV capacity in tokens.
    fn kv_max(&self) -> usize;
    /// Runs `tokens` at the next positions; returns `[T × n_vocab]` f32 logits, row-major.
    ///
    /// Errors: [`crate::error::EngineError`].
    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>, crate::error::EngineError>;

    /// [`Stepper::step`] returning only the last token's row (`[n_vocab]`); a stepper that can
    /// skip the other rows' work overrides it.
    ///
    /// Errors: [`crate::error::EngineError`].
    fn step_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>, crate::error::EngineError> {
        let all = self.step(tokens)?;
        let n_vocab = all.len() / tokens.len().max(1);
        Ok(all[all.len() - n_vocab..].to_vec())
    }
}

impl Stepper for Session {
    fn reset(&mut self) {
        Session::reset(self)
    }

    fn start(&mut self, prompt: &[u32]) -> usize {
        Session::start_request(self, prompt)
    }

    fn kv_max(&self) -> usize {
        Session::kv_max(self)
    }

    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>, crate::error::EngineError> {
        Session::step(self, tokens)
    }

    fn step_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>, crate::error::EngineError> {
        Session::step_last(self, tokens)
    }
}

/// What one generation is asked to do (shared by `aubier run` and the server).
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateParams {
    /// Tokens to generate at most; 0 runs the prompt only.
    pub max_tokens: usize,
    /// Sampler settings.
    pub sampling: SamplingParams,
    /// Keep generating past an end-of-sequence id.
    pub ignore_eos: bool,
    /// End-of-sequence ids (`tokenizer.ggml.eos_token_id`).
    pub eos_ids: Vec<u32>,
    /// Return the logits of every prompt position (teacher-forced) in [`GenerateOutput::prompt_logits`].
    pub keep_prompt_logits: bool,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence id was sampled.
    Stop,
    /// `max_tokens` or the KV capacity was reached.
    Length,
    /// `on_token` asked to stop (stop string matched, client gone).
    Cancelled,
}

/// The result of [`generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOutput {
    /// Generated ids, in order (EOS excluded).
    pub ids: Vec<u32>,
    /// Why it ended.
    pub finish: FinishReason,
    /// Leading prompt tokens whose cache rows were reused, not prefilled ([`Stepper::start`]).
    pub cached_tokens: usize,
    /// Prefilled prompt tokens (those not reused) ÷ prefill wall time (tok/s).
    pub prefill_tok_s: f64,
    /// Decoded tokens ÷ decode wall time (tok/s); 0 when fewer than 2 tokens were generated.
    pub decode_tok_s: f64,
    /// `[n_prompt × n_vocab]` f32 row-major, when asked for.
    pub prompt_logits: Option<Vec<f32>>,
}

/// Errors of [`generate`].
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The prompt is empty.
    #[error("the prompt is empty: at least one token id is needed")]
    EmptyPrompt,
    /// The prompt alone does not fit in the KV cache.
    #[error("the prompt has {prompt} tokens but the KV cache holds {kv_max}")]
    PromptTooLong { prompt: usize, kv_max: usize },
    /// Bad sampling parameters or logits.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] crate::error::EngineError),
}

/// Runs one request: prefill `prompt`, then decode under `params`, calling `on_token` with each
/// generated id.
///
/// Errors: [`GenerateError`]; the session is left reset-able in every case.
pub fn generate(
    session: &mut dyn Stepper,
    prompt: &[u32],
    params: &GenerateParams,
    on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
) -> Result<GenerateOutput, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let kv_max = session.kv_max();
    if prompt.len() > kv_max {
        return Err(GenerateError::PromptTooLong {
            prompt: prompt.len(),
            kv_max,
        });
    }
    let mut sampler = Sampler::new(params.sampling.clone())?;
    let cached = if params.keep_prompt_logits {
        session.reset();
        0
    } else {
        session.start(prompt)
    };
    let budget = params.max_tokens.min(kv_max - prompt.len() + 1);

    let t0 = Instant::now();
    let (mut last, prompt_logits) = if params.keep_prompt_logits {
        let logits = session.step(prompt)?;
        let n_vocab = logits.len() / prompt.len();
        (
            logits[(prompt.len() - 1) * n_vocab..].to_vec(),
            Some(logits),
        )
    } else {
        (session.step_last(&prompt[cached..])?, None)
    };
    let prefill_s = t0.elapsed().as_secs_f64();

    let mut ids = Vec::new();
    let mut finish = FinishReason::Length;
    let t1 = Instant::now();
    while ids.len() < budget {
        let id = sampler.sample(&last)?;
        if !params.ignore_eos && params.eos_ids.contains(&id) {
            finish = FinishReason::Stop;
            break;
        }
        ids.push(id);
        if on_token(id).is_break() {
            finish = FinishReason::Cancelled;
            break;
        }
        if ids.len() == budget {
            break;
        }
        last = session.step(&[id])?;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    let decoded = ids.len().saturating_sub(1);
    Ok(GenerateOutput {
        cached_tokens: cached,
        prefill_tok_s: rate(prompt.len() - cached, prefill_s),
        decode_tok_s: if decoded > 0 {
            rate(decoded, decode_s)
        } else {
            0.0
        },
        ids,
        finish,
        prompt_logits,
    })
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}
