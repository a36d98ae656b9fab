//! Expert-placement policies: which routed experts of one MoE layer live in the fast store.
//!
//! # Cache model
//!
//! One policy instance manages one layer: a fast store of `slots` experts out of `n_experts`.
//! Time advances in *steps* (one token); in each step the router picks a set `R_t` of distinct
//! experts (top-k), and each is served from the fast store when resident (a hit) or from the host
//! store otherwise (a miss). On a miss the policy may admit the expert (copy it into the fast
//! store, evicting at most one resident when full) or bypass it (serve it from the host store and
//! leave the fast store alone). On demand paging alone nothing is loaded that was not just routed,
//! so after step `t` the resident set is a subset of `S_t ∪ R_t` of size ≤ `slots`. The figure of
//! merit is the served fraction, hits ÷ routed slots.
//!
//! A *prefetch* ([`Policy::prefetch`]) loads an expert that a predictor expects the next step to
//! route, before that step begins. It is not a reference (no count, recency or ghost hit is
//! credited to it): the policy only places it, most protected where it has an order (the head of
//! an LRU list; in the frequency policies it keeps its own key and so is their first victim until
//! routed; in [`TwoQ`] a resident FIFO of its own, `Apre`, the first victim), and picks the victim
//! as its demand misses do. An expert prefetched since the last
//! [`Policy::begin_step`] is never evicted by another prefetch (it is *pinned* until its step
//! begins), nor is a resident one named to [`Policy::prefetch`] (the replay and the store pin a
//! step's predicted residents first, [`Policy::pin_resident`], so that no prefetch evicts an
//! expert the step is predicted to read); when every resident is pinned, or the policy keeps a
//! fixed set ([`StaticSet`]) or is the demand-paging ceiling ([`Min`]), the prefetch is refused.
//!
//! A step's accesses are presented hits first ([`Policy::access_step`] does this), so an admission
//! never evicts an expert the same step still needs.
//!
//! # Policies
//!
//! * [`TwoQ`] — 2Q, "full version", Johnson & Shasha, VLDB 1994 ("2Q: A Low Overhead High
//!   Performance Buffer Management Replacement Algorithm", §2). The paper keeps three queues:
//!   `A1in` (FIFO of pages seen once, resident), `A1out` (FIFO of *identifiers* of pages pushed out of
//!   `A1in`, not resident) and `Am` (LRU of pages re-referenced while in `A1out`, resident). Its
//!   rules on a reference to `X`: in `Am` → move to the head of `Am`; in `A1out` → reclaim a slot and
//!   put `X` at the head of `Am`; in `A1in` → do nothing (a *correlated reference*, not evidence of
//!   reuse); in no queue → reclaim a slot and put `X` at the head of `A1in`. Reclaiming takes a free
//!   slot if any, else the tail of `A1in` when `|A1in| > Kin` (its identifier goes to the head of
//!   `A1out`, whose tail is dropped beyond `Kout`), else the tail of `Am` (forgotten, not put on
//!   `A1out`). The paper recommends `Kin` = 25 % and `Kout` = 50 % of the buffer.
//!
//!   **Mapping used here.** The fast store admits an expert only on a second access while
//!   remembered, so the fast store *is* `Am` (`slots` experts, LRU), and `A1in`/`A1out` are both
//!   identifier-only queues acting as the admission filter: a first access puts the id at the head
//!   of `A1in` (a miss, bypassed); `A1in` is bounded by `Kin` directly (it owns no slots, so there is
//!   no "free slot" case), its overflow moves to the head of `A1out`, bounded by `Kout`; a reference
//!   while in `A1in` does nothing (the paper's correlated-reference rule); a reference while in
//!   `A1out` promotes the expert into `Am`, evicting `Am`'s LRU tail when full (the evicted id is
//!   forgotten, as in the paper). `Kin = 0` turns the filter into "admit on the second access while
//!   in the `Kout`-long ghost queue". With [`Admission::Remembered`] a re-reference while in
//!   `A1in` promotes too (the correlated-reference rule off). A cap on promotions per step (per
//!   layer and token) bounds the copy traffic; a promotion refused by the cap leaves the id where
//!   it is. The defaults ([`TwoQParams::DEFAULT_A1IN`] and the others) were chosen by replay over
//!   the calibrated synthetic presets ([`crate::placement::synthetic::Preset`]).
//!
//!   **Frequency admission** ([`Admission::Frequency`]), after TinyLFU (Einziger, Friedman &
//!   Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM Transactions on Storage
//!   13(4), 2017): a promotion that `remembered` would make happens only when a slot is free or
//!   the candidate's frequency exceeds that of the victim it would evict (`Apre`'s oldest, else
//!   `Am`'s tail; ties refuse, and the id then stays where it is). Frequencies are exact per-layer counters (a layer has at
//!   most a few hundred experts, so TinyLFU's sketch is not needed), bumped on every routed
//!   access (hit or miss, before the decision), and all halved after every `W` accesses
//!   (TinyLFU's reset), `W = window · n_experts`, so the counts follow a drifting hot set.
//!
//!   **Prefetches** go to a fourth queue, `Apre`: resident, FIFO, sharing the `slots` with `Am`.
//!   A hit there is a correlated reference, as in the paper's resident `A1in` (the expert stays
//!   in `Apre`), except under frequency admission, where it moves the expert to the head of `Am`
//!   when it is more frequent than `Am`'s tail, which takes its place as `Apre`'s oldest. A slot
//!   is reclaimed (for a promotion or a prefetch) from `Apre`'s oldest first (its id goes to the
//!   head of `A1out`, so a demand re-reference promotes it), then from `Am`'s tail: a wrong
//!   prefetch is the next victim and the reused set in `Am` survives, as in LFU, where a
//!   prefetched expert keeps its own low count.
//! * [`Lru`] — admit every miss, evict the least recently used resident.
//! * [`Lfu`] — perfect LFU: a reference count per expert over every access since boot (resident or
//!   not; a layer has only `n_experts` ids), and the resident set kept as the best `slots` by the key
//!   (count, last use, lower id loses): a miss is admitted when its key beats the worst resident's,
//!   which then leaves. Ties in count go to recency (the less recently used loses) and, among
//!   experts never used (seeded ones), to the id (the lower id loses). The brief's "lower id, then
//!   LRU order" would never reach the recency key, ids being unique, so recency comes first here.
//! * [`StaticSet`] — a fixed set that never changes; [`StaticSet::oracle`] is the best fixed set, the
//!   `slots` most frequent experts of the whole trace (ties to the lower id), an offline oracle.
//! * [`Min`] — Belady's MIN with bypass, the exact optimum of this cache model (offline: it is built
//!   from the layer's whole sequence). After each step it keeps, out of `S_t ∪ R_t`, the `slots`
//!   experts whose next use is soonest, and drops those never used again. Per access: on a hit the
//!   resident's key becomes its next use; on a miss with next use `u`, admit when there is a free
//!   slot, or when the resident with the farthest next use `v` has `v > u` (evict it), else bypass.
//!   Optimality, by Belady's exchange argument (IBM Systems Journal 5(2), 1966) extended to
//!   bypass: take an optimal schedule that after step `t` keeps `b` but not `a`, both in
//!   `S_t ∪ R_t`, with `next(a) < next(b)`. Keep `a` instead and copy the schedule otherwise. Until
//!   `next(a)` the hits are the same (`b` is not used before then, and the original cannot
//!   re-acquire `a` before `next(a)`, since only routed experts can be loaded); at `next(a)` the
//!   swap gains a hit, and from there it follows the original with `a` in `b`'s place, losing at
//!   most one hit, at `next(b)`. So keeping the soonest-used is never worse, and MIN is optimal.
//!   `tests/replay.rs` checks it against exhaustive search.
//!
//! Comparisons, one paper each, in files of their own: `placement::arc` (ARC), `placement::lrfu`
//! (LRFU) and `placement::lecar` (LeCaR).
//!
//! # Start state
//!
//! [`TwoQ`] (its `Am`), [`Lru`], [`Lfu`], [`Min`] and the comparisons start from a given initial
//! membership (the identity set `0..slots` or a `--resident-set` seed; an empty one starts them
//! empty). The first id of the list counts as the most recently used. [`StaticSet`] starts from its own fixed set.

use std::any::Any;
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The outcome of one routed access to an expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The expert was resident: served from the fast store.
    Hit,
    /// The expert was not resident: served from the host store.
    Miss {
        /// Whether the policy admits it into the fast store now (the store copies its bytes).
        admit: bool,
        /// The resident expert evicted to make room, if any (only with `admit`).
        evict: Option<u32>,
    },
}

/// The outcome of one prefetch ([`Policy::prefetch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// The expert was resident already: nothing is loaded.
    Resident,
    /// The expert is copied into the fast store now, evicting `evict` when the store was full.
    Loaded {
        /// The resident expert evicted to make room, if any.
        evict: Option<u32>,
    },
    /// The policy does not take prefetches ([`StaticSet`], [`Min`]), or every resident is pinned
    /// by an earlier prefetch for the same step: nothing is loaded.
    Refused,
}

/// The experts prefetched, or named to a prefetch while resident, since the last
/// [`Policy::begin_step`]: pinned, never a prefetch's victim. At most a step's `top_k` long, so a
/// list is searched faster than a set.
#[derive(Clone, Debug, Default)]
pub(super) struct Pins(Vec<u32>);

