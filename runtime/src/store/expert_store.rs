//! The split expert store's policy side (ARCHITECTURE.md § runtime, split expert store): which
//! expert of each MoE layer holds which fast-store slot, the placement policy of every layer, the
//! budget in slots, promotions and the served counts. The slots' memory is the backend's
//! ([`SlotMemory`], the module note of [`crate::store`]).
//!
//! Algorithm. After a step ran, [`ExpertStore::observe`] counts every routed (token, layer,
//! expert) as served from the fast store when the expert was resident while the step computed it,
//! then feeds each token's routed ids, in token order, to the layer's [`Policy`] (2Q by default,
//! `crate::placement::policy`) and makes the slots follow the policy's resident set: experts it
//! dropped free their slot, experts it admitted are written into a free slot (a *promotion*).
//! Within a multi-token prefill the placement is fixed while the step computes, so an expert
//! admitted at token 3 serves token 5 of the same prefill from the host store; one token per step
//! (decode) serves exactly as `aubier replay` counts.
//!
//! Read-ahead (`--prefetch-budget b`, a plan with the `predict_experts` outputs): in a one-token
//! step, once layer `L`'s predicted experts are known (its router applied before its
//! attention), [`ExpertStore::read_ahead`] sends up to `b` of those not members to the layer's
//! policy as prefetches, as `aubier replay` models them, frees the slots of the experts it
//! evicts and hands back the copies to make, each into a slot it takes. In
//! [`ReadAheadMode::Sync`] the step makes each at once and publishes it
//! ([`ExpertStore::publish`]); in [`ReadAheadMode::Background`] the backend queues each on its
//! slot memory's copy worker (`crate::store::copier`), which lives as long as the memory, and
//! hands the store the copy's ticket ([`ExpertStore::queued`]): the step never waits for a
//! copy, and a copy may end steps later. The store publishes a copy whose ticket says done the
//! next time it looks at the layer ([`ExpertStore::step_slots`], the observation). The step's
//! `moe_ffn` reads the slot map as it is when its tables are built ([`ExpertStore::step_slots`]),
//! and the step's routed ids count as served against that map: a copy not done by then is read
//! from the host store and counted late (in its own step) or pending (in a later one). The
//! membership lives under a per-layer lock, taken only while a step runs. How far ahead the
//! prediction runs is the plan's (`aubier_compiler::CompileOptions::prefetch_lead`: layer `L`'s
//! ids are known `d` layers before its `moe_ffn`); what the backend also reads into the page
//! cache (the predicted experts not loaded, the routed ones not resident, the queued copies'
//! sources) is [`PageAhead`], which changes no count.
//!
//! A copy in flight owns its slot's bytes until it ends; the store keeps the rest off them:
//! * its expert is a member (no second copy of it: the policy's rotation does not write it
//!   again) and its slot is taken; no kernel reads the slot before it is published;
//! * an expert evicted while its copy is in flight leaves the membership at once, but its
//!   slot is reused by a write from the step ([`SlotMemory::fill`]: promotions, reset, claim)
//!   only after the memory cleared it of the copy (cancelled when not started, else waited
//!   for); a read-ahead copy may take it at once, queued behind the old one on the same
//!   worker, which makes copies in order;
//! * a store that claims memory another store filled ([`ExpertStore::claim`], a new store)
//!   first cancels the copies in flight in it and waits for the one being made; the store
//!   whose copies were cancelled rewrites its members, those included, when it claims back;
//! * a store dropped with copies in flight leaves them to the worker, which writes slots no
//!   store reads until the next store claims them (cancelling or waiting as above); a memory
//!   dropped with copies in flight cancels them and joins the worker after the copy it is
//!   making.
//!
//! Budget: `n_res` slots per layer, at most the slots the loaded model's memory has
//! ([`StoreOptions::budget`]). `n_res = 0` keeps every expert in the host store (no policy runs);
//! `n_res = n_expert` keeps every expert resident (nothing rotates).
//!
//! Sharing: a loaded model has one slot memory ([`SharedSlots`]) for all its sessions' stores.
//! Each store holds it while a step runs and observes; when another store filled it last, the
//! store writes its own resident experts back first ([`ExpertStore::claim`]), so sessions that
//! alternate stay correct (and pay the copies); one session, the server's, never does.
//!
//! Reset: the boot state (membership and every policy's [`Snapshot`]) is kept; with
//! [`ResetMode::Exact`] [`ExpertStore::reset`] restores both before each request (writing back
//! the experts that left) and reports how long it took; [`ResetMode::None`] keeps them.

use super::copier::{CopyEnd, CopyTicket};
use super::{FastBudget, SlotMemory, StoreError};
use crate::placement::arc::ArcCache;
use crate::placement::hotset::HotSet;
use crate::placement::lecar::LeCaR;
use crate::placement::lrfu::Lrfu;
use crate::placement::policy::{
    Access, Admission, Lfu, Lru, Policy, PolicyError, PolicyKind, Prefetch, Snapshot, StaticSet,
    TwoQ, TwoQParams,
};
use crate::progress::{Count, Progress, Quiet};
use aubier_compiler::plan::Plan;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// What happens to the store between requests (`--reset`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ResetMode {
    /// Restore membership and policy state to the boot state (timed and reported).
    #[default]
    Exact,
    /// Keep them (the control: a request then depends on the ones before it).
    None,
}

impl ResetMode {
    /// The command-line name: `exact` or `none`.
    pub fn name(self) -> &'static str {
        match self {
            ResetMode::Exact => "exact",
            ResetMode::None => "none",
        }
    }
}

impl fmt::Display for ResetMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ResetMode {
    type Err = String;

    /// Parses `exact` or `none`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(ResetMode::Exact),
            "none" => Ok(ResetMode::None),
            _ => Err(format!("unknown reset mode `{s}` (known: exact, none)")),
        }
    }
}

