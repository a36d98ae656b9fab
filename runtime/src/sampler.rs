//! Token sampling from one row of logits: logit bias, penalties, greedy, temperature, min-p,
//! top-k, top-p, seeded; and the raw log-probabilities of a row ([`token_logprobs`]).
//!
//! Algorithm, in vLLM's order (`vllm/v1/sample/sampler.py`, whose docstring lists the steps):
//! 0. the logit bias (OpenAI `logit_bias`): each listed id's bias is added to its f32 logit,
//!    before the penalties, as vLLM applies its logit-bias processor among the processors that
//!    can change the argmax (so greedy honours it too);
//! 1. penalties, on the f32 logits, over the request's history: the repetition penalty `p`
//!    (llama.cpp / vLLM / the CTRL paper) on every distinct id of the prompt and of the tokens
//!    generated so far (`logit > 0 ? logit / p : logit · p`, saturating at ±`f32::MAX` so that
//!    a finite logit stays finite), then the frequency and presence
//!    penalties (OpenAI) on the generated ids only (`logit -= frequency · count`, then
//!    `logit -= presence` when `count > 0`);
//! 2. with `temperature == 0`, the argmax (lowest id on ties, as the reference greedy chains);
//! 3. otherwise each id's weight, its probability relative to the top one:
//!    `exp((logit − max) / temperature)` in f32 (1 for the top id; below ~1e-45 it is 0 and the
//!    id is never drawn), summed in f64;
//! 4. min-p: drop every id whose probability is below `min_p` × the top probability;
//! 5. top-k: keep the `top_k` largest (0 = all; ties broken by the lower id);
//! 6. top-p: softmax what is left, keep the smallest prefix (by descending probability) whose
//!    mass reaches `top_p`, renormalise;
//! 7. draw with a ChaCha8 stream seeded by `seed`.
//!
//! Nothing sorts the vocabulary: min-p is a filter on the weights; top-k selects the k largest
//! (`select_nth_unstable`, O(n)); top-p is a quickselect by mass (partition around a pivot,
//! keep the side where the nucleus's mass is reached: O(n) expected, a sort of what is left
//! after 64 rounds); the draw walks the kept candidates in the order these steps leave them
//! (by id when nothing truncated). "Largest" is by weight, then lower id, compared as one
//! integer per candidate: each order is a fixed function of the row, so a seed still fixes the
//! tokens.
//!
//! The biased and penalised copy of the row, the candidates and the block sums live in buffers
//! the sampler keeps: after the first token, a token allocates only top-p's bucket sums and, with
//! a penalty on, what the history's sets take as they grow.
//!
//! The same seed, history and logits always give the same token. The drawn id joins the history.
//! llama.cpp's default chain differs (its penalties look at the last 64 tokens, prompt included,
//! and it applies top-k before temperature); the results coincide only without penalties.
//!
//! [`token_logprobs`] is the model's raw distribution, `log_softmax` of the row before any of the
//! steps above (vLLM's `raw_logprobs`, and OpenAI's), in f64.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{HashMap, HashSet};

/// Sampling parameters, as the OpenAI API names them (`top_k`, `min_p` and `repetition_penalty`
/// as vLLM's OpenAI server does).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 = greedy. Must be finite and ≥ 0.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 = off.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// After temperature, drop the ids whose probability is below `min_p` × the top probability;
    /// in [0, 1], 0 = off.
    pub min_p: f32,
    /// Subtracted from the logit of every id generated at least once so far (OpenAI); finite,
    /// 0 = off.
    pub presence_penalty: f32,
    /// Subtracted from the logit of every generated id once per time it was generated (OpenAI);
    /// finite, 0 = off.
    pub frequency_penalty: f32,
    /// Divides the positive logits and multiplies the others of every id of the prompt or
    /// generated so far; finite and > 0, 1 = off.
    pub repetition_penalty: f32,
    /// Seed of the random stream.
    pub seed: u64,
    /// `(id, bias)` pairs (OpenAI `logit_bias`): `bias` is added to the logit of `id` before
    /// the penalties (module note, step 0); each bias finite. An id outside the row is skipped
    /// (the server checks ids against the vocabulary). Empty = off.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Checks every parameter against the sampler's rule (the one check: the server and `aubier
    /// run` call it, and [`Sampler::new`] too).
    ///
    /// Errors: the first parameter out of range, as a [`SampleError`] whose
    /// [`SampleError::field`] names it.
    pub fn validate(&self) -> Result<(), SampleError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SampleError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SampleError::TopP(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SampleError::MinP(self.min_p));
        }
        if !self.presence_penalty.is_finite() {
            return Err(SampleError::PresencePenalty(self.presence_penalty));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(SampleError::FrequencyPenalty(self.frequency_penalty));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(SampleError::RepetitionPenalty(self.repetition_penalty));
        }
        if let Some(&(id, bias)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
            return Err(SampleError::LogitBias(id, bias));
        }
        Ok(())
    }

    /// Whether any penalty is on (then the sampler keeps the history).
    fn penalised(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Whether the row is changed before the draw (bias or penalties: then it is copied).
    fn rewrites_row(&self) -> bool {
        self.penalised() || !self.logit_bias.is_empty()
    }
}

