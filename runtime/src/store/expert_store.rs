//! The split expert store of the CPU backend (ARCHITECTURE.md § runtime, split expert store).
//!
//! Algorithm. Each MoE layer's experts are partitioned between
//! * a **fast store**: `n_res` slots per layer in one anonymous mapping the store owns, `mlock`ed
//!   where the system permits (one warning naming the reason and the byte count where not). A slot
//!   holds a *copy* of one expert's bytes: its slice of every stacked expert tensor of the layer
//!   (`ffn_gate_up_exps`, or `ffn_gate_exps` + `ffn_up_exps`, then `ffn_down_exps`), each slice the
//!   contiguous bytes `e · expert_bytes .. (e + 1) · expert_bytes` of the tensor (ggml layout
//!   `{ne0, ne1, n_expert}`, `expert_bytes = row_bytes · ne1`), back to back;
//! * a **host store**: the mapped GGUF file itself (zero-copy; the model's weight views).
//!
//! The executor reads an expert through [`ExpertSource::fast_copy`]: the slot copy when resident,
//! the host alias otherwise. After a step ran, [`ExpertStore::observe`] counts every routed
//! (token, layer, expert) as served from the fast store when the expert was resident while the
//! step computed it, then feeds each token's routed ids, in token order, to the layer's
//! [`Policy`] (2Q by default, `crate::placement::policy`) and makes the slots follow the policy's
//! resident set: experts it dropped free their slot, experts it admitted are copied in (a
//! *promotion*). Within a multi-token prefill the placement is fixed while the step computes, so
//! an expert admitted at token 3 serves token 5 of the same prefill from the host store; one token
//! per step (decode) serves exactly as `aubier replay` counts.
//!
//! Budget: [`FastBudget`] gives slots per layer or total bytes; slots × the layers' per-expert
//! bytes is allocated once and never grows. `n_res = 0` keeps every expert in the host store (no
//! policy runs); `n_res = n_expert` keeps every expert resident (nothing rotates).
//!
//! Reset: the boot state (membership and every policy's [`Snapshot`]) is kept; with
//! [`ResetMode::Exact`] [`ExpertStore::reset`] restores both before each request (copying back the
//! experts that left) and reports how long it took; [`ResetMode::None`] keeps them.

use crate::backend::cpu::q8::{
    deinterleave_rows, interleave_rows, q8_interleaved_fn, q8_rows_fn, INTERLEAVE_ROWS,
};
use crate::backend::{BackendKind, ExpertSource};
use crate::engine::Model;
use crate::error::StoreError;
use crate::ggml_type::GgmlType;
use crate::placement::hotset::HotSet;
use crate::placement::policy::{
    Access, Lfu, Lru, Policy, PolicyError, PolicyKind, Snapshot, StaticSet, TwoQ, TwoQParams,
};
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{Operand, WeightId};
use aubier_compiler::types::{Attrs, WeightRef};
use memmap2::MmapMut;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

/// How big the fast store is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FastBudget {
    /// Every expert resident when their bytes fit in half the memory available at boot
    /// (`MemAvailable` of `/proc/meminfo`; unknown = fits), else as many slots per layer as fit
    /// there. The default: a model that fits runs from owned, locked memory as a user expects.
    #[default]
    Auto,
    /// `n` slots per layer (`--n-res`), `0..=n_expert`.
    Slots(usize),
    /// At most this many bytes in all (`--fast-budget`): `n_res = bytes ÷ Σ_layers expert bytes`,
    /// at most `n_expert`.
    Bytes(u64),
}

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
    /// Fast-store size.
    pub budget: FastBudget,
    /// Seed membership per layer (hottest first); `None` seeds the identity set `0..n_res`.
    pub resident_set: Option<HotSet>,
    /// Placement policy: `2q`, `lru`, `lfu` or `static` (`static` = the seed, never rotated);
    /// `min` is an offline oracle and is refused.
    pub policy: PolicyKind,
    /// 2Q `Kin` as a fraction of the slots (the paper's 0.25).
    pub a1in: f64,
    /// 2Q `Kout` as a fraction of the slots (the paper's 0.5).
    pub a1out: f64,
    /// 2Q cap on promotions per token per layer; `None` = no cap.
    pub max_promotions: Option<usize>,
    /// Between requests.
    pub reset: ResetMode,
    /// Copies of Q2_K / Q3_K expert tensors in the interleaved layout of the decode kernels
    /// ([`crate::backend::cpu::q8::interleave_rows`]) where the CPU has them: for the `cpu`
    /// backend, whose decode then streams each group of rows in address order with no
    /// transpose. The oracle reads such experts from the host alias instead. Also copies the
    /// dense `mat_mul` weights into huge pages for the `cpu` backend: interleaved where they
    /// have such kernels, else (the Q6_K output head) as the file's bytes (`dense_copies`).
    /// On by default (the product path); it applies to a model bound to the `cpu` backend only
    /// (the oracle reads the file's layout, in place).
    pub interleave: bool,
}

