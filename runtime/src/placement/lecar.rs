//! LeCaR, Learning Cache Replacement: Vietri, Rodriguez, Martinez, Lyons, Liu, Rangaswami, Zhao &
//! Narasimhan, "Driving Cache Replacement with ML-based LeCaR", HotStorage 2018 (Algorithms 1–2).
//!
//! An adaptive mix of two experts, LRU and LFU, by regret minimisation: on a miss with the cache
//! full, the victim is LRU's with probability `w_LRU`, else LFU's, and the id evicted goes on that
//! policy's history (a FIFO of at most `slots` ids, with the time of eviction). A later miss on an
//! id found in policy P's history is P's mistake: `w_P ← w_P · e^(−λ·r)` with the regret
//! `r = d^(t − t_evicted)`, then the weights are renormalised (the id leaves the history). The
//! paper's constants: learning rate `λ = 0.45`, discount `d = 0.005^(1 / slots)`; the weights start
//! at ½ each. Every miss is admitted.
//!
//! Mapping here: time is the access count; LFU's frequency is every reference since boot (resident
//! or not, as this crate's perfect LFU), its ties to the less recent; the random choice draws from a
//! ChaCha8 stream seeded with 0, so a replay is deterministic. A prefetch is not a reference (no
//! count, no recency); its victim is drawn as a miss's is, among unpinned residents, and goes on
//! the history of the policy that chose it. O(log slots) per access.

use super::policy::{
    check_expert, check_seed, Access, Pins, Policy, PolicyError, PolicyKind, Prefetch,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeSet, VecDeque};

/// The paper's learning rate.
const LEARNING_RATE: f64 = 0.45;

/// LeCaR over one layer's experts (see the module note).
#[derive(Clone, Debug)]
pub struct LeCaR {
    n_experts: u32,
    slots: usize,
    /// Accesses so far.
    clock: u64,
    /// References per expert since boot.
    count: Vec<u64>,
    /// Clock of each expert's last reference (0 = never).
    last: Vec<u64>,
    is_resident: Vec<bool>,
    /// Residents by (last, id): the first is LRU's victim.
    by_recency: BTreeSet<(u64, u32)>,
    /// Residents by (count, last, id): the first is LFU's victim.
    by_frequency: BTreeSet<(u64, u64, u32)>,
    /// Evicted by LRU (index 0) and by LFU (1): (id, clock of eviction), oldest first.
    history: [VecDeque<(u32, u64)>; 2],
    /// `[w_LRU, w_LFU]`, summing to 1.
    weights: [f64; 2],
    discount: f64,
    rng: ChaCha8Rng,
    pins: Pins,
}

impl LeCaR {
    /// LeCaR with `slots` slots and `initial` resident (never referenced). Errors:
    /// [`PolicyError::Slots`] and the seed errors.
    pub fn new(n_experts: u32, slots: usize, initial: &[u32]) -> Result<Self, PolicyError> {
        check_seed(initial, slots, n_experts)?;
        let mut is_resident = vec![false; n_experts as usize];
        for &e in initial {
            is_resident[e as usize] = true;
        }
        Ok(LeCaR {
            n_experts,
            slots,
            clock: 0,
            count: vec![0; n_experts as usize],
            last: vec![0; n_experts as usize],
            is_resident,
            by_recency: initial.iter().map(|&e| (0, e)).collect(),
            by_frequency: initial.iter().map(|&e| (0, 0, e)).collect(),
            history: [VecDeque::new(), VecDeque::new()],
            weights: [0.5, 0.5],
            discount: 0.005f64.powf(1.0 / slots as f64),
            rng: ChaCha8Rng::seed_from_u64(0),
            pins: Pins::default(),
        })
    }

    /// `[w_LRU, w_LFU]` now.
    pub fn weights(&self) -> [f64; 2] {
        self.weights
    }

    fn unlink(&mut self, e: u32) {
        let i = e as usize;
        self.by_recency.remove(&(self.last[i], e));
        self.by_frequency.remove(&(self.count[i], self.last[i], e));
    }