/// Errors of [`Sampler::new`] and [`Sampler::sample`].
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SampleError {
    /// `temperature` is negative or not finite.
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    /// `top_p` is outside (0, 1].
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    /// `min_p` is outside [0, 1].
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
    /// `presence_penalty` is not finite.
    #[error("presence_penalty must be a finite number, got {0}")]
    PresencePenalty(f32),
    /// `frequency_penalty` is not finite.
    #[error("frequency_penalty must be a finite number, got {0}")]
    FrequencyPenalty(f32),
    /// `repetition_penalty` is not a finite number > 0.
    #[error("repetition_penalty must be a finite number > 0, got {0}")]
    RepetitionPenalty(f32),
    /// A `logit_bias` entry (id, bias) whose bias is not finite.
    #[error("logit_bias of token {0} must be a finite number, got {1}")]
    LogitBias(u32, f32),
    /// The logits row is empty.
    #[error("empty logits row")]
    Empty,
    /// Every logit is NaN or −∞, so no token can be drawn.
    #[error("no finite logit to sample from")]
    NoFinite,
}

impl SampleError {
    /// The [`SamplingParams`] field at fault (its OpenAI name); `None` for an error of the
    /// logits row.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            SampleError::Temperature(_) => Some("temperature"),
            SampleError::TopP(_) => Some("top_p"),
            SampleError::MinP(_) => Some("min_p"),
            SampleError::PresencePenalty(_) => Some("presence_penalty"),
            SampleError::FrequencyPenalty(_) => Some("frequency_penalty"),
            SampleError::RepetitionPenalty(_) => Some("repetition_penalty"),
            SampleError::LogitBias(..) => Some("logit_bias"),
            SampleError::Empty | SampleError::NoFinite => None,
        }
    }
}

/// The ids the penalties look at (kept only while a penalty is on).
#[derive(Clone, Debug, Default)]
struct History {
    /// Distinct ids of the prompt and of the generated tokens (the repetition penalty's set).
    seen: HashSet<u32>,
    /// How many times each id was generated (the frequency and presence penalties').
    counts: HashMap<u32, u32>,
}

impl History {
    /// Applies the penalties of `p` to `row` in place (module note, step 1).
    fn apply(&self, p: &SamplingParams, row: &mut [f32]) {
        if p.repetition_penalty != 1.0 {
            for &id in &self.seen {
                if let Some(l) = row.get_mut(id as usize) {
                    let penalized = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                    // A finite logit stays finite, however large the penalty.
                    *l = if l.is_finite() {
                        penalized.clamp(-f32::MAX, f32::MAX)
                    } else {
                        penalized
                    };
                }
            }
        }
        for (&id, &count) in &self.counts {
            if let Some(l) = row.get_mut(id as usize) {
                *l -= p.frequency_penalty * count as f32;
                *l -= p.presence_penalty;
            }
        }
    }
}

/// A seeded sampler with its history; one per generated sequence (one per choice).
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    history: History,
    /// The candidates of the last draw as [`key`]s (kept to reuse its allocation).
    cand: Vec<u64>,
    /// The weights of each [`BLOCK`] of `cand`, summed.
    blocks: Vec<f64>,
    /// The biased and penalised copy of the last row (kept to reuse its allocation).
    row: Vec<f32>,
}

/// Candidates per partial sum: the draw walks the sums, then one block.
const BLOCK: usize = 64;

/// Sums the weights of every [`BLOCK`] of `cand` into `blocks`; returns their total.
fn block_sums(cand: &[u64], blocks: &mut Vec<f64>) -> f64 {
    blocks.clear();
    blocks.extend(
        cand.chunks(BLOCK)
            .map(|b| b.iter().map(|&c| key_weight(c)).sum::<f64>()),
    );
    blocks.iter().sum()
}

/// A candidate as one integer that orders as truncation keeps: its weight's bits (a weight is
/// a finite f32 ≥ 0, whose bits order as the numbers do) above the complement of its id, so
/// that a larger key is a larger weight, then a lower id.
fn key(id: u32, weight: f32) -> u64 {
    (u64::from(weight.to_bits()) << 32) | u64::from(!id)
}

/// The id of a [`key`].
fn key_id(k: u64) -> u32 {
    !(k as u32)
}

/// The weight of a [`key`].
fn key_weight(k: u64) -> f64 {
    f64::from(f32::from_bits((k >> 32) as u32))
}

/// Partition rounds of [`nucleus_select`] before it sorts what is left.
const NUCLEUS_ROUNDS: usize = 64;