impl Pins {
    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    pub(super) fn add(&mut self, expert: u32) {
        self.0.push(expert);
    }

    pub(super) fn contains(&self, expert: u32) -> bool {
        self.0.contains(&expert)
    }

    /// How many pinned experts satisfy `pred` (e.g. are still resident).
    pub(super) fn count(&self, pred: impl Fn(u32) -> bool) -> usize {
        self.0.iter().filter(|&&e| pred(e)).count()
    }
}

/// The policies known to [`crate::placement::replay`] and `aubier replay`, with their names.
macro_rules! policy_kinds {
    ($($(#[$doc:meta])* $kind:ident = $name:literal,)*) => {
        /// The policies known to [`crate::placement::replay`] and `aubier replay`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum PolicyKind {
            $($(#[$doc])* $kind,)*
        }

        impl PolicyKind {
            /// Every policy, in the order `aubier replay` prints them.
            pub const ALL: &[PolicyKind] = &[$(PolicyKind::$kind,)*];

            /// The command-line / JSON name (`2q`, `lru`, `lfu`, `static`, `min`, `arc`, `lrfu`,
            /// `lecar`).
            pub fn name(self) -> &'static str {
                match self {
                    $(PolicyKind::$kind => $name,)*
                }
            }
        }
    };
}

policy_kinds! {
    /// [`TwoQ`], named `2q`.
    TwoQ = "2q",
    /// [`Lru`], named `lru`.
    Lru = "lru",
    /// [`Lfu`], named `lfu`.
    Lfu = "lfu",
    /// [`StaticSet::oracle`], named `static`.
    Static = "static",
    /// [`Min`], named `min`.
    Min = "min",
    /// `placement::arc::ArcCache`, named `arc`.
    Arc = "arc",
    /// `placement::lrfu::Lrfu`, named `lrfu`.
    Lrfu = "lrfu",
    /// `placement::lecar::LeCaR`, named `lecar`.
    LeCaR = "lecar",
}

/// Error of [`PolicyKind::from_str`]: the name is not one of [`PolicyKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy `{0}` (known: 2q, lru, lfu, static, min, arc, lrfu, lecar)")]
pub struct UnknownPolicy(pub String);

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    /// Parses a name as printed by [`PolicyKind::name`] (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .iter()
            .copied()
            .find(|k| k.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// Errors of the policies: bad construction parameters, or accesses the policy cannot accept.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// `slots` is 0 or more than the layer has experts.
    #[error("slots = {slots} must be in 1..={n_experts}")]
    Slots {
        /// Requested fast-store slots.
        slots: usize,
        /// Experts in the layer.
        n_experts: u32,
    },
    /// An expert id (accessed, or in a seed) is not below `n_experts`.
    #[error("expert {expert} is not below n_experts = {n_experts}")]
    ExpertOutOfRange {
        /// The offending id.
        expert: u32,
        /// Experts in the layer.
        n_experts: u32,
    },
    /// The initial membership lists more experts than there are slots.
    #[error("initial membership has {len} experts but only {slots} slots")]
    SeedTooLarge {
        /// Experts listed.
        len: usize,
        /// Fast-store slots.
        slots: usize,
    },
    /// The initial membership lists an expert twice.
    #[error("initial membership lists expert {expert} twice")]
    SeedDuplicate {
        /// The repeated id.
        expert: u32,
    },
    /// One step routes the same expert twice (a top-k never does).
    #[error("expert {expert} is routed twice in one step")]
    DuplicateInStep {
        /// The repeated id.
        expert: u32,
    },
    /// A 2Q queue fraction is negative or not finite.
    #[error("2Q {name} = {value} must be a finite fraction >= 0 of the slots")]
    Fraction {
        /// `a1in` or `a1out`.
        name: &'static str,
        /// The value given.
        value: f64,
    },
    /// LRFU's decay is outside `0..=1` or not a number.
    #[error("LRFU lambda = {value} must be in 0..=1 (0 is LFU, 1 is LRU)")]
    Lambda {
        /// The value given.
        value: f64,
    },
    /// An oracle ([`Min`]) was asked about an expert that its trace does not route at this step.
    #[error(
        "expert {expert} is not routed at step {step} of the trace this oracle was built from"
    )]
    OffTrace {
        /// 0-based step.
        step: usize,
        /// The expert asked about.
        expert: u32,
    },
    /// An oracle ([`Min`]) was stepped past the end of its trace.
    #[error("step {step} is past the end of the oracle's trace ({steps} steps)")]
    PastEnd {
        /// The step that was begun.
        step: usize,
        /// Steps in the trace.
        steps: usize,
    },
    /// An oracle ([`Min`]) was accessed before its first [`Policy::begin_step`].
    #[error("access before the first begin_step")]
    NoStep,
    /// [`SaveState::reset_to`] got a snapshot of another kind of policy.
    #[error("cannot reset a {expected} policy to a {got} snapshot")]
    SnapshotKind {
        /// The policy being reset.
        expected: PolicyKind,
        /// The policy the snapshot was taken from.
        got: PolicyKind,
    },
}

/// A saved policy state (membership, queues, counters, step cursor and knobs), from
/// [`SaveState::snapshot`]; restore it with [`SaveState::reset_to`] (the `--reset=exact` of
/// ARCHITECTURE.md: back to the boot state between requests). It holds a copy of the policy
/// itself, so every policy saves and restores the same way ([`Snapshot::of`],
/// [`Snapshot::restore`]).
#[derive(Clone)]
pub struct Snapshot {
    kind: PolicyKind,
    state: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Snapshot({})", self.kind)
    }
}

impl Snapshot {
    /// The kind of policy this snapshot was taken from.
    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// A snapshot of `policy` (a copy of it).
    pub fn of<P: Policy + Clone + Send + Sync + 'static>(policy: &P) -> Snapshot {
        Snapshot {
            kind: policy.kind(),
            state: Arc::new(policy.clone()),
        }
    }

    /// Sets `policy` back to this snapshot. Errors: [`PolicyError::SnapshotKind`] when the
    /// snapshot was taken from another type of policy.
    pub fn restore<P: Policy + Clone + 'static>(&self, policy: &mut P) -> Result<(), PolicyError> {
        match self.state.downcast_ref::<P>() {
            Some(saved) => {
                *policy = saved.clone();
                Ok(())
            }
            None => Err(PolicyError::SnapshotKind {
                expected: policy.kind(),
                got: self.kind,
            }),
        }
    }
}

/// Saving and restoring a policy's whole state: every [`Policy`] that is `Clone + Send + Sync`
/// has it, by a copy of itself ([`Snapshot`]).
pub trait SaveState {
    /// Saves the whole state.
    fn snapshot(&self) -> Snapshot;

    /// Restores a state saved by [`SaveState::snapshot`] of the same kind of policy. Errors:
    /// [`PolicyError::SnapshotKind`].
    fn reset_to(&mut self, snapshot: &Snapshot) -> Result<(), PolicyError>;
}

impl<P: Policy + Clone + Send + Sync + 'static> SaveState for P {
    fn snapshot(&self) -> Snapshot {
        Snapshot::of(self)
    }

    fn reset_to(&mut self, snapshot: &Snapshot) -> Result<(), PolicyError> {
        snapshot.restore(self)
    }
}

/// A placement policy for one layer. A store drives it per routed expert; `replay` drives it from a
/// trace. Expert ids are `0..n_experts` of the layer.
///
/// Protocol: call [`Policy::begin_step`] once per token, then [`Policy::access`] once per routed
/// expert of that token, hits first — or call [`Policy::access_step`], which does both.
pub trait Policy: SaveState {
    /// Which policy this is.
    fn kind(&self) -> PolicyKind;

    /// Fast-store slots of the layer.
    fn slots(&self) -> usize;

    /// Starts the next step (token); by default nothing happens. Errors: [`PolicyError::PastEnd`]
    /// for an oracle at the end of its trace.
    fn begin_step(&mut self) -> Result<(), PolicyError> {
        Ok(())
    }

    /// Whether `expert` is resident in the fast store now (no state change; false when out of range).
    fn is_resident(&self, expert: u32) -> bool;

    /// Serves one routed access and updates the policy state. Errors:
    /// [`PolicyError::ExpertOutOfRange`]; for [`Min`] also `OffTrace` / `NoStep`.
    fn access(&mut self, expert: u32) -> Result<Access, PolicyError>;

    /// The resident experts, in the policy's own order (most valuable first where it has one).
    fn resident(&self) -> Vec<u32>;

    /// Loads `expert` ahead of the step predicted to route it (see the module note): not a
    /// reference; pinned until the next [`Policy::begin_step`], as is a resident `expert`
    /// ([`Prefetch::Resident`]: nothing loaded). Errors:
    /// [`PolicyError::ExpertOutOfRange`].
    fn prefetch(&mut self, expert: u32) -> Result<Prefetch, PolicyError>;

    /// Pins every resident expert of `predicted` (a [`Policy::prefetch`] of each), so that no
    /// prefetch before the next [`Policy::begin_step`] evicts an expert the step is predicted to
    /// read: the replay and the store call it before their loads. Errors: those of `prefetch`.
    fn pin_resident(
        &mut self,
        predicted: &mut dyn Iterator<Item = u32>,
    ) -> Result<(), PolicyError> {
        for e in predicted {
            if self.is_resident(e) {
                self.prefetch(e)?;
            }
        }
        Ok(())
    }

