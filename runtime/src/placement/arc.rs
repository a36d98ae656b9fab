//! ARC, the Adaptive Replacement Cache: Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead
//! Replacement Cache", FAST 2003 (Fig. 4, the algorithm as written there).
//!
//! Four LRU lists over the ids: `T1` (resident, seen once recently) and `T2` (resident, seen at
//! least twice), and the ghost lists `B1` and `B2` (ids recently evicted from `T1` and `T2`, not
//! resident). A target `p` for the size of `T1` adapts: a hit in `B1` (recency would have helped)
//! grows it by `max(|B2| / |B1|, 1)`, a hit in `B2` shrinks it by `max(|B1| / |B2|, 1)`. Every miss
//! is admitted (demand paging, no bypass); REPLACE evicts the LRU of `T1` into `B1` when
//! `|T1| > p` (or `|T1| = p` and the id is in `B2`), else the LRU of `T2` into `B2`. The lists are
//! bounded as in the paper: `|T1| + |B1| ≤ c`, all four together `≤ 2c`, with `c` the slots.
//! Mapping here: a step's accesses are presented hits first (as for every policy); the initial
//! membership seeds `T1` (first id most recent), `p` starts at 0. A prefetch enters as a new page
//! (the paper's case IV, which may drop a ghost) at the head of `T1` without adapting `p`, and its
//! first reference counts as a first one (it stays in `T1`, at its head: a prefetch is not a
//! reference); a ghost it had is forgotten. O(1) per access.

use super::policy::{
    check_expert, check_seed, Access, Pins, Policy, PolicyError, PolicyKind, Prefetch, Queues,
};

const T1: usize = 0;
const T2: usize = 1;
const B1: usize = 2;
const B2: usize = 3;

/// ARC over one layer's experts (see the module note).
#[derive(Clone, Debug)]
pub struct ArcCache {
    n_experts: u32,
    slots: usize,
    queues: Queues,
    /// The target size of `T1`, in `0..=slots`.
    p: f64,
    /// Per expert: prefetched and not referenced since.
    unreferenced: Vec<bool>,
    pins: Pins,
}

impl ArcCache {
    /// ARC with `slots` slots and `initial` resident in `T1`. Errors: [`PolicyError::Slots`], and
    /// the seed errors (`ExpertOutOfRange`, `SeedTooLarge`, `SeedDuplicate`).
    pub fn new(n_experts: u32, slots: usize, initial: &[u32]) -> Result<Self, PolicyError> {
        check_seed(initial, slots, n_experts)?;
        let mut queues = Queues::new(4, n_experts as usize);
        for &e in initial {
            queues.push_back(T1, e);
        }
        Ok(ArcCache {
            n_experts,
            slots,
            queues,
            p: 0.0,
            unreferenced: vec![false; n_experts as usize],
            pins: Pins::default(),
        })
    }

    /// The current target size of `T1`, in experts.
    pub fn target(&self) -> f64 {
        self.p
    }

    /// The paper's REPLACE when the cache is full: the evicted id, moved to its ghost list. The
    /// victim is the least recent unpinned id of the list the paper picks, else of the other.
    fn replace(&mut self, in_b2: bool) -> Option<u32> {
        if self.queues.len(T1) + self.queues.len(T2) < self.slots {
            return None;
        }
        let t1 = self.queues.len(T1) as f64;
        let order = if t1 >= 1.0 && (t1 > self.p || (in_b2 && t1 == self.p)) {
            [(T1, B1), (T2, B2)]
        } else {
            [(T2, B2), (T1, B1)]
        };
        let (victim, to) = order.into_iter().find_map(|(from, to)| {
            self.queues
                .pop_back_unpinned(from, &self.pins)
                .map(|v| (v, to))
        })?;
        self.queues.push_front(to, victim);
        Some(victim)
    }

    /// Room for an id in no list (the paper's case IV): trims the directory, then REPLACE.
    fn make_room(&mut self) -> Option<u32> {
        let l1 = self.queues.len(T1) + self.queues.len(B1);
        let all = l1 + self.queues.len(T2) + self.queues.len(B2);
        if l1 >= self.slots {
            if self.queues.len(T1) < self.slots {
                self.queues.pop_back(B1);
                self.replace(false)
            } else {
                self.queues.pop_back_unpinned(T1, &self.pins)
            }
        } else {
            if all >= 2 * self.slots {
                self.queues.pop_back(B2);
            }
            self.replace(false)
        }
    }
}

impl Policy for ArcCache {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Arc
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn begin_step(&mut self) -> Result<(), PolicyError> {
        self.pins.clear();
        Ok(())
    }

    fn is_resident(&self, expert: u32) -> bool {
        expert < self.n_experts && matches!(self.queues.queue_of(expert), Some(T1 | T2))
    }