impl Default for StoreOptions {
    /// [`FastBudget::Auto`], identity seed, 2Q with the paper's fractions, no cap, exact reset,
    /// interleaved copies (the `cpu` backend's layout).
    fn default() -> Self {
        StoreOptions {
            budget: FastBudget::Auto,
            resident_set: None,
            policy: PolicyKind::TwoQ,
            a1in: TwoQParams::PAPER_A1IN,
            a1out: TwoQParams::PAPER_A1OUT,
            max_promotions: None,
            reset: ResetMode::Exact,
            interleave: true,
        }
    }
}

/// What one request did with the store (`aubier run --json`'s `store`, the server's log line).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct StoreReport {
    /// Fast-store slots per layer.
    pub n_res: usize,
    /// Bytes of the fast store (all layers).
    pub fast_bytes: u64,
    /// Bytes of the copies of dense weights ([`StoreOptions::interleave`]).
    pub dense_bytes: u64,
    /// `fast_hits ÷ routed` (0 when nothing was routed).
    pub served_fraction: f64,
    /// Routed (token, layer, expert) slots served from the fast store.
    pub fast_hits: u64,
    /// All routed (token, layer, expert) slots.
    pub routed: u64,
    /// Experts copied into the fast store by the policy (not counting reset).
    pub promotions: u64,
    /// Time the reset before this request took (ms; 0 with `--reset none`).
    pub reset_ms: f64,
}

/// One stacked expert tensor of a layer, as held in a slot.
#[derive(Clone, Copy, Debug)]
struct Part {
    weight: WeightId,
    expert_bytes: usize,
    /// Offset of this tensor's slice within a slot.
    offset: usize,
    /// The type and row bytes of a tensor whose copies are interleaved.
    interleave: Option<(GgmlType, usize)>,
}

/// The store of one MoE layer.
struct Layer {
    layer: usize,
    parts: Vec<Part>,
    /// Bytes of one slot: Σ parts' expert bytes.
    slot_bytes: usize,
    /// Offset of slot 0 in the arena.
    base: usize,
    /// `[n_expert]`: the slot holding each expert, if resident.
    slot_of: Vec<Option<u32>>,
    /// `[n_res]`: the expert in each slot, if any.
    expert_in: Vec<Option<u32>>,
    policy: Option<Box<dyn Policy + Send + Sync>>,
    /// Membership and policy state at boot.
    boot_members: Vec<u32>,
    boot_policy: Option<Snapshot>,
}

impl fmt::Debug for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layer")
            .field("layer", &self.layer)
            .field("slot_bytes", &self.slot_bytes)
            .field("resident", &self.expert_in.iter().flatten().count())
            .finish_non_exhaustive()
    }
}