    /// One step: begins it and serves every routed expert of `experts` (one token's top-k in this
    /// layer), hits before misses. `out` receives one [`Access`] per entry of `experts`, in the same
    /// order. Errors: [`PolicyError::DuplicateInStep`], and those of `begin_step` / `access`.
    fn access_step(&mut self, experts: &[u32], out: &mut Vec<Access>) -> Result<(), PolicyError> {
        for (i, &e) in experts.iter().enumerate() {
            if experts[..i].contains(&e) {
                return Err(PolicyError::DuplicateInStep { expert: e });
            }
        }
        self.begin_step()?;
        const PENDING: Access = Access::Miss {
            admit: false,
            evict: None,
        };
        out.clear();
        for &e in experts {
            if self.is_resident(e) {
                out.push(self.access(e)?);
            } else {
                out.push(PENDING);
            }
        }
        for (slot, &e) in out.iter_mut().zip(experts) {
            if *slot == PENDING {
                *slot = self.access(e)?;
            }
        }
        Ok(())
    }
}

pub(super) fn check_expert(expert: u32, n_experts: u32) -> Result<usize, PolicyError> {
    if expert < n_experts {
        Ok(expert as usize)
    } else {
        Err(PolicyError::ExpertOutOfRange { expert, n_experts })
    }
}

pub(super) fn check_slots(slots: usize, n_experts: u32) -> Result<(), PolicyError> {
    if slots == 0 || slots > n_experts as usize {
        Err(PolicyError::Slots { slots, n_experts })
    } else {
        Ok(())
    }
}

/// Validates an initial membership: ids in range, no repeats, at most `slots` of them.
pub(super) fn check_seed(initial: &[u32], slots: usize, n_experts: u32) -> Result<(), PolicyError> {
    check_slots(slots, n_experts)?;
    if initial.len() > slots {
        return Err(PolicyError::SeedTooLarge {
            len: initial.len(),
            slots,
        });
    }
    let mut seen = vec![false; n_experts as usize];
    for &e in initial {
        let i = check_expert(e, n_experts)?;
        if seen[i] {
            return Err(PolicyError::SeedDuplicate { expert: e });
        }
        seen[i] = true;
    }
    Ok(())
}

/// Intrusive doubly linked queues over the ids `0..n`: each id is in at most one queue, so one
/// `prev`/`next` pair per id serves them all and every operation is O(1).
#[derive(Clone, Debug)]
pub(super) struct Queues {
    head: Vec<u32>,
    tail: Vec<u32>,
    len: Vec<usize>,
    prev: Vec<u32>,
    next: Vec<u32>,
    member: Vec<u8>,
}

const NIL: u32 = u32::MAX;
const NO_QUEUE: u8 = u8::MAX;

impl Queues {
    pub(super) fn new(n_queues: usize, n_ids: usize) -> Self {
        Queues {
            head: vec![NIL; n_queues],
            tail: vec![NIL; n_queues],
            len: vec![0; n_queues],
            prev: vec![NIL; n_ids],
            next: vec![NIL; n_ids],
            member: vec![NO_QUEUE; n_ids],
        }
    }

    pub(super) fn queue_of(&self, id: u32) -> Option<usize> {
        match self.member[id as usize] {
            NO_QUEUE => None,
            q => Some(q as usize),
        }
    }

    pub(super) fn len(&self, q: usize) -> usize {
        self.len[q]
    }

    /// Links `id` (in no queue) at the head of `q`.
    pub(super) fn push_front(&mut self, q: usize, id: u32) {
        let i = id as usize;
        self.member[i] = q as u8;
        self.prev[i] = NIL;
        self.next[i] = self.head[q];
        match self.head[q] {
            NIL => self.tail[q] = id,
            h => self.prev[h as usize] = id,
        }
        self.head[q] = id;
        self.len[q] += 1;
    }

    /// Links `id` (in no queue) at the tail of `q`.
    pub(super) fn push_back(&mut self, q: usize, id: u32) {
        let i = id as usize;
        self.member[i] = q as u8;
        self.next[i] = NIL;
        self.prev[i] = self.tail[q];
        match self.tail[q] {
            NIL => self.head[q] = id,
            t => self.next[t as usize] = id,
        }
        self.tail[q] = id;
        self.len[q] += 1;
    }

    /// Unlinks `id` from its queue (no-op when in none).
    pub(super) fn remove(&mut self, id: u32) {
        let Some(q) = self.queue_of(id) else { return };
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        match p {
            NIL => self.head[q] = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail[q] = p,
            n => self.prev[n as usize] = p,
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.member[i] = NO_QUEUE;
        self.len[q] -= 1;
    }

    /// The id at the tail of `q`, if any.
    pub(super) fn tail(&self, q: usize) -> Option<u32> {
        match self.tail[q] {
            NIL => None,
            t => Some(t),
        }
    }

    pub(super) fn pop_back(&mut self, q: usize) -> Option<u32> {
        match self.tail[q] {
            NIL => None,
            t => {
                self.remove(t);
                Some(t)
            }
        }
    }

    /// Unlinks and returns the id of `q` nearest its tail that is not pinned.
    pub(super) fn pop_back_unpinned(&mut self, q: usize, pins: &Pins) -> Option<u32> {
        let mut cur = self.tail[q];
        while cur != NIL && pins.contains(cur) {
            cur = self.prev[cur as usize];
        }
        match cur {
            NIL => None,
            id => {
                self.remove(id);
                Some(id)
            }
        }
    }

    pub(super) fn move_to_front(&mut self, id: u32) {
        if let Some(q) = self.queue_of(id) {
            self.remove(id);
            self.push_front(q, id);
        }
    }

    /// The ids of `q`, head to tail.
    pub(super) fn ids(&self, q: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len[q]);
        let mut cur = self.head[q];
        while cur != NIL {
            out.push(cur);
            cur = self.next[cur as usize];
        }
        out
    }
}

/// Which re-reference of a remembered, non-resident expert promotes it into [`TwoQ`]'s `Am`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Admission {
    /// The paper's rule, named `ghost`: a re-reference while in `A1out`; one while in `A1in` is a
    /// correlated reference and does nothing.
    Ghost,
    /// Named `remembered`: a re-reference while in `A1in` or `A1out`.
    Remembered,
    /// Named `frequency` (or `frequency:W`): TinyLFU's admission on top of `remembered`. A
    /// re-reference while in `A1in` or `A1out` promotes only when a slot is free or the
    /// expert's frequency exceeds that of the victim it would evict (`Apre`'s oldest, else
    /// `Am`'s tail). Frequencies count every routed access of the layer (hit or miss) and are
    /// all halved every `window · n_experts` accesses; a hit on a prefetched expert in `Apre`
    /// moves it into `Am` under the same test (see the module note).
    Frequency {
        /// The aging window `W`, in multiples of the layer's expert count (at least 1).
        window: u32,
    },
}

impl Admission {
    /// The default aging window of [`Admission::Frequency`], in multiples of the expert count.
    pub const DEFAULT_WINDOW: u32 = 2;

    /// The command-line name: `ghost`, `remembered` or `frequency`.
    pub fn name(self) -> &'static str {
        match self {
            Admission::Ghost => "ghost",
            Admission::Remembered => "remembered",
            Admission::Frequency { .. } => "frequency",
        }
    }
}

impl fmt::Display for Admission {
    /// The name; `frequency:W` for [`Admission::Frequency`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Admission::Frequency { window } => write!(f, "frequency:{window}"),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for Admission {
    type Err = String;

    /// Parses `ghost`, `remembered`, `frequency` (window [`Admission::DEFAULT_WINDOW`]) or
    /// `frequency:W` with `W` ≥ 1 (ASCII case-insensitive). Errors: a message naming them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (name, window) = match s.split_once(':') {
            Some((name, w)) => (name, Some(w)),
            None => (s, None),
        };
        let unknown = || {
            format!(
                "unknown 2Q admission `{s}` (known: ghost, remembered, frequency, frequency:W \
                 with W >= 1)"
            )
        };
        match (name.to_ascii_lowercase().as_str(), window) {
            ("ghost", None) => Ok(Admission::Ghost),
            ("remembered", None) => Ok(Admission::Remembered),
            ("frequency", None) => Ok(Admission::Frequency {
                window: Admission::DEFAULT_WINDOW,
            }),
            ("frequency", Some(w)) => match w.trim().parse::<u32>() {
                Ok(window) if window >= 1 => Ok(Admission::Frequency { window }),
                _ => Err(unknown()),
            },
            _ => Err(unknown()),
        }
    }
}

/// Knobs of [`TwoQ`], in experts (see [`TwoQParams::from_fractions`] for the paper's fractions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TwoQParams {
    /// Fast-store slots of the layer: the size of `Am`.
    pub slots: usize,
    /// `Kin`: the most ids `A1in` remembers (first-seen experts, not resident).
    pub a1in: usize,
    /// `Kout`: the most ids the ghost queue `A1out` remembers (not resident).
    pub a1out: usize,
    /// The most promotions into `Am` per step (token) in this layer; `None` = no cap.
    pub max_promotions: Option<usize>,
    /// Which re-reference promotes.
    pub admission: Admission,
}