/// Settings of the expert store of a session (`aubier run` / `aubier serve` flags, `StoreArgs`).
#[derive(Clone, Debug, PartialEq)]
pub struct StoreOptions {
    /// Slots per layer this store uses: `Auto` (the default) every slot the loaded model has;
    /// `Slots(n)` or `Bytes(b)` fewer (at most the model's: [`StoreError::OverCapacity`]).
    pub budget: FastBudget,
    /// Seed membership per layer (hottest first); `None` seeds the identity set `0..n_res`.
    pub resident_set: Option<HotSet>,
    /// Placement policy: `2q`, `lru`, `lfu`, `arc`, `lrfu`, `lecar` or `static` (`static` = the
    /// seed, never rotated); `min` is an offline oracle and is refused.
    pub policy: PolicyKind,
    /// 2Q `Kin` as a fraction of the slots ([`TwoQParams::DEFAULT_A1IN`] by default).
    pub a1in: f64,
    /// 2Q `Kout` as a fraction of the slots ([`TwoQParams::DEFAULT_A1OUT`] by default).
    pub a1out: f64,
    /// 2Q cap on promotions per token per layer; `None` = no cap.
    pub max_promotions: Option<usize>,
    /// 2Q admission rule.
    pub admission: Admission,
    /// Between requests.
    pub reset: ResetMode,
    /// Read-ahead: at most this many of a layer's predicted experts loaded per one-token step
    /// ahead of its `moe_ffn` ([`ExpertStore::read_ahead`]); 0 = demand paging only. Needs a plan
    /// with the `predict_experts` outputs.
    pub prefetch_budget: usize,
    /// How the read-ahead's copies run.
    pub read_ahead: ReadAheadMode,
    /// What the read-ahead also asks the kernel to read into the page cache (host backends).
    pub page_ahead: PageAhead,
}

/// What the read-ahead (`prefetch_budget > 0`, one-token steps) also asks the kernel to read
/// from the file into the page cache (`madvise(MADV_WILLNEED)` over each expert's bytes in the
/// host store, issued on a worker thread beside the steps: the call submits the reads, which can
/// take milliseconds per expert on a cold file, and the kernel then reads the ranges
/// asynchronously, several at a time), so that the disk serves them in parallel rather than one
/// page fault or one copy after another (`--page-ahead`; host backends). It changes no count: membership, served, late
/// and pending are the same in every variant, only when the bytes reach the page cache differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PageAhead {
    /// Nothing: each expert read from the host store is faulted in by the kernel that reads it
    /// (or by its copy, which advises its own expert when it starts).
    Off,
    /// The experts the step will read from the host store: each layer's predicted experts that
    /// the budget does not load, as soon as they are predicted, and the routed experts that are
    /// not resident, before the layer's `moe_ffn` (the behaviour before this option existed).
    #[default]
    Host,
    /// As `Host`, and each read-ahead copy's source bytes at the moment the copy is queued on the
    /// copy worker, so that the disk reads every queued copy's expert in parallel while the
    /// worker copies them one at a time (the copies then mostly find their bytes cached).
    All,
}

impl PageAhead {
    /// The command-line name: `off`, `host` or `all`.
    pub fn name(self) -> &'static str {
        match self {
            PageAhead::Off => "off",
            PageAhead::Host => "host",
            PageAhead::All => "all",
        }
    }
}

impl fmt::Display for PageAhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PageAhead {
    type Err = String;

    /// Parses `off`, `host` or `all`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(PageAhead::Off),
            "host" => Ok(PageAhead::Host),
            "all" => Ok(PageAhead::All),
            _ => Err(format!("unknown page-ahead `{s}` (known: off, host, all)")),
        }
    }
}

/// How the read-ahead's copies into the fast store run (`--read-ahead`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReadAheadMode {
    /// On the slot memory's copy worker, beside the step's kernels and past the step's end,
    /// never waited for by the step: an expert whose copy is not done when its layer's kernel
    /// reads it is read from the host store.
    #[default]
    Background,
    /// In the step, before it goes on: every copy is done when its kernel reads it (tests, so
    /// that their counts do not depend on timing).
    Sync,
}

impl ReadAheadMode {
    /// The command-line name: `background` or `sync`.
    pub fn name(self) -> &'static str {
        match self {
            ReadAheadMode::Background => "background",
            ReadAheadMode::Sync => "sync",
        }
    }
}

impl fmt::Display for ReadAheadMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReadAheadMode {
    type Err = String;

    /// Parses `background` or `sync`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "background" => Ok(ReadAheadMode::Background),
            "sync" => Ok(ReadAheadMode::Sync),
            _ => Err(format!(
                "unknown read-ahead mode `{s}` (known: background, sync)"
            )),
        }
    }
}

impl Default for StoreOptions {
    /// Every slot of the model, identity seed, 2Q with the default knobs
    /// ([`TwoQParams::DEFAULT_A1IN`] and the others), no cap, exact reset, no read-ahead.
    fn default() -> Self {
        StoreOptions {
            budget: FastBudget::Auto,
            resident_set: None,
            policy: PolicyKind::TwoQ,
            a1in: TwoQParams::DEFAULT_A1IN,
            a1out: TwoQParams::DEFAULT_A1OUT,
            max_promotions: None,
            admission: TwoQParams::DEFAULT_ADMISSION,
            reset: ResetMode::Exact,
            prefetch_budget: 0,
            read_ahead: ReadAheadMode::Background,
            page_ahead: PageAhead::Host,
        }
    }
}