/// The split expert store of one session: fast-store copies plus the host alias, and the
/// placement policy of every MoE layer.
pub struct ExpertStore {
    model: Arc<Model>,
    layers: Vec<Layer>,
    /// `[n_weights]`: `(layer index, part)` of every stacked expert weight.
    by_weight: Vec<Option<(usize, usize)>>,
    arena: Option<MmapMut>,
    /// Copies of dense weights ([`StoreOptions::interleave`]): their bytes, and `[n_weights]`
    /// where each copied weight is in them.
    dense: Option<MmapMut>,
    dense_at: Vec<Option<DenseCopy>>,
    n_res: usize,
    n_expert: usize,
    policy: PolicyKind,
    reset: ResetMode,
    report: StoreReport,
    access: Vec<Access>,
    token_ids: Vec<u32>,
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

impl ExpertStore {
    /// Builds the store of `model`: finds every `moe_ffn` step's stacked expert weights, sizes the
    /// fast store from `opts.budget`, allocates and locks it, copies the seed experts in and
    /// builds each layer's policy.
    ///
    /// Errors: [`StoreError::Plan`] for MoE steps that disagree on the expert count or repeat a
    /// layer; [`StoreError::TooManySlots`]; [`StoreError::OfflinePolicy`];
    /// [`StoreError::HotSet`] for a resident set of the wrong layer count or with bad ids;
    /// [`StoreError::Policy`] for bad 2Q fractions; [`StoreError::Alloc`].
    pub fn new(model: Arc<Model>, opts: &StoreOptions) -> Result<ExpertStore, StoreError> {
        if opts.policy == PolicyKind::Min {
            return Err(StoreError::OfflinePolicy);
        }
        let n_weights = model.plan.weights.len();
        // Only the cpu backend reads the copies of dense weights and interleaved experts.
        let interleave = opts.interleave && matches!(model.backend(), BackendKind::Cpu(_));
        let mut layers: Vec<Layer> = Vec::new();
        let mut n_expert = None;
        for (step, cs) in model.plan.steps.iter().zip(model.program().steps()) {
            if step.op != Op::MoeFfn {
                continue;
            }
            let Attrs::Moe { layer, .. } = step.attrs else {
                return Err(StoreError::Plan(
                    "a moe_ffn step without Moe attributes".into(),
                ));
            };
            if layers.iter().any(|l| l.layer == layer) {
                return Err(StoreError::Plan(format!(
                    "layer {layer} has two moe_ffn steps"
                )));
            }
            let mut parts = Vec::new();
            let mut offset = 0;
            for t in &cs.expert_tables {
                let Some(&Operand::Weight(weight)) = step.args.get(t.arg) else {
                    return Err(StoreError::Plan(format!(
                        "layer {layer}: expert operand {} is not a weight",
                        t.arg
                    )));
                };
                if *n_expert.get_or_insert(t.n_expert) != t.n_expert {
                    return Err(StoreError::Plan(format!(
                        "layer {layer} has {} experts, an earlier layer {}",
                        t.n_expert,
                        n_expert.unwrap_or_default()
                    )));
                }
                parts.push(Part {
                    weight,
                    expert_bytes: t.expert_bytes,
                    offset,
                    interleave: interleave
                        .then(|| interleavable(&model.plan.weights[weight], t.expert_bytes))
                        .flatten(),
                });
                offset += t.expert_bytes;
            }
            layers.push(Layer {
                layer,
                parts,
                slot_bytes: offset,
                base: 0,
                slot_of: Vec::new(),
                expert_in: Vec::new(),
                policy: None,
                boot_members: Vec::new(),
                boot_policy: None,
            });
        }
        layers.sort_by_key(|l| l.layer);
        let n_expert = n_expert.unwrap_or(0);
        let per_slot: u64 = layers.iter().map(|l| l.slot_bytes as u64).sum();
        let n_res = match opts.budget {
            FastBudget::Slots(n) if n > n_expert => {
                return Err(StoreError::TooManySlots { n_res: n, n_expert })
            }
            FastBudget::Slots(n) => n,
            FastBudget::Bytes(b) => slots_within(b, per_slot, n_expert),
            FastBudget::Auto => match available_memory() {
                Some(avail) => slots_within(avail / 2, per_slot, n_expert),
                None => n_expert,
            },
        };
        if let Some(h) = &opts.resident_set {
            h.check(model.config.n_layer, n_expert as u32)?;
        }

        let mut by_weight = vec![None; n_weights];
        let mut total = 0usize;
        for (li, l) in layers.iter_mut().enumerate() {
            for (pi, p) in l.parts.iter().enumerate() {
                by_weight[p.weight] = Some((li, pi));
            }
            l.base = total;
            total += l.slot_bytes * n_res;
        }
        let arena = if total > 0 {
            let mut map = anon_arena(total)?;
            if let Err(e) = map.lock() {
                tracing::warn!(
                    bytes = total,
                    "mlock of the fast expert store failed ({e}); its {total} bytes stay pageable \
                     (raise RLIMIT_MEMLOCK, e.g. `ulimit -l`, to lock them)"
                );
            }
            map.fill(0);
            Some(map)
        } else {
            None
        };

        let (dense, dense_at) = if interleave {
            dense_copies(&model, &by_weight)?
        } else {
            (None, vec![None; n_weights])
        };
        let dense_bytes = dense_at.iter().flatten().map(|c| c.len as u64).sum();
        let mut store = ExpertStore {
            model,
            layers,
            by_weight,
            arena,
            dense,
            dense_at,
            n_res,
            n_expert,
            policy: opts.policy,
            reset: opts.reset,
            report: StoreReport {
                n_res,
                fast_bytes: total as u64,
                dense_bytes,
                ..StoreReport::default()
            },
            access: Vec::new(),
            token_ids: Vec::new(),
        };
        for li in 0..store.layers.len() {
            let layer = store.layers[li].layer;
            let identity: Vec<u32>;
            let seed: &[u32] = match &opts.resident_set {
                Some(h) => h.seed(layer, n_res),
                None => {
                    identity = (0..n_res as u32).collect();
                    &identity
                }
            };
            let policy = build_policy(opts, n_expert as u32, n_res, seed)
                .map_err(|source| StoreError::Policy { layer, source })?;
            let l = &mut store.layers[li];
            l.slot_of = vec![None; n_expert];
            l.expert_in = vec![None; n_res];
            l.boot_members = seed.to_vec();
            l.boot_policy = policy.as_ref().map(|p| p.snapshot());
            l.policy = policy;
            for &e in seed {
                store.admit(li, e);
            }
        }
        tracing::info!(
            n_res,
            n_expert,
            layers = store.layers.len(),
            fast_bytes = total,
            policy = %opts.policy,
            reset = %opts.reset,
            "expert store ready"
        );
        Ok(store)
    }

