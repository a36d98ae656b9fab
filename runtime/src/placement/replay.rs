//! Offline replay: a routing trace through a placement policy, one policy instance per layer,
//! giving the served fraction (routed slots served from the fast store ÷ all routed slots) and the
//! experts copied into the fast store.
//!
//! The replay follows the decode loop's order: token by token, and within a token layer by layer,
//! each layer's `top_k` experts as one step ([`Policy::access_step`]: hits first). With a prefetch
//! budget `b` ([`ReplayOptions::prefetch_budget`]), once layer `l`'s experts of a token are known
//! a [`CoOccurrence`] predictor of the pair `(l, l + 1)` (learned online from the tokens already
//! replayed) names `top_k` experts for layer `l + 1`: those resident are pinned
//! ([`Policy::pin_resident`], so that no load evicts them) and the first `b` of the others are
//! prefetched into layer `l + 1`'s policy before that layer's step; then the predictor learns
//! the token's true `(l, l + 1)` pair. Layer 0 has no predictor. An expert counts as served when
//! it is resident when its step reads it, prefetched or not. Loads (copies into the fast store)
//! are the demand misses admitted plus the prefetches.

use super::arc::ArcCache;
use super::hotset::{HotSet, HotSetError};
use super::lecar::LeCaR;
use super::lrfu::Lrfu;
use super::policy::{
    Access, Admission, Lfu, Lru, Min, Policy, PolicyError, PolicyKind, Prefetch, StaticSet, TwoQ,
    TwoQParams,
};
use super::predict::CoOccurrence;
use super::trace::Trace;

/// Settings of one replay.
#[derive(Clone, Copy, Debug)]
pub struct ReplayOptions<'a> {
    /// Fast-store slots per layer (1..=n_experts).
    pub slots: usize,
    /// 2Q `Kin` as a fraction of `slots`.
    pub a1in: f64,
    /// 2Q `Kout` as a fraction of `slots`.
    pub a1out: f64,
    /// 2Q cap on promotions per step per layer; `None` = no cap.
    pub max_promotions: Option<usize>,
    /// 2Q admission rule.
    pub admission: Admission,
    /// LRFU's decay `λ` per step, in `0..=1`.
    pub lrfu_lambda: f64,
    /// Seed membership; `None` seeds the identity set `0..slots`. Used by every policy but
    /// `static`, which always starts from its own oracle set.
    pub resident_set: Option<&'a HotSet>,
    /// Prefetch loads per token per layer, issued one layer ahead from the co-occurrence
    /// predictor; 0 = demand paging only. `static` and `min` refuse prefetches.
    pub prefetch_budget: usize,
}

impl ReplayOptions<'_> {
    /// `slots` slots, the default 2Q knobs ([`TwoQParams::DEFAULT_A1IN`] and the others, no
    /// promotion cap), [`Lrfu::DEFAULT_LAMBDA`], identity seed, no prefetch.
    pub fn new(slots: usize) -> Self {
        ReplayOptions {
            slots,
            a1in: TwoQParams::DEFAULT_A1IN,
            a1out: TwoQParams::DEFAULT_A1OUT,
            max_promotions: None,
            admission: TwoQParams::DEFAULT_ADMISSION,
            lrfu_lambda: Lrfu::DEFAULT_LAMBDA,
            resident_set: None,
            prefetch_budget: 0,
        }
    }
}

/// Counts of a replay, summed over tokens and layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// Routed (token, layer, expert) slots served from the fast store.
    pub hits: u64,
    /// All routed slots.
    pub routed: u64,
    /// Demand misses admitted into the fast store (one expert copied in each).
    pub admitted: u64,
    /// Prefetches loaded (one expert copied in each).
    pub prefetched: u64,
    /// Prefetched experts that the step they were loaded for routed.
    pub prefetch_used: u64,
    /// Predicted experts that the step routed (layers ≥ 1, with prefetch on).
    pub predicted_right: u64,
    /// Routed slots of the steps a prediction was made for (layers ≥ 1, with prefetch on).
    pub predicted_routed: u64,
}

impl Served {
    /// `hits / routed` (0 when nothing was routed).
    pub fn fraction(&self) -> f64 {
        ratio(self.hits, self.routed)
    }

    /// Experts copied into the fast store: demand admissions plus prefetches.
    pub fn loads(&self) -> u64 {
        self.admitted + self.prefetched
    }

