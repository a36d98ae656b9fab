//! Offline replay: a routing trace through each placement policy, one policy instance per layer,
//! giving the served fraction (routed slots served from the fast store ÷ all routed slots).
//!
//! Every layer is replayed on its own (layers share nothing in the store), token by token, each
//! token's `top_k` experts as one step ([`Policy::access_step`]: hits first). Layers run in
//! parallel (rayon); the result does not depend on the order.

use super::arc::ArcCache;
use super::hotset::{HotSet, HotSetError};
use super::lecar::LeCaR;
use super::lrfu::Lrfu;
use super::policy::{
    Access, Admission, Lfu, Lru, Min, Policy, PolicyError, PolicyKind, StaticSet, TwoQ, TwoQParams,
};
use super::trace::Trace;
use rayon::prelude::*;

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
}

impl ReplayOptions<'_> {
    /// `slots` slots, the default 2Q knobs ([`TwoQParams::DEFAULT_A1IN`] and the others, no
    /// promotion cap), [`Lrfu::DEFAULT_LAMBDA`], identity seed.
    pub fn new(slots: usize) -> Self {
        ReplayOptions {
            slots,
            a1in: TwoQParams::DEFAULT_A1IN,
            a1out: TwoQParams::DEFAULT_A1OUT,
            max_promotions: None,
            admission: TwoQParams::DEFAULT_ADMISSION,
            lrfu_lambda: Lrfu::DEFAULT_LAMBDA,
            resident_set: None,
        }
    }
}

/// Hits and routed slots of a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// Routed (token, layer, expert) slots served from the fast store.
    pub hits: u64,
    /// All routed slots.
    pub routed: u64,
}

impl Served {
    /// `hits / routed` (0 when nothing was routed).
    pub fn fraction(&self) -> f64 {
        if self.routed == 0 {
            0.0
        } else {
            self.hits as f64 / self.routed as f64
        }
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

/// Replays one layer; the hits and routed slots of that layer.
fn replay_layer(
    kind: PolicyKind,
    trace: &Trace,
    layer: usize,
    opts: &ReplayOptions<'_>,
) -> Result<Served, ReplayError> {
    let mut policy = policy_for_layer(kind, trace, layer, opts)?;
    let steps = trace.layer_steps(layer).ok_or(ReplayError::Layer {
        layer,
        n_layers: trace.n_layers(),
    })?;
    let mut out = Vec::with_capacity(trace.top_k() as usize);
    let mut served = Served::default();
    for step in steps {
        policy
            .access_step(step, &mut out)
            .map_err(|source| ReplayError::Policy {
                policy: kind,
                layer,
                source,
            })?;
        served.hits += out.iter().filter(|a| **a == Access::Hit).count() as u64;
        served.routed += step.len() as u64;
    }
    Ok(served)
}

/// Replays the whole trace through `kind`: the served fraction over every (token, layer, expert)
/// routed slot. Errors: those of [`policy_for_layer`].
pub fn replay(
    trace: &Trace,
    kind: PolicyKind,
    opts: &ReplayOptions<'_>,
) -> Result<Served, ReplayError> {
    let per_layer = (0..trace.n_layers())
        .into_par_iter()
        .map(|layer| replay_layer(kind, trace, layer, opts))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(per_layer.iter().fold(Served::default(), |acc, s| Served {
        hits: acc.hits + s.hits,
        routed: acc.routed + s.routed,
    }))
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
        assert_eq!(
            s,
            Served {
                hits: 10,
                routed: 12
            }
        );
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
}