    fn access(&mut self, expert: u32) -> Result<Access, PolicyError> {
        let e = check_expert(expert, self.n_experts)?;
        let c = self.slots as f64;
        let first_reference = std::mem::take(&mut self.unreferenced[e]);
        let evict = match self.queues.queue_of(expert) {
            Some(T1 | T2) => {
                self.queues.remove(expert);
                let to = if first_reference { T1 } else { T2 };
                self.queues.push_front(to, expert);
                return Ok(Access::Hit);
            }
            Some(B1) => {
                let delta = (self.queues.len(B2) as f64 / self.queues.len(B1) as f64).max(1.0);
                self.p = (self.p + delta).min(c);
                self.queues.remove(expert);
                let evict = self.replace(false);
                self.queues.push_front(T2, expert);
                evict
            }
            Some(_) => {
                let delta = (self.queues.len(B1) as f64 / self.queues.len(B2) as f64).max(1.0);
                self.p = (self.p - delta).max(0.0);
                self.queues.remove(expert);
                let evict = self.replace(true);
                self.queues.push_front(T2, expert);
                evict
            }
            None => {
                let evict = self.make_room();
                self.queues.push_front(T1, expert);
                evict
            }
        };
        Ok(Access::Miss { admit: true, evict })
    }

    /// Residents, `T2` then `T1`, most recent first in each.
    fn resident(&self) -> Vec<u32> {
        let mut out = self.queues.ids(T2);
        out.extend(self.queues.ids(T1));
        out
    }

    fn prefetch(&mut self, expert: u32) -> Result<Prefetch, PolicyError> {
        let e = check_expert(expert, self.n_experts)?;
        if self.is_resident(expert) {
            self.pins.add(expert);
            return Ok(Prefetch::Resident);
        }
        let resident = self.queues.len(T1) + self.queues.len(T2);
        if resident >= self.slots && self.pins.count(|r| self.is_resident(r)) >= resident {
            return Ok(Prefetch::Refused);
        }
        self.queues.remove(expert);
        let evict = self.make_room();
        self.queues.push_front(T1, expert);
        self.unreferenced[e] = true;
        self.pins.add(expert);
        Ok(Prefetch::Loaded { evict })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(p: &mut ArcCache, e: u32) -> Access {
        let mut out = Vec::new();
        p.access_step(&[e], &mut out).unwrap();
        out[0]
    }

    #[test]
    fn hand_worked_adaptation() {
        // c = 2, empty. 1, 2 fill T1 = [2 1]. 3: |T1| + |B1| = 2 = c and |T1| = c → T1's LRU (1)
        // is dropped outright; T1 = [3 2]. 2: hit → T2 = [2]; T1 = [3]. 4: L1 = 1 < c, all = 2 <
        // 2c; REPLACE: |T1| = 1 > p = 0 → 3 to B1; T1 = [4]. 3: in B1 → p = 1; REPLACE: |T1| = 1
        // not > 1 → T2's LRU (2) to B2; T2 = [3]. 2: in B2 → p = 0; REPLACE (in B2, |T1| = 1 > 0)
        // → 4 to B1; T2 = [2 3].
        let mut p = ArcCache::new(8, 2, &[]).unwrap();
        let admit = |evict| Access::Miss { admit: true, evict };
        assert_eq!(step(&mut p, 1), admit(None));
        assert_eq!(step(&mut p, 2), admit(None));
        assert_eq!(step(&mut p, 3), admit(Some(1)));
        assert_eq!(step(&mut p, 2), Access::Hit);
        assert_eq!(step(&mut p, 4), admit(Some(3)));
        assert_eq!(step(&mut p, 3), admit(Some(2)));
        assert_eq!(p.target(), 1.0);
        assert_eq!(step(&mut p, 2), admit(Some(4)));
        assert_eq!(p.target(), 0.0);
        assert_eq!(p.resident(), vec![2, 3]);
    }

    #[test]
    fn a_prefetched_page_first_referenced_stays_in_t1() {
        // c = 2, empty. Prefetch 1 and 2 (T1 = [2 1]); 1 is referenced: a first reference, so T1 =
        // [1 2] and T2 stays empty. 3: |T1| + |B1| = c and |T1| = c → T1's LRU (2) is dropped, no
        // ghost; so 2 is then a new page and p stays 0. (Had the hit moved 1 to T2, 2 would have
        // gone to B1 and its return would have raised p to 1.)
        let mut p = ArcCache::new(8, 2, &[]).unwrap();
        assert_eq!(p.prefetch(1).unwrap(), Prefetch::Loaded { evict: None });
        assert_eq!(p.prefetch(2).unwrap(), Prefetch::Loaded { evict: None });
        assert_eq!(step(&mut p, 1), Access::Hit);
        let admit = |evict| Access::Miss { admit: true, evict };
        assert_eq!(step(&mut p, 3), admit(Some(2)));
        assert_eq!(step(&mut p, 2), admit(Some(1)));
        assert_eq!(p.target(), 0.0);
    }
}
