//! Synthetic routing traces with a known skew, a drifting hot set, short-range locality and
//! cross-layer correlation, for policy benchmarks; named presets calibrated to the statistics of
//! real routing in `../shared/design/ROUTING.md` ([`Preset`]).
//!
//! Model, per layer: a random permutation maps popularity ranks to experts; rank `r` (0-based) has
//! base weight `(r + 1)^-zipf` (Zipf-like). Each token draws `top_k` distinct ranks by successive
//! weighted draws without replacement (each draw renormalises over the ranks left), and routes to
//! the experts holding them. Five processes move the routing away from independent draws, each off
//! at 0 (the default), consuming no randomness then:
//!
//! * **swap drift** (`drift`, `hot`): before each step, `drift` swaps on average (the integer part
//!   always, the fractional part with that probability), each exchanging the expert at a uniform
//!   rank in `0..hot` with the expert at a uniform rank in `hot..n_experts` — a hot expert goes
//!   cold and a cold one takes its place;
//! * **weight drift** (`sigma`, `tau`): each rank's weight is multiplied by `exp(x_r)`, with `x_r`
//!   a stationary AR(1) process of standard deviation `sigma` and correlation time `tau` steps
//!   (`x ← φ·x + sigma·√(1 − φ²)·N(0, 1)` before each step, `φ = exp(−1 / tau)`, started from its
//!   stationary law) — popularity that wanders smoothly, shared by the sequences decoded together;
//! * **topic** (`topic`): each sequence draws its own log-weight offsets `y_r ~ N(0, topic²)` at
//!   its first token and keeps them (weight `base_r · exp(x_r + y_r)`) — a prompt's own experts;
//! * **carry** (`carry`): each expert the previous token of the same sequence routed to is routed
//!   again with probability `carry` (kept before the fresh draws fill the rest of the top-k) — the
//!   short-range locality of real routing;
//! * **cross-layer correlation** (`rho`): in layer `l ≥ 1`, with probability `rho` a token's
//!   experts are a fixed per-layer mapping of its experts in layer `l − 1` (the expert at base rank
//!   `r` of layer `l − 1` maps to the expert at base rank `r` of layer `l`, so the mapping carries
//!   popularity over), otherwise they are drawn independently from layer `l`'s own process (whose
//!   state advances either way).
//!
//! Tokens are grouped into sequences of `seq_len` (`seq` counts them, `pos` restarts at 0; carry
//! does not cross a sequence boundary), decoded `batch` at a time: the tokens of a group of
//! `batch` sequences are interleaved step by step, as a batched server logs them, and both drifts
//! advance once per step (with `batch` 1, once per token). All randomness comes from one ChaCha8 stream seeded by
//! `seed`, so a spec always gives the same trace.

use super::trace::{Trace, TraceError, TraceRecord};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;
use std::str::FromStr;

/// Parameters of a synthetic trace; the text form is an optional [`Preset`] name followed by
/// `key=value` pairs, joined by commas (`qwen-like,seed=1`, or
/// `experts=128,top_k=4,layers=36,tokens=4096,seq_len=512,zipf=1,hot=32,drift=0.05,seed=0`), the
/// pairs overriding the preset's values, missing keys taking the preset's (or the [`Default`])
/// values.
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
    /// Tokens per sequence (`seq_len`); the last sequence takes what is left.
    pub seq_len: usize,
    /// Sequences decoded together (`batch`, ≥ 1): their tokens are interleaved step by step.
    pub batch: usize,
    /// Zipf exponent of the rank weights (`zipf`); 0 = uniform.
    pub zipf: f64,
    /// Size of the hot region of ranks that swap drift exchanges out of (`hot`), in
    /// `1..n_experts`; `None` = `max(1, n_experts / 4)`.
    pub hot: Option<u32>,
    /// Mean swaps per token per layer (`drift`); 0 = no swap drift.
    pub drift: f64,
    /// Standard deviation of each rank's log-weight (`sigma`, natural log); 0 = no weight drift.
    pub sigma: f64,
    /// Correlation time of the log-weights, in steps (`tau`, > 0).
    pub tau: f64,
    /// Standard deviation of each sequence's own log-weight offsets (`topic`, natural log); 0 =
    /// none.
    pub topic: f64,
    /// Probability that an expert of the previous token of the sequence is routed again (`carry`,
    /// in `0..=1`).
    pub carry: f64,
    /// Probability that a token's experts in layer `l ≥ 1` map from layer `l − 1`'s (`rho`, in
    /// `0..=1`).
    pub rho: f64,
    /// Seed of the random stream (`seed`).
    pub seed: u64,
}