    /// The predictor's recall: predicted experts that were routed ÷ routed slots of the steps
    /// predicted for; `None` when nothing was predicted for (no prefetch, or one layer).
    pub fn recall(&self) -> Option<f64> {
        (self.predicted_routed > 0).then(|| ratio(self.predicted_right, self.predicted_routed))
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Errors of [`replay`] and [`policy_for_layer`].
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A policy refused its parameters or an access.
    #[error("{policy}, layer {layer}: {source}")]
    Policy {
        /// The policy.
        policy: PolicyKind,
        /// 0-based layer.
        layer: usize,
        /// What it said.
        source: PolicyError,
    },
    /// The seed membership does not fit the trace.
    #[error(transparent)]
    HotSet(#[from] HotSetError),
    /// The layer is not in the trace.
    #[error("layer {layer} is not in the trace ({n_layers} layers)")]
    Layer {
        /// The layer asked for.
        layer: usize,
        /// Layers in the trace.
        n_layers: usize,
    },
}

/// Builds `kind` for `layer` of `trace` with the options' knobs and seed (MIN and `static` read the
/// layer's whole sequence). Errors: `Layer`, `HotSet` (checked against the trace), `Policy`.
pub fn policy_for_layer(
    kind: PolicyKind,
    trace: &Trace,
    layer: usize,
    opts: &ReplayOptions<'_>,
) -> Result<Box<dyn Policy + Send + Sync>, ReplayError> {
    let steps = trace.layer_steps(layer).ok_or(ReplayError::Layer {
        layer,
        n_layers: trace.n_layers(),
    })?;
    let identity: Vec<u32>;
    let seed: &[u32] = match opts.resident_set {
        Some(h) => {
            h.check(trace.n_layers(), trace.n_experts())?;
            h.seed(layer, opts.slots)
        }
        None => {
            identity = (0..trace.n_experts().min(opts.slots as u32)).collect();
            &identity
        }
    };
    let n = trace.n_experts();
    let wrap = |source| ReplayError::Policy {
        policy: kind,
        layer,
        source,
    };
    Ok(match kind {
        PolicyKind::TwoQ => {
            let params = TwoQParams::from_fractions(
                opts.slots,
                opts.a1in,
                opts.a1out,
                opts.max_promotions,
                opts.admission,
            )
            .map_err(wrap)?;
            Box::new(TwoQ::new(n, params, seed).map_err(wrap)?)
        }
        PolicyKind::Lru => Box::new(Lru::new(n, opts.slots, seed).map_err(wrap)?),
        PolicyKind::Lfu => Box::new(Lfu::new(n, opts.slots, seed).map_err(wrap)?),
        PolicyKind::Static => Box::new(StaticSet::oracle(n, opts.slots, steps).map_err(wrap)?),
        PolicyKind::Min => Box::new(Min::new(n, opts.slots, seed, steps).map_err(wrap)?),
        PolicyKind::Arc => Box::new(ArcCache::new(n, opts.slots, seed).map_err(wrap)?),
        PolicyKind::Lrfu => {
            Box::new(Lrfu::new(n, opts.slots, opts.lrfu_lambda, seed).map_err(wrap)?)
        }
        PolicyKind::LeCaR => Box::new(LeCaR::new(n, opts.slots, seed).map_err(wrap)?),
    })
}

/// Replays the whole trace through `kind` (with prefetch when `opts.prefetch_budget > 0`; see
/// the module note): the counts over every (token, layer, expert) routed slot. Errors: those of
/// [`policy_for_layer`], and `Policy` for an access or a prefetch a policy refuses.
pub fn replay(
    trace: &Trace,
    kind: PolicyKind,
    opts: &ReplayOptions<'_>,
) -> Result<Served, ReplayError> {
    let n_layers = trace.n_layers();
    let mut policies = (0..n_layers)
        .map(|layer| policy_for_layer(kind, trace, layer, opts))
        .collect::<Result<Vec<_>, _>>()?;
    let mut predictors = match opts.prefetch_budget {
        0 => Vec::new(),
        _ => vec![CoOccurrence::new(trace.n_experts()); n_layers.saturating_sub(1)],
    };
    let top_k = trace.top_k() as usize;
    let (mut out, mut predicted) = (Vec::with_capacity(top_k), Vec::with_capacity(top_k));
    let mut loaded = Vec::with_capacity(opts.prefetch_budget.min(top_k));
    let mut served = Served::default();
    for token in 0..trace.tokens() {
        for (layer, policy) in policies.iter_mut().enumerate() {
            let wrap = |source| ReplayError::Policy {
                policy: kind,
                layer,
                source,
            };
            let experts = |layer| {
                trace
                    .experts(token, layer)
                    .ok_or(ReplayError::Layer { layer, n_layers })
            };
            let step = experts(layer)?;
            loaded.clear();
            let predictor = match layer {
                0 => None,
                _ => predictors.get_mut(layer - 1),
            };
            if let Some(predictor) = &predictor {
                predictor
                    .predict(experts(layer - 1)?, top_k, &mut predicted)
                    .map_err(wrap)?;
                served.predicted_right +=
                    predicted.iter().filter(|e| step.contains(e)).count() as u64;
                served.predicted_routed += step.len() as u64;
                policy
                    .pin_resident(&mut predicted.iter().copied())
                    .map_err(wrap)?;
                for &e in &predicted {
                    if loaded.len() == opts.prefetch_budget {
                        break;
                    }
                    match policy.prefetch(e).map_err(wrap)? {
                        Prefetch::Loaded { .. } => loaded.push(e),
                        Prefetch::Resident => {}
                        Prefetch::Refused => break,
                    }
                }
            }
            policy.access_step(step, &mut out).map_err(wrap)?;
            served.hits += out.iter().filter(|a| **a == Access::Hit).count() as u64;
            served.admitted += out
                .iter()
                .filter(|a| matches!(a, Access::Miss { admit: true, .. }))
                .count() as u64;
            served.routed += step.len() as u64;
            served.prefetched += loaded.len() as u64;
            served.prefetch_used += loaded.iter().filter(|e| step.contains(e)).count() as u64;
            if let Some(predictor) = predictor {
                predictor.learn(experts(layer - 1)?, step).map_err(wrap)?;
            }
        }
    }
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::trace::TraceRecord;

    fn trace(layers: &[Vec<Vec<u32>>], n_experts: u32) -> Trace {
        let tokens = layers[0].len();
        let records: Vec<TraceRecord> = (0..tokens)
            .map(|t| TraceRecord {
                seq: 0,
                pos: t as u64,
                n_experts,
                top_k: layers[0][0].len() as u32,
                layers: layers.iter().map(|l| l[t].clone()).collect(),
            })
            .collect();
        Trace::from_records(&records).unwrap()
    }

    #[test]
    fn static_counts_top_n_hits_over_all_layers() {
        // Layer 0 routes 5 four times and 6 twice; layer 1 routes 7 every time. With 1 slot the
        // oracle keeps 5 and 7: 4 + 6 hits of 12 routed slots.
        let t = trace(
            &[
                vec![vec![5], vec![6], vec![5], vec![5], vec![6], vec![5]],
                vec![vec![7]; 6],
            ],
            8,
        );
        let s = replay(&t, PolicyKind::Static, &ReplayOptions::new(1)).unwrap();
        assert_eq!((s.hits, s.routed, s.loads()), (10, 12, 0));
    }

    #[test]
    fn identity_seed_and_resident_set_seed() {
        // One layer routing expert 2 three times, 1 slot. Identity seed {0}: LRU misses once.
        // Seed {2}: LRU hits every time.
        let t = trace(&[vec![vec![2]; 3]], 4);
        let lru = replay(&t, PolicyKind::Lru, &ReplayOptions::new(1)).unwrap();
        assert_eq!(lru.hits, 2);
        let hot = HotSet {
            layers: vec![vec![2, 3]],
        };
        let opts = ReplayOptions {
            resident_set: Some(&hot),
            ..ReplayOptions::new(1)
        };
        assert_eq!(replay(&t, PolicyKind::Lru, &opts).unwrap().hits, 3);
        let bad = HotSet {
            layers: vec![vec![2], vec![1]],
        };
        let opts = ReplayOptions {
            resident_set: Some(&bad),
            ..ReplayOptions::new(1)
        };
        assert!(matches!(
            replay(&t, PolicyKind::Lru, &opts),
            Err(ReplayError::HotSet(HotSetError::LayerCount { .. }))
        ));
    }

    #[test]
    fn bad_slots_name_policy_and_layer() {
        let t = trace(&[vec![vec![2]; 3]], 4);
        let e = replay(&t, PolicyKind::Lfu, &ReplayOptions::new(5)).unwrap_err();
        assert_eq!(e.to_string(), "lfu, layer 0: slots = 5 must be in 1..=4");
    }

    /// Two layers, 16 experts, top-4: layer 0 cycles through the sets {0..3}, {4..7}, {8..11},
    /// {12..15}; layer 1 routes the image of layer 0's set under the fixed map `e ↦ (5e + 3) mod
    /// 16`. Every token's layer-1 set follows from its layer-0 set.
    fn cyclic_mapped(tokens: usize) -> Trace {
        let layer0: Vec<Vec<u32>> = (0..tokens)
            .map(|t| (0..4).map(|i| 4 * (t as u32 % 4) + i).collect())
            .collect();
        let layer1 = layer0
            .iter()
            .map(|s| s.iter().map(|e| (5 * e + 3) % 16).collect())
            .collect();
        trace(&[layer0, layer1], 16)
    }

    fn with_budget(slots: usize, budget: usize) -> ReplayOptions<'static> {
        ReplayOptions {
            prefetch_budget: budget,
            ..ReplayOptions::new(slots)
        }
    }

    #[test]
    fn prefetch_budget_is_spent_exactly_and_replaces_demand_loads() {
        // LRU with 4 slots: each layer holds the previous token's 4 experts, so every routed expert
        // is a miss without prefetch. From token 4 on, the predictor has seen each layer-0 set once
        // and names the 4 layer-1 experts exactly, none resident: min(budget, 4) are loaded, each
        // then hit, and each replaces a demand admission.
        let tokens = 64;
        let t = cyclic_mapped(tokens);
        let base = replay(&t, PolicyKind::Lru, &with_budget(4, 0)).unwrap();
        assert_eq!((base.prefetched, base.recall()), (0, None));
        for budget in [1, 2, 3, 4, 6] {
            let s = replay(&t, PolicyKind::Lru, &with_budget(4, budget)).unwrap();
            let loads = (tokens as u64 - 4) * budget.min(4) as u64;
            assert_eq!(s.prefetched, loads, "budget {budget}");
            assert_eq!(s.prefetch_used, loads, "budget {budget}");
            assert_eq!(s.hits - base.hits, loads, "budget {budget}");
            assert_eq!(s.loads(), base.loads(), "budget {budget}");
            assert_eq!(s.recall(), Some((tokens as f64 - 4.0) / tokens as f64));
        }
    }

    #[test]
    fn a_prefetch_never_evicts_a_predicted_resident() {
        // LRU, 2 slots, budget 1. Layer 0 alternates [0, 1] and [0, 2]; layer 1 follows with
        // [4, 5] and [4, 6], which the predictor names exactly from token 2 on. There 4 is
        // resident but least recent: pinned, so the load of 5 (or 6) evicts the other, and both
        // routed experts hit (unpinned, the load would evict 4 and the step would hit once).
        // Hits: layer 0, 2 then 1 per token; layer 1, none at token 0 (identity seed), 1 at
        // token 1 (predicted [4, 5], resident, nothing loaded), then 2 per token.
        let tokens = 64u64;
        let layer0: Vec<Vec<u32>> = (0..tokens)
            .map(|t| if t % 2 == 0 { vec![0, 1] } else { vec![0, 2] })
            .collect();
        let layer1 = layer0.iter().map(|s| vec![4, s[1] + 4]).collect();
        let t = trace(&[layer0, layer1], 8);
        let s = replay(&t, PolicyKind::Lru, &with_budget(2, 1)).unwrap();
        assert_eq!(s.hits, (2 + (tokens - 1)) + (1 + 2 * (tokens - 2)));
        assert_eq!((s.prefetched, s.prefetch_used), (tokens - 2, tokens - 2));
    }

    #[test]
    fn static_and_min_take_no_prefetch() {
        let t = cyclic_mapped(32);
        for kind in [PolicyKind::Static, PolicyKind::Min] {
            let base = replay(&t, kind, &with_budget(4, 0)).unwrap();
            let s = replay(&t, kind, &with_budget(4, 2)).unwrap();
            assert_eq!(s.prefetched, 0, "{kind}");
            assert_eq!((s.hits, s.admitted), (base.hits, base.admitted), "{kind}");
        }
    }

    #[test]
    fn prefetch_on_correlated_layers_serves_more_with_more_budget() {
        // qwen-like with every token's next-layer experts a fixed map of its current ones (ρ = 1):
        // served fraction rises with the budget for every policy that takes prefetches, and no
        // step loads more than the budget.
        let spec: crate::placement::synthetic::SyntheticSpec =
            "qwen-like,rho=1,tokens=512,layers=4".parse().unwrap();
        let t = crate::placement::synthetic::synthetic_trace(&spec).unwrap();
        let steps = (t.tokens() * (t.n_layers() - 1)) as u64;
        for &kind in PolicyKind::ALL {
            if matches!(kind, PolicyKind::Static | PolicyKind::Min) {
                continue;
            }
            let mut last = replay(&t, kind, &with_budget(15, 0)).unwrap();
            for budget in [1, 2, 4] {
                let s = replay(&t, kind, &with_budget(15, budget)).unwrap();
                assert!(
                    s.fraction() > last.fraction(),
                    "{kind}, budget {budget}: {} <= {}",
                    s.fraction(),
                    last.fraction()
                );
                assert!(s.prefetched <= steps * budget as u64, "{kind}");
                assert!(s.recall().unwrap() > 0.9, "{kind}: {:?}", s.recall());
                last = s;
            }
        }
    }

    #[test]
    fn prefetch_replay_is_deterministic() {
        let spec: crate::placement::synthetic::SyntheticSpec =
            "olmoe-like,rho=0.8,tokens=256".parse().unwrap();
        let t = crate::placement::synthetic::synthetic_trace(&spec).unwrap();
        for &kind in PolicyKind::ALL {
            let a = replay(&t, kind, &with_budget(16, 2)).unwrap();
            let b = replay(&t, kind, &with_budget(16, 2)).unwrap();
            assert_eq!(a, b, "{kind}");
        }
    }
}
