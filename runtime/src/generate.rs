//! The one decode loop (ARCHITECTURE.md § rules of the house): `aubier run` and the server both
//! drive a [`Session`] through [`generate`] with the same [`GenerateParams`]; there is no second loop.
//! Anything that turns tokens into logits ([`Stepper`]) runs under it — the server's scripted fake
//! engine too.
//!
//! Algorithm: start the request ([`Stepper::start`]: a reset to position 0, or, with the session's
//! prompt cache on, position `n` past the prefix the prompt shares with the cached request chain,
//! whose logits are those of a cold run — `crate::session`), prefill the rest of the prompt in one
//! step (`step_last`: the last row of logits only; the whole prompt from position 0 when its
//! logits are kept), sample from the last row (the sampler's history holds the prompt and the ids
//! generated so far, for its penalties), then decode one token per `step`. When
//! log-probabilities are asked for, each sampled token's are computed from the same raw row before
//! the next step ([`crate::sampler::token_logprobs`]). After each sampled token the
//! caller's `on_token` decides whether to go on, so a vanished client or a matched stop string stops
//! generation before the next step. EOS ends generation (unless `ignore_eos`) and is not reported;
//! so does a `stop_token_ids` id. Before `min_tokens` tokens those ids cannot be sampled (their
//! logits are −∞ for the draw; the log-probabilities stay the raw row's).
//! `prompt + max_tokens` is clamped to the session's KV capacity; hitting that clamp or `max_tokens`
//! finishes with [`FinishReason::Length`].
//!
//! With a [`Constraint`] (structured output, tool calls) the disallowed logits are set to −∞
//! before each sample and the sampled id is committed to it; the next step's mask is computed by
//! the request's mask worker (one scoped thread, which the constraint is handed to and back)
//! while the session runs the step, and received before the next sample (the first mask likewise
//! overlaps the prefill). EOS is then sampled only where the grammar accepts.

use crate::sampler::{token_logprobs, SampleError, Sampler, SamplingParams, TokenLogprobs};
use crate::session::Session;
use crate::text::grammar::{Constraint, GrammarError, GRAMMAR_STACK};
use std::ops::ControlFlow;
use std::sync::mpsc;
use std::time::{Duration, Instant};

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
    /// Keep generating past an end-of-sequence id (vLLM's `ignore_eos`). A grammar's end still
    /// ends generation: past it the grammar allows no token.
    pub ignore_eos: bool,
    /// End-of-sequence ids (`tokenizer.ggml.eos_token_id`).
    pub eos_ids: Vec<u32>,
    /// Ids that end generation as EOS does, whatever `ignore_eos` (vLLM's `stop_token_ids`); not
    /// reported either.
    pub stop_token_ids: Vec<u32>,
    /// Tokens generated before an end id may be sampled (vLLM's `min_tokens`): until then the
    /// logits of the end ids (`eos_ids` unless `ignore_eos`, and `stop_token_ids`) are −∞, as
    /// vLLM's min-tokens logits processor sets them, except where the grammar allows nothing
    /// else. 0 = off.
    pub min_tokens: usize,
    /// Return the logits of every prompt position (teacher-forced) in [`GenerateOutput::prompt_logits`].
    pub keep_prompt_logits: bool,
    /// `Some(k)`: hand each generated token's raw log-probability and the `k` most likely ids'
    /// to `on_token` ([`GeneratedToken::logprobs`]); `None` computes none (they cost a pass over
    /// the row, and a selection for `k > 0`).
    pub logprobs: Option<usize>,
}

/// One generated token, as [`generate`] hands it to `on_token`.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratedToken {
    /// The sampled id.
    pub id: u32,
    /// Its log-probability and the top ones, under the raw distribution of the row it was
    /// sampled from (the model's logits, before penalties, temperature or any mask); `Some`
    /// exactly when [`GenerateParams::logprobs`] is.
    pub logprobs: Option<TokenLogprobs>,
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
    /// Time the loop waited for the constraint's mask after the step it overlapped had ended
    /// (the part of the mask cost not hidden behind the model); zero without a constraint.
    pub mask_wait: Duration,
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
    /// The output constraint failed: its mask could not be computed or it refused the sampled
    /// token (with a mask applied, only an engine defect or a bug leads here).
    #[error("constrained decoding failed: {0}")]
    Constraint(#[from] GrammarError),
}

