//! LRFU, Least Recently/Frequently Used: Lee, Choi, Kim, Noh, Min, Cho & Kim, "LRFU: A Spectrum of
//! Policies that Subsumes the Least Recently Used and Least Frequently Used Policies", IEEE
//! Transactions on Computers 50(12), 2001.
//!
//! Each expert has a Combined Recency and Frequency value `CRF(t) = Σ F(t − tᵢ)` over its past
//! references `tᵢ`, with `F(x) = (1/2)^(λ·x)`: `λ = 0` counts references (LFU), `λ = 1` weighs the
//! latest one above all earlier ones together (LRU). The paper updates it incrementally,
//! `CRF(t) = F(0) + F(t − t_last) · CRF(t_last)`. Time is the step (token), so the experts of one
//! step age together. The resident with the lowest CRF is the victim.
//!
//! Mapping here: the CRF of every expert is kept, resident or not (a layer has only `n_experts`
//! ids; the paper keeps evicted blocks' history too), and a miss is admitted only when its CRF
//! beats the lowest resident's (bypass otherwise), as this crate's perfect LFU does — so `λ = 0`
//! is [`super::policy::Lfu`] up to its tie-breaks. Since `F` is exponential, the order of two CRFs
//! never changes with time, and residents are kept sorted by the time-free key
//! `log₂ CRF(t_last) + λ · t_last`. O(log slots) per access.

use super::policy::{
    check_expert, check_seed, Access, Pins, Policy, PolicyError, PolicyKind, Prefetch,
};
use std::collections::BTreeSet;

/// Maps an `f64` to a `u64` whose order is the float's total order.
fn ordered(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | 1 << 63
    }
}

/// LRFU over one layer's experts (see the module note).
#[derive(Clone, Debug)]
pub struct Lrfu {
    n_experts: u32,
    slots: usize,
    lambda: f64,
    /// Steps begun.
    step: u64,
    /// Per expert, `log₂ CRF(t_last) + λ · t_last` (−∞ = never referenced).
    key: Vec<f64>,
    is_resident: Vec<bool>,
    /// Residents keyed by (ordered key, id); the first is the victim.
    resident: BTreeSet<(u64, u32)>,
    pins: Pins,
}

impl Lrfu {
    /// The `λ` chosen by replay over the calibrated synthetic presets on their tuning seed
    /// (docs/BENCHMARKS.md).
    pub const DEFAULT_LAMBDA: f64 = 0.03;

    /// LRFU with `slots` slots, decay `lambda` (in `0..=1`, per step) and `initial` resident (never
    /// referenced). Errors: [`PolicyError::Slots`], the seed errors, and
    /// [`PolicyError::Lambda`] for a `lambda` outside `0..=1` (NaN included).
    pub fn new(
        n_experts: u32,
        slots: usize,
        lambda: f64,
        initial: &[u32],
    ) -> Result<Self, PolicyError> {
        check_seed(initial, slots, n_experts)?;
        if !(0.0..=1.0).contains(&lambda) {
            return Err(PolicyError::Lambda { value: lambda });
        }
        let mut is_resident = vec![false; n_experts as usize];
        for &e in initial {
            is_resident[e as usize] = true;
        }
        Ok(Lrfu {
            n_experts,
            slots,
            lambda,
            step: 0,
            key: vec![f64::NEG_INFINITY; n_experts as usize],
            is_resident,
            resident: initial
                .iter()
                .map(|&e| (ordered(f64::NEG_INFINITY), e))
                .collect(),
            pins: Pins::default(),
        })
    }
}

impl Policy for Lrfu {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lrfu
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn begin_step(&mut self) -> Result<(), PolicyError> {
        self.step += 1;
        self.pins.clear();
        Ok(())
    }

    fn is_resident(&self, expert: u32) -> bool {
        expert < self.n_experts && self.is_resident[expert as usize]
    }

    fn access(&mut self, expert: u32) -> Result<Access, PolicyError> {
        let e = check_expert(expert, self.n_experts)?;
        let now = self.lambda * self.step as f64;
        let old = self.key[e];
        let new = (1.0 + (old - now).exp2()).log2() + now;
        self.key[e] = new;
        if self.is_resident[e] {
            self.resident.remove(&(ordered(old), expert));
            self.resident.insert((ordered(new), expert));
            return Ok(Access::Hit);
        }
        let evict = if self.resident.len() < self.slots {
            None
        } else {
            match self.resident.first().copied() {
                Some((k, victim)) if k < ordered(new) => {
                    self.resident.remove(&(k, victim));
                    self.is_resident[victim as usize] = false;
                    Some(victim)
                }
                _ => {
                    return Ok(Access::Miss {
                        admit: false,
                        evict: None,
                    })
                }
            }
        };
        self.is_resident[e] = true;
        self.resident.insert((ordered(new), expert));
        Ok(Access::Miss { admit: true, evict })
    }

    /// Residents, highest CRF first.
    fn resident(&self) -> Vec<u32> {
        self.resident.iter().rev().map(|k| k.1).collect()
    }

    /// Admits `expert` with its own CRF (unchanged: not a reference), evicting the unpinned
    /// resident with the lowest CRF when full.
    fn prefetch(&mut self, expert: u32) -> Result<Prefetch, PolicyError> {
        let e = check_expert(expert, self.n_experts)?;
        if self.is_resident[e] {
            self.pins.add(expert);
            return Ok(Prefetch::Resident);
        }
        let evict = if self.resident.len() >= self.slots {
            let pins = &self.pins;
            match self.resident.iter().find(|k| !pins.contains(k.1)).copied() {
                Some((k, victim)) => {
                    self.resident.remove(&(k, victim));
                    self.is_resident[victim as usize] = false;
                    Some(victim)
                }
                None => return Ok(Prefetch::Refused),
            }
        } else {
            None
        };
        self.is_resident[e] = true;
        self.resident.insert((ordered(self.key[e]), expert));
        self.pins.add(expert);
        Ok(Prefetch::Loaded { evict })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &mut Lrfu, steps: &[&[u32]]) -> Vec<Access> {
        let mut out = Vec::new();
        let mut all = Vec::new();
        for s in steps {
            p.access_step(s, &mut out).unwrap();
            all.extend_from_slice(&out);
        }
        all
    }

    #[test]
    fn lambda_spans_lfu_to_lru() {
        // One slot. Expert 0 is referenced at steps 1-3 (CRF 1.75 at step 3 when λ = 1), then 1
        // at steps 4 and 5. λ = 1: 1's first reference (CRF 1) beats 0's, decayed to 0.875 at
        // step 4. λ = 0 (counts): 1 (count 1, then 2) never beats 0 (count 3).
        let steps: [&[u32]; 5] = [&[0], &[0], &[0], &[1], &[1]];
        let admit = |evict| Access::Miss { admit: true, evict };
        let mut lru = Lrfu::new(2, 1, 1.0, &[]).unwrap();
        assert_eq!(
            run(&mut lru, &steps),
            [
                admit(None),
                Access::Hit,
                Access::Hit,
                admit(Some(0)),
                Access::Hit
            ]
        );
        let bypass = Access::Miss {
            admit: false,
            evict: None,
        };
        let mut lfu = Lrfu::new(2, 1, 0.0, &[]).unwrap();
        assert_eq!(
            run(&mut lfu, &steps),
            [admit(None), Access::Hit, Access::Hit, bypass, bypass]
        );
        assert!(matches!(
            Lrfu::new(2, 1, 1.5, &[]),
            Err(PolicyError::Lambda { .. })
        ));
    }
}
