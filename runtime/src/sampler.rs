//! Token sampling from one row of logits: greedy, temperature, top-k, top-p, seeded.
//!
//! Algorithm (the order vLLM and the OpenAI API imply): with `temperature == 0` take the argmax
//! (lowest id on ties, as the reference greedy chains do). Otherwise scale the logits by
//! `1/temperature`, keep the `top_k` largest (0 = all; ties broken by the lower id), softmax them in
//! f64, keep the smallest prefix (by descending probability) whose mass reaches `top_p`, renormalise,
//! and draw with a ChaCha8 stream seeded by `seed` — the same seed and logits always give the same
//! token sequence.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sampling parameters, as the OpenAI API names them.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 = greedy. Must be finite and ≥ 0.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 = off.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Seed of the random stream.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
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
    /// The logits row is empty.
    #[error("empty logits row")]
    Empty,
    /// Every logit is NaN or −∞, so no token can be drawn.
    #[error("no finite logit to sample from")]
    NoFinite,
}

/// A seeded sampler; one per request.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// Validates `params` and seeds the random stream.
    ///
    /// Errors: [`SampleError::Temperature`], [`SampleError::TopP`].
    pub fn new(params: SamplingParams) -> Result<Sampler, SampleError> {
        if !params.temperature.is_finite() || params.temperature < 0.0 {
            return Err(SampleError::Temperature(params.temperature));
        }
        if !(params.top_p > 0.0 && params.top_p <= 1.0) {
            return Err(SampleError::TopP(params.top_p));
        }
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Ok(Sampler { params, rng })
    }

    /// Draws one token id from `logits` (`[n_vocab]` f32).
    ///
    /// Errors: [`SampleError::Empty`], [`SampleError::NoFinite`].
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::Empty);
        }
        if self.params.temperature == 0.0 {
            return argmax(logits).ok_or(SampleError::NoFinite);
        }
        let inv_t = 1.0 / f64::from(self.params.temperature);
        let mut cand: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan() && **l != f32::NEG_INFINITY)
            .map(|(i, &l)| (i as u32, f64::from(l) * inv_t))
            .collect();
        if cand.is_empty() {
            return Err(SampleError::NoFinite);
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.params.top_k > 0 {
            cand.truncate(self.params.top_k);
        }
        let max = cand[0].1;
        let mut total = 0.0;
        for c in cand.iter_mut() {
            c.1 = (c.1 - max).exp();
            total += c.1;
        }
        let top_p = f64::from(self.params.top_p);
        let mut kept = 0;
        let mut mass = 0.0;
        for c in cand.iter() {
            kept += 1;
            mass += c.1 / total;
            if mass >= top_p {
                break;
            }
        }
        cand.truncate(kept);
        let kept_total: f64 = cand.iter().map(|c| c.1).sum();
        let mut u = self.rng.random::<f64>() * kept_total;
        for &(id, w) in &cand {
            if u < w {
                return Ok(id);
            }
            u -= w;
        }
        Ok(cand[cand.len() - 1].0)
    }
}

/// Index of the largest logit, lowest id on ties; NaN never wins. `None` when every entry is NaN.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if l <= b => {}
            _ => best = Some((i, l)),
        }
    }
    best.map(|(i, _)| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            top_k: 0,
            seed: 7,
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

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // p = softmax([10, 0, 0]) puts > 0.99 on id 0, so top_p 0.9 keeps id 0 alone.
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            top_k: 0,
            seed: 1,
        };
        let mut s = Sampler::new(p).unwrap();
        for _ in 0..100 {
            assert_eq!(s.sample(&[10.0, 0.0, 0.0]).unwrap(), 0);
        }
    }

    #[test]
    fn bad_parameters_are_refused() {
        let bad_t = SamplingParams {
            temperature: -1.0,
            ..SamplingParams::default()
        };
        assert_eq!(
            Sampler::new(bad_t).unwrap_err(),
            SampleError::Temperature(-1.0)
        );
        let bad_p = SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        };
        assert_eq!(Sampler::new(bad_p).unwrap_err(), SampleError::TopP(0.0));
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&[]).unwrap_err(), SampleError::Empty);
    }
}