/// What one request did with the store (`aubier run --json`'s `store`, the server's log line).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct StoreReport {
    /// Fast-store slots per layer.
    pub n_res: usize,
    /// Bytes of the experts the slots hold when full (all layers: `n_res` × one expert of every
    /// layer, the file's bytes).
    pub fast_bytes: u64,
    /// `fast_hits ÷ routed` (0 when nothing was routed).
    pub served_fraction: f64,
    /// Routed (token, layer, expert) slots served from the fast store.
    pub fast_hits: u64,
    /// All routed (token, layer, expert) slots.
    pub routed: u64,
    /// Experts written into the fast store by the policy (not counting reset).
    pub promotions: u64,
    /// Experts the policy dropped from the fast store (not counting reset).
    pub evictions: u64,
    /// Bytes of the experts of the routed slots served from the host store: what the kernels
    /// read from it (over the bus on a GPU), one expert's bytes per routed slot.
    pub host_bytes: u64,
    /// Bytes written into the fast store by promotions (not counting reset).
    pub promoted_bytes: u64,
    /// Time the reset before this request took (ms; 0 with `--reset none`).
    pub reset_ms: f64,
    /// Experts the read-ahead copied into the fast store ahead of their layer.
    pub prefetches: u64,
    /// Bytes of those copies.
    pub prefetch_bytes: u64,
    /// Routed slots served by a read-ahead copy (counted in `fast_hits` too).
    pub prefetch_served: u64,
    /// Routed slots whose read-ahead copy was not done when their kernel read the layer, in the
    /// step that issued it: read from the host store (counted as misses).
    pub prefetch_late: u64,
    /// Routed slots, in a step after the one that issued it, of an expert whose read-ahead copy
    /// was still in flight when their kernel read the layer (a copy outlives its step): read
    /// from the host store (counted as misses; 0 in sync mode, where every copy ends within
    /// its step).
    pub prefetch_pending: u64,
}

/// A loaded model's slot memory, shared by the stores of its sessions (the module note): the
/// memory and the store that filled it last.
#[derive(Debug)]
pub struct SharedSlots(Mutex<HeldSlots>);

/// The slot memory while a store holds it ([`SharedSlots::lock`]).
#[derive(Debug)]
pub struct HeldSlots {
    memory: Box<dyn SlotMemory>,
    /// [`ExpertStore::id`] of the store whose residents the slots hold.
    filled_by: Option<u64>,
}

impl SharedSlots {
    /// Shares `memory`, which no store has filled yet.
    pub fn new(memory: Box<dyn SlotMemory>) -> SharedSlots {
        SharedSlots(Mutex::new(HeldSlots {
            memory,
            filled_by: None,
        }))
    }

    /// Holds the memory until the guard drops (a step and its observation).
    pub fn lock(&self) -> MutexGuard<'_, HeldSlots> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes allocated for them.
    pub fn bytes(&self) -> u64 {
        self.lock().memory.bytes()
    }
}

impl HeldSlots {
    /// The memory, for a backend's step to read.
    pub fn memory(&self) -> &dyn SlotMemory {
        &*self.memory
    }
}

/// The placement of one MoE layer.
struct Layer {
    /// The model layer.
    layer: usize,
    /// `[n_expert]`: the slot holding each expert, if resident.
    slot_of: Vec<Option<u32>>,
    /// `[n_res]`: the expert in each slot, if any.
    expert_in: Vec<Option<u32>>,
    policy: Option<Box<dyn Policy + Send + Sync>>,
    /// Membership and policy state at boot.
    boot_members: Vec<u32>,
    boot_policy: Option<Snapshot>,
    /// The slot of each expert as the step's kernel read them ([`ExpertStore::step_slots`]),
    /// what the step's routed ids count against; `None`: the membership now.
    step_map: Option<Vec<Option<u32>>>,
    /// The experts the read-ahead loaded in the current step ([`ExpertStore::read_ahead`]),
    /// counted by its observation.
    issued: Vec<u32>,
    /// The read-ahead copies not yet published, of this step or earlier ones.
    ahead: Vec<Ahead>,
    /// The first read-ahead copy that failed, reported by the next observation.
    ahead_error: Option<StoreError>,
}

/// A read-ahead copy not yet published: while the expert is a member its slot is taken (no
/// other expert is written there), and no kernel reads the slot until the copy ends
/// ([`ExpertStore::publish`], or [`Layer::settle`] once its ticket says so).
#[derive(Debug)]
struct Ahead {
    expert: u32,
    slot: u32,
    /// The copy's ticket on the slot memory's worker ([`ExpertStore::queued`]); `None` while
    /// the step makes it itself (sync) or has not queued it yet.
    ticket: Option<Arc<CopyTicket>>,
    /// The expert left the membership while its copy was in flight: the slot is free for the
    /// read-ahead (whose copies the worker makes in order) but a write from the step clears it
    /// of the copy first ([`SlotMemory::fill`]); the entry goes when the copy ends.
    evicted: bool,
}

/// A copy the read-ahead asks of the slot memory: expert `expert` of the `layer`-th MoE layer
/// into `slot`, which no kernel reads until [`ExpertStore::publish`] makes it resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AheadCopy {
    /// MoE layer (plan order).
    pub layer: usize,
    /// The slot.
    pub slot: usize,
    /// The expert.
    pub expert: u32,
}

impl fmt::Debug for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layer")
            .field("layer", &self.layer)
            .field("resident", &self.expert_in.iter().flatten().count())
            .finish_non_exhaustive()
    }
}

/// The split expert store of one session: membership and the placement policy of every MoE
/// layer, driving the loaded model's slot memory.
pub struct ExpertStore {
    id: u64,
    /// Locked only while a step runs (the read-ahead changes a layer's membership then); every
    /// `&mut self` method reaches them without locking.
    layers: Vec<Mutex<Layer>>,
    /// Per MoE layer, the bytes of one expert.
    expert_bytes: Vec<u64>,
    n_res: usize,
    n_expert: usize,
    policy: PolicyKind,
    reset: ResetMode,
    report: StoreReport,
    access: Vec<Access>,
    token_ids: Vec<u32>,
    prefetch_budget: usize,
    read_ahead: ReadAheadMode,
    page_ahead: PageAhead,
}