/// Runs one request: prefill `prompt`, then decode under `params` (and `constraint`, when given:
/// only the ids it allows are sampled), calling `on_token` with each generated token.
///
/// Errors: [`GenerateError`]; the session is left reset-able in every case.
pub fn generate(
    session: &mut dyn Stepper,
    prompt: &[u32],
    params: &GenerateParams,
    constraint: Option<&mut Constraint>,
    on_token: &mut dyn FnMut(&GeneratedToken) -> ControlFlow<()>,
) -> Result<GenerateOutput, GenerateError> {
    let Some(c) = constraint else {
        return decode(session, prompt, params, &mut Mask::default(), on_token);
    };
    // One mask worker for the whole request: the constraint goes to it for each mask and comes
    // back with the result.
    std::thread::scope(|s| {
        let (to_worker, jobs) = mpsc::channel::<&mut Constraint>();
        let (to_loop, done) = mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("aubier-mask".to_owned())
            .stack_size(GRAMMAR_STACK)
            .spawn_scoped(s, move || {
                for c in jobs {
                    let result = c.compute_mask();
                    if to_loop.send((c, result)).is_err() {
                        break;
                    }
                }
            });
        if let Err(e) = worker {
            return Err(GenerateError::Constraint(GrammarError::Matcher(format!(
                "starting the mask thread: {e}"
            ))));
        }
        let mut mask = Mask {
            held: Some(c),
            link: Some((to_worker, done)),
        };
        decode(session, prompt, params, &mut mask, on_token)
    })
}

/// A mask computed by the worker: the constraint handed back, and the computation's result.
type Computed<'c> = (&'c mut Constraint, Result<(), GrammarError>);

/// The constraint of a request and the channels to its mask worker; empty without one.
#[derive(Default)]
struct Mask<'c> {
    /// The constraint, while the loop holds it.
    held: Option<&'c mut Constraint>,
    /// To the worker and back.
    link: Option<(
        mpsc::Sender<&'c mut Constraint>,
        mpsc::Receiver<Computed<'c>>,
    )>,
}

impl Mask<'_> {
    fn constraint(&mut self) -> Option<&mut Constraint> {
        self.held.as_deref_mut()
    }

    /// Runs `step` on this thread while the worker computes the constraint's next mask; adds the
    /// time spent waiting for the mask after `step` returned to `wait`. The step's error comes
    /// first, then the mask's.
    fn overlap<T>(
        &mut self,
        wait: &mut Duration,
        step: impl FnOnce() -> Result<T, GenerateError>,
    ) -> Result<T, GenerateError> {
        let (Some(c), Some((to_worker, done))) = (self.held.take(), self.link.as_ref()) else {
            return step();
        };
        let lost = || GrammarError::Matcher("the mask worker stopped (it panicked)".to_owned());
        if let Err(mpsc::SendError(c)) = to_worker.send(c) {
            self.held = Some(c);
            return Err(lost().into());
        }
        let out = step();
        let t = Instant::now();
        let (c, mask) = done.recv().map_err(|_| lost())?;
        *wait += t.elapsed();
        self.held = Some(c);
        let out = out?;
        mask?;
        Ok(out)
    }
}

/// The tokens a request may generate after a prompt of `prompt` tokens: `max_tokens` (`None`:
/// as many as fit) clamped to the room the context leaves, since prompt and completion together
/// are at most `kv_max` tokens (one limit, as vLLM's `max_model_len`; the last generated token
/// would not need a cache cell, but `usage` counts it). The one place this rule lives: the
/// decode loop and the server's routes both call it.
///
/// Errors: [`GenerateError::EmptyPrompt`] for `prompt == 0`, [`GenerateError::PromptTooLong`]
/// for `prompt > kv_max`.
pub fn completion_room(
    prompt: usize,
    max_tokens: Option<usize>,
    kv_max: usize,
) -> Result<usize, GenerateError> {
    if prompt == 0 {
        return Err(GenerateError::EmptyPrompt);
    }
    let room = kv_max
        .checked_sub(prompt)
        .ok_or(GenerateError::PromptTooLong { prompt, kv_max })?;
    Ok(max_tokens.map_or(room, |m| m.min(room)))
}