impl TwoQParams {
    /// The paper's recommended `Kin` as a fraction of the buffer (25 %).
    pub const PAPER_A1IN: f64 = 0.25;
    /// The paper's recommended `Kout` as a fraction of the buffer (50 %).
    pub const PAPER_A1OUT: f64 = 0.5;
    /// The default `Kin` as a fraction of the slots, chosen with [`TwoQParams::DEFAULT_A1OUT`] by
    /// replay over the calibrated synthetic presets on their tuning seed (docs/BENCHMARKS.md,
    /// "Choosing 2Q's knobs"): 0, so that a re-reference promotes whenever the id is remembered
    /// (the paper's 25 % treats a re-reference within `Kin` ids as correlated and ignores it).
    pub const DEFAULT_A1IN: f64 = 0.0;
    /// The default `Kout` as a fraction of the slots: 200 %, chosen with
    /// [`TwoQParams::DEFAULT_ADMISSION`] (docs/BENCHMARKS.md, "Choosing the default"): the ghost
    /// queue then remembers every recent id and the frequency test decides.
    pub const DEFAULT_A1OUT: f64 = 2.0;
    /// The default admission rule: [`Admission::Frequency`] with window 2
    /// ([`Admission::DEFAULT_WINDOW`]), which with `Kout` 200 % was above the paper's
    /// [`Admission::Ghost`] (`Kout` 50 %) in every cell of the tuning grid (4 presets × demand
    /// and prefetch × 2 slot counts, seed 1; docs/BENCHMARKS.md, "Choosing the default").
    pub const DEFAULT_ADMISSION: Admission = Admission::Frequency {
        window: Admission::DEFAULT_WINDOW,
    };
    /// The default `Kout` with a prefetch budget: 25 %, chosen with
    /// [`TwoQParams::PREFETCH_ADMISSION`] by replay over the calibrated presets' prefetch cells
    /// on their tuning seed (docs/BENCHMARKS.md, "Knobs for the read-ahead"): with prefetches,
    /// a short ghost queue and a long window promote less on demand, so `Am` churns less.
    pub const PREFETCH_A1OUT: f64 = 0.25;
    /// The default admission rule with a prefetch budget: [`Admission::Frequency`] with window
    /// 32, chosen with [`TwoQParams::PREFETCH_A1OUT`].
    pub const PREFETCH_ADMISSION: Admission = Admission::Frequency { window: 32 };

    /// The default `(Kout as a fraction of the slots, admission)`: [`TwoQParams::DEFAULT_A1OUT`]
    /// and [`TwoQParams::DEFAULT_ADMISSION`] on demand paging, [`TwoQParams::PREFETCH_A1OUT`]
    /// and [`TwoQParams::PREFETCH_ADMISSION`] when `prefetch` (a prefetch budget above 0).
    pub fn default_knobs(prefetch: bool) -> (f64, Admission) {
        if prefetch {
            (TwoQParams::PREFETCH_A1OUT, TwoQParams::PREFETCH_ADMISSION)
        } else {
            (TwoQParams::DEFAULT_A1OUT, TwoQParams::DEFAULT_ADMISSION)
        }
    }

    /// Knobs from fractions of `slots`, as the paper states them: `Kin = round(a1in · slots)`,
    /// `Kout = round(a1out · slots)`. Errors: [`PolicyError::Fraction`] for a negative or
    /// non-finite fraction.
    pub fn from_fractions(
        slots: usize,
        a1in: f64,
        a1out: f64,
        max_promotions: Option<usize>,
        admission: Admission,
    ) -> Result<Self, PolicyError> {
        let count = |name, value: f64| {
            if value.is_finite() && value >= 0.0 {
                Ok((value * slots as f64).round() as usize)
            } else {
                Err(PolicyError::Fraction { name, value })
            }
        };
        Ok(TwoQParams {
            slots,
            a1in: count("a1in", a1in)?,
            a1out: count("a1out", a1out)?,
            max_promotions,
            admission,
        })
    }
}

/// 2Q with admission on a second access while remembered (see the module note for the mapping of
/// the paper's queues). O(1) per access.
#[derive(Clone, Debug)]
pub struct TwoQ {
    n_experts: u32,
    params: TwoQParams,
    queues: Queues,
    promotions: usize,
    pins: Pins,
    /// [`Admission::Frequency`]'s counts per expert (empty with the other rules).
    freq: Vec<u32>,
    /// Accesses since the counts were last halved.
    since_aging: u64,
}

const AM: usize = 0;
const A1IN: usize = 1;
const A1OUT: usize = 2;
/// Resident prefetched experts not yet re-referenced through `A1out` (FIFO, newest at the head).
const APRE: usize = 3;

impl TwoQ {
    /// A 2Q policy whose `Am` starts as `initial` (first id = most recently used). Errors:
    /// [`PolicyError::Slots`], and the seed errors (`ExpertOutOfRange`, `SeedTooLarge`,
    /// `SeedDuplicate`).
    pub fn new(n_experts: u32, params: TwoQParams, initial: &[u32]) -> Result<Self, PolicyError> {
        check_seed(initial, params.slots, n_experts)?;
        let mut queues = Queues::new(4, n_experts as usize);
        for &e in initial {
            queues.push_back(AM, e);
        }
        let freq = match params.admission {
            Admission::Frequency { .. } => vec![0; n_experts as usize],
            Admission::Ghost | Admission::Remembered => Vec::new(),
        };
        Ok(TwoQ {
            n_experts,
            params,
            queues,
            promotions: 0,
            pins: Pins::default(),
            freq,
            since_aging: 0,
        })
    }

    /// [`Admission::Frequency`]'s count of `expert` (0 with the other rules).
    pub fn frequency(&self, expert: u32) -> u32 {
        self.freq.get(expert as usize).copied().unwrap_or(0)
    }

    /// Counts one access of `expert` and halves every count once `window · n_experts` accesses
    /// have been counted since the last halving (no-op without [`Admission::Frequency`]).
    fn count(&mut self, expert: usize) {
        let Admission::Frequency { window } = self.params.admission else {
            return;
        };
        self.freq[expert] = self.freq[expert].saturating_add(1);
        self.since_aging += 1;
        if self.since_aging >= u64::from(window.max(1)) * u64::from(self.n_experts) {
            self.since_aging = 0;
            for f in &mut self.freq {
                *f /= 2;
            }
        }
    }

    /// Whether [`Admission::Frequency`] refuses to promote `expert` now: `Am` is full and its
    /// tail (the victim) is at least as frequent. Always false with the other rules.
    fn frequency_refuses(&self, expert: u32) -> bool {
        if !matches!(self.params.admission, Admission::Frequency { .. }) || !self.full() {
            return false;
        }
        match self.queues.tail(APRE).or(self.queues.tail(AM)) {
            Some(victim) => self.frequency(expert) <= self.frequency(victim),
            None => false,
        }
    }

    /// Whether a hit on `expert`, resident in `Apre`, moves it into `Am` under
    /// [`Admission::Frequency`]: when it is more frequent than `Am`'s tail (which then takes its
    /// place as `Apre`'s oldest, the next victim), or `Am` is empty. Always false with the
    /// other rules (a hit in `Apre` is a correlated reference).
    fn frequency_swaps(&self, expert: u32) -> bool {
        if !matches!(self.params.admission, Admission::Frequency { .. }) {
            return false;
        }
        match self.queues.tail(AM) {
            Some(v) => self.frequency(expert) > self.frequency(v),
            None => true,
        }
    }

    /// Whether every slot holds an expert (of `Am` or `Apre`).
    fn full(&self) -> bool {
        self.queues.len(AM) + self.queues.len(APRE) >= self.params.slots
    }

    /// Frees a slot when full: the oldest expert of `Apre` (its id goes to the head of `A1out`),
    /// else `Am`'s least recent one (forgotten); with `honour_pins`, never a pinned one. `Some(None)`
    /// when a slot was free; `None` when every resident is pinned.
    fn reclaim(&mut self, honour_pins: bool) -> Option<Option<u32>> {
        if !self.full() {
            return Some(None);
        }
        let none = Pins::default();
        let pins = if honour_pins { &self.pins } else { &none };
        if let Some(v) = self.queues.pop_back_unpinned(APRE, pins) {
            self.remember(v);
            return Some(Some(v));
        }
        self.queues.pop_back_unpinned(AM, pins).map(Some)
    }

    /// Puts `id` (in no queue) at the head of `A1out`, dropping its tail beyond `Kout`.
    fn remember(&mut self, id: u32) {
        self.queues.push_front(A1OUT, id);
        if self.queues.len(A1OUT) > self.params.a1out {
            self.queues.pop_back(A1OUT);
        }
    }

    /// The knobs.
    pub fn params(&self) -> TwoQParams {
        self.params
    }

    /// The ids in `A1in`, newest first.
    pub fn a1in(&self) -> Vec<u32> {
        self.queues.ids(A1IN)
    }

    /// The ids in `A1out`, newest first.
    pub fn a1out(&self) -> Vec<u32> {
        self.queues.ids(A1OUT)
    }

    /// The resident prefetched experts not yet promoted (`Apre`), newest first.
    pub fn prefetched(&self) -> Vec<u32> {
        self.queues.ids(APRE)
    }
}

impl Policy for TwoQ {
    fn kind(&self) -> PolicyKind {
        PolicyKind::TwoQ
    }

    fn slots(&self) -> usize {
        self.params.slots
    }

    fn begin_step(&mut self) -> Result<(), PolicyError> {
        self.promotions = 0;
        self.pins.clear();
        Ok(())
    }