    /// Fast-store slots per layer.
    pub fn n_res(&self) -> usize {
        self.n_res
    }

    /// Experts per MoE layer.
    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// Bytes of the fast store, all layers (what the budget bounds).
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
            let mut v: Vec<u32> = l.expert_in.iter().flatten().copied().collect();
            v.sort_unstable();
            v
        })
    }

    /// The policy state of the `i`-th MoE layer (`None` with `n_res = 0` or past the last layer).
    pub fn policy_snapshot(&self, i: usize) -> Option<Snapshot> {
        self.layers
            .get(i)
            .and_then(|l| l.policy.as_ref().map(|p| p.snapshot()))
    }

    /// Every resident copy of the `i`-th MoE layer as `(expert, weight, fast bytes, host bytes)`,
    /// the fast bytes in the file's layout (deinterleaved where [`StoreOptions::interleave`]
    /// interleaved them), for checking that each copy equals the file.
    pub fn copies(&self, i: usize) -> Vec<(u32, WeightId, Vec<u8>, &[u8])> {
        let Some(l) = self.layers.get(i) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for &e in l.expert_in.iter().flatten() {
            for p in &l.parts {
                if let (Some(fast), Some(host)) =
                    (self.fast_copy(p.weight, e as usize), self.host(p, e))
                {
                    let mut own = fast.to_vec();
                    if let Some((ty, row_bytes)) = p.interleave {
                        if deinterleave_rows(ty, fast, &mut own, row_bytes).is_err() {
                            continue;
                        }
                    }
                    out.push((e, p.weight, own, host));
                }
            }
        }
        out
    }

    /// The counters of the current request.
    pub fn report(&self) -> StoreReport {
        self.report
    }

    /// Starts a request: zeroes the request counters and, with [`ResetMode::Exact`], restores the
    /// boot membership (copying back experts that left) and every policy's boot state; returns the
    /// time that took in ms (0 with [`ResetMode::None`]), also kept as the report's `reset_ms`.
    ///
    /// Errors: [`StoreError::Policy`] if a policy refuses its own boot snapshot (a bug).
    pub fn reset(&mut self) -> Result<f64, StoreError> {
        let started = Instant::now();
        if self.reset == ResetMode::Exact {
            for li in 0..self.layers.len() {
                let l = &mut self.layers[li];
                if let (Some(p), Some(s)) = (l.policy.as_mut(), l.boot_policy.as_ref()) {
                    p.reset_to(s).map_err(|source| StoreError::Policy {
                        layer: l.layer,
                        source,
                    })?;
                }
                let target = l.boot_members.clone();
                self.follow(li, &target);
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
            dense_bytes: self.report.dense_bytes,
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
    /// refuses an access (an id routed twice in one token). On error the counters may be partly
    /// updated; the slots always equal the file's bytes.
    pub fn observe(&mut self, router_ids: &[Vec<i32>], t: usize) -> Result<(), StoreError> {
        self.observe_after(&[], router_ids, t)
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
    ) -> Result<(), StoreError> {
        if router_ids.len() != self.layers.len() {
            return Err(StoreError::Plan(format!(
                "{} routing rows for {} MoE layers",
                router_ids.len(),
                self.layers.len()
            )));
        }
        for (li, ids) in router_ids.iter().enumerate() {
            let layer = self.layers[li].layer;
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
            let l = &self.layers[li];
            let hits = ids
                .iter()
                .filter(|&&e| l.slot_of[e as usize].is_some())
                .count() as u64;
            self.report.routed += ids.len() as u64;
            self.report.fast_hits += hits;
            let Some(policy) = self.layers[li].policy.as_mut() else {
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
            self.report.promotions += self.follow(li, &target) as u64;
        }
        self.report.served_fraction = if self.report.routed == 0 {
            0.0
        } else {
            self.report.fast_hits as f64 / self.report.routed as f64
        };
        Ok(())
    }

    /// Makes layer `li`'s slots hold exactly `target` (at most `n_res` distinct ids below
    /// `n_expert`, as policies keep them): frees the slots of experts not in it, then copies in
    /// the missing ones. Returns the number of copies.
    fn follow(&mut self, li: usize, target: &[u32]) -> usize {
        let l = &mut self.layers[li];
        let mut keep = vec![false; self.n_expert];
        for &e in target {
            keep[e as usize] = true;
        }
        for s in 0..l.expert_in.len() {
            if let Some(e) = l.expert_in[s] {
                if !keep[e as usize] {
                    l.expert_in[s] = None;
                    l.slot_of[e as usize] = None;
                }
            }
        }
        let mut copies = 0;
        for &e in target {
            if self.layers[li].slot_of[e as usize].is_none() && self.admit(li, e) {
                copies += 1;
            }
        }
        copies
    }

    /// Copies expert `e` of layer `li` into a free slot; false when none is free.
    fn admit(&mut self, li: usize, e: u32) -> bool {
        let l = &self.layers[li];
        let Some(slot) = l.expert_in.iter().position(Option::is_none) else {
            return false;
        };
        let start = l.base + slot * l.slot_bytes;
        let (Some(arena), model) = (self.arena.as_mut(), &self.model) else {
            return false;
        };
        for p in &l.parts {
            let Some(host) = model.weight_view(p.weight) else {
                return false;
            };
            let src = &host[e as usize * p.expert_bytes..][..p.expert_bytes];
            let dst = &mut arena[start + p.offset..][..p.expert_bytes];
            match p.interleave {
                Some((ty, row_bytes)) => {
                    if interleave_rows(ty, src, dst, row_bytes).is_err() {
                        return false;
                    }
                }
                None => dst.copy_from_slice(src),
            }
            model.release_host_pages(src);
        }
        let l = &mut self.layers[li];
        l.expert_in[slot] = Some(e);
        l.slot_of[e as usize] = Some(slot as u32);
        true
    }

    /// Whether the fast path reads plan weight `weight` through the store: a layer's stacked
    /// experts, or a dense weight it holds an interleaved copy of.
    pub fn holds(&self, weight: WeightId) -> bool {
        matches!(self.by_weight.get(weight), Some(Some(_)))
            || matches!(self.dense_at.get(weight), Some(Some(_)))
    }

    /// The host-alias bytes of expert `e` of part `p`.
    fn host(&self, p: &Part, e: u32) -> Option<&[u8]> {
        self.model
            .weight_view(p.weight)?
            .get(e as usize * p.expert_bytes..)?
            .get(..p.expert_bytes)
    }
}

/// An anonymous mapping of `bytes` for copies the decode kernels stream, in transparent huge
/// pages where the kernel allows them (`madvise` mode included): with 2 MiB pages a Q2_K matrix
/// streamed 21.3 -> 22.9 GB/s on two threads (Zen 4). Advice only: refused, the mapping stays in
/// 4 KiB pages.
///
/// Errors: [`StoreError::Alloc`].
fn anon_arena(bytes: usize) -> Result<MmapMut, StoreError> {
    let map = MmapMut::map_anon(bytes).map_err(|source| StoreError::Alloc { bytes, source })?;
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    Ok(map)
}

/// Where one dense weight's copy lies in the store's dense arena.
#[derive(Clone, Copy, Debug)]
struct DenseCopy {
    start: usize,
    len: usize,
    /// In the interleaved layout of [`interleave_rows`]; else the file's bytes.
    interleaved: bool,
}

/// Copies of the dense weights the fast path's `mat_mul` reads, in the huge pages of one
/// [`anon_arena`]: every weight that is not an expert tensor (`by_weight`), is read only as the
/// weight of `mat_mul` steps and is a matrix, copied interleaved where it is [`interleavable`] as
/// one block of rows, else as the file's bytes where its type has a Q8_K decode kernel (the
/// output head: 440 MiB of Q6_K on the real model, read in full by every decoded token; from
/// its 4 KiB file pages two threads read 28.4–29.3 GB/s on Zen 4, from 2 MiB pages 27.6–31.2).
/// Each is copied in turn, a chunk at a time, and each copied chunk's mapped pages released
/// ([`Model::release_host_pages`]), so the copies replace the file's pages in the resident set
/// instead of doubling them, even for a moment. Returns the copies and `[n_weights]` where each
/// one is.
///
/// Errors: [`StoreError::Alloc`].
fn dense_copies(
    model: &Model,
    by_weight: &[Option<(usize, usize)>],
) -> Result<(Option<MmapMut>, Vec<Option<DenseCopy>>), StoreError> {
    let plan = &model.plan;
    let n = plan.weights.len();
    // Weights read by something other than a `mat_mul`'s weight operand are left alone.
    let mut only_mat_mul = vec![true; n];
    let mut mat_mul = vec![false; n];
    for step in &plan.steps {
        for (i, a) in step.args.iter().enumerate() {
            if let &Operand::Weight(w) = a {
                if step.op == Op::MatMul && i == 0 {
                    mat_mul[w] = true;
                } else {
                    only_mat_mul[w] = false;
                }
            }
        }
    }
    let mut at: Vec<Option<DenseCopy>> = vec![None; n];
    let mut chosen = Vec::new();
    let mut total = 0usize;
    for (w, r) in plan.weights.iter().enumerate() {
        let Some(view) = model.weight_view(w) else {
            continue;
        };
        if by_weight[w].is_some() || !mat_mul[w] || !only_mat_mul[w] || r.ne.len() != 2 {
            continue;
        }
        // `Some((type, row bytes))` interleaved, `None` the file's bytes.
        let layout = interleavable(r, view.len());
        let plain = layout.is_none()
            && GgmlType::from_name(&r.ggml_type)
                .and_then(q8_rows_fn)
                .is_some();
        if layout.is_some() || plain {
            at[w] = Some(DenseCopy {
                start: total,
                len: view.len(),
                interleaved: layout.is_some(),
            });
            chosen.push((w, layout));
            total += view.len().next_multiple_of(64);
        }
    }
    if total == 0 {
        return Ok((None, at));
    }
    let mut map = anon_arena(total)?;
    for (w, layout) in chosen {
        let (Some(src), Some(copy)) = (model.weight_view(w), at[w]) else {
            continue;
        };
        let dst = &mut map[copy.start..copy.start + copy.len];
        match layout {
            Some((ty, row_bytes)) => {
                if interleave_rows(ty, src, dst, row_bytes).is_err() {
                    at[w] = None;
                    continue;
                }
                model.release_host_pages(src);
            }
            None => {
                for (d, c) in dst.chunks_mut(COPY_CHUNK).zip(src.chunks(COPY_CHUNK)) {
                    d.copy_from_slice(c);
                    model.release_host_pages(c);
                }
                // The pages that straddle two chunks, whole in neither.
                model.release_host_pages(src);
            }
        }
    }
    tracing::info!(
        weights = at.iter().flatten().count(),
        bytes = total,
        "dense weights copied for the fast path"
    );
    Ok((Some(map), at))
}

/// Bytes of a plain dense copy between two releases of the file's pages.
const COPY_CHUNK: usize = 8 << 20;

/// The type and row bytes of the expert tensor `w` (`expert_bytes` per expert) when its rows have
/// an interleaved decode kernel on this CPU and each expert is whole groups of them.
fn interleavable(w: &WeightRef, expert_bytes: usize) -> Option<(GgmlType, usize)> {
    let ty = GgmlType::from_name(&w.ggml_type)?;
    q8_interleaved_fn(ty)?;
    let row_bytes = ty.row_size(*w.ne.first()?)?;
    let group = INTERLEAVE_ROWS.checked_mul(row_bytes)?;
    (group > 0 && expert_bytes.is_multiple_of(group)).then_some((ty, row_bytes))
}

impl ExpertSource for ExpertStore {
    fn dense_copy(&self, weight: WeightId) -> Option<(&[u8], bool)> {
        let c = (*self.dense_at.get(weight)?)?;
        let bytes = self.dense.as_ref()?.get(c.start..c.start + c.len)?;
        Some((bytes, c.interleaved))
    }

    fn interleaved(&self, weight: WeightId) -> bool {
        matches!(
            self.by_weight.get(weight),
            Some(Some((li, pi))) if self.layers[*li].parts[*pi].interleave.is_some()
        )
    }

    fn fast_copy(&self, weight: WeightId, expert: usize) -> Option<&[u8]> {
        let (li, pi) = (*self.by_weight.get(weight)?)?;
        let l = &self.layers[li];
        let slot = (*l.slot_of.get(expert)?)? as usize;
        let p = &l.parts[pi];
        let start = l.base + slot * l.slot_bytes + p.offset;
        self.arena.as_ref()?.get(start..start + p.expert_bytes)
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
            let params =
                TwoQParams::from_fractions(n_res, opts.a1in, opts.a1out, opts.max_promotions)?;
            Box::new(TwoQ::new(n_expert, params, seed)?)
        }
        PolicyKind::Lru => Box::new(Lru::new(n_expert, n_res, seed)?),
        PolicyKind::Lfu => Box::new(Lfu::new(n_expert, n_res, seed)?),
        PolicyKind::Static | PolicyKind::Min => Box::new(StaticSet::new(n_expert, n_res, seed)?),
    }))
}

/// Slots per layer that fit in `bytes` when one slot in every layer costs `per_slot` bytes.
fn slots_within(bytes: u64, per_slot: u64, n_expert: usize) -> usize {
    if per_slot == 0 {
        return n_expert;
    }
    (bytes / per_slot).min(n_expert as u64) as usize
}

/// `MemAvailable` of `/proc/meminfo` in bytes; `None` where it cannot be read.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
