//! Predicting the next MoE layer's experts from routing history: cross-layer co-occurrence
//! learned online, the predictor of `aubier replay`'s prefetch model.
//!
//! One [`CoOccurrence`] serves one pair of consecutive MoE layers `(l, l + 1)`. It counts, over the
//! tokens learned so far, `seen[i]` (tokens routed to expert `i` in layer `l`) and `pair[i][j]`
//! (tokens routed to `i` in layer `l` and to `j` in layer `l + 1`). For a token routed to the
//! set `E` in layer `l`, the score of expert `j` of layer `l + 1` is `max_{i ∈ E} pair[i][j] /
//! seen[i]`, the largest empirical `P(j routed next | i routed now)`; the prediction is the `k`
//! experts of highest positive score, ties to the lower id (nothing before anything is learned).
//! The max, not the sum, over `E`: a sum credits an expert that follows many experts often routed
//! together with `E`'s (a popular one) as much as one that follows an expert of `E` itself; on the
//! presets' tuning seed with `ρ` = 0.8 the max raised the recall from 0.45 to 0.83 on
//! `olmoe-like` (top-8) and by 0.1 to 0.9 points on the others (docs/BENCHMARKS.md).
//! Under the synthetic generator's cross-layer draw (with probability `ρ` a token's next experts
//! are a fixed mapping of its current ones, `placement::synthetic`), `P(map(i) | i) ≈ ρ + (1 − ρ) ·
//! q`, `q` being the chance that `map(i)` is drawn anyway, so the mapped experts lead once each
//! `i` has been seen a few times. History-based predictors of this kind are the alternative to
//! applying the next layer's router to the current hidden state; MoE-Infinity (Xue et al., "MoE-
//! Infinity: Offloading-Efficient MoE Model Serving", arXiv 2401.14361) tracks expert activations
//! across layers in the same spirit. O(n_experts · (|E| + log n_experts)) per prediction;
//! `n_experts²` counters.

use super::policy::{check_expert, PolicyError};

/// Cross-layer co-occurrence counts of one pair of consecutive layers (see the module note).
#[derive(Clone, Debug)]
pub struct CoOccurrence {
    n_experts: u32,
    /// Tokens routed to `i` in the first layer, per `i`.
    seen: Vec<u64>,
    /// `pair[i · n_experts + j]`: tokens routed to `i` in the first layer and `j` in the second.
    pair: Vec<u64>,
}

impl CoOccurrence {
    /// Empty counts for layers of `n_experts` experts.
    pub fn new(n_experts: u32) -> Self {
        let n = n_experts as usize;
        CoOccurrence {
            n_experts,
            seen: vec![0; n],
            pair: vec![0; n * n],
        }
    }

    /// Learns one token: `current`, its experts in the first layer; `next`, in the second.
    /// Errors: [`PolicyError::ExpertOutOfRange`] (nothing is learned then).
    pub fn learn(&mut self, current: &[u32], next: &[u32]) -> Result<(), PolicyError> {
        for &e in current.iter().chain(next) {
            check_expert(e, self.n_experts)?;
        }
        let n = self.n_experts as usize;
        for &i in current {
            self.seen[i as usize] += 1;
            for &j in next {
                self.pair[i as usize * n + j as usize] += 1;
            }
        }
        Ok(())
    }

    /// Writes into `out` the at most `k` experts of the second layer predicted for a token routed
    /// to `current` in the first, highest score first (ties to the lower id); only experts with a
    /// positive score. Errors: [`PolicyError::ExpertOutOfRange`].
    pub fn predict(
        &self,
        current: &[u32],
        k: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), PolicyError> {
        out.clear();
        let n = self.n_experts as usize;
        let mut score = vec![0.0f64; n];
        for &i in current {
            let i = check_expert(i, self.n_experts)?;
            if self.seen[i] == 0 {
                continue;
            }
            let seen = self.seen[i] as f64;
            for (s, &c) in score.iter_mut().zip(&self.pair[i * n..(i + 1) * n]) {
                *s = s.max(c as f64 / seen);
            }
        }
        let mut order: Vec<u32> = (0..self.n_experts)
            .filter(|&j| score[j as usize] > 0.0)
            .collect();
        order.sort_by(|&a, &b| {
            score[b as usize]
                .total_cmp(&score[a as usize])
                .then(a.cmp(&b))
        });
        out.extend(order.into_iter().take(k));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicts_the_most_likely_successors_ties_to_the_lower_id() {
        let mut p = CoOccurrence::new(6);
        let mut out = Vec::new();
        p.predict(&[0, 1], 2, &mut out).unwrap();
        assert!(out.is_empty(), "nothing learned, nothing predicted");
        // 0 is followed by 3 twice and 4 once (P = 1, ½); 1 by 4 and 5 once each (P = 1, 1).
        p.learn(&[0], &[3, 4]).unwrap();
        p.learn(&[0], &[3]).unwrap();
        p.learn(&[1], &[4, 5]).unwrap();
        p.predict(&[0], 3, &mut out).unwrap();
        assert_eq!(out, vec![3, 4]);
        // From {0, 1}: 3, 4 and 5 all score 1 (the max over 0 and 1); the lower ids win the tie.
        p.predict(&[0, 1], 2, &mut out).unwrap();
        assert_eq!(out, vec![3, 4]);
        // 2 is followed by 5 once and 4 once; from {0, 2} 3 scores 1, 4 and 5 score ½ (4 wins).
        p.learn(&[2], &[5]).unwrap();
        p.learn(&[2], &[4]).unwrap();
        p.predict(&[0, 2], 3, &mut out).unwrap();
        assert_eq!(out, vec![3, 4, 5]);
        p.predict(&[5], 2, &mut out).unwrap();
        assert!(out.is_empty(), "5 was never seen in the first layer");
        assert_eq!(
            p.learn(&[6], &[0]).unwrap_err(),
            PolicyError::ExpertOutOfRange {
                expert: 6,
                n_experts: 6
            }
        );
    }

    #[test]
    fn a_fixed_map_is_recalled_exactly_after_warm_up() {
        // Layer l routes 4 of 32 experts (a ChaCha8 stream), layer l + 1 their images under a fixed
        // permutation. After 200 tokens every prediction is the true set.
        use rand::seq::index::sample;
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let map: Vec<u32> = (0..32).map(|e| (e * 13 + 5) % 32).collect();
        let mut p = CoOccurrence::new(32);
        let mut out = Vec::new();
        for t in 0..400 {
            let current: Vec<u32> = sample(&mut rng, 32, 4).iter().map(|e| e as u32).collect();
            let mut next: Vec<u32> = current.iter().map(|&e| map[e as usize]).collect();
            if t >= 200 {
                p.predict(&current, 4, &mut out).unwrap();
                out.sort_unstable();
                next.sort_unstable();
                assert_eq!(out, next, "token {t}");
            }
            p.learn(&current, &next).unwrap();
        }
    }
}
