//! Synthetic routing traces with a known skew and a rotating hot set, for policy benchmarks.
//!
//! Model, per layer: a random permutation maps popularity ranks to experts; rank `r` (0-based) has
//! weight `(r + 1)^-zipf` (Zipf-like). Each token draws `top_k` distinct ranks by successive weighted
//! draws without replacement (each draw renormalises over the ranks left), and routes to the experts
//! holding them. Before each token, the hot set drifts: `drift` swaps per token on average (the
//! integer part always, the fractional part with that probability), each exchanging the expert at
//! a uniform rank in `0..hot` with the expert at a uniform rank in `hot..n_experts` — a hot expert
//! goes cold and a cold one takes its place, the rotation seen within a generation. Tokens are
//! grouped into sequences of `seq_len` (`seq` counts them, `pos` restarts at 0). All randomness comes
//! from one ChaCha8 stream seeded by `seed`, so a spec always gives the same trace.

use super::trace::{Trace, TraceError, TraceRecord};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;
use std::str::FromStr;

/// Parameters of a synthetic trace; the text form is `key=value` pairs joined by commas
/// (`experts=128,top_k=4,layers=36,tokens=4096,seq_len=512,zipf=1,hot=32,drift=0.05,seed=0`),
/// missing keys taking the [`Default`] values.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticSpec {
    /// Experts per layer (`experts`).
    pub n_experts: u32,
    /// Experts per token per layer (`top_k`).
    pub top_k: u32,
    /// MoE layers (`layers`).
    pub n_layers: usize,
    /// Tokens (`tokens`).
    pub tokens: usize,
    /// Tokens per sequence (`seq_len`).
    pub seq_len: usize,
    /// Zipf exponent of the rank weights (`zipf`); 0 = uniform.
    pub zipf: f64,
    /// Size of the hot region of ranks that drift swaps out of (`hot`), in `1..n_experts`;
    /// `None` = `max(1, n_experts / 4)`.
    pub hot: Option<u32>,
    /// Mean swaps per token per layer (`drift`); 0 = a fixed hot set.
    pub drift: f64,
    /// Seed of the random stream (`seed`).
    pub seed: u64,
}

impl Default for SyntheticSpec {
    /// Mistral Small 4's shape (128 experts, top-4, 36 layers), 4096 tokens in sequences of 512,
    /// Zipf 1, hot region `n_experts / 4`, 0.05 swaps per token, seed 0.
    fn default() -> Self {
        SyntheticSpec {
            n_experts: 128,
            top_k: 4,
            n_layers: 36,
            tokens: 4096,
            seq_len: 512,
            zipf: 1.0,
            hot: None,
            drift: 0.05,
            seed: 0,
        }
    }
}

/// Errors of parsing or checking a [`SyntheticSpec`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SyntheticError {
    /// A pair is not `key=value`, or the key is unknown.
    #[error("synthetic spec: `{0}` is not one of experts, top_k, layers, tokens, seq_len, zipf, hot, drift, seed as key=value")]
    Key(String),
    /// A value does not parse as the key's type.
    #[error("synthetic spec: {key} = `{value}` is not a valid {expected}")]
    Value {
        /// The key.
        key: &'static str,
        /// The text given.
        value: String,
        /// The type wanted.
        expected: &'static str,
    },
    /// The values are inconsistent.
    #[error("synthetic spec: {0}")]
    Invalid(String),
}

impl fmt::Display for SyntheticSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "experts={},top_k={},layers={},tokens={},seq_len={},zipf={},hot={},drift={},seed={}",
            self.n_experts,
            self.top_k,
            self.n_layers,
            self.tokens,
            self.seq_len,
            self.zipf,
            self.hot(),
            self.drift,
            self.seed
        )
    }
}

fn parse_value<T: FromStr>(
    key: &'static str,
    value: &str,
    expected: &'static str,
) -> Result<T, SyntheticError> {
    value.trim().parse().map_err(|_| SyntheticError::Value {
        key,
        value: value.to_string(),
        expected,
    })
}

impl FromStr for SyntheticSpec {
    type Err = SyntheticError;