/// A layer through its lock; a poisoned lock (a panic elsewhere) still holds a consistent layer,
/// since every change to it is made under the lock without unwinding in between.
fn lock(l: &Mutex<Layer>) -> MutexGuard<'_, Layer> {
    l.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A layer reached through `&mut`.
fn layer_mut(l: &mut Mutex<Layer>) -> &mut Layer {
    l.get_mut().unwrap_or_else(PoisonError::into_inner)
}

impl fmt::Debug for ExpertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExpertStore")
            .field("n_res", &self.n_res)
            .field("n_expert", &self.n_expert)
            .field("policy", &self.policy)
            .field("reset", &self.reset)
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

/// Ids of stores, for [`HeldSlots::filled_by`].
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl ExpertStore {
    /// Builds the store of `plan`'s MoE layers ([`Plan::moe_layers`]) over `slots`: sizes it from
    /// `opts.budget` within the memory's slots, builds each layer's policy and writes the seed
    /// experts into their slots.
    ///
    /// Errors: [`StoreError::Plan`] for MoE steps that disagree on the expert count or repeat a
    /// layer; [`StoreError::TooManySlots`] / [`StoreError::OverCapacity`];
    /// [`StoreError::OfflinePolicy`]; [`StoreError::HotSet`] for a resident set of the wrong
    /// layer count or with bad ids; [`StoreError::Policy`] for bad 2Q fractions;
    /// [`StoreError::Slot`] when the memory cannot be filled.
    pub fn new(
        plan: &Plan,
        opts: &StoreOptions,
        slots: &mut HeldSlots,
    ) -> Result<ExpertStore, StoreError> {
        ExpertStore::new_observed(plan, opts, slots, &mut Quiet)
    }

    /// [`ExpertStore::new`], the seed experts' writes into their slots a step of `progress`,
    /// counted in bytes.
    ///
    /// Errors: those of [`ExpertStore::new`].
    pub fn new_observed(
        plan: &Plan,
        opts: &StoreOptions,
        slots: &mut HeldSlots,
        progress: &mut dyn Progress,
    ) -> Result<ExpertStore, StoreError> {
        if opts.policy == PolicyKind::Min {
            return Err(StoreError::OfflinePolicy);
        }
        if opts.prefetch_budget > 0 && plan.predicted_ids().is_empty() {
            return Err(StoreError::NoPrediction);
        }
        let moe = plan
            .moe_layers()
            .map_err(|e| StoreError::Plan(e.to_string()))?;
        let n_expert = moe.first().map_or(0, |l| l.n_expert);
        let per_slot = slots.memory.slot_bytes();
        let capacity = slots.memory.slots();
        let n_res = opts.budget.slots(per_slot, n_expert, || capacity)?;
        if n_res > capacity {
            return Err(StoreError::OverCapacity { n_res, capacity });
        }
        if let Some(h) = &opts.resident_set {
            h.check(plan.config.n_layer, n_expert as u32)?;
        }
        let mut store = ExpertStore {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            layers: Vec::with_capacity(moe.len()),
            expert_bytes: moe.iter().map(|l| l.expert_bytes() as u64).collect(),
            n_res,
            n_expert,
            policy: opts.policy,
            reset: opts.reset,
            report: StoreReport {
                n_res,
                fast_bytes: per_slot * n_res as u64,
                ..StoreReport::default()
            },
            access: Vec::new(),
            token_ids: Vec::new(),
            prefetch_budget: opts.prefetch_budget,
            read_ahead: opts.read_ahead,
            page_ahead: opts.page_ahead,
        };
        for l in &moe {
            let identity: Vec<u32>;
            let seed: &[u32] = match &opts.resident_set {
                Some(h) => h.seed(l.layer, n_res),
                None => {
                    identity = (0..n_res as u32).collect();
                    &identity
                }
            };
            let policy = build_policy(opts, n_expert as u32, n_res, seed).map_err(|source| {
                StoreError::Policy {
                    layer: l.layer,
                    source,
                }
            })?;
            store.layers.push(Mutex::new(Layer {
                layer: l.layer,
                slot_of: vec![None; n_expert],
                expert_in: vec![None; n_res],
                boot_members: seed.to_vec(),
                boot_policy: policy.as_ref().map(|p| p.snapshot()),
                policy,
                step_map: None,
                issued: Vec::new(),
                ahead: Vec::new(),
                ahead_error: None,
            }));
        }
        // Another store's read-ahead copies may still be in flight in this memory.
        slots.memory.settle_copies(true);
        slots.filled_by = Some(store.id);
        let seeded = (store.layers.iter_mut().zip(&store.expert_bytes))
            .map(|(l, &bytes)| layer_mut(l).boot_members.len() as u64 * bytes)
            .sum();
        progress.step("filling the fast store", Count::Bytes(seeded));
        for li in 0..store.layers.len() {
            let seed = layer_mut(&mut store.layers[li]).boot_members.clone();
            for e in seed {
                store.admit(li, e, slots)?;
                progress.advance(store.expert_bytes[li]);
            }
        }
        tracing::info!(
            n_res,
            n_expert,
            layers = store.layers.len(),
            fast_bytes = store.report.fast_bytes,
            policy = %opts.policy,
            reset = %opts.reset,
            "expert store ready"
        );
        Ok(store)
    }

    /// Makes `slots` hold this store's resident experts: when another store filled them last,
    /// cancels the read-ahead copies still in flight in the memory (the other store's: it
    /// rewrites its slots when it claims them back) and writes every expert of this store's
    /// membership into its slot, those whose read-ahead copy had not ended included (they are
    /// published by the rewrite).
    ///
    /// Errors: [`StoreError::Slot`] when the memory cannot be filled.
    pub fn claim(&self, slots: &mut HeldSlots) -> Result<(), StoreError> {
        if slots.filled_by == Some(self.id) {
            return Ok(());
        }
        slots.memory.settle_copies(true);
        slots.filled_by = None;
        for (li, l) in self.layers.iter().enumerate() {
            let mut l = lock(l);
            let l = &mut *l;
            for a in std::mem::take(&mut l.ahead) {
                if !a.evicted {
                    l.slot_of[a.expert as usize] = Some(a.slot);
                }
            }
            for (slot, e) in l.expert_in.iter().enumerate() {
                if let Some(e) = e {
                    slots.memory.fill(li, slot, *e)?;
                }
            }
        }
        slots.filled_by = Some(self.id);
        Ok(())
    }

    /// The slot of expert `expert` of the `layer`-th MoE layer (plan order), when resident.
    pub fn slot_of(&self, layer: usize, expert: usize) -> Option<usize> {
        let s = (*lock(self.layers.get(layer)?).slot_of.get(expert)?)?;
        Some(s as usize)
    }

    /// `[n_expert]`: the slot of every expert of the `layer`-th MoE layer (plan order) that is
    /// resident now, for a step's kernel to read: the read-ahead copies whose tickets say done
    /// are published first, those still in flight are not in it. The step's
    /// routed ids of that layer count as served against this map ([`ExpertStore::observe`]).
    /// Empty past the last layer.
    pub fn step_slots(&self, layer: usize) -> Vec<Option<u32>> {
        let Some(l) = self.layers.get(layer) else {
            return Vec::new();
        };
        let mut l = lock(l);
        l.settle();
        let map = l.slot_of.clone();
        l.step_map = Some(map.clone());
        map
    }

    /// Read-ahead ([`StoreOptions::prefetch_budget`]) for a one-token step, called once the
    /// `layer`-th MoE layer's predicted experts (`predicted`, best first: the plan's
    /// `predicted_ids` of that layer) are known and before its `moe_ffn` runs. As `aubier
    /// replay`'s prefetch does: the predicted members are pinned ([`Policy::pin_resident`]:
    /// never a prefetch's victim until the step's accesses), then up to the budget of predicted
    /// experts that are not members (resident, or with a copy in flight) go to the layer's
    /// policy as prefetches ([`Policy::prefetch`], pinned until the step's accesses), the slots
    /// of the experts it evicts are freed at once, and each loaded expert takes a free slot (one
    /// with no copy in flight when there is one; else the new copy is made after the one in
    /// flight, the slot memory's worker making them in order). The copies to make are returned; each is read by
    /// kernels only once published ([`ExpertStore::publish`], or its ticket
    /// ([`ExpertStore::queued`]) saying done). Nothing without a policy, a budget, or for an id
    /// out of range.
    pub fn read_ahead(&self, layer: usize, predicted: &[i32]) -> Vec<AheadCopy> {
        let mut copies = Vec::new();
        let Some(l) = self.layers.get(layer) else {
            return copies;
        };
        let mut l = lock(l);
        let l = &mut *l;
        let Some(policy) = l.policy.as_mut().filter(|_| self.prefetch_budget > 0) else {
            return copies;
        };
        let in_range = |&id: &i32| {
            u32::try_from(id)
                .ok()
                .filter(|&e| (e as usize) < self.n_expert)
        };
        if policy
            .pin_resident(&mut predicted.iter().filter_map(in_range))
            .is_err()
        {
            return copies;
        }
        for &id in predicted {
            if copies.len() == self.prefetch_budget {
                break;
            }
            if id < 0 || id as usize >= self.n_expert || l.expert_in.contains(&Some(id as u32)) {
                continue;
            }
            let e = id as u32;
            let Some(policy) = l.policy.as_mut() else {
                break;
            };
            match policy.prefetch(e) {
                Ok(Prefetch::Loaded { evict }) => {
                    if let Some(v) = evict {
                        if let Some(s) = l.expert_in.iter().position(|&x| x == Some(v)) {
                            l.leave(s);
                        }
                    }
                    let Some(slot) = l.open_slot() else {
                        break;
                    };
                    l.expert_in[slot] = Some(e);
                    l.issued.push(e);
                    l.ahead.push(Ahead {
                        expert: e,
                        slot: slot as u32,
                        ticket: None,
                        evicted: false,
                    });
                    copies.push(AheadCopy {
                        layer,
                        slot,
                        expert: e,
                    });
                }
                Ok(Prefetch::Resident) => {}
                Ok(Prefetch::Refused) | Err(_) => break,
            }
        }
        copies
    }

    /// Ends a read-ahead copy the step made itself ([`ReadAheadMode::Sync`]): with `done` `Ok`
    /// its expert becomes resident in its slot (kernels that build their tables after this read
    /// it there); with an error the slot is freed and the error is reported by the next
    /// observation.
    pub fn publish(&self, copy: AheadCopy, done: Result<(), StoreError>) {
        let Some(l) = self.layers.get(copy.layer) else {
            return;
        };
        let mut l = lock(l);
        let Some(i) = l.ahead.iter().position(|a| a.unqueued(copy)) else {
            return;
        };
        let a = l.ahead.swap_remove(i);
        let end = match done {
            Ok(()) => CopyEnd::Done,
            Err(e) => CopyEnd::Failed(Some(e)),
        };
        l.end_copy(&a, end);
    }

    /// Hands the store the ticket of a read-ahead copy queued on the slot memory's worker
    /// ([`ReadAheadMode::Background`]): the copy is published once the ticket says done, by the
    /// first [`ExpertStore::step_slots`] (or observation) after that, however many steps later;
    /// a failed or cancelled copy frees its slot, the failure reported by the next observation.
    pub fn queued(&self, copy: AheadCopy, ticket: Arc<CopyTicket>) {
        let Some(l) = self.layers.get(copy.layer) else {
            return;
        };
        let mut l = lock(l);
        if let Some(a) = l.ahead.iter_mut().find(|a| a.unqueued(copy)) {
            a.ticket = Some(ticket);
        }
    }

    /// How the read-ahead's copies run; `None` when the store does not read ahead (no budget,
    /// or no slots).
    pub fn read_ahead_mode(&self) -> Option<ReadAheadMode> {
        (self.prefetch_budget > 0 && self.n_res > 0).then_some(self.read_ahead)
    }

    /// What the read-ahead also reads into the page cache ([`StoreOptions::page_ahead`]); it
    /// applies only where [`ExpertStore::read_ahead_mode`] is `Some`.
    pub fn page_ahead(&self) -> PageAhead {
        self.page_ahead
    }

    /// The read-ahead copies of the `i`-th MoE layer not yet published: expert, whether it was
    /// evicted meanwhile, and its ticket once queued.
    #[cfg(test)]
    pub(crate) fn in_flight(&self, i: usize) -> Vec<(u32, bool, Option<Arc<CopyTicket>>)> {
        self.layers.get(i).map_or_else(Vec::new, |l| {
            let l = lock(l);
            l.ahead
                .iter()
                .map(|a| (a.expert, a.evicted, a.ticket.clone()))
                .collect()
        })
    }

    /// Fast-store slots per layer.
    pub fn n_res(&self) -> usize {
        self.n_res
    }

    /// Experts per MoE layer.
    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// Bytes of the experts the slots hold when full, all layers (what the budget bounds).
    pub fn fast_bytes(&self) -> u64 {
        self.report.fast_bytes
    }

    /// The reset mode.
    pub fn reset_mode(&self) -> ResetMode {
        self.reset
    }

    /// MoE layers, in layer order.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The resident experts of the `i`-th MoE layer, ascending (empty past the last layer).
    pub fn resident(&self, i: usize) -> Vec<u32> {
        self.layers.get(i).map_or_else(Vec::new, |l| {
            let mut v: Vec<u32> = lock(l).expert_in.iter().flatten().copied().collect();
            v.sort_unstable();
            v
        })
    }

    /// The policy state of the `i`-th MoE layer (`None` with `n_res = 0` or past the last layer).
    pub fn policy_snapshot(&self, i: usize) -> Option<Snapshot> {
        self.layers
            .get(i)
            .and_then(|l| lock(l).policy.as_ref().map(|p| p.snapshot()))
    }

    /// Every resident expert of the `i`-th MoE layer as `(expert, tensor, bytes)`: each of its
    /// tensors read back from its slot in the file's layout ([`SlotMemory::read_back`]), for
    /// checking that each equals the file. Waits for the read-ahead copies in flight first and
    /// publishes them.
    ///
    /// Errors: [`StoreError::Slot`] when a slot cannot be read back.
    pub fn copies(
        &self,
        i: usize,
        slots: &mut HeldSlots,
        tensors: usize,
    ) -> Result<Vec<(u32, usize, Vec<u8>)>, StoreError> {
        self.claim(slots)?;
        slots.memory.settle_copies(false);
        let Some(l) = self.layers.get(i) else {
            return Ok(Vec::new());
        };
        let mut l = lock(l);
        l.settle();
        let mut out = Vec::new();
        for (slot, e) in l.expert_in.iter().enumerate() {
            if let Some(e) = e {
                for t in 0..tensors {
                    out.push((*e, t, slots.memory.read_back(i, slot, t)?));
                }
            }
        }
        Ok(out)
    }

    /// The counters of the current request.
    pub fn report(&self) -> StoreReport {
        self.report
    }

    /// Starts a request: zeroes the request counters and, with [`ResetMode::Exact`], restores the
    /// boot membership (writing back experts that left) and every policy's boot state; returns
    /// the time that took in ms (0 with [`ResetMode::None`]), also kept as the report's
    /// `reset_ms`.
    ///
    /// Errors: [`StoreError::Policy`] if a policy refuses its own boot snapshot (a bug);
    /// [`StoreError::Slot`] when the memory cannot be filled.
    pub fn reset(&mut self, slots: &mut HeldSlots) -> Result<f64, StoreError> {
        let started = Instant::now();
        self.claim(slots)?;
        if self.reset == ResetMode::Exact {
            for li in 0..self.layers.len() {
                let l = layer_mut(&mut self.layers[li]);
                l.step_map = None;
                l.issued.clear();
                if let (Some(p), Some(s)) = (l.policy.as_mut(), l.boot_policy.as_ref()) {
                    p.reset_to(s).map_err(|source| StoreError::Policy {
                        layer: l.layer,
                        source,
                    })?;
                }
                let target = l.boot_members.clone();
                self.follow(li, &target, slots)?;
            }
        }
        let ms = if self.reset == ResetMode::Exact {
            started.elapsed().as_secs_f64() * 1e3
        } else {
            0.0
        };
        self.report = StoreReport {
            n_res: self.n_res,
            fast_bytes: self.report.fast_bytes,
            reset_ms: ms,
            ..StoreReport::default()
        };
        tracing::debug!(reset = %self.reset, reset_ms = ms, "expert store reset");
        Ok(ms)
    }

    /// Accounts one executed step of `t` tokens and rotates the fast store.
    ///
    /// `router_ids[i]` is the `i`-th MoE layer's routing of the step: `[t × k]` i32, row-major, one
    /// row of top-k ids per token (the plan's `router_ids.{l}` output). Every id counts as routed,
    /// and as a fast hit when resident now (the placement the step computed with); then each
    /// token's ids go to the layer's policy in token order, and the slots follow the policy.
    ///
    /// Errors: [`StoreError::Plan`] when the layer count differs or a row is not `t × k`;
    /// [`StoreError::Routed`] for an id outside the layer; [`StoreError::Policy`] when a policy
    /// refuses an access (an id routed twice in one token); [`StoreError::Slot`] when the memory
    /// cannot be filled. On error the counters may be partly updated; the slots always hold the
    /// file's bytes of the experts the store says they hold.
    pub fn observe(
        &mut self,
        router_ids: &[Vec<i32>],
        t: usize,
        slots: &mut HeldSlots,
    ) -> Result<(), StoreError> {
        self.observe_after(&[], router_ids, t, slots)
    }

    /// [`ExpertStore::observe`] of the first step of a request that reused the cached rows of
    /// its first tokens (`crate::session`'s prompt cache): `reused[i]` is the `i`-th MoE layer's
    /// routing of those tokens as they were computed (`[n × k]`, row-major; empty slices or no
    /// layers for none). They count nothing — no step computed them — but their ids go to the
    /// policies before the step's own tokens, so the policies see the access sequence of a cold
    /// prefill of the whole prompt, and the step's slots count as hits against the placement
    /// it computed with, as they would in a cold prefill run in one step.
    ///
    /// Errors: those of [`ExpertStore::observe`]; [`StoreError::Plan`] as well when a layer's
    /// reused ids are not whole rows of `k`.
    pub fn observe_after(
        &mut self,
        reused: &[Vec<i32>],
        router_ids: &[Vec<i32>],
        t: usize,
        slots: &mut HeldSlots,
    ) -> Result<(), StoreError> {
        if router_ids.len() != self.layers.len() {
            return Err(StoreError::Plan(format!(
                "{} routing rows for {} MoE layers",
                router_ids.len(),
                self.layers.len()
            )));
        }
        self.claim(slots)?;
        for (li, ids) in router_ids.iter().enumerate() {
            let l = layer_mut(&mut self.layers[li]);
            let layer = l.layer;
            if let Some(e) = l.ahead_error.take() {
                return Err(e);
            }
            if t == 0 || ids.len() % t != 0 {
                return Err(StoreError::Plan(format!(
                    "layer {layer}: {} routed ids for {t} tokens",
                    ids.len()
                )));
            }
            let n_expert = self.n_expert;
            for &id in ids {
                if id < 0 || id as usize >= n_expert {
                    return Err(StoreError::Routed {
                        layer,
                        id: id as i64,
                        n_expert,
                    });
                }
            }
            let l = layer_mut(&mut self.layers[li]);
            let map = l.step_map.take();
            let resident = |e: i32| match &map {
                Some(m) => m[e as usize].is_some(),
                None => l.slot_of[e as usize].is_some(),
            };
            let hits = ids.iter().filter(|&&e| resident(e)).count() as u64;
            let bytes = self.expert_bytes[li];
            let r = &mut self.report;
            r.routed += ids.len() as u64;
            r.fast_hits += hits;
            r.host_bytes += (ids.len() as u64 - hits) * bytes;
            for &e in &l.issued {
                let routed = ids.iter().filter(|&&id| id as u32 == e).count() as u64;
                if resident(e as i32) {
                    r.prefetch_served += routed;
                } else {
                    r.prefetch_late += routed;
                }
            }
            for a in l
                .ahead
                .iter()
                .filter(|a| !a.evicted && !l.issued.contains(&a.expert))
            {
                if !resident(a.expert as i32) {
                    let routed = ids.iter().filter(|&&id| id as u32 == a.expert).count() as u64;
                    r.prefetch_pending += routed;
                }
            }
            r.prefetches += l.issued.len() as u64;
            r.prefetch_bytes += l.issued.len() as u64 * bytes;
            l.issued.clear();
            // A copy neither made nor queued (the step failed before): it ends unmade.
            while let Some(i) = l.ahead.iter().position(|a| a.ticket.is_none()) {
                let a = l.ahead.swap_remove(i);
                l.end_copy(&a, CopyEnd::Cancelled);
            }
            let Some(policy) = l.policy.as_mut() else {
                continue;
            };
            let k = ids.len() / t;
            let earlier = reused.get(li).map_or(&[][..], Vec::as_slice);
            if earlier.len() % k.max(1) != 0 {
                return Err(StoreError::Plan(format!(
                    "layer {layer}: {} reused routed ids are not rows of {k}",
                    earlier.len()
                )));
            }
            for row in earlier
                .chunks_exact(k.max(1))
                .chain(ids.chunks_exact(k.max(1)))
            {
                self.token_ids.clear();
                self.token_ids.extend(row.iter().map(|&e| e as u32));
                policy
                    .access_step(&self.token_ids, &mut self.access)
                    .map_err(|source| StoreError::Policy { layer, source })?;
            }
            let target = policy.resident();
            let (writes, evictions) = self.follow(li, &target, slots)?;
            self.report.promotions += writes as u64;
            self.report.promoted_bytes += writes as u64 * self.expert_bytes[li];
            self.report.evictions += evictions as u64;
        }
        self.report.served_fraction = if self.report.routed == 0 {
            0.0
        } else {
            self.report.fast_hits as f64 / self.report.routed as f64
        };
        Ok(())
    }

    /// Makes layer `li`'s membership exactly `target` (at most `n_res` distinct ids below
    /// `n_expert`, as policies keep them): publishes the read-ahead copies that ended, frees the
    /// slots of experts not in the target (a copy in flight into one goes on, its expert no
    /// longer a member), then writes in the missing ones; an expert whose read-ahead copy is in
    /// flight is a member already. Returns the number of writes and of experts dropped.
    fn follow(
        &mut self,
        li: usize,
        target: &[u32],
        slots: &mut HeldSlots,
    ) -> Result<(usize, usize), StoreError> {
        let l = layer_mut(&mut self.layers[li]);
        l.settle();
        let mut keep = vec![false; self.n_expert];
        for &e in target {
            keep[e as usize] = true;
        }
        let mut dropped = 0;
        for s in 0..l.expert_in.len() {
            if let Some(e) = l.expert_in[s] {
                if !keep[e as usize] {
                    l.leave(s);
                    dropped += 1;
                }
            }
        }
        let mut writes = 0;
        for &e in target {
            let member = layer_mut(&mut self.layers[li]).expert_in.contains(&Some(e));
            if !member && self.admit(li, e, slots)? {
                writes += 1;
            }
        }
        Ok((writes, dropped))
    }

    /// Writes expert `e` of layer `li` into a free slot ([`Layer::open_slot`]); false when none
    /// is free. A slot that still takes an evicted expert's read-ahead copy is cleared of it by
    /// the memory first (the copy cancelled when it has not started, else waited for).
    fn admit(&mut self, li: usize, e: u32, slots: &mut HeldSlots) -> Result<bool, StoreError> {
        let l = layer_mut(&mut self.layers[li]);
        let Some(slot) = l.open_slot() else {
            return Ok(false);
        };
        slots.memory.fill(li, slot, e)?;
        // Only evicted experts' copies were left on this slot, and they have ended.
        l.ahead.retain(|a| a.slot as usize != slot);
        l.expert_in[slot] = Some(e);
        l.slot_of[e as usize] = Some(slot as u32);
        Ok(true)
    }
}