impl Default for SyntheticSpec {
    /// Mistral Small 4's shape (128 experts, top-4, 36 layers), 4096 tokens in sequences of 512
    /// decoded one at a time, Zipf 1, hot region `n_experts / 4`, 0.05 swaps per token, no weight drift (`tau` 64), no
    /// carry, no cross-layer correlation, seed 0.
    fn default() -> Self {
        SyntheticSpec {
            n_experts: 128,
            top_k: 4,
            n_layers: 36,
            tokens: 4096,
            seq_len: 512,
            batch: 1,
            zipf: 1.0,
            hot: None,
            drift: 0.05,
            sigma: 0.0,
            tau: 64.0,
            topic: 0.0,
            carry: 0.0,
            rho: 0.0,
            seed: 0,
        }
    }
}

/// Named synthetic specs calibrated to `../shared/design/ROUTING.md` (its per-layer statistics and
/// its policy table; `tests/routing_stats.rs` checks them). Each has its source model's expert
/// count and top-k; `mistral4-like` is Mistral Small 4's shape (128 experts, top-4) with the Qwen
/// statistics scaled by the fraction of experts. The knobs were tuned on seed 1; the presets use
/// seed 0, held out. No cross-layer correlation (`rho` 0): ROUTING.md does not measure it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Qwen1.5-MoE-A2.7B: 60 experts, top-4, 24 layers.
    QwenLike,
    /// OLMoE-1B-7B: 64 experts, top-8, 16 layers.
    OlmoeLike,
    /// Mixtral-8x7B: 8 experts, top-2, 32 layers.
    MixtralLike,
    /// Mistral Small 4: 128 experts, top-4, 36 layers, Qwen-like routing.
    Mistral4Like,
}

impl Preset {
    /// Every preset, in the order `docs/BENCHMARKS.md` reports them.
    pub const ALL: [Preset; 4] = [
        Preset::QwenLike,
        Preset::OlmoeLike,
        Preset::MixtralLike,
        Preset::Mistral4Like,
    ];

    /// The seed the knobs were tuned on (the presets' own seed, 0, is held out).
    pub const TUNING_SEED: u64 = 1;