    /// Parses `key=value,…` over the defaults, then [`SyntheticSpec::check`]s. An empty string is
    /// the default spec.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut spec = SyntheticSpec::default();
        for pair in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| SyntheticError::Key(pair.to_string()))?;
            const INT: &str = "non-negative integer";
            const NUM: &str = "number";
            match key.trim() {
                "experts" => spec.n_experts = parse_value("experts", value, INT)?,
                "top_k" => spec.top_k = parse_value("top_k", value, INT)?,
                "layers" => spec.n_layers = parse_value("layers", value, INT)?,
                "tokens" => spec.tokens = parse_value("tokens", value, INT)?,
                "seq_len" => spec.seq_len = parse_value("seq_len", value, INT)?,
                "zipf" => spec.zipf = parse_value("zipf", value, NUM)?,
                "hot" => spec.hot = Some(parse_value("hot", value, INT)?),
                "drift" => spec.drift = parse_value("drift", value, NUM)?,
                "seed" => spec.seed = parse_value("seed", value, INT)?,
                _ => return Err(SyntheticError::Key(pair.to_string())),
            }
        }
        spec.check()?;
        Ok(spec)
    }
}

impl SyntheticSpec {
    /// The hot region in effect: `hot`, or `max(1, n_experts / 4)` when unset.
    pub fn hot(&self) -> u32 {
        self.hot.unwrap_or((self.n_experts / 4).max(1))
    }

    /// Checks the values: `1 ≤ top_k ≤ experts`, `layers`, `tokens`, `seq_len` ≥ 1, `zipf` and
    /// `drift` finite and ≥ 0, `1 ≤ hot < experts`. Errors: `Invalid`, naming the value.
    pub fn check(&self) -> Result<(), SyntheticError> {
        let bad = |m: String| Err(SyntheticError::Invalid(m));
        if self.top_k == 0 || self.top_k > self.n_experts {
            return bad(format!(
                "top_k = {} must be in 1..=experts ({})",
                self.top_k, self.n_experts
            ));
        }
        if self.n_layers == 0 || self.tokens == 0 || self.seq_len == 0 {
            return bad("layers, tokens and seq_len must be >= 1".to_string());
        }
        if !(self.zipf.is_finite() && self.zipf >= 0.0) {
            return bad(format!("zipf = {} must be finite and >= 0", self.zipf));
        }
        if !(self.drift.is_finite() && self.drift >= 0.0) {
            return bad(format!("drift = {} must be finite and >= 0", self.drift));
        }
        if self.hot() == 0 || self.hot() >= self.n_experts {
            return bad(format!(
                "hot = {} must be in 1..experts ({})",
                self.hot(),
                self.n_experts
            ));
        }
        Ok(())
    }
}

/// Draws `k` distinct ranks, successive draws without replacement proportional to `weights`.
fn draw_ranks(
    rng: &mut ChaCha8Rng,
    weights: &[f64],
    k: usize,
    taken: &mut [bool],
    out: &mut Vec<usize>,
) {
    taken.fill(false);
    out.clear();
    let mut left: f64 = weights.iter().sum();
    for _ in 0..k {
        let mut u = rng.random::<f64>() * left;
        let mut pick = None;
        for (r, &w) in weights.iter().enumerate() {
            if taken[r] {
                continue;
            }
            pick = Some(r);
            if u < w {
                break;
            }
            u -= w;
        }
        // `pick` is the rank drawn, or the last rank left when rounding ran past the end.
        if let Some(r) = pick {
            taken[r] = true;
            left -= weights[r];
            out.push(r);
        }
    }
}