    fn is_resident(&self, expert: u32) -> bool {
        expert < self.n_experts && matches!(self.queues.queue_of(expert), Some(AM | APRE))
    }

    fn access(&mut self, expert: u32) -> Result<Access, PolicyError> {
        check_expert(expert, self.n_experts)?;
        let bypass = Access::Miss {
            admit: false,
            evict: None,
        };
        let remembered = self.params.admission != Admission::Ghost;
        self.count(expert as usize);
        match self.queues.queue_of(expert) {
            Some(AM) => {
                self.queues.move_to_front(expert);
                Ok(Access::Hit)
            }
            Some(APRE) => {
                if self.frequency_swaps(expert) {
                    if let Some(v) = self.queues.pop_back(AM) {
                        self.queues.push_back(APRE, v);
                    }
                    self.queues.remove(expert);
                    self.queues.push_front(AM, expert);
                }
                Ok(Access::Hit)
            }
            Some(q) if q == A1OUT || remembered => {
                if self
                    .params
                    .max_promotions
                    .is_some_and(|cap| self.promotions >= cap)
                    || self.frequency_refuses(expert)
                {
                    return Ok(bypass);
                }
                self.queues.remove(expert);
                let evict = self.reclaim(false).flatten();
                self.queues.push_front(AM, expert);
                self.promotions += 1;
                Ok(Access::Miss { admit: true, evict })
            }
            Some(_) => Ok(bypass),
            None => {
                self.queues.push_front(A1IN, expert);
                if self.queues.len(A1IN) > self.params.a1in {
                    if let Some(y) = self.queues.pop_back(A1IN) {
                        self.remember(y);
                    }
                }
                Ok(bypass)
            }
        }
    }

    /// `Am` (most recent first), then `Apre` (newest first).
    fn resident(&self) -> Vec<u32> {
        let mut out = self.queues.ids(AM);
        out.extend(self.queues.ids(APRE));
        out
    }

    /// Puts `expert` at the head of `Apre` (out of `A1in` / `A1out` if remembered there), freeing
    /// a slot when full as a promotion does but never taking a pinned expert. Not a promotion:
    /// the promotion cap does not count it.
    fn prefetch(&mut self, expert: u32) -> Result<Prefetch, PolicyError> {
        check_expert(expert, self.n_experts)?;
        if self.is_resident(expert) {
            self.pins.add(expert);
            return Ok(Prefetch::Resident);
        }
        let Some(evict) = self.reclaim(true) else {
            return Ok(Prefetch::Refused);
        };
        self.queues.remove(expert);
        self.queues.push_front(APRE, expert);
        self.pins.add(expert);
        Ok(Prefetch::Loaded { evict })
    }
}

/// Least recently used: admit every miss, evict the LRU resident when full. O(1) per access.
#[derive(Clone, Debug)]
pub struct Lru {
    n_experts: u32,
    slots: usize,
    queues: Queues,
    pins: Pins,
}

impl Lru {
    /// An LRU policy starting with `initial` resident (first id = most recently used). Errors: as
    /// [`TwoQ::new`].
    pub fn new(n_experts: u32, slots: usize, initial: &[u32]) -> Result<Self, PolicyError> {
        check_seed(initial, slots, n_experts)?;
        let mut queues = Queues::new(1, n_experts as usize);
        for &e in initial {
            queues.push_back(0, e);
        }
        Ok(Lru {
            n_experts,
            slots,
            queues,
            pins: Pins::default(),
        })
    }
}

impl Policy for Lru {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lru
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn begin_step(&mut self) -> Result<(), PolicyError> {
        self.pins.clear();
        Ok(())
    }

    fn is_resident(&self, expert: u32) -> bool {
        expert < self.n_experts && self.queues.queue_of(expert).is_some()
    }

    fn access(&mut self, expert: u32) -> Result<Access, PolicyError> {
        check_expert(expert, self.n_experts)?;
        if self.queues.queue_of(expert).is_some() {
            self.queues.move_to_front(expert);
            return Ok(Access::Hit);
        }
        let evict = if self.queues.len(0) >= self.slots {
            self.queues.pop_back(0)
        } else {
            None
        };
        self.queues.push_front(0, expert);
        Ok(Access::Miss { admit: true, evict })
    }

    fn resident(&self) -> Vec<u32> {
        self.queues.ids(0)
    }

    /// Puts `expert` at the head (most recent), evicting the least recent unpinned resident.
    fn prefetch(&mut self, expert: u32) -> Result<Prefetch, PolicyError> {
        check_expert(expert, self.n_experts)?;
        if self.queues.queue_of(expert).is_some() {
            self.pins.add(expert);
            return Ok(Prefetch::Resident);
        }
        let evict = if self.queues.len(0) >= self.slots {
            match self.queues.pop_back_unpinned(0, &self.pins) {
                Some(v) => Some(v),
                None => return Ok(Prefetch::Refused),
            }
        } else {
            None
        };
        self.queues.push_front(0, expert);
        self.pins.add(expert);
        Ok(Prefetch::Loaded { evict })
    }
}

/// Perfect LFU with recency tie-break (see the module note). O(log slots) per access.
#[derive(Clone, Debug)]
pub struct Lfu {
    n_experts: u32,
    slots: usize,
    /// References per expert since boot.
    count: Vec<u64>,
    /// Access clock of each expert's last reference (0 = never referenced).
    last: Vec<u64>,
    clock: u64,
    /// Resident experts keyed by (count, last, id); the first is the next victim.
    resident: BTreeSet<(u64, u64, u32)>,
    pins: Pins,
}

impl Lfu {
    /// An LFU policy starting with `initial` resident, all counts 0. Errors: as [`TwoQ::new`].
    pub fn new(n_experts: u32, slots: usize, initial: &[u32]) -> Result<Self, PolicyError> {
        check_seed(initial, slots, n_experts)?;
        Ok(Lfu {
            n_experts,
            slots,
            count: vec![0; n_experts as usize],
            last: vec![0; n_experts as usize],
            clock: 0,
            resident: initial.iter().map(|&e| (0, 0, e)).collect(),
            pins: Pins::default(),
        })
    }

    fn key(&self, e: usize) -> (u64, u64, u32) {
        (self.count[e], self.last[e], e as u32)
    }
}

impl Policy for Lfu {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Lfu
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn begin_step(&mut self) -> Result<(), PolicyError> {
        self.pins.clear();
        Ok(())
    }

    fn is_resident(&self, expert: u32) -> bool {
        expert < self.n_experts && self.resident.contains(&self.key(expert as usize))
    }

    fn access(&mut self, expert: u32) -> Result<Access, PolicyError> {
        let e = check_expert(expert, self.n_experts)?;
        let old = self.key(e);
        let was_resident = self.resident.remove(&old);
        self.clock += 1;
        self.count[e] += 1;
        self.last[e] = self.clock;
        let new = self.key(e);
        if was_resident {
            self.resident.insert(new);
            return Ok(Access::Hit);
        }
        if self.resident.len() < self.slots {
            self.resident.insert(new);
            return Ok(Access::Miss {
                admit: true,
                evict: None,
            });
        }
        match self.resident.first().copied() {
            Some(victim) if victim < new => {
                self.resident.remove(&victim);
                self.resident.insert(new);
                Ok(Access::Miss {
                    admit: true,
                    evict: Some(victim.2),
                })
            }
            _ => Ok(Access::Miss {
                admit: false,
                evict: None,
            }),
        }
    }

    /// Residents, most valuable (highest count, then most recent) first.
    fn resident(&self) -> Vec<u32> {
        self.resident.iter().rev().map(|k| k.2).collect()
    }

    /// Admits `expert` with its own key (count and last use unchanged), evicting the unpinned
    /// resident with the lowest key when full.
    fn prefetch(&mut self, expert: u32) -> Result<Prefetch, PolicyError> {
        let e = check_expert(expert, self.n_experts)?;
        let key = self.key(e);
        if self.resident.contains(&key) {
            self.pins.add(expert);
            return Ok(Prefetch::Resident);
        }
        let evict = if self.resident.len() >= self.slots {
            let pins = &self.pins;
            match self.resident.iter().find(|k| !pins.contains(k.2)).copied() {
                Some(victim) => {
                    self.resident.remove(&victim);
                    Some(victim.2)
                }
                None => return Ok(Prefetch::Refused),
            }
        } else {
            None
        };
        self.resident.insert(key);
        self.pins.add(expert);
        Ok(Prefetch::Loaded { evict })
    }
}

/// A fixed resident set: hits on its members, bypasses everything else, never changes.
#[derive(Clone, Debug)]
pub struct StaticSet {
    n_experts: u32,
    slots: usize,
    members: Vec<u32>,
    is_member: Vec<bool>,
}

impl StaticSet {
    /// A fixed set `members` (order kept for [`Policy::resident`]). Errors: as [`TwoQ::new`].
    pub fn new(n_experts: u32, slots: usize, members: &[u32]) -> Result<Self, PolicyError> {
        check_seed(members, slots, n_experts)?;
        let mut is_member = vec![false; n_experts as usize];
        for &e in members {
            is_member[e as usize] = true;
        }
        Ok(StaticSet {
            n_experts,
            slots,
            members: members.to_vec(),
            is_member,
        })
    }