/// The decode loop of [`generate`], with the constraint (if any) in `mask`.
fn decode(
    session: &mut dyn Stepper,
    prompt: &[u32],
    params: &GenerateParams,
    mask: &mut Mask<'_>,
    on_token: &mut dyn FnMut(&GeneratedToken) -> ControlFlow<()>,
) -> Result<GenerateOutput, GenerateError> {
    let budget = completion_room(prompt.len(), Some(params.max_tokens), session.kv_max())?;
    let mut sampler = Sampler::new(params.sampling.clone())?.with_prompt(prompt);
    let cached = if params.keep_prompt_logits {
        session.reset();
        0
    } else {
        session.start(prompt)
    };

    let mut mask_wait = Duration::ZERO;
    let t0 = Instant::now();
    let (mut last, prompt_logits) = mask.overlap(&mut mask_wait, || {
        if params.keep_prompt_logits {
            let logits = session.step(prompt)?;
            let n_vocab = logits.len() / prompt.len();
            Ok((
                logits[(prompt.len() - 1) * n_vocab..].to_vec(),
                Some(logits),
            ))
        } else {
            Ok((session.step_last(&prompt[cached..])?, None))
        }
    })?;
    let prefill_s = t0.elapsed().as_secs_f64();

    let mut ids = Vec::new();
    let mut finish = FinishReason::Length;
    // A grammar ends where it accepts EOS, ignore_eos or not.
    let eos_ends = !params.ignore_eos || mask.constraint().is_some();
    let end_ids = end_ids(
        eos_ends.then_some(&params.eos_ids[..]),
        &params.stop_token_ids,
    );
    let ends = |id: u32| end_ids.binary_search(&id).is_ok();
    let mut held = Vec::new();
    let t1 = Instant::now();
    while ids.len() < budget {
        // Log-probabilities are the model's raw distribution, before the grammar's mask.
        let raw = (params.logprobs.is_some() && mask.constraint().is_some()).then(|| last.clone());
        if let Some(c) = mask.constraint() {
            c.apply(&mut last)?;
        }
        if ids.len() < params.min_tokens {
            hold_ends(&mut last, &mut held, &end_ids);
        }
        let id = sampler.sample(&last)?;
        // Give the held logits back, so that the log-probabilities read the row as it was.
        give_back(&mut last, &mut held);
        if let Some(c) = mask.constraint() {
            c.commit(id)?;
        }
        if ends(id) {
            finish = FinishReason::Stop;
            break;
        }
        ids.push(id);
        let token = GeneratedToken {
            id,
            logprobs: params
                .logprobs
                .map(|k| token_logprobs(raw.as_deref().unwrap_or(&last), id, k)),
        };
        if on_token(&token).is_break() {
            finish = FinishReason::Cancelled;
            break;
        }
        if ids.len() == budget {
            break;
        }
        last = mask.overlap(&mut mask_wait, || Ok(session.step(&[id])?))?;
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
        mask_wait,
    })
}

