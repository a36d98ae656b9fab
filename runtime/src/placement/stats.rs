//! Statistics of a routing trace, per layer and averaged over layers: the measures of
//! `../shared/design/ROUTING.md` ("What real MoE routing looks like"), computed the same way on a
//! recorded trace and on a synthetic one, so that a generator can be calibrated against them.
//!
//! Definitions (each per layer, over the trace in token order; the trace's value is the mean over
//! layers):
//!
//! * **coverage at q** (q = 50, 80, 90 %): the fewest experts whose routed slots add up to at least
//!   q of the layer's routed slots (experts ranked by count over the whole trace);
//! * **overlap at lag L** (L = 1, 8): over the token pairs of one sequence `L` positions apart
//!   (same `seq`, `pos` and `pos − L`; the tokens of several sequences may be interleaved, as a
//!   batched server logs them), the mean share of the later token's top-k that the earlier one
//!   also routed to; independent uniform draws give `top_k / n_experts`;
//! * **reuse distance**: for every routed slot `(t, e)` whose expert `e` was routed earlier in the
//!   layer, `t − t'` with `t'` the latest earlier token routing `e` — in tokens of the whole trace,
//!   across sequence boundaries, as a cache that persists between requests sees it; median and 90th
//!   percentile by nearest rank (`sorted[⌈p·n⌉ − 1]`);
//! * **drift of the top-25 % set**: the trace is cut into consecutive 64-token windows (a last
//!   shorter window is dropped); in each, the `round(n_experts / 4)` experts routed most often (ties
//!   to the lower id); the mean Jaccard index of that set between consecutive windows.

use super::trace::Trace;
use std::collections::HashMap;

/// Tokens per window of the drift measure (ROUTING.md's 64).
pub const DRIFT_WINDOW: usize = 64;

/// The statistics of one layer, or their mean over layers (see the module note).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoutingStats {
    /// Experts covering 50 %, 80 % and 90 % of the routed slots.
    pub coverage: [f64; 3],
    /// Mean share of a token's top-k also routed by the previous token of its sequence (0..=1).
    pub lag1: f64,
    /// The same at lag 8.
    pub lag8: f64,
    /// Median reuse distance, in tokens.
    pub reuse_median: f64,
    /// 90th percentile of the reuse distance, in tokens.
    pub reuse_p90: f64,
    /// Mean Jaccard index of the top-25 % set between consecutive 64-token windows (0..=1).
    pub drift: f64,
}