impl Layer {
    /// A free slot (one that no expert takes), best first: one no read-ahead copy is in flight
    /// into, else one whose copies are all still queued (a write from the step cancels them
    /// rather than wait), else any; `None` when every slot is taken.
    fn open_slot(&self) -> Option<usize> {
        let copies = |s: usize| self.ahead.iter().filter(move |a| a.slot as usize == s);
        let running = |s: usize| copies(s).any(|a| a.ticket.as_ref().is_some_and(|t| t.running()));
        (0..self.expert_in.len())
            .filter(|&s| self.expert_in[s].is_none())
            .min_by_key(|&s| match (copies(s).next().is_some(), running(s)) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            })
    }

    /// Takes the expert in slot `s` out of the membership: the slot is free, and a read-ahead
    /// copy in flight into it goes on for nobody.
    fn leave(&mut self, s: usize) {
        if let Some(e) = self.expert_in[s].take() {
            self.slot_of[e as usize] = None;
        }
        for a in self.ahead.iter_mut().filter(|a| a.slot as usize == s) {
            a.evicted = true;
        }
    }

    /// Publishes every read-ahead copy whose ticket says done, frees the slot of each that
    /// failed or was cancelled (the first failure kept for the next observation), and forgets
    /// them; the copies still in flight stay as they are. Never waits.
    fn settle(&mut self) {
        let mut i = 0;
        while i < self.ahead.len() {
            let end = match &self.ahead[i].ticket {
                Some(t) => t.poll(),
                None => CopyEnd::Pending,
            };
            if matches!(end, CopyEnd::Pending) {
                i += 1;
                continue;
            }
            let a = self.ahead.swap_remove(i);
            self.end_copy(&a, end);
        }
    }

    /// Applies how copy `a` (no longer in `ahead`) ended: done, its expert, if still a member,
    /// becomes resident; failed or cancelled, a member's slot is freed; a failure is kept for
    /// the next observation.
    fn end_copy(&mut self, a: &Ahead, end: CopyEnd) {
        match end {
            CopyEnd::Pending => {}
            CopyEnd::Done if !a.evicted => self.slot_of[a.expert as usize] = Some(a.slot),
            CopyEnd::Done => {}
            CopyEnd::Failed(error) => {
                if !a.evicted {
                    self.expert_in[a.slot as usize] = None;
                }
                if let Some(e) = error {
                    self.ahead_error.get_or_insert(e);
                }
            }
            CopyEnd::Cancelled if !a.evicted => self.expert_in[a.slot as usize] = None,
            CopyEnd::Cancelled => {}
        }
    }
}