    /// The name: `qwen-like`, `olmoe-like`, `mixtral-like`, `mistral4-like`.
    pub fn name(self) -> &'static str {
        match self {
            Preset::QwenLike => "qwen-like",
            Preset::OlmoeLike => "olmoe-like",
            Preset::MixtralLike => "mixtral-like",
            Preset::Mistral4Like => "mistral4-like",
        }
    }

    /// The preset's spec (seed 0).
    pub fn spec(self) -> SyntheticSpec {
        let (n_experts, top_k, n_layers, tokens, seq_len, batch) = match self {
            Preset::QwenLike => (60, 4, 24, 2048, 82, 12),
            Preset::OlmoeLike => (64, 8, 16, 3072, 63, 2),
            Preset::MixtralLike => (8, 2, 32, 2048, 144, 2),
            Preset::Mistral4Like => (128, 4, 36, 4096, 82, 12),
        };
        let (zipf, sigma, tau, topic, carry) = match self {
            Preset::QwenLike => (0.3, 0.3, 1.0, 0.2, 0.04),
            Preset::OlmoeLike => (0.74, 0.6, 12.0, 0.66, 0.04),
            Preset::MixtralLike => (0.28, 0.63, 8.0, 0.34, 0.1),
            Preset::Mistral4Like => (0.3, 0.3, 4.0, 0.2, 0.015),
        };
        SyntheticSpec {
            n_experts,
            top_k,
            n_layers,
            tokens,
            seq_len,
            batch,
            zipf,
            hot: None,
            drift: 0.0,
            sigma,
            tau,
            topic,
            carry,
            rho: 0.0,
            seed: 0,
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors of parsing or checking a [`SyntheticSpec`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SyntheticError {
    /// A pair is not `key=value`, or the key is unknown, or a leading name is not a preset.
    #[error("synthetic spec: `{0}` is not a preset (qwen-like, olmoe-like, mixtral-like, mistral4-like) first, or one of experts, top_k, layers, tokens, seq_len, batch, zipf, hot, drift, sigma, tau, topic, carry, rho, seed as key=value")]
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
            "experts={},top_k={},layers={},tokens={},seq_len={},batch={},zipf={},hot={},drift={},\
             sigma={},tau={},topic={},carry={},rho={},seed={}",
            self.n_experts,
            self.top_k,
            self.n_layers,
            self.tokens,
            self.seq_len,
            self.batch,
            self.zipf,
            self.hot(),
            self.drift,
            self.sigma,
            self.tau,
            self.topic,
            self.carry,
            self.rho,
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

impl FromStr for Preset {
    type Err = SyntheticError;

    /// Parses a preset name ([`Preset::name`], ASCII case-insensitive). Errors: `Key`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| SyntheticError::Key(s.to_string()))
    }
}

impl FromStr for SyntheticSpec {
    type Err = SyntheticError;

    /// Parses `[preset,]key=value,…` over the preset (or the defaults), then
    /// [`SyntheticSpec::check`]s. An empty string is the default spec. Errors: `Key` (also for a
    /// name that is not a preset or not first), `Value`, `Invalid`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut spec = SyntheticSpec::default();
        for (i, pair) in s.split(',').filter(|p| !p.trim().is_empty()).enumerate() {
            let Some((key, value)) = pair.split_once('=') else {
                if i > 0 {
                    return Err(SyntheticError::Key(pair.to_string()));
                }
                spec = pair.parse::<Preset>()?.spec();
                continue;
            };
            const INT: &str = "non-negative integer";
            const NUM: &str = "number";
            match key.trim() {
                "experts" => spec.n_experts = parse_value("experts", value, INT)?,
                "top_k" => spec.top_k = parse_value("top_k", value, INT)?,
                "layers" => spec.n_layers = parse_value("layers", value, INT)?,
                "tokens" => spec.tokens = parse_value("tokens", value, INT)?,
                "seq_len" => spec.seq_len = parse_value("seq_len", value, INT)?,
                "batch" => spec.batch = parse_value("batch", value, INT)?,
                "zipf" => spec.zipf = parse_value("zipf", value, NUM)?,
                "hot" => spec.hot = Some(parse_value("hot", value, INT)?),
                "drift" => spec.drift = parse_value("drift", value, NUM)?,
                "sigma" => spec.sigma = parse_value("sigma", value, NUM)?,
                "tau" => spec.tau = parse_value("tau", value, NUM)?,
                "topic" => spec.topic = parse_value("topic", value, NUM)?,
                "carry" => spec.carry = parse_value("carry", value, NUM)?,
                "rho" => spec.rho = parse_value("rho", value, NUM)?,
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

    /// Checks the values: `1 ≤ top_k ≤ experts`, `layers`, `tokens`, `seq_len`, `batch` ≥ 1, `zipf`,
    /// `drift` and `sigma` finite and ≥ 0, `tau` finite and > 0, `carry` and `rho` in `0..=1`,
    /// `1 ≤ hot < experts`. Errors: `Invalid`, naming the value.
    pub fn check(&self) -> Result<(), SyntheticError> {
        let bad = |m: String| Err(SyntheticError::Invalid(m));
        if self.top_k == 0 || self.top_k > self.n_experts {
            return bad(format!(
                "top_k = {} must be in 1..=experts ({})",
                self.top_k, self.n_experts
            ));
        }
        if self.n_layers == 0 || self.tokens == 0 || self.seq_len == 0 || self.batch == 0 {
            return bad("layers, tokens, seq_len and batch must be >= 1".to_string());
        }
        for (name, v) in [
            ("zipf", self.zipf),
            ("drift", self.drift),
            ("sigma", self.sigma),
            ("topic", self.topic),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(format!("{name} = {v} must be finite and >= 0"));
            }
        }
        if !(self.tau.is_finite() && self.tau > 0.0) {
            return bad(format!("tau = {} must be finite and > 0", self.tau));
        }
        for (name, v) in [("carry", self.carry), ("rho", self.rho)] {
            if !(0.0..=1.0).contains(&v) {
                return bad(format!("{name} = {v} must be in 0..=1"));
            }
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

/// Adds `k` distinct ranks to `out`, successive draws without replacement proportional to
/// `weights` among the ranks not yet `taken` (which the draws mark).
fn draw_ranks(
    rng: &mut ChaCha8Rng,
    weights: &[f64],
    k: usize,
    taken: &mut [bool],
    out: &mut Vec<usize>,
) {
    let mut left: f64 = weights
        .iter()
        .zip(taken.iter())
        .filter(|(_, t)| !**t)
        .map(|(w, _)| w)
        .sum();
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

/// A standard normal draw (Box–Muller, one of the pair).
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// The generator state of one layer.
struct LayerState {
    /// Rank → expert, as swap drift leaves it.
    perm: Vec<u32>,
    /// Expert → rank (the inverse of `perm`).
    rank_of: Vec<usize>,
    /// Per rank, the log-weight of weight drift.
    x: Vec<f64>,
    /// Per sequence of the batch, per rank, its topic's log-weight offset.
    topic: Vec<Vec<f64>>,
    /// Per rank, the weight in effect.
    weights: Vec<f64>,
    /// Expert of layer `l − 1` → expert of this layer, for cross-layer correlation.
    from_prev_layer: Vec<u32>,
    /// Per sequence of the batch (`seq % batch`), the experts of its previous token.
    prev: Vec<Vec<u32>>,
}

/// The `(seq, pos)` of every token in trace order: groups of `batch` sequences, one group after
/// the other, each decoded step by step (position `p` of every sequence of the group, in `seq`
/// order, then `p + 1`); every sequence has `seq_len` tokens but the last, which has the rest.
fn token_order(spec: &SyntheticSpec) -> Vec<(usize, usize)> {
    let n_seqs = spec.tokens.div_ceil(spec.seq_len);
    let len = |seq: usize| spec.seq_len.min(spec.tokens - seq * spec.seq_len);
    let mut order = Vec::with_capacity(spec.tokens);
    for group in (0..n_seqs).step_by(spec.batch) {
        let seqs = group..(group + spec.batch).min(n_seqs);
        for pos in 0..spec.seq_len {
            order.extend(seqs.clone().filter(|&q| pos < len(q)).map(|q| (q, pos)));
        }
    }
    order
}

/// Generates the trace a spec describes. Errors: [`SyntheticSpec::check`]'s (as
/// [`SyntheticError::Invalid`]).
pub fn synthetic_trace(spec: &SyntheticSpec) -> Result<Trace, SyntheticError> {
    spec.check()?;
    let n = spec.n_experts as usize;
    let k = spec.top_k as usize;
    let hot = spec.hot() as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let base: Vec<f64> = (0..n).map(|r| ((r + 1) as f64).powf(-spec.zipf)).collect();
    let mut layers: Vec<LayerState> = (0..spec.n_layers)
        .map(|_| {
            let mut perm: Vec<u32> = (0..spec.n_experts).collect();
            perm.shuffle(&mut rng);
            LayerState {
                perm,
                rank_of: vec![0; n],
                x: vec![0.0; n],
                topic: vec![vec![0.0; n]; spec.batch],
                weights: base.clone(),
                from_prev_layer: Vec::new(),
                prev: vec![Vec::new(); spec.batch],
            }
        })
        .collect();
    for l in 0..layers.len() {
        for r in 0..n {
            let e = layers[l].perm[r] as usize;
            layers[l].rank_of[e] = r;
        }
        if l > 0 {
            let mut map = vec![0u32; n];
            for (r, &e) in layers[l - 1].perm.iter().enumerate() {
                map[e as usize] = layers[l].perm[r];
            }
            layers[l].from_prev_layer = map;
        }
    }
    let phi = (-1.0 / spec.tau).exp();
    let innovation = spec.sigma * (1.0 - phi * phi).sqrt();
    if spec.sigma > 0.0 {
        for layer in &mut layers {
            for x in &mut layer.x {
                *x = spec.sigma * normal(&mut rng);
            }
        }
    }
    let mut taken = vec![false; n];
    let mut ranks = Vec::with_capacity(k);
    let mut records = Vec::with_capacity(spec.tokens);
    for (seq, pos) in token_order(spec) {
        let lane = seq % spec.batch;
        // The first sequence of a group is the longest, so it starts every step.
        let new_step = lane == 0;
        let mut routed: Vec<Vec<u32>> = Vec::with_capacity(spec.n_layers);
        for (l, layer) in layers.iter_mut().enumerate() {
            if new_step {
                let swaps = spec.drift.floor() as usize
                    + usize::from(rng.random::<f64>() < spec.drift.fract());
                for _ in 0..swaps {
                    let a = rng.random_range(0..hot);
                    let b = rng.random_range(hot..n);
                    layer.perm.swap(a, b);
                    layer.rank_of[layer.perm[a] as usize] = a;
                    layer.rank_of[layer.perm[b] as usize] = b;
                }
                if spec.sigma > 0.0 {
                    for x in &mut layer.x {
                        *x = phi * *x + innovation * normal(&mut rng);
                    }
                }
            }
            if spec.topic > 0.0 && pos == 0 {
                for y in &mut layer.topic[lane] {
                    *y = spec.topic * normal(&mut rng);
                }
            }
            if spec.sigma > 0.0 || spec.topic > 0.0 {
                let offsets = layer.x.iter().zip(&layer.topic[lane]);
                for ((w, b), (x, y)) in layer.weights.iter_mut().zip(&base).zip(offsets) {
                    *w = b * (x + y).exp();
                }
            }
            let experts: Vec<u32> = if l > 0 && spec.rho > 0.0 && rng.random::<f64>() < spec.rho {
                routed[l - 1]
                    .iter()
                    .map(|&e| layer.from_prev_layer[e as usize])
                    .collect()
            } else {
                taken.fill(false);
                ranks.clear();
                if pos > 0 && spec.carry > 0.0 {
                    for &e in &layer.prev[lane] {
                        if rng.random::<f64>() < spec.carry {
                            let r = layer.rank_of[e as usize];
                            taken[r] = true;
                            ranks.push(r);
                        }
                    }
                }
                let fresh = k - ranks.len();
                draw_ranks(&mut rng, &layer.weights, fresh, &mut taken, &mut ranks);
                ranks.iter().map(|&r| layer.perm[r]).collect()
            };
            layer.prev[lane].clone_from(&experts);
            routed.push(experts);
        }
        records.push(TraceRecord {
            seq: seq as u64,
            pos: pos as u64,
            n_experts: spec.n_experts,
            top_k: spec.top_k,
            layers: routed,
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

    #[test]
    fn presets_parse_first_and_take_overrides() {
        let s: SyntheticSpec = "qwen-like, seed=1".parse().unwrap();
        assert_eq!(
            s,
            SyntheticSpec {
                seed: Preset::TUNING_SEED,
                ..Preset::QwenLike.spec()
            }
        );
        assert_eq!((s.n_experts, s.top_k), (60, 4));
        assert_eq!("MIXTRAL-like".parse::<Preset>(), Ok(Preset::MixtralLike));
        assert!(matches!(
            "seed=1,qwen-like".parse::<SyntheticSpec>(),
            Err(SyntheticError::Key(_))
        ));
        assert!(matches!(
            "gpt-like".parse::<SyntheticSpec>(),
            Err(SyntheticError::Key(_))
        ));
        for p in Preset::ALL {
            // The text form spells out the hot region in effect (`hot` unset in the preset).
            let again: SyntheticSpec = p.spec().to_string().parse().unwrap();
            assert_eq!(again.to_string(), p.spec().to_string(), "{p}");
            assert_eq!(
                synthetic_trace(&again).ok(),
                synthetic_trace(&p.spec()).ok(),
                "{p}"
            );
        }
    }

    #[test]
    fn batches_interleave_step_by_step() {
        // 7 tokens in sequences of 3, two at a time: sequences 0 and 1 interleaved, then 2 (1 token).
        let spec: SyntheticSpec = "experts=8,top_k=2,layers=1,tokens=7,seq_len=3,batch=2"
            .parse()
            .unwrap();
        let order: Vec<(u64, u64)> = (0..7)
            .map(|t| {
                let r = synthetic_trace(&spec).unwrap().record(t).unwrap();
                (r.seq, r.pos)
            })
            .collect();
        assert_eq!(
            order,
            [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (2, 0)]
        );
    }

    #[test]
    fn rho_one_maps_each_layer_from_the_one_before() {
        // With ρ = 1 layer 1 is a fixed function of layer 0: an expert of layer 0 always lands on
        // the same expert of layer 1. With ρ = 0 the layers are independent and it does not.
        let mapped = |rho: f64| {
            let spec = SyntheticSpec {
                n_experts: 16,
                top_k: 2,
                n_layers: 2,
                tokens: 400,
                rho,
                ..SyntheticSpec::default()
            };
            let t = synthetic_trace(&spec).unwrap();
            let mut image = [None; 16];
            (0..t.tokens()).all(|i| {
                let (a, b) = (t.experts(i, 0).unwrap(), t.experts(i, 1).unwrap());
                a.iter()
                    .zip(b)
                    .all(|(&x, &y)| *image[x as usize].get_or_insert(y) == y)
            })
        };
        assert!(mapped(1.0));
        assert!(!mapped(0.0));
    }
}