    /// The best fixed set for a layer's whole sequence of steps: the `slots` experts routed most
    /// often, ties to the lower id, most frequent first. Errors: `Slots`, `ExpertOutOfRange`.
    pub fn oracle<'a>(
        n_experts: u32,
        slots: usize,
        steps: impl IntoIterator<Item = &'a [u32]>,
    ) -> Result<Self, PolicyError> {
        check_slots(slots, n_experts)?;
        let mut count = vec![0u64; n_experts as usize];
        for step in steps {
            for &e in step {
                count[check_expert(e, n_experts)?] += 1;
            }
        }
        let mut order: Vec<u32> = (0..n_experts).collect();
        order.sort_by_key(|&e| (std::cmp::Reverse(count[e as usize]), e));
        order.truncate(slots);
        StaticSet::new(n_experts, slots, &order)
    }
}

impl Policy for StaticSet {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Static
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn is_resident(&self, expert: u32) -> bool {
        expert < self.n_experts && self.is_member[expert as usize]
    }

    fn access(&mut self, expert: u32) -> Result<Access, PolicyError> {
        let e = check_expert(expert, self.n_experts)?;
        Ok(if self.is_member[e] {
            Access::Hit
        } else {
            Access::Miss {
                admit: false,
                evict: None,
            }
        })
    }

    fn resident(&self) -> Vec<u32> {
        self.members.clone()
    }

    /// A fixed set takes no prefetch: [`Prefetch::Resident`] for a member, else
    /// [`Prefetch::Refused`].
    fn prefetch(&mut self, expert: u32) -> Result<Prefetch, PolicyError> {
        refuse_prefetch(self, expert, self.n_experts)
    }
}

/// The prefetch of a policy that takes none: [`Prefetch::Resident`] for a resident, else
/// [`Prefetch::Refused`]. Errors: [`PolicyError::ExpertOutOfRange`].
fn refuse_prefetch(
    policy: &impl Policy,
    expert: u32,
    n_experts: u32,
) -> Result<Prefetch, PolicyError> {
    check_expert(expert, n_experts)?;
    Ok(if policy.is_resident(expert) {
        Prefetch::Resident
    } else {
        Prefetch::Refused
    })
}

/// "Never used again" as a next-use step.
const NEVER: u64 = u64::MAX;

/// The future of one layer's trace, shared by a [`Min`] and its snapshots.
#[derive(Debug)]
struct Future {
    /// Step `t` routes `ids[offsets[t]..offsets[t + 1]]`.
    offsets: Vec<usize>,
    ids: Vec<u32>,
    /// For each entry of `ids`, the next step that routes the same expert, or [`NEVER`].
    next: Vec<u64>,
    /// Per expert, the first step that routes it, or [`NEVER`].
    first: Vec<u64>,
}

/// Belady's MIN with bypass: the exact optimum of the cache model (see the module note). It is an
/// offline oracle bound to the sequence it was built from: the accesses must follow it.
/// O(k + log slots) per access after an O(steps · k) precomputation.
#[derive(Clone, Debug)]
pub struct Min {
    n_experts: u32,
    slots: usize,
    future: Arc<Future>,
    /// The current step; `None` before the first `begin_step`.
    step: Option<usize>,
    /// Per expert, its next use (meaningful while resident).
    key: Vec<u64>,
    is_resident: Vec<bool>,
    /// Residents keyed by (next use, id); the last is the farthest.
    resident: BTreeSet<(u64, u32)>,
}

impl Min {
    /// MIN over a layer's `steps` (each the experts one token routes, distinct), starting with
    /// `initial` resident. Errors: as [`TwoQ::new`], plus `ExpertOutOfRange` / `DuplicateInStep`
    /// for a bad step.
    pub fn new<'a>(
        n_experts: u32,
        slots: usize,
        initial: &[u32],
        steps: impl IntoIterator<Item = &'a [u32]>,
    ) -> Result<Self, PolicyError> {
        check_seed(initial, slots, n_experts)?;
        let mut offsets = vec![0];
        let mut ids = Vec::new();
        for step in steps {
            for (i, &e) in step.iter().enumerate() {
                check_expert(e, n_experts)?;
                if step[..i].contains(&e) {
                    return Err(PolicyError::DuplicateInStep { expert: e });
                }
            }
            ids.extend_from_slice(step);
            offsets.push(ids.len());
        }
        let mut next = vec![NEVER; ids.len()];
        let mut seen = vec![NEVER; n_experts as usize];
        for t in (0..offsets.len() - 1).rev() {
            for j in offsets[t]..offsets[t + 1] {
                let e = ids[j] as usize;
                next[j] = seen[e];
                seen[e] = t as u64;
            }
        }
        let future = Future {
            offsets,
            ids,
            next,
            first: seen,
        };
        let mut key = vec![NEVER; n_experts as usize];
        let mut is_resident = vec![false; n_experts as usize];
        let mut resident = BTreeSet::new();
        for &e in initial {
            key[e as usize] = future.first[e as usize];
            is_resident[e as usize] = true;
            resident.insert((key[e as usize], e));
        }
        Ok(Min {
            n_experts,
            slots,
            future: Arc::new(future),
            step: None,
            key,
            is_resident,
            resident,
        })
    }

    /// Steps in the oracle's trace.
    pub fn steps(&self) -> usize {
        self.future.offsets.len() - 1
    }
}

impl Policy for Min {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Min
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn begin_step(&mut self) -> Result<(), PolicyError> {
        let step = self.step.map_or(0, |s| s + 1);
        if step >= self.steps() {
            return Err(PolicyError::PastEnd {
                step,
                steps: self.steps(),
            });
        }
        self.step = Some(step);
        Ok(())
    }

    fn is_resident(&self, expert: u32) -> bool {
        expert < self.n_experts && self.is_resident[expert as usize]
    }

    fn access(&mut self, expert: u32) -> Result<Access, PolicyError> {
        let e = check_expert(expert, self.n_experts)?;
        let t = self.step.ok_or(PolicyError::NoStep)?;
        let f = &self.future;
        let j = (f.offsets[t]..f.offsets[t + 1])
            .find(|&j| f.ids[j] == expert)
            .ok_or(PolicyError::OffTrace { step: t, expert })?;
        let next = f.next[j];
        if self.is_resident[e] {
            self.resident.remove(&(self.key[e], expert));
            self.key[e] = next;
            self.resident.insert((next, expert));
            return Ok(Access::Hit);
        }
        let bypass = Access::Miss {
            admit: false,
            evict: None,
        };
        if next == NEVER {
            return Ok(bypass);
        }
        let evict = if self.resident.len() < self.slots {
            None
        } else {
            match self.resident.last().copied() {
                Some((far, victim)) if far > next => {
                    self.resident.remove(&(far, victim));
                    self.is_resident[victim as usize] = false;
                    Some(victim)
                }
                _ => return Ok(bypass),
            }
        };
        self.key[e] = next;
        self.is_resident[e] = true;
        self.resident.insert((next, expert));
        Ok(Access::Miss { admit: true, evict })
    }

    /// Residents, soonest next use first.
    fn resident(&self) -> Vec<u32> {
        self.resident.iter().map(|k| k.1).collect()
    }