/// Generates the trace a spec describes. Errors: [`SyntheticSpec::check`]'s (as
/// [`SyntheticError::Invalid`]).
pub fn synthetic_trace(spec: &SyntheticSpec) -> Result<Trace, SyntheticError> {
    spec.check()?;
    let n = spec.n_experts as usize;
    let hot = spec.hot() as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let weights: Vec<f64> = (0..n).map(|r| ((r + 1) as f64).powf(-spec.zipf)).collect();
    let mut perms: Vec<Vec<u32>> = (0..spec.n_layers)
        .map(|_| {
            let mut p: Vec<u32> = (0..spec.n_experts).collect();
            p.shuffle(&mut rng);
            p
        })
        .collect();
    let mut taken = vec![false; n];
    let mut ranks = Vec::with_capacity(spec.top_k as usize);
    let mut records = Vec::with_capacity(spec.tokens);
    for t in 0..spec.tokens {
        let mut layers = Vec::with_capacity(spec.n_layers);
        for perm in &mut perms {
            let swaps =
                spec.drift.floor() as usize + usize::from(rng.random::<f64>() < spec.drift.fract());
            for _ in 0..swaps {
                let a = rng.random_range(0..hot);
                let b = rng.random_range(hot..n);
                perm.swap(a, b);
            }
            draw_ranks(
                &mut rng,
                &weights,
                spec.top_k as usize,
                &mut taken,
                &mut ranks,
            );
            layers.push(ranks.iter().map(|&r| perm[r]).collect());
        }
        records.push(TraceRecord {
            seq: (t / spec.seq_len) as u64,
            pos: (t % spec.seq_len) as u64,
            n_experts: spec.n_experts,
            top_k: spec.top_k,
            layers,
        });
    }
    Trace::from_records(&records).map_err(|e: TraceError| SyntheticError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parses_over_defaults_and_round_trips() {
        let s: SyntheticSpec = "experts=16, top_k=2,tokens=100,zipf=0.5".parse().unwrap();
        assert_eq!(
            s,
            SyntheticSpec {
                n_experts: 16,
                top_k: 2,
                tokens: 100,
                zipf: 0.5,
                ..SyntheticSpec::default()
            }
        );
        assert_eq!(s.hot(), 4);
        let again: SyntheticSpec = s.to_string().parse().unwrap();
        assert_eq!(again.to_string(), s.to_string());
    }

    #[test]
    fn spec_errors_name_the_key() {
        assert!(matches!(
            "expert=4".parse::<SyntheticSpec>(),
            Err(SyntheticError::Key(_))
        ));
        assert_eq!(
            "zipf=x".parse::<SyntheticSpec>().unwrap_err().to_string(),
            "synthetic spec: zipf = `x` is not a valid number"
        );
        assert!(matches!(
            "top_k=200".parse::<SyntheticSpec>(),
            Err(SyntheticError::Invalid(_))
        ));
        assert!(matches!(
            "hot=128".parse::<SyntheticSpec>(),
            Err(SyntheticError::Invalid(_))
        ));
    }

    #[test]
    fn traces_are_deterministic_and_shaped() {
        let spec: SyntheticSpec = "experts=16,top_k=4,layers=3,tokens=50,seq_len=20,hot=4"
            .parse()
            .unwrap();
        let a = synthetic_trace(&spec).unwrap();
        assert_eq!(a, synthetic_trace(&spec).unwrap());
        assert_eq!(
            (a.tokens(), a.n_layers(), a.top_k(), a.n_experts()),
            (50, 3, 4, 16)
        );
        let r = a.record(45).unwrap();
        assert_eq!((r.seq, r.pos), (2, 5));
        let other = SyntheticSpec { seed: 1, ..spec };
        assert_ne!(a, synthetic_trace(&other).unwrap());
    }

    #[test]
    fn skew_follows_the_zipf_weights() {
        // No drift: each layer's rank order is fixed, so the most frequent expert of a layer must be
        // drawn far more often than the median one under Zipf 1.2, and about as often under Zipf 0.
        let freq = |zipf: f64| {
            let spec = SyntheticSpec {
                n_experts: 32,
                top_k: 1,
                n_layers: 1,
                tokens: 20_000,
                zipf,
                hot: Some(8),
                drift: 0.0,
                ..SyntheticSpec::default()
            };
            let t = synthetic_trace(&spec).unwrap();
            let mut count = [0u32; 32];
            for s in t.layer_steps(0).unwrap() {
                count[s[0] as usize] += 1;
            }
            count.sort_unstable_by(|a, b| b.cmp(a));
            (count[0], count[16])
        };
        // Zipf 1.2 over 32 ranks: p(rank 0) ≈ 0.323, p(rank 16) ≈ 0.0108 — a ratio near 30.
        let (top, mid) = freq(1.2);
        assert!(top > 20 * mid, "top {top}, median {mid}");
        // Uniform: 32 counts of mean 625 and standard deviation ~25; even the largest stays far
        // below 1.3 × the median.
        let (top, mid) = freq(0.0);
        assert!(top < mid * 13 / 10, "top {top}, median {mid}");
    }
}