/// Bits of a [`key`] that bucket it for [`nucleus`]: the weight's sign, exponent and 3 mantissa
/// bits (buckets an eighth of an octave wide).
const BUCKET_SHIFT: u32 = 52;

/// Reorders `cand` ([`key`]s) so that its first `k` entries are the top-p nucleus, and returns
/// `k`: the fewest of the largest keys whose weights sum to at least `need` (all of them when
/// none do). One pass sums the weights per bucket of [`BUCKET_SHIFT`]; the buckets above the
/// one where the mass reaches `need` are kept whole, and [`nucleus_select`] finds the rest
/// within that bucket.
fn nucleus(cand: &mut [u64], need: f64) -> usize {
    let mut mass = vec![0.0f64; 1 << (64 - BUCKET_SHIFT)];
    for &c in cand.iter() {
        mass[(c >> BUCKET_SHIFT) as usize] += key_weight(c);
    }
    let mut above = 0.0;
    let Some(edge) = (0..mass.len()).rev().find(|&b| {
        above += mass[b];
        above >= need
    }) else {
        return cand.len();
    };
    above -= mass[edge];
    let edge = edge as u64;
    let whole = partition(cand, |c| c >> BUCKET_SHIFT > edge);
    let within = partition(&mut cand[whole..], |c| c >> BUCKET_SHIFT == edge);
    whole + nucleus_select(&mut cand[whole..whole + within], need - above)
}

/// Moves the keys for which `first` holds to the front of `cand` (branch-free Lomuto), and
/// returns how many there are.
fn partition(cand: &mut [u64], first: impl Fn(u64) -> bool) -> usize {
    let mut store = 0;
    for i in 0..cand.len() {
        let up = first(cand[i]);
        cand.swap(i, store);
        store += usize::from(up);
    }
    store
}

/// [`nucleus`] by quickselect: partition around a pivot, keep the side where the mass reaches
/// `need` (O(n) expected); after [`NUCLEUS_ROUNDS`] rounds, a sort of what is left.
fn nucleus_select(cand: &mut [u64], need: f64) -> usize {
    let (mut lo, mut hi) = (0, cand.len());
    // The mass of `cand[..lo]`, every one of which is in the nucleus.
    let mut acc = 0.0f64;
    for _ in 0..NUCLEUS_ROUNDS {
        if hi - lo <= 32 {
            break;
        }
        // Median of three as the pivot, moved to the end of the range.
        let mid = lo + (hi - lo) / 2;
        let mut three = [lo, mid, hi - 1];
        three.sort_by_key(|&i| cand[i]);
        cand.swap(three[1], hi - 1);
        let pivot = cand[hi - 1];
        let store = lo + partition(&mut cand[lo..hi - 1], |c| c > pivot);
        let above: f64 = cand[lo..store].iter().map(|&c| key_weight(c)).sum();
        cand.swap(store, hi - 1);
        if acc + above >= need {
            hi = store;
        } else if acc + above + key_weight(pivot) >= need {
            return store + 1;
        } else {
            acc += above + key_weight(pivot);
            lo = store + 1;
        }
    }
    cand[lo..hi].sort_unstable_by(|a, b| b.cmp(a));
    for (i, &c) in cand[lo..hi].iter().enumerate() {
        acc += key_weight(c);
        if acc >= need {
            return lo + i + 1;
        }
    }
    hi
}

impl Sampler {
    /// Validates `params` and seeds the random stream; the history is empty.
    ///
    /// Errors: [`SampleError::Temperature`], [`SampleError::TopP`], [`SampleError::MinP`],
    /// [`SampleError::PresencePenalty`], [`SampleError::FrequencyPenalty`],
    /// [`SampleError::RepetitionPenalty`], [`SampleError::LogitBias`].
    pub fn new(params: SamplingParams) -> Result<Sampler, SampleError> {
        params.validate()?;
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Ok(Sampler {
            params,
            rng,
            history: History::default(),
            cand: Vec::new(),
            blocks: Vec::new(),
            row: Vec::new(),
        })
    }

    /// Adds the prompt `ids` to the history (the repetition penalty counts them as seen; the
    /// frequency and presence penalties look at generated ids only).
    pub fn with_prompt(mut self, ids: &[u32]) -> Sampler {
        if self.params.repetition_penalty != 1.0 {
            self.history.seen.extend(ids.iter().copied());
        }
        self
    }