    /// MIN stays the demand-paging ceiling: [`Prefetch::Resident`] for a resident, else
    /// [`Prefetch::Refused`].
    fn prefetch(&mut self, expert: u32) -> Result<Prefetch, PolicyError> {
        refuse_prefetch(self, expert, self.n_experts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &mut dyn Policy, steps: &[&[u32]]) -> Vec<Vec<Access>> {
        let mut out = Vec::new();
        steps
            .iter()
            .map(|s| {
                p.access_step(s, &mut out).unwrap();
                out.clone()
            })
            .collect()
    }

    const MISS_ADMIT: Access = Access::Miss {
        admit: true,
        evict: None,
    };
    const BYPASS: Access = Access::Miss {
        admit: false,
        evict: None,
    };

    #[test]
    fn policy_names_round_trip() {
        for &k in PolicyKind::ALL {
            assert_eq!(k.name().parse::<PolicyKind>(), Ok(k));
        }
        assert_eq!("LRU".parse::<PolicyKind>(), Ok(PolicyKind::Lru));
        assert!("arcs".parse::<PolicyKind>().is_err());
    }

    #[test]
    fn lru_evicts_least_recent() {
        // slots 2, seed [0, 1] (0 most recent). 2 evicts 1; touching 0 then 3 evicts 2.
        let mut p = Lru::new(4, 2, &[0, 1]).unwrap();
        let o = run(&mut p, &[&[2], &[0], &[3], &[1]]);
        assert_eq!(
            o,
            vec![
                vec![Access::Miss {
                    admit: true,
                    evict: Some(1)
                }],
                vec![Access::Hit],
                vec![Access::Miss {
                    admit: true,
                    evict: Some(2)
                }],
                vec![Access::Miss {
                    admit: true,
                    evict: Some(0)
                }],
            ]
        );
        assert_eq!(p.resident(), vec![1, 3]);
    }

    #[test]
    fn lfu_keeps_frequent_and_breaks_ties_by_recency() {
        // Empty start, slots 2. Counts after steps: 0:2, 1:1; then 2 (count 1) ties with 1 (count 1)
        // and wins on recency, evicting 1; then 1 (count 2) beats 2 (count 1) and evicts it.
        let mut p = Lfu::new(4, 2, &[]).unwrap();
        let o = run(&mut p, &[&[0, 1], &[0], &[2], &[1]]);
        assert_eq!(o[0], vec![MISS_ADMIT, MISS_ADMIT]);
        assert_eq!(o[1], vec![Access::Hit]);
        assert_eq!(
            o[2],
            vec![Access::Miss {
                admit: true,
                evict: Some(1)
            }]
        );
        assert_eq!(
            o[3],
            vec![Access::Miss {
                admit: true,
                evict: Some(2)
            }]
        );
        // Now 0 (count 2, older) and 1 (count 2, newer): 3 (count 1) cannot get in.
        let o = run(&mut p, &[&[3]]);
        assert_eq!(o[0], vec![BYPASS]);
        assert_eq!(p.resident(), vec![1, 0]);
    }

    #[test]
    fn lfu_seed_ties_evict_the_lower_id() {
        let mut p = Lfu::new(4, 2, &[1, 0]).unwrap();
        let o = run(&mut p, &[&[3]]);
        assert_eq!(
            o[0],
            vec![Access::Miss {
                admit: true,
                evict: Some(0)
            }]
        );
    }

    #[test]
    fn static_oracle_takes_most_frequent_lower_id_on_ties() {
        let steps: [&[u32]; 3] = [&[3, 1], &[3, 2], &[1, 0]];
        let p = StaticSet::oracle(4, 2, steps).unwrap();
        assert_eq!(p.resident(), vec![1, 3]);
        let p = StaticSet::oracle(4, 3, steps).unwrap();
        assert_eq!(p.resident(), vec![1, 3, 0]);
    }

    #[test]
    fn access_step_serves_hits_before_misses() {
        // LRU slots 2 holding [0, 1] with 1 least recent: the step [2, 1] must hit 1 first, so the
        // admission of 2 evicts 0, not 1.
        let mut p = Lru::new(3, 2, &[0, 1]).unwrap();
        let o = run(&mut p, &[&[2, 1]]);
        assert_eq!(
            o[0],
            vec![
                Access::Miss {
                    admit: true,
                    evict: Some(0)
                },
                Access::Hit
            ]
        );
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert_eq!(
            Lru::new(4, 0, &[]).unwrap_err(),
            PolicyError::Slots {
                slots: 0,
                n_experts: 4
            }
        );
        assert_eq!(
            Lru::new(4, 5, &[]).unwrap_err(),
            PolicyError::Slots {
                slots: 5,
                n_experts: 4
            }
        );
        assert_eq!(
            Lfu::new(4, 2, &[0, 1, 2]).unwrap_err(),
            PolicyError::SeedTooLarge { len: 3, slots: 2 }
        );
        assert_eq!(
            StaticSet::new(4, 2, &[1, 1]).unwrap_err(),
            PolicyError::SeedDuplicate { expert: 1 }
        );
        let params = TwoQParams::from_fractions(2, 0.25, 0.5, None, Admission::Ghost).unwrap();
        assert_eq!(
            TwoQ::new(4, params, &[7]).unwrap_err(),
            PolicyError::ExpertOutOfRange {
                expert: 7,
                n_experts: 4
            }
        );
        let mut p = TwoQ::new(4, params, &[]).unwrap();
        assert_eq!(
            p.access(4).unwrap_err(),
            PolicyError::ExpertOutOfRange {
                expert: 4,
                n_experts: 4
            }
        );
        let mut out = Vec::new();
        assert_eq!(
            p.access_step(&[1, 1], &mut out).unwrap_err(),
            PolicyError::DuplicateInStep { expert: 1 }
        );
        assert!(matches!(
            TwoQParams::from_fractions(2, -0.1, 0.5, None, Admission::Ghost),
            Err(PolicyError::Fraction { name: "a1in", .. })
        ));
        assert!(matches!(
            TwoQParams::from_fractions(2, 0.25, f64::NAN, None, Admission::Ghost),
            Err(PolicyError::Fraction { name: "a1out", .. })
        ));
    }

    #[test]
    fn min_is_bound_to_its_trace() {
        let steps: [&[u32]; 2] = [&[0, 1], &[2, 3]];
        let mut p = Min::new(4, 2, &[], steps).unwrap();
        assert_eq!(p.access(0).unwrap_err(), PolicyError::NoStep);
        p.begin_step().unwrap();
        assert_eq!(
            p.access(2).unwrap_err(),
            PolicyError::OffTrace { step: 0, expert: 2 }
        );
        p.begin_step().unwrap();
        assert_eq!(
            p.begin_step().unwrap_err(),
            PolicyError::PastEnd { step: 2, steps: 2 }
        );
    }

    #[test]
    fn min_bypasses_experts_never_used_again_and_far_ones() {
        // slots 1, seed [0]. Step 0 routes 1 (used again at step 2) while 0 is next used at step 1:
        // 1 is farther, so it is bypassed; at step 1, 0 hits and is never used again; at step 2, 1
        // (never used again either) is bypassed too.
        let steps: [&[u32]; 3] = [&[1], &[0], &[1]];
        let mut p = Min::new(2, 1, &[0], steps).unwrap();
        let o = run(&mut p, &steps);
        assert_eq!(o, vec![vec![BYPASS], vec![Access::Hit], vec![BYPASS]]);
    }

    #[test]
    fn snapshots_restore_the_whole_state() {
        let steps: Vec<Vec<u32>> = (0..40u32)
            .map(|t| vec![(t * 7) % 9, (t * 5 + 1) % 9 + 9])
            .collect();
        let step_refs: Vec<&[u32]> = steps.iter().map(|s| s.as_slice()).collect();
        let params = TwoQParams::from_fractions(4, 0.25, 0.5, Some(1), Admission::Ghost).unwrap();
        let seed = [0, 1, 2, 3];
        let mut policies: Vec<Box<dyn Policy>> = vec![
            Box::new(TwoQ::new(18, params, &seed).unwrap()),
            Box::new(Lru::new(18, 4, &seed).unwrap()),
            Box::new(Lfu::new(18, 4, &seed).unwrap()),
            Box::new(StaticSet::oracle(18, 4, step_refs.iter().copied()).unwrap()),
            Box::new(Min::new(18, 4, &seed, step_refs.iter().copied()).unwrap()),
        ];
        for p in &mut policies {
            run(p.as_mut(), &step_refs[..10]);
            let snap = p.snapshot();
            let a = run(p.as_mut(), &step_refs[10..]);
            p.reset_to(&snap).unwrap();
            let b = run(p.as_mut(), &step_refs[10..]);
            assert_eq!(a, b, "{}", p.kind());
        }
        let lru_snap = policies[1].snapshot();
        assert_eq!(
            policies[0].reset_to(&lru_snap).unwrap_err(),
            PolicyError::SnapshotKind {
                expected: PolicyKind::TwoQ,
                got: PolicyKind::Lru
            }
        );
    }

    #[test]
    fn two_q_promotion_cap_keeps_the_id_in_a1out() {
        // slots 2, Kin 0, Kout 2, cap 1 per step. Step 0: 0 and 1 go to A1out. Step 1: both are
        // re-referenced; only the first promotion is allowed, 1 stays in A1out; step 2 promotes it.
        let params = TwoQParams {
            slots: 2,
            a1in: 0,
            a1out: 2,
            max_promotions: Some(1),
            admission: Admission::Ghost,
        };
        let mut p = TwoQ::new(4, params, &[]).unwrap();
        let o = run(&mut p, &[&[0, 1], &[0, 1]]);
        assert_eq!(o[0], vec![BYPASS, BYPASS]);
        assert_eq!(o[1], vec![MISS_ADMIT, BYPASS]);
        assert_eq!(p.a1out(), vec![1]);
        let o = run(&mut p, &[&[1]]);
        assert_eq!(o[0], vec![MISS_ADMIT]);
        assert_eq!(p.resident(), vec![1, 0]);
    }

    #[test]
    fn prefetch_loads_pins_and_refuses() {
        // 8 experts, 2 slots seeded [0, 1]. A prefetch of a resident (0) loads nothing and pins
        // it; so the prefetch of 5 evicts 1, and a prefetch of 6 is refused (every resident
        // pinned) until the next step begins; then a prefetch evicts one of them. Static and
        // MIN refuse.
        use super::super::{arc::ArcCache, lecar::LeCaR, lrfu::Lrfu};
        let steps: [&[u32]; 2] = [&[0, 5], &[7]];
        let params = TwoQParams::from_fractions(2, 0.0, 0.5, None, Admission::Ghost).unwrap();
        let seed = [0, 1];
        let takers: Vec<Box<dyn Policy>> = vec![
            Box::new(TwoQ::new(8, params, &seed).unwrap()),
            Box::new(Lru::new(8, 2, &seed).unwrap()),
            Box::new(Lfu::new(8, 2, &seed).unwrap()),
            Box::new(ArcCache::new(8, 2, &seed).unwrap()),
            Box::new(Lrfu::new(8, 2, 0.5, &seed).unwrap()),
            Box::new(LeCaR::new(8, 2, &seed).unwrap()),
        ];
        for mut p in takers {
            let kind = p.kind();
            assert_eq!(p.prefetch(0).unwrap(), Prefetch::Resident, "{kind}");
            assert_eq!(
                p.prefetch(5).unwrap(),
                Prefetch::Loaded { evict: Some(1) },
                "{kind}"
            );
            assert_eq!(p.prefetch(6).unwrap(), Prefetch::Refused, "{kind}");
            let mut held = p.resident();
            held.sort_unstable();
            assert_eq!(held, vec![0, 5], "{kind}");
            let mut out = Vec::new();
            p.access_step(steps[0], &mut out).unwrap();
            assert_eq!(out, vec![Access::Hit, Access::Hit], "{kind}");
            assert!(
                matches!(
                    p.prefetch(7).unwrap(),
                    Prefetch::Loaded { evict: Some(0 | 5) }
                ),
                "{kind}"
            );
            assert_eq!(
                p.prefetch(8).unwrap_err(),
                PolicyError::ExpertOutOfRange {
                    expert: 8,
                    n_experts: 8
                },
                "{kind}"
            );
        }
        let mut fixed = StaticSet::new(8, 2, &seed).unwrap();
        let mut min = Min::new(8, 2, &seed, steps).unwrap();
        for p in [&mut fixed as &mut dyn Policy, &mut min] {
            assert_eq!(p.prefetch(1).unwrap(), Prefetch::Resident, "{}", p.kind());
            assert_eq!(p.prefetch(5).unwrap(), Prefetch::Refused, "{}", p.kind());
            assert_eq!(p.resident().len(), 2, "{}", p.kind());
        }
    }

    #[test]
    fn a_prefetch_is_not_a_reference() {
        // LFU, 2 slots, counts 0:2 and 1:1. A prefetched 5 keeps its count 0, so the next
        // admitted miss (2, count 1 after its access, more recent than 1) evicts 5, not 1.
        let mut p = Lfu::new(8, 2, &[]).unwrap();
        run(&mut p, &[&[0, 1], &[0]]);
        assert_eq!(p.prefetch(5).unwrap(), Prefetch::Loaded { evict: Some(1) });
        let o = run(&mut p, &[&[2]]);
        assert_eq!(
            o[0],
            vec![Access::Miss {
                admit: true,
                evict: Some(5)
            }]
        );
    }

    /// A demand miss admitted in place of `victim`.
    fn evicting(victim: u32) -> Access {
        Access::Miss {
            admit: true,
            evict: Some(victim),
        }
    }

    fn frequency_two_q(n: u32, slots: usize, a1out: usize, window: u32, seed: &[u32]) -> TwoQ {
        let params = TwoQParams {
            slots,
            a1in: 0,
            a1out,
            max_promotions: None,
            admission: Admission::Frequency { window },
        };
        TwoQ::new(n, params, seed).unwrap()
    }

    #[test]
    fn admission_names_parse_and_print() {
        for (text, adm) in [
            ("ghost", Admission::Ghost),
            ("Remembered", Admission::Remembered),
            (
                "frequency",
                Admission::Frequency {
                    window: Admission::DEFAULT_WINDOW,
                },
            ),
            (" frequency:8 ", Admission::Frequency { window: 8 }),
        ] {
            assert_eq!(text.parse::<Admission>().unwrap(), adm, "{text}");
            assert_eq!(adm.to_string().parse::<Admission>().unwrap(), adm);
        }
        assert_eq!(
            Admission::Frequency { window: 8 }.to_string(),
            "frequency:8"
        );
        for bad in ["frequency:0", "frequency:x", "ghost:3", "freq", ""] {
            assert!(bad.parse::<Admission>().is_err(), "{bad}");
        }
    }

    #[test]
    fn frequency_admission_needs_more_uses_than_the_victim() {
        // 8 experts, 1 slot, Kin 0, Kout 4, no aging within the trace (W = 100 · 8). Counts after
        // each access in brackets.
        //   [0] 0 (1): first seen, to A1out, bypassed.   [0] 0 (2): remembered, Am free: admitted.
        //   [0] 0 (3): hit.                                [1] 1 (1): to A1out, bypassed.
        //   [1] 1 (2): 2 <= 3 (victim 0): refused.        [1] 1 (3): 3 <= 3, a tie: refused.
        //   [1] 1 (4): 4 > 3: admitted, evicting 0.        [1]: hit.
        // `remembered` alone would admit 1 at its second access.
        let mut p = frequency_two_q(8, 1, 4, 100, &[]);
        let steps: [&[u32]; 8] = [&[0], &[0], &[0], &[1], &[1], &[1], &[1], &[1]];
        let o = run(&mut p, &steps);
        let expected = [
            BYPASS,
            MISS_ADMIT,
            Access::Hit,
            BYPASS,
            BYPASS,
            BYPASS,
            evicting(0),
            Access::Hit,
        ];
        for (t, (got, want)) in o.iter().zip(expected).enumerate() {
            assert_eq!(got, &vec![want], "step {t}");
        }
        assert_eq!((p.frequency(0), p.frequency(1)), (3, 5));
        assert_eq!(p.resident(), vec![1]);
        assert!(p.a1out().is_empty(), "0 is forgotten, 1 promoted");
    }

    #[test]
    fn frequency_aging_lets_a_newer_expert_in() {
        // 2 experts, 1 slot, Kout 2. With window 1 the counts halve every 2 accesses:
        //   [0] 0 (1), A1out.   [0] 0 (2), then halved to 1 (1: 0); Am free: admitted.
        //   [1] 1 (1), A1out.   [1] 1 (2), then halved: 0 has 0, 1 has 1; 1 > 0: admitted.
        // Without aging (window 100) the last access compares 2 with 2 and is refused.
        let steps: [&[u32]; 4] = [&[0], &[0], &[1], &[1]];
        let mut aged = frequency_two_q(2, 1, 2, 1, &[]);
        let o = run(&mut aged, &steps);
        assert_eq!(o[1], vec![MISS_ADMIT]);
        assert_eq!(o[3], vec![evicting(0)]);
        assert_eq!((aged.frequency(0), aged.frequency(1)), (0, 1));
        let mut kept = frequency_two_q(2, 1, 2, 100, &[]);
        let o = run(&mut kept, &steps);
        assert_eq!(o[3], vec![BYPASS]);
        assert_eq!(kept.resident(), vec![0]);
    }

    #[test]
    fn two_q_prefetches_are_the_first_victims() {
        // 8 experts, 3 slots seeded [0, 1, 2] (0 most recent), Kin 0, Kout round(0.5 · 3) = 2.
        // Prefetch 5: full, Apre empty, so Am's tail 2 leaves; Am [0, 1], Apre [5]. Step [1]: a
        // hit, Am [1, 0]; 5 was a wrong prefetch. Steps [6], [6]: 6 is remembered, then promoted;
        // the slot comes from Apre's oldest, 5 (its id to A1out), not from Am's tail 0. Step [5]:
        // remembered, promoted; Apre is empty, so Am's tail 0 leaves. (With the prefetch at the
        // head of Am, step [1] would leave Am [1, 5, 0] and the promotion of 6 would evict 0.)
        let params = TwoQParams::from_fractions(3, 0.0, 0.5, None, Admission::Ghost).unwrap();
        let mut p = TwoQ::new(8, params, &[0, 1, 2]).unwrap();
        assert_eq!(p.prefetch(5).unwrap(), Prefetch::Loaded { evict: Some(2) });
        assert_eq!((p.resident(), p.prefetched()), (vec![0, 1, 5], vec![5]));
        let o = run(&mut p, &[&[1], &[6], &[6]]);
        assert_eq!(o[0], vec![Access::Hit]);
        assert_eq!(o[1], vec![BYPASS]);
        assert_eq!(o[2], vec![evicting(5)]);
        assert_eq!((p.resident(), p.a1out()), (vec![6, 1, 0], vec![5]));
        let o = run(&mut p, &[&[5]]);
        assert_eq!(o[0], vec![evicting(0)]);
        assert_eq!(p.resident(), vec![5, 6, 1]);
    }

    #[test]
    fn a_used_prefetch_stays_in_apre_unless_more_frequent_than_am_tail() {
        // Ghost admission: a hit in Apre is a correlated reference. 8 experts, 2 slots seeded
        // [0, 1]; prefetch 5 evicts 1; step [5] hits and 5 stays in Apre.
        let params = TwoQParams::from_fractions(2, 0.0, 1.0, None, Admission::Ghost).unwrap();
        let mut p = TwoQ::new(8, params, &[0, 1]).unwrap();
        assert_eq!(p.prefetch(5).unwrap(), Prefetch::Loaded { evict: Some(1) });
        assert_eq!(run(&mut p, &[&[5], &[5]])[1], vec![Access::Hit]);
        assert_eq!(p.prefetched(), vec![5]);
        // Frequency admission, Kout 2, no aging. Step [0]: a hit, 0 (1). Prefetch 5 evicts Am's
        // tail 1: Am [0], Apre [5]. Step [5]: 5 (1), not above 0's 1: stays. Step [5]: 5 (2) > 1:
        // 5 to Am's head, 0 to Apre as its oldest. Prefetch 6 then evicts 0, not 5.
        let mut p = frequency_two_q(8, 2, 2, 100, &[0, 1]);
        run(&mut p, &[&[0]]);
        assert_eq!(p.prefetch(5).unwrap(), Prefetch::Loaded { evict: Some(1) });
        run(&mut p, &[&[5]]);
        assert_eq!((p.resident(), p.prefetched()), (vec![0, 5], vec![5]));
        run(&mut p, &[&[5]]);
        assert_eq!((p.resident(), p.prefetched()), (vec![5, 0], vec![0]));
        assert_eq!(p.prefetch(6).unwrap(), Prefetch::Loaded { evict: Some(0) });
        assert_eq!(p.resident(), vec![5, 6]);
        assert_eq!(p.a1out(), vec![0]);
    }
}