impl RoutingStats {
    /// The statistics as `(name, value)` pairs, in the order of ROUTING.md's table; the names are
    /// the keys of `aubier replay --stats --json`.
    pub fn named(&self) -> [(&'static str, f64); 8] {
        [
            ("coverage50", self.coverage[0]),
            ("coverage80", self.coverage[1]),
            ("coverage90", self.coverage[2]),
            ("lag1", self.lag1),
            ("lag8", self.lag8),
            ("reuse_median", self.reuse_median),
            ("reuse_p90", self.reuse_p90),
            ("drift", self.drift),
        ]
    }
}

/// `sorted[⌈p·n⌉ − 1]` of an ascending list (0 when empty).
fn nearest_rank(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64
}

/// Mean overlap at `lag` of one layer's `steps` (`None` when no token has a token of its sequence
/// `lag` positions earlier). `earlier[t]` is the index of the token of `t`'s sequence at position
/// `pos − lag`, if the trace has it.
fn overlap(steps: &[&[u32]], earlier: &[Option<usize>]) -> Option<f64> {
    let (mut sum, mut pairs) = (0.0, 0usize);
    for (t, e) in earlier.iter().enumerate() {
        let Some(e) = *e else { continue };
        let shared = steps[t].iter().filter(|x| steps[e].contains(x)).count();
        sum += shared as f64 / steps[t].len() as f64;
        pairs += 1;
    }
    (pairs > 0).then(|| sum / pairs as f64)
}

/// For every token of `trace`, the index of the token of its sequence `lag` positions earlier.
fn earlier_tokens(trace: &Trace, lag: u64) -> Vec<Option<usize>> {
    let index: HashMap<(u64, u64), usize> = trace
        .seqs()
        .iter()
        .zip(trace.positions())
        .enumerate()
        .map(|(t, (&s, &p))| ((s, p), t))
        .collect();
    trace
        .seqs()
        .iter()
        .zip(trace.positions())
        .map(|(&s, &p)| p.checked_sub(lag).and_then(|q| index.get(&(s, q)).copied()))
        .collect()
}

/// The `top` experts routed most often in `steps` (ties to the lower id), as a membership mask.
fn top_set(steps: &[&[u32]], n_experts: usize, top: usize) -> Vec<bool> {
    let mut count = vec![0u64; n_experts];
    for s in steps {
        for &e in *s {
            count[e as usize] += 1;
        }
    }
    let mut order: Vec<usize> = (0..n_experts).collect();
    order.sort_by_key(|&e| (std::cmp::Reverse(count[e]), e));
    let mut member = vec![false; n_experts];
    for &e in &order[..top] {
        member[e] = true;
    }
    member
}

/// The statistics of one layer's `steps` (token order); `lag1[t]` / `lag8[t]` index the tokens of
/// `t`'s sequence 1 and 8 positions earlier.
fn layer_stats(
    steps: &[&[u32]],
    lag1: &[Option<usize>],
    lag8: &[Option<usize>],
    n_experts: usize,
) -> RoutingStats {
    let mut count = vec![0u64; n_experts];
    let mut last: Vec<Option<usize>> = vec![None; n_experts];
    let mut reuse = Vec::new();
    for (t, s) in steps.iter().enumerate() {
        for &e in *s {
            let e = e as usize;
            count[e] += 1;
            if let Some(prev) = last[e] {
                reuse.push((t - prev) as u64);
            }
            last[e] = Some(t);
        }
    }
    reuse.sort_unstable();
    count.sort_unstable_by(|a, b| b.cmp(a));
    let total: u64 = count.iter().sum();
    let mut coverage = [0.0; 3];
    for (c, q) in coverage.iter_mut().zip([0.5, 0.8, 0.9]) {
        let mut acc = 0u64;
        let need = (q * total as f64).ceil() as u64;
        let m = count
            .iter()
            .position(|&n| {
                acc += n;
                acc >= need
            })
            .map_or(n_experts, |i| i + 1);
        *c = m as f64;
    }
    let top = ((n_experts as f64) / 4.0).round().max(1.0) as usize;
    let sets: Vec<Vec<bool>> = steps
        .chunks_exact(DRIFT_WINDOW)
        .map(|w| top_set(w, n_experts, top))
        .collect();
    let jaccards: Vec<f64> = sets
        .windows(2)
        .map(|p| {
            let both = p[0].iter().zip(&p[1]).filter(|(a, b)| **a && **b).count();
            let either = p[0].iter().zip(&p[1]).filter(|(a, b)| **a || **b).count();
            both as f64 / either as f64
        })
        .collect();
    RoutingStats {
        coverage,
        lag1: overlap(steps, lag1).unwrap_or(0.0),
        lag8: overlap(steps, lag8).unwrap_or(0.0),
        reuse_median: nearest_rank(&reuse, 0.5),
        reuse_p90: nearest_rank(&reuse, 0.9),
        drift: if jaccards.is_empty() {
            0.0
        } else {
            jaccards.iter().sum::<f64>() / jaccards.len() as f64
        },
    }
}

/// The statistics of every layer of `trace`, `[n_layers]`.
pub fn per_layer(trace: &Trace) -> Vec<RoutingStats> {
    let (lag1, lag8) = (earlier_tokens(trace, 1), earlier_tokens(trace, 8));
    (0..trace.n_layers())
        .map(|l| {
            let steps: Vec<&[u32]> = trace.layer_steps(l).into_iter().flatten().collect();
            layer_stats(&steps, &lag1, &lag8, trace.n_experts() as usize)
        })
        .collect()
}

/// The mean over layers of [`per_layer`] (ROUTING.md's "mean over layers").
pub fn trace_stats(trace: &Trace) -> RoutingStats {
    let layers = per_layer(trace);
    let n = layers.len() as f64;
    let mut mean = RoutingStats::default();
    for s in &layers {
        for i in 0..3 {
            mean.coverage[i] += s.coverage[i] / n;
        }
        mean.lag1 += s.lag1 / n;
        mean.lag8 += s.lag8 / n;
        mean.reuse_median += s.reuse_median / n;
        mean.reuse_p90 += s.reuse_p90 / n;
        mean.drift += s.drift / n;
    }
    mean
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::trace::TraceRecord;

    fn one_layer(steps: &[&[u32]], seqs: &[u64], n_experts: u32) -> Trace {
        let records: Vec<TraceRecord> = steps
            .iter()
            .zip(seqs)
            .enumerate()
            .map(|(t, (s, &seq))| TraceRecord {
                seq,
                pos: t as u64,
                n_experts,
                top_k: s.len() as u32,
                layers: vec![s.to_vec()],
            })
            .collect();
        Trace::from_records(&records).unwrap()
    }

    #[test]
    fn hand_worked_small_trace() {
        // 4 experts, top-2, 10 tokens; seq 0 = tokens 0..5, seq 1 = tokens 5..10.
        let steps: [&[u32]; 10] = [
            &[0, 1],
            &[0, 2],
            &[0, 1],
            &[3, 0],
            &[0, 1],
            &[1, 2],
            &[0, 1],
            &[0, 3],
            &[2, 0],
            &[0, 1],
        ];
        let seqs = [0, 0, 0, 0, 0, 1, 1, 1, 1, 1];
        let s = trace_stats(&one_layer(&steps, &seqs, 4));
        // Counts: 0 → 9, 1 → 6, 2 → 3, 3 → 2 of 20. 50 % (10) needs {0, 1} (9 < 10 ≤ 15); 80 %
        // (16) and 90 % (18) need {0, 1, 2} (15 < 16, 18 ≤ 9 + 6 + 3 = 18).
        assert_eq!(s.coverage, [2.0, 3.0, 3.0]);
        // Lag-1 pairs inside a sequence: (0,1) ½, (1,2) ½, (2,3) ½, (3,4) ½; (5,6) ½, (6,7) ½,
        // (7,8) ½, (8,9) ½: all ½.
        assert_eq!(s.lag1, 0.5);
        // No pair of one sequence is 8 apart.
        assert_eq!(s.lag8, 0.0);
        // Reuse distances (t − t'): expert 0 at t = 1, 2, 3, 4, 6, 7, 8, 9 → 1, 1, 1, 1, 2, 1,
        // 1, 1; expert 1 at 2, 4, 5, 6, 9 → 2, 2, 1, 1, 3; expert 2 at 5, 8 → 4, 3; expert 3 at
        // 7 → 4. Sorted (16): 1×9, 2×3, 3×2, 4×2 → median (8th) = 1, p90 (15th) = 4.
        assert_eq!((s.reuse_median, s.reuse_p90), (1.0, 4.0));
        assert_eq!(s.drift, 0.0);
    }

    #[test]
    fn drift_compares_consecutive_windows() {
        // 8 experts (top set of 2), top-1: 64 tokens of expert 0 then 1 alternately, then 64 of
        // 1 and 2: the sets {0, 1} and {1, 2} share 1 of 3.
        let mut steps: Vec<[u32; 1]> = (0..64).map(|t| [t % 2]).collect();
        steps.extend((0..64).map(|t| [1 + t % 2]));
        let refs: Vec<&[u32]> = steps.iter().map(|s| s.as_slice()).collect();
        let s = trace_stats(&one_layer(&refs, &[0; 128], 8));
        assert!((s.drift - 1.0 / 3.0).abs() < 1e-12, "{}", s.drift);
    }
}