    /// Draws one token id from `logits` (`[n_vocab]` f32, left as they are) after the logit
    /// bias and the penalties of the history, and adds it to the history.
    ///
    /// Errors: [`SampleError::Empty`], [`SampleError::NoFinite`].
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::Empty);
        }
        let id = if self.params.rewrites_row() {
            let mut row = std::mem::take(&mut self.row);
            row.clear();
            row.extend_from_slice(logits);
            for &(id, bias) in &self.params.logit_bias {
                if let Some(l) = row.get_mut(id as usize) {
                    *l += bias;
                }
            }
            self.history.apply(&self.params, &mut row);
            let drawn = self.draw(&row);
            self.row = row;
            drawn?
        } else {
            self.draw(logits)?
        };
        if self.params.penalised() {
            self.history.seen.insert(id);
            *self.history.counts.entry(id).or_insert(0) += 1;
        }
        Ok(id)
    }

    /// Steps 2–7 of the module note on an already penalised row.
    fn draw(&mut self, logits: &[f32]) -> Result<u32, SampleError> {
        let p = &self.params;
        if p.temperature == 0.0 {
            return argmax(logits).ok_or(SampleError::NoFinite);
        }
        let top = argmax(logits).ok_or(SampleError::NoFinite)?;
        let max = logits[top as usize];
        if max == f32::NEG_INFINITY {
            return Err(SampleError::NoFinite);
        }
        let inv_t = 1.0 / p.temperature;
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, &l)| key(i as u32, ((l - max) * inv_t).exp())),
        );
        if p.min_p > 0.0 {
            // The weight is p_i / p_max, 1 for the top id, which always stays.
            let min_p = f64::from(p.min_p);
            cand.retain(|&c| key_weight(c) >= min_p);
        }
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, |a, b| b.cmp(a));
            cand.truncate(p.top_k);
        }
        let blocks = &mut self.blocks;
        let mut total = block_sums(cand, blocks);
        if p.top_p < 1.0 {
            let kept = nucleus(cand, f64::from(p.top_p) * total);
            cand.truncate(kept);
            total = block_sums(cand, blocks);
        }
        let mut u = self.rng.random::<f64>() * total;
        for (block, &sum) in cand.chunks(BLOCK).zip(blocks.iter()) {
            if u >= sum {
                u -= sum;
                continue;
            }
            for &c in block {
                let w = key_weight(c);
                if u < w {
                    return Ok(key_id(c));
                }
                u -= w;
            }
        }
        Ok(cand
            .iter()
            .rfind(|&&c| key_weight(c) > 0.0)
            .map_or(top, |&c| key_id(c)))
    }
}

/// Index of the largest logit, lowest id on ties; NaN never wins. `None` when every entry is NaN.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    // The maximum by lanes (`f32::max` passes over NaN), then its first position.
    let mut lanes = [f32::NAN; 16];
    let mut chunks = logits.chunks_exact(16);
    for c in &mut chunks {
        for (m, &l) in lanes.iter_mut().zip(c) {
            *m = m.max(l);
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NAN, |m, &l| m.max(l));
    logits.iter().position(|&l| l == max).map(|i| i as u32)
}

/// Log-probabilities of one position under the model's raw distribution.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// `log_softmax(row)[id]` of the token asked about (natural log, ≤ 0; −∞ for a −∞ or NaN
    /// logit).
    pub logprob: f64,
    /// The most likely ids and their log-probabilities, by descending probability, lower id
    /// first on ties.
    pub top: Vec<(u32, f64)>,
}

/// A logit as the log-probability functions read it: NaN counts as −∞.
fn finite_or_minus_inf(l: f32) -> f64 {
    if l.is_nan() {
        f64::NEG_INFINITY
    } else {
        f64::from(l)
    }
}

/// `log Σ exp(logits)` of a row (`[n_vocab]` f32; NaN counts as −∞), in f64 around the row's
/// maximum; +∞ for a row with no finite logit (so every log-probability is −∞). `logit −
/// logsumexp(row)` is the token's log-probability; `aubier quality`'s NLL is its negation.
pub fn logsumexp(logits: &[f32]) -> f64 {
    let max = logits
        .iter()
        .map(|&l| finite_or_minus_inf(l))
        .fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return f64::INFINITY;
    }
    max + logits
        .iter()
        .map(|&l| (finite_or_minus_inf(l) - max).exp())
        .sum::<f64>()
        .ln()
}