impl Ahead {
    /// Whether this is `copy`, not yet queued nor evicted.
    fn unqueued(&self, copy: AheadCopy) -> bool {
        self.expert == copy.expert
            && self.slot as usize == copy.slot
            && self.ticket.is_none()
            && !self.evicted
    }
}

/// The policy of one layer, or `None` for `n_res = 0`.
fn build_policy(
    opts: &StoreOptions,
    n_expert: u32,
    n_res: usize,
    seed: &[u32],
) -> Result<Option<Box<dyn Policy + Send + Sync>>, PolicyError> {
    if n_res == 0 {
        return Ok(None);
    }
    Ok(Some(match opts.policy {
        PolicyKind::TwoQ => {
            let params = TwoQParams::from_fractions(
                n_res,
                opts.a1in,
                opts.a1out,
                opts.max_promotions,
                opts.admission,
            )?;
            Box::new(TwoQ::new(n_expert, params, seed)?)
        }
        PolicyKind::Lru => Box::new(Lru::new(n_expert, n_res, seed)?),
        PolicyKind::Lfu => Box::new(Lfu::new(n_expert, n_res, seed)?),
        PolicyKind::Arc => Box::new(ArcCache::new(n_expert, n_res, seed)?),
        PolicyKind::Lrfu => Box::new(Lrfu::new(n_expert, n_res, Lrfu::DEFAULT_LAMBDA, seed)?),
        PolicyKind::LeCaR => Box::new(LeCaR::new(n_expert, n_res, seed)?),
        PolicyKind::Static | PolicyKind::Min => Box::new(StaticSet::new(n_expert, n_res, seed)?),
    }))
}