/// The ids that end a choice, sorted and without repeats (for a binary search, and so that
/// [`hold_ends`] walks each once): `eos_ids` when EOS ends it, and `stop_ids` (a client's list,
/// as long as its body allows).
fn end_ids(eos_ids: Option<&[u32]>, stop_ids: &[u32]) -> Vec<u32> {
    let mut ids: Vec<u32> = eos_ids
        .unwrap_or_default()
        .iter()
        .chain(stop_ids)
        .copied()
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Sets the logits of `end_ids` to −∞ in `row`, saving each one's value in `held`; when that
/// would leave no finite logit (a grammar that allows nothing but its end), puts them back and
/// holds nothing.
fn hold_ends(row: &mut [f32], held: &mut Vec<(u32, f32)>, end_ids: &[u32]) {
    for &id in end_ids {
        if let Some(l) = row.get_mut(id as usize) {
            held.push((id, *l));
            *l = f32::NEG_INFINITY;
        }
    }
    if !held.is_empty() && !row.iter().any(|l| *l > f32::NEG_INFINITY) {
        give_back(row, held);
    }
}

/// Puts the logits [`hold_ends`] saved in `held` back into `row`, last saved first, and empties
/// `held`.
fn give_back(row: &mut [f32], held: &mut Vec<(u32, f32)>) {
    for &(i, l) in held.iter().rev() {
        row[i as usize] = l;
    }
    held.clear();
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same row after every token: EOS (2) first at 3, then 5 at 2, then 1 at 1, others 0.
    struct SameRow;

    const ROW: [f32; 8] = [0.0, 1.0, 3.0, 0.0, 0.0, 2.0, 0.0, 0.0];

    impl Stepper for SameRow {
        fn reset(&mut self) {}
        fn kv_max(&self) -> usize {
            64
        }
        fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>, crate::error::EngineError> {
            Ok(ROW.repeat(tokens.len()))
        }
    }

    /// Greedy ids and finish of `SameRow` after a one-token prompt, and each token's raw
    /// log-probability.
    fn run(
        ignore_eos: bool,
        stop: &[u32],
        min_tokens: usize,
    ) -> (Vec<u32>, FinishReason, Vec<f64>) {
        let params = GenerateParams {
            max_tokens: 4,
            sampling: SamplingParams::default(),
            min_tokens,
            stop_token_ids: stop.to_vec(),
            ignore_eos,
            eos_ids: vec![2],
            keep_prompt_logits: false,
            logprobs: Some(0),
        };
        let mut lps = Vec::new();
        let out = generate(&mut SameRow, &[0], &params, None, &mut |t| {
            lps.push(t.logprobs.as_ref().expect("asked").logprob);
            ControlFlow::Continue(())
        })
        .expect("generate");
        (out.ids, out.finish, lps)
    }

    #[test]
    fn end_ids_are_each_held_once_and_stay_when_nothing_else_is_allowed() {
        let ninf = f32::NEG_INFINITY;
        // EOS when it ends the choice, and the stop ids, each once (a client's list may repeat
        // ids as often as its body allows; the loop walks this set per token).
        assert_eq!(end_ids(Some(&[2]), &[2, 0, 2, 2]), vec![0, 2]);
        assert_eq!(end_ids(None, &[5, 5, 1]), vec![1, 5]);
        assert_eq!(end_ids(None, &[]), Vec::<u32>::new());
        let mut held = Vec::new();
        let mut row = [0.5, ninf, 3.0];
        hold_ends(&mut row, &mut held, &end_ids(Some(&[2]), &[2]));
        assert_eq!(row, [0.5, ninf, ninf]);
        assert_eq!(held, vec![(2, 3.0)]);
        give_back(&mut row, &mut held);
        assert_eq!((row, held.len()), ([0.5, ninf, 3.0], 0));
        // A grammar that allows only the end: nothing is held, the row is as it was.
        let mut row = [ninf, ninf, 3.0];
        hold_ends(&mut row, &mut held, &[2]);
        assert_eq!((row, held.len()), ([ninf, ninf, 3.0], 0));
    }

    #[test]
    fn end_ids_min_tokens_and_ignore_eos_follow_vllm() {
        use FinishReason::{Length, Stop};
        let ids_finish = |r: (Vec<u32>, FinishReason, Vec<f64>)| (r.0, r.1);
        // The argmax is EOS: nothing generated.
        assert_eq!(ids_finish(run(false, &[], 0)), (vec![], Stop));
        // min_tokens: EOS is −∞ for three tokens (the runner-up 5 is drawn), then ends.
        assert_eq!(ids_finish(run(false, &[], 3)), (vec![5, 5, 5], Stop));
        // A stop id is held too; past min_tokens it would end the choice, but EOS comes first.
        assert_eq!(ids_finish(run(false, &[5], 2)), (vec![1, 1], Stop));
        // ignore_eos: EOS is generated and reported, up to max_tokens.
        assert_eq!(ids_finish(run(true, &[], 0)), (vec![2; 4], Length));
        // A stop id ends the choice whatever ignore_eos, and it is not reported.
        assert_eq!(ids_finish(run(true, &[2], 0)), (vec![], Stop));
        assert_eq!(ids_finish(run(true, &[5], 2)), (vec![2, 2, 2, 2], Length));
        // The log-probabilities are the raw row's, held logits or not.
        let lse = ROW.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln();
        assert_eq!(run(false, &[], 3).2, vec![2.0 - lse; 3]);
        // EOS listed as a stop id too: held twice, given back once as it was.
        assert_eq!(run(false, &[2], 3), (vec![5; 3], Stop, vec![2.0 - lse; 3]));
    }

    #[test]
    fn the_room_is_what_the_context_leaves_after_the_prompt() {
        assert_eq!(completion_room(10, None, 16).unwrap(), 6);
        assert_eq!(completion_room(10, Some(4), 16).unwrap(), 4);
        assert_eq!(completion_room(10, Some(40), 16).unwrap(), 6);
        assert_eq!(completion_room(16, Some(1), 16).unwrap(), 0);
        assert!(matches!(
            completion_room(17, None, 16),
            Err(GenerateError::PromptTooLong {
                prompt: 17,
                kv_max: 16
            })
        ));
        assert!(matches!(
            completion_room(0, None, 16),
            Err(GenerateError::EmptyPrompt)
        ));
    }
}