/// The raw log-probability of `id` in `logits` (`[n_vocab]` f32, finite or −∞; NaN counts as
/// −∞) and the `top` most likely ids (all of them when `top ≥ n_vocab`): `logit − logsumexp(row)`
/// in f64, before penalties, temperature or any truncation. A row with no finite logit gives −∞
/// everywhere; an `id` outside the row gives −∞.
pub fn token_logprobs(logits: &[f32], id: u32, top: usize) -> TokenLogprobs {
    let key = finite_or_minus_inf;
    let lse = logsumexp(logits);
    let logprob = |i: u32| {
        logits
            .get(i as usize)
            .map_or(f64::NEG_INFINITY, |&l| key(l) - lse)
    };
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let order = |a: &u32, b: &u32| {
        key(logits[*b as usize])
            .total_cmp(&key(logits[*a as usize]))
            .then(a.cmp(b))
    };
    let k = top.min(ids.len());
    if k > 0 && k < ids.len() {
        ids.select_nth_unstable_by(k - 1, order);
    }
    ids.truncate(k);
    ids.sort_unstable_by(order);
    TokenLogprobs {
        logprob: logprob(id),
        top: ids.into_iter().map(|i| (i, logprob(i))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    /// `n` draws, one fresh sampler per seed, each first fed `prefix` (one-hot rows) and then
    /// sampling `logits`.
    fn draws(p: &SamplingParams, prefix: &[&[f32]], logits: &[f32], n: u64) -> Vec<u32> {
        (0..n)
            .map(|seed| {
                let mut s = Sampler::new(SamplingParams { seed, ..p.clone() }).unwrap();
                for row in prefix {
                    s.sample(row).unwrap();
                }
                s.sample(logits).unwrap()
            })
            .collect()
    }

    #[test]
    fn greedy_takes_lowest_id_on_ties_and_skips_nan() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&[1.0, 3.0, 3.0, f32::NAN]).unwrap(), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), None);
    }

    #[test]
    fn same_seed_same_stream_and_top_k_one_is_greedy() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let p = SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: 7,
            ..SamplingParams::default()
        };
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone()).unwrap();
            (0..20)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(&p), draw(&p));
        let other = SamplingParams {
            seed: 8,
            ..p.clone()
        };
        assert_ne!(draw(&p), draw(&other));
        let k1 = SamplingParams { top_k: 1, ..p };
        let greedy = argmax(&logits).unwrap();
        assert!(draw(&k1).iter().all(|&t| t == greedy));
    }

    /// The ids a full sort keeps (min-p, then top-k, then top-p on the sorted rest) and their
    /// probabilities: the reference the selection-based draw must agree with.
    fn reference(p: &SamplingParams, logits: &[f32]) -> Vec<(u32, f64)> {
        let inv_t = 1.0 / f64::from(p.temperature);
        let mut c: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, f64::from(l) * inv_t))
            .collect();
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let max = c[0].1;
        c.retain(|x| (x.1 - max).exp() >= f64::from(p.min_p));
        if p.top_k > 0 {
            c.truncate(p.top_k);
        }
        let w: Vec<f64> = c.iter().map(|x| (x.1 - max).exp()).collect();
        let total: f64 = w.iter().sum();
        let (mut kept, mut mass) = (0, 0.0);
        for x in &w {
            kept += 1;
            mass += x / total;
            if mass >= f64::from(p.top_p) {
                break;
            }
        }
        let kept_total: f64 = w[..kept].iter().sum();
        c.iter()
            .zip(&w)
            .take(kept)
            .map(|(x, w)| (x.0, w / kept_total))
            .collect()
    }

    /// Draws `n` tokens of `logits` under `p` (one seed each) and checks them against `prob`
    /// (id → probability): every draw is a key of `prob`, and every id of probability ≥ 2 % is
    /// drawn within five standard deviations of its binomial count (a false alarm has
    /// probability below 1e-6 per id; the seeds are fixed, so a pass is reproducible). Returns
    /// the count of each id drawn.
    fn drawn_as(
        p: &SamplingParams,
        logits: &[f32],
        prob: &HashMap<u32, f64>,
        n: u64,
    ) -> HashMap<u32, u32> {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for id in draws(p, &[], logits, n) {
            assert!(
                prob.contains_key(&id),
                "{p:?}: drew {id}, outside the kept set"
            );
            *counts.entry(id).or_insert(0) += 1;
        }
        for (&id, &q) in prob.iter().filter(|(_, &q)| q >= 0.02) {
            let got = f64::from(counts.get(&id).copied().unwrap_or(0));
            let mean = q * n as f64;
            let sd = (n as f64 * q * (1.0 - q)).sqrt();
            assert!(
                (got - mean).abs() <= 5.0 * sd,
                "{p:?}: id {id} drawn {got} times, expected {mean:.0} ± {sd:.0}"
            );
        }
        counts
    }

    #[test]
    fn truncation_keeps_what_a_full_sort_keeps_and_draws_by_its_probabilities() {
        // A row of 5000 logits from a fixed LCG, in [0, 4), every tenth one repeated (ties);
        // at temperature 0.7 top-p 0.9 keeps thousands of ids, so the nucleus selection grows
        // past its first 256 and 1024 candidates.
        let mut x = 12345u64;
        let logits: Vec<f32> = (0..5000)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if i % 10 == 9 {
                    1.5
                } else {
                    (x >> 40) as f32 / (1u64 << 24) as f32 * 4.0
                }
            })
            .collect();
        for (top_k, top_p, min_p) in [
            (0, 1.0, 0.0),
            (7, 1.0, 0.0),
            (300, 0.5, 0.0),
            (0, 0.9, 0.0),
            (0, 0.999, 0.05),
            (0, 1.0, 0.3),
            (40, 0.9, 0.05),
        ] {
            let p = SamplingParams {
                temperature: 0.7,
                top_k,
                top_p,
                min_p,
                ..SamplingParams::default()
            };
            let want = reference(&p, &logits);
            let prob: HashMap<u32, f64> = want.iter().copied().collect();
            let n = 4000;
            let counts = drawn_as(&p, &logits, &prob, n);
            // As many distinct ids as the kept set gives in `n` draws (a draw from too small a
            // set falls short).
            let distinct: f64 = prob.values().map(|q| 1.0 - (1.0 - q).powi(n as i32)).sum();
            assert!(
                counts.len() as f64 >= 0.9 * distinct,
                "{p:?}: {} distinct ids drawn, {distinct:.0} expected of {} kept",
                counts.len(),
                want.len()
            );
        }
    }

    /// A row of `n` logits from a fixed LCG, in [0, 4).
    fn lcg_row(n: usize) -> Vec<f32> {
        let mut x = 987654321u64;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 40) as f32 / (1u64 << 24) as f32 * 4.0
            })
            .collect()
    }

    #[test]
    fn a_bias_of_minus_100_turns_greedy_to_the_runner_up_and_plus_100_forces() {
        let logits = lcg_row(1000);
        let by_value = |a: &usize, b: &usize| logits[*a].total_cmp(&logits[*b]);
        let top = (0..logits.len()).max_by(by_value).unwrap();
        let second = (0..logits.len())
            .filter(|&i| i != top)
            .max_by(by_value)
            .unwrap();
        let lowest = (0..logits.len()).min_by(by_value).unwrap();
        assert_eq!(
            Sampler::new(params(0.0)).unwrap().sample(&logits),
            Ok(top as u32)
        );
        let banned = SamplingParams {
            logit_bias: vec![(top as u32, -100.0)],
            ..params(0.0)
        };
        assert_eq!(
            Sampler::new(banned).unwrap().sample(&logits),
            Ok(second as u32)
        );
        // The row spans less than 4, so +100 leaves every other id below e^-96 of it.
        for temperature in [0.0, 1.0] {
            let forced = SamplingParams {
                logit_bias: vec![(lowest as u32, 100.0), (5000, -100.0)],
                ..params(temperature)
            };
            assert!(draws(&forced, &[], &logits, 200)
                .iter()
                .all(|&id| id == lowest as u32));
        }
    }

    #[test]
    fn biased_draws_follow_the_softmax_of_the_biased_logits() {
        let logits = lcg_row(50);
        let bias = vec![(3, 2.5), (17, -1.0), (40, 1.25), (49, -100.0)];
        let mut biased = logits.clone();
        for &(id, b) in &bias {
            biased[id as usize] += b;
        }
        for p in [
            params(0.8),
            SamplingParams {
                top_p: 0.9,
                top_k: 20,
                ..params(0.8)
            },
        ] {
            let want: HashMap<u32, f64> = reference(&p, &biased).into_iter().collect();
            let with_bias = SamplingParams {
                logit_bias: bias.clone(),
                ..p.clone()
            };
            // The biased ids 3 and 40 are among those `drawn_as` checks (probability ≥ 2 %), and
            // 49 (−100) is never drawn.
            assert!(want[&3] >= 0.02 && want[&40] >= 0.02);
            let counts = drawn_as(&with_bias, &logits, &want, 4000);
            assert!(!counts.contains_key(&49));
        }
    }

    #[test]
    fn the_bias_comes_before_the_repetition_penalty() {
        // vLLM's order: (2 − 4) · 2 = −4 < −3.5, so id 1 wins; the penalty first would give
        // 2 / 2 − 4 = −3 > −3.5 and id 0.
        let p = SamplingParams {
            repetition_penalty: 2.0,
            logit_bias: vec![(0, -4.0)],
            ..params(0.0)
        };
        let mut s = Sampler::new(p).unwrap().with_prompt(&[0]);
        assert_eq!(s.sample(&[2.0, -3.5]), Ok(1));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // p = softmax([10, 0, 0]) puts > 0.99 on id 0, so top_p 0.9 keeps id 0 alone.
        let p = SamplingParams {
            top_p: 0.9,
            ..params(1.0)
        };
        let mut s = Sampler::new(p).unwrap();
        for _ in 0..100 {
            assert_eq!(s.sample(&[10.0, 0.0, 0.0]).unwrap(), 0);
        }
    }

    #[test]
    fn penalties_by_hand() {
        // Seen {0, 1, 2}; generated 1 twice and 2 once. Repetition 2: 2/2 = 1, -1·2 = -2,
        // 3/2 = 1.5, id 3 unseen. Then frequency 0.5 and presence 0.25 on the generated ids:
        // -2 - 0.5·2 - 0.25 = -3.25 and 1.5 - 0.5·1 - 0.25 = 0.75.
        let p = SamplingParams {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplingParams::default()
        };
        let h = History {
            seen: [0, 1, 2].into_iter().collect(),
            counts: [(1, 2), (2, 1)].into_iter().collect(),
        };
        let mut row = [2.0, -1.0, 3.0, 4.0];
        h.apply(&p, &mut row);
        assert_eq!(row, [1.0, -3.25, 0.75, 4.0]);

        // The sampler builds that history from the prompt and its own draws.
        let mut s = Sampler::new(p).unwrap().with_prompt(&[0, 0]);
        let one_hot = |i: usize| {
            let mut r = [f32::NEG_INFINITY; 4];
            r[i] = 0.0;
            r
        };
        for i in [1, 2, 1] {
            assert_eq!(s.sample(&one_hot(i)).unwrap(), i as u32);
        }
        let mut row = [2.0, -1.0, 3.0, 4.0];
        s.history.apply(&s.params, &mut row);
        assert_eq!(row, [1.0, -3.25, 0.75, 4.0]);
    }

    #[test]
    fn repetition_penalty_moves_greedy_and_covers_prompt_and_output() {
        let rep = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        // 3/2 = 1.5 < 2: the prompt's id loses.
        let mut s = Sampler::new(rep.clone()).unwrap().with_prompt(&[0]);
        assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 1);
        // A negative logit is multiplied: -1·2 = -2 < -1.5.
        let mut s = Sampler::new(rep.clone()).unwrap().with_prompt(&[0]);
        assert_eq!(s.sample(&[-1.0, -1.5]).unwrap(), 1);
        // No prompt: the generated ids count. 0, then [1.5, 2] → 1, then [1.5, 1] → 0.
        let mut s = Sampler::new(rep).unwrap();
        let seq: Vec<u32> = (0..3).map(|_| s.sample(&[3.0, 2.0]).unwrap()).collect();
        assert_eq!(seq, [0, 1, 0]);
        // Off at its default.
        let mut s = Sampler::new(SamplingParams::default())
            .unwrap()
            .with_prompt(&[0]);
        assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 0);
    }

    #[test]
    fn an_extreme_repetition_penalty_keeps_finite_logits_finite() {
        for penalty in [f32::MAX, f32::MIN_POSITIVE / 4.0] {
            let p = SamplingParams {
                repetition_penalty: penalty,
                temperature: 1.0,
                ..SamplingParams::default()
            };
            let mut s = Sampler::new(p).unwrap().with_prompt(&[0, 1]);
            let mut row = [-10_000.0, 3.0, f32::NEG_INFINITY];
            s.history.apply(&s.params, &mut row);
            assert!(row[..2].iter().all(|l| l.is_finite()), "{penalty}: {row:?}");
            assert_eq!(row[2], f32::NEG_INFINITY);
            assert!(s.sample(&[-10_000.0, 3.0, f32::NEG_INFINITY]).unwrap() < 2);
        }
    }

    #[test]
    fn frequency_counts_every_time_presence_once_and_neither_the_prompt() {
        let logits = [1.0, 0.9, 0.0];
        let run = |p: SamplingParams| {
            let mut s = Sampler::new(p).unwrap().with_prompt(&[0, 0, 0]);
            (0..5)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        // Frequency 0.15: [1, .9] → 0; [.85, .9] → 1; [.85, .75] → 0; [.7, .75] → 1; [.7, .6] → 0.
        let freq = run(SamplingParams {
            frequency_penalty: 0.15,
            ..SamplingParams::default()
        });
        assert_eq!(freq, [0, 1, 0, 1, 0]);
        // Presence 0.15: [1, .9] → 0; [.85, .9] → 1; then [.85, .75] for good → 0.
        let presence = run(SamplingParams {
            presence_penalty: 0.15,
            ..SamplingParams::default()
        });
        assert_eq!(presence, [0, 1, 0, 0, 0]);
        // A negative penalty favours repetition: 0 forever.
        let negative = run(SamplingParams {
            frequency_penalty: -0.5,
            presence_penalty: -0.5,
            ..SamplingParams::default()
        });
        assert_eq!(negative, [0; 5]);
    }

    #[test]
    fn min_p_applies_after_temperature() {
        // p = [0.5, 0.3, 0.15, 0.05]; min_p 0.4. At T = 1, p/p_max = [1, .6, .3, .1]: ids 0 and 1
        // stay. At T = 2, p/p_max = sqrt(...) = [1, .775, .548, .316]: ids 0, 1 and 2 stay.
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        for (t, kept) in [(1.0, 2), (2.0, 3)] {
            let p = SamplingParams {
                min_p: 0.4,
                ..params(t)
            };
            let got = draws(&p, &[], &logits, 400);
            for id in 0..4 {
                assert_eq!(got.contains(&id), id < kept, "T {t}: id {id}");
            }
        }
        // min_p 1 keeps the top id only.
        let p = SamplingParams {
            min_p: 1.0,
            ..params(1.0)
        };
        assert!(draws(&p, &[], &logits, 100).iter().all(|&id| id == 0));
    }

    #[test]
    fn penalties_apply_before_temperature() {
        // Generated once: id 0. Frequency 1 makes [1, 0] into [0, 0], which T = 0.5 leaves even,
        // so min_p 0.9 keeps both. Temperature first would give [2, 0] - [1, 0] = [1, 0]:
        // p1/p0 = e^-1 < 0.9, id 1 dropped.
        let p = SamplingParams {
            frequency_penalty: 1.0,
            min_p: 0.9,
            ..params(0.5)
        };
        let got = draws(&p, &[&[0.0, f32::NEG_INFINITY]], &[1.0, 0.0], 200);
        assert!(got.contains(&0) && got.contains(&1), "{got:?}");
    }

    #[test]
    fn bad_parameters_are_refused() {
        let d = SamplingParams::default;
        for (p, e) in [
            (
                SamplingParams {
                    temperature: -1.0,
                    ..d()
                },
                SampleError::Temperature(-1.0),
            ),
            (SamplingParams { top_p: 0.0, ..d() }, SampleError::TopP(0.0)),
            (SamplingParams { min_p: 1.5, ..d() }, SampleError::MinP(1.5)),
            (
                SamplingParams {
                    presence_penalty: f32::INFINITY,
                    ..d()
                },
                SampleError::PresencePenalty(f32::INFINITY),
            ),
            (
                SamplingParams {
                    frequency_penalty: f32::NEG_INFINITY,
                    ..d()
                },
                SampleError::FrequencyPenalty(f32::NEG_INFINITY),
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..d()
                },
                SampleError::RepetitionPenalty(0.0),
            ),
            (
                SamplingParams {
                    logit_bias: vec![(1, 1.0), (7, f32::INFINITY)],
                    ..d()
                },
                SampleError::LogitBias(7, f32::INFINITY),
            ),
        ] {
            let name = format!("{:?}", e).to_ascii_lowercase();
            let field = e.field().unwrap().replace('_', "");
            assert!(name.starts_with(&field), "{e:?} names {field}");
            assert_eq!(p.validate().unwrap_err(), e);
            assert_eq!(Sampler::new(p).unwrap_err(), e);
        }
        assert_eq!(d().validate(), Ok(()));
        assert_eq!(SampleError::Empty.field(), None);
        let mut s = Sampler::new(d()).unwrap();
        assert_eq!(s.sample(&[]).unwrap_err(), SampleError::Empty);
    }

    #[test]
    fn logsumexp_treats_nan_as_minus_infinity() {
        let e = std::f64::consts::E;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(logsumexp(&[1.0, 0.0, f32::NAN]), (e + 1.0).ln()));
        assert!(close(logsumexp(&[1000.0, 1000.0]), 1000.0 + 2f64.ln()));
        assert_eq!(logsumexp(&[f32::NEG_INFINITY, f32::NAN]), f64::INFINITY);
        assert_eq!(logsumexp(&[]), f64::INFINITY);
    }

    #[test]
    fn logprobs_are_the_raw_log_softmax() {
        // softmax([1, 0, 0, -inf]) = [e, 1, 1, 0] / (e + 2).
        let e = std::f64::consts::E;
        let row = [0.0, 1.0, 0.0, f32::NEG_INFINITY];
        let lp = token_logprobs(&row, 2, 2);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(lp.logprob, -(e + 2.0).ln()), "{lp:?}");
        assert_eq!(lp.top.len(), 2);
        assert_eq!(
            (lp.top[0].0, lp.top[1].0),
            (1, 0),
            "ties: the lower id first"
        );
        assert!(close(lp.top[0].1, 1.0 - (e + 2.0).ln()));
        assert!(close(lp.top[1].1, -(e + 2.0).ln()));
        // Asking for more than the row holds gives all of it, −∞ last; NaN counts as −∞.
        let all = token_logprobs(&[0.0, f32::NAN, 0.0], 1, 10);
        assert_eq!(all.logprob, f64::NEG_INFINITY);
        assert_eq!(all.top.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 2, 1]);
        assert!(close(all.top[0].1, -(2f64).ln()));
        // No top entries when none are asked for; an id outside the row, or a row with no finite
        // logit, is −∞.
        assert!(token_logprobs(&row, 0, 0).top.is_empty());
        assert_eq!(token_logprobs(&row, 9, 0).logprob, f64::NEG_INFINITY);
        let none = token_logprobs(&[f32::NEG_INFINITY; 2], 0, 1);
        assert_eq!(none.logprob, f64::NEG_INFINITY);
        assert_eq!(none.top, vec![(0, f64::NEG_INFINITY)]);
    }
}