    /// Draws LRU or LFU by the weights and evicts that policy's victim (the least recent, or
    /// least frequent, resident not in `pins`) onto its history; `None` when every resident is
    /// pinned.
    fn evict(&mut self, pins: &Pins) -> Option<u32> {
        let policy = usize::from(self.rng.random::<f64>() >= self.weights[0]);
        let victim = if policy == 0 {
            self.by_recency
                .iter()
                .map(|k| k.1)
                .find(|&v| !pins.contains(v))
        } else {
            self.by_frequency
                .iter()
                .map(|k| k.2)
                .find(|&v| !pins.contains(v))
        }?;
        self.unlink(victim);
        self.is_resident[victim as usize] = false;
        let history = &mut self.history[policy];
        history.push_back((victim, self.clock));
        if history.len() > self.slots {
            history.pop_front();
        }
        Some(victim)
    }

    fn link(&mut self, e: u32) {
        let i = e as usize;
        self.by_recency.insert((self.last[i], e));
        self.by_frequency.insert((self.count[i], self.last[i], e));
    }
}

impl Policy for LeCaR {
    fn kind(&self) -> PolicyKind {
        PolicyKind::LeCaR
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn begin_step(&mut self) -> Result<(), PolicyError> {
        self.pins.clear();
        Ok(())
    }

    fn is_resident(&self, expert: u32) -> bool {
        expert < self.n_experts && self.is_resident[expert as usize]
    }

    fn access(&mut self, expert: u32) -> Result<Access, PolicyError> {
        let e = check_expert(expert, self.n_experts)?;
        let resident = self.is_resident[e];
        if resident {
            self.unlink(expert);
        }
        self.clock += 1;
        self.count[e] += 1;
        self.last[e] = self.clock;
        if resident {
            self.link(expert);
            return Ok(Access::Hit);
        }
        for (policy, history) in self.history.iter_mut().enumerate() {
            if let Some(i) = history.iter().position(|h| h.0 == expert) {
                let regret = self.discount.powf((self.clock - history[i].1) as f64);
                history.remove(i);
                self.weights[policy] *= (-LEARNING_RATE * regret).exp();
                let sum = self.weights[0] + self.weights[1];
                self.weights = [self.weights[0] / sum, self.weights[1] / sum];
            }
        }
        let evict = if self.by_recency.len() >= self.slots {
            self.evict(&Pins::default())
        } else {
            None
        };
        self.is_resident[e] = true;
        self.link(expert);
        Ok(Access::Miss { admit: true, evict })
    }

    /// Residents, most recently used first.
    fn resident(&self) -> Vec<u32> {
        self.by_recency.iter().rev().map(|k| k.1).collect()
    }

    fn prefetch(&mut self, expert: u32) -> Result<Prefetch, PolicyError> {
        let e = check_expert(expert, self.n_experts)?;
        if self.is_resident[e] {
            self.pins.add(expert);
            return Ok(Prefetch::Resident);
        }
        let resident = self.by_recency.len();
        if resident >= self.slots && self.pins.count(|r| self.is_resident[r as usize]) >= resident {
            return Ok(Prefetch::Refused);
        }
        let evict = if resident >= self.slots {
            let pins = std::mem::take(&mut self.pins);
            let evict = self.evict(&pins);
            self.pins = pins;
            evict
        } else {
            None
        };
        self.is_resident[e] = true;
        self.link(expert);
        self.pins.add(expert);
        Ok(Prefetch::Loaded { evict })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_stay_a_distribution_and_a_hot_expert_stays() {
        // One slot, a cyclic pattern 0 1 0 1 …: every access after the first misses, each
        // eviction is a mistake of the policy that made it, and the weights stay a distribution.
        let mut p = LeCaR::new(2, 1, &[]).unwrap();
        let mut out = Vec::new();
        let mut hits = 0;
        for t in 0..40u32 {
            p.access_step(&[t % 2], &mut out).unwrap();
            hits += usize::from(out[0] == Access::Hit);
        }
        assert_eq!(hits, 0);
        let [a, b] = p.weights();
        assert!((a + b - 1.0).abs() < 1e-12 && a > 0.0 && b > 0.0, "{a} {b}");
        // Two slots seeded [0, 1]; expert 0 on every even access, 1, 2, 3 in turn between: the
        // other resident is both LRU's and LFU's victim, so 0 stays and hits all 30 times.
        let mut q = LeCaR::new(4, 2, &[0, 1]).unwrap();
        let mut hits_of_0 = 0;
        for t in 0..60u32 {
            let e = if t % 2 == 0 { 0 } else { 1 + t % 3 };
            q.access_step(&[e], &mut out).unwrap();
            hits_of_0 += usize::from(e == 0 && out[0] == Access::Hit);
        }
        assert_eq!(hits_of_0, 30);
    }
}
