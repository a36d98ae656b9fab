//! Host memory of the host backends: the fast store's slots ([`HostSlots`], a [`SlotMemory`])
//! and copies of dense weights ([`DenseCopies`]), each in one anonymous mapping in transparent
//! huge pages, every copy in the file's layout or in the backend's own ([`CopyLayout`]).
//!
//! Slots: `slots` per MoE layer, one mapping for all, `mlock`ed where the system permits (one
//! warning naming the reason and the byte count where not). A slot holds one expert: its slice of
//! every stacked tensor of the layer, back to back (the plan's [`MoeLayer::tensors`] order). The
//! file's pages of a copied slice are released after the copy, so copies replace the file's
//! pages in the resident set instead of doubling them. The read-ahead's copies into the slots
//! are made by the memory's own worker ([`Copier`]), which lives as long as the memory and
//! holds the mapping ([`SlotArena`]) for as long as it runs, so a copy may outlive the step that
//! issued it; every other write of a slot first clears it of the worker's copies. The read-ahead
//! into the page cache (`madvise(MADV_WILLNEED)`, which submits the disk reads and on a cold file
//! can take milliseconds per expert) is issued by a second worker, so that neither the step nor
//! the copies wait for it.

use crate::progress::{Count, Progress};
use crate::store::copier::{Copier, CopyTicket};
use crate::store::expert_store::AheadCopy;
use crate::store::{SlotMemory, StoreError};
use crate::weights::Weights;
use aubier_compiler::plan::{MoeLayer, WeightId};
use memmap2::MmapMut;
use std::any::Any;
use std::sync::Arc;

/// The layout of a host backend's copy of a weight's bytes (an expert in a slot, a dense weight)
/// when it is not the file's.
pub(crate) trait CopyLayout: std::fmt::Debug + Send + Sync {
    /// Writes `src` (the file's bytes) into `dst` (as many bytes) in this layout.
    ///
    /// Errors: why `src` cannot take this layout.
    fn write(&self, src: &[u8], dst: &mut [u8]) -> Result<(), String>;

    /// Writes `src` (in this layout) into `dst` in the file's layout.
    ///
    /// Errors: why it cannot.
    fn read(&self, src: &[u8], dst: &mut [u8]) -> Result<(), String>;
}

/// What a host backend copies, and in what layout (`None`: the file's bytes).
#[derive(Debug, Default)]
pub(crate) struct HostLayout {
    /// Per MoE layer (plan order), per stacked tensor: the layout of its slot copies.
    pub experts: Vec<Vec<Option<Arc<dyn CopyLayout>>>>,
    /// Dense weights the backend's kernels read from a copy.
    pub dense: Vec<(WeightId, Option<Arc<dyn CopyLayout>>)>,
}

/// An anonymous mapping of `bytes` for copies the kernels stream, in transparent huge pages
/// where the kernel allows them (`madvise` mode included): with 2 MiB pages a Q2_K matrix
/// streamed 21.3 -> 22.9 GB/s on two threads (Zen 4). Advice only: refused, the mapping stays in
/// 4 KiB pages.
///
/// Errors: [`StoreError::Alloc`].
fn anon_arena(bytes: usize) -> Result<MmapMut, StoreError> {
    let map = MmapMut::map_anon(bytes).map_err(|e| StoreError::Alloc {
        bytes: bytes as u64,
        reason: e.to_string(),
    })?;
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    Ok(map)
}

/// One stacked expert tensor as its slots hold it.
#[derive(Clone, Debug)]
struct Part {
    weight: WeightId,
    expert_bytes: usize,
    /// Offset within a slot.
    offset: usize,
    /// The layout of the copies; `None`: the file's bytes.
    layout: Option<Arc<dyn CopyLayout>>,
}

/// The slots of one MoE layer.
#[derive(Clone, Debug)]
struct SlotLayer {
    parts: Vec<Part>,
    slot_bytes: usize,
    /// Offset of slot 0 in the arena.
    base: usize,
}

/// The fast store's slots in host memory: the mapping, and the worker that makes the
/// read-ahead's copies into it.
#[derive(Debug)]
pub(crate) struct HostSlots {
    arena: Arc<SlotArena>,
    copier: Copier,
    /// Issues the page-cache read-ahead ([`HostSlots::read_ahead_host`]) in the order asked.
    advisor: Copier,
}

/// The slots' mapping and what a copy into it needs, shared with the copy worker's queued
/// copies (so the mapping outlives every copy into it).
#[derive(Debug)]
pub(crate) struct SlotArena {
    weights: Arc<Weights>,
    layers: Vec<SlotLayer>,
    slots: usize,
    /// Owns the mapping; its bytes are reached only through `base`.
    arena: Option<MmapMut>,
    /// The mapping's first byte, taken once from `&mut` so that a read-ahead copy may write a
    /// slot no kernel reads while the step reads others ([`SlotArena::fill_unread`]).
    base: *mut u8,
}

// SAFETY: `base` points into `arena`, which the struct owns and never remaps. Slot bytes are
// written only through `fill_unread`, whose contract is that nothing else reads or writes that
// slot meanwhile; readers (`copy`) borrow `&self` and read published slots only. So sharing a
// `&SlotArena` between threads races on no byte.
unsafe impl Send for SlotArena {}
// SAFETY: as for `Send`.
unsafe impl Sync for SlotArena {}

impl HostSlots {
    /// `slots` slots for every layer of `moe` (one expert each), the copies of tensor `j` of
    /// layer `i` in `layouts[i][j]` (`None` or missing: the file's bytes).
    ///
    /// Errors: [`StoreError::Alloc`] when the mapping cannot be made.
    pub(crate) fn new(
        weights: Arc<Weights>,
        moe: &[MoeLayer],
        slots: usize,
        layouts: &[Vec<Option<Arc<dyn CopyLayout>>>],
    ) -> Result<HostSlots, StoreError> {
        Ok(HostSlots {
            arena: Arc::new(SlotArena::new(weights, moe, slots, layouts)?),
            copier: Copier::new(),
            advisor: Copier::named("aubier-page-ahead"),
        })
    }

    /// Has the memory's advice worker start reading `experts` of MoE layer `layer` from the file
    /// into the page cache, in this order ([`SlotArena::read_ahead_host`]), after the advice
    /// asked for before; returns at once (nothing queued for no experts). Advice only: an
    /// expert out of range is skipped, and advice still queued when the memory drops is dropped.
    pub(crate) fn read_ahead_host(&self, layer: usize, experts: Vec<u32>) {
        if experts.is_empty() {
            return;
        }
        let arena = Arc::clone(&self.arena);
        // Slot `usize::MAX` names no slot: no write of a slot waits for advice.
        self.advisor.queue(
            (layer, usize::MAX),
            Box::new(move || {
                for e in experts {
                    arena.read_ahead_host(layer, e);
                }
                Ok(())
            }),
        );
    }

    /// Makes the read-ahead copy `copy` now, on the caller's thread ([`SlotArena::fill_unread`]).
    ///
    /// # Safety
    /// As [`SlotArena::fill_unread`]'s, for `copy`'s slot.
    ///
    /// Errors: those of [`SlotArena::fill_unread`].
    pub(crate) unsafe fn fill_unread(&self, copy: AheadCopy) -> Result<(), StoreError> {
        self.copier.clear((copy.layer, copy.slot));
        // SAFETY: the caller's contract; the worker's copies into the slot are cleared.
        unsafe { self.arena.fill_unread(copy.layer, copy.slot, copy.expert) }
    }

    /// Queues the read-ahead copy `copy` on the memory's worker, after every copy queued before
    /// (so an older copy into the same slot is made first), and returns its ticket, which says
    /// when the slot holds the expert.
    ///
    /// # Safety
    /// Nothing reads slot `copy.slot` of MoE layer `copy.layer` until the ticket says the copy
    /// ended: the expert store took the slot for this copy
    /// ([`crate::store::expert_store::ExpertStore::read_ahead`]) and publishes it only then.
    /// (Writers need no promise: every other write of a slot clears it of the worker's copies
    /// first.)
    pub(crate) unsafe fn copy_later(&self, copy: AheadCopy) -> Arc<CopyTicket> {
        let arena = Arc::clone(&self.arena);
        self.copier.queue(
            (copy.layer, copy.slot),
            Box::new(move || {
                // SAFETY: nobody reads the slot until the ticket ends (the caller's contract);
                // the worker is its only writer until then (others clear it first, which waits
                // for this copy), and `arena` keeps the mapping alive.
                unsafe { arena.fill_unread(copy.layer, copy.slot, copy.expert) }
            }),
        )
    }

    /// The copy of tensor `tensor` of the expert in slot `slot` of MoE layer `layer`
    /// ([`SlotArena::copy`]).
    pub(crate) fn copy(&self, layer: usize, slot: usize, tensor: usize) -> Option<(&[u8], bool)> {
        self.arena.copy(layer, slot, tensor)
    }
}

#[cfg(test)]
impl HostSlots {
    /// Holds the copy worker until `gate` receives (or 30 s pass): a copy queued now that
    /// waits for it, so the copies queued after it stay queued until then.
    pub(crate) fn hold_worker(&self, gate: std::sync::mpsc::Receiver<()>) {
        hold(&self.copier, gate);
    }

    /// Holds the advice worker ([`HostSlots::read_ahead_host`]) as [`HostSlots::hold_worker`]
    /// does the copy worker.
    pub(crate) fn hold_advisor(&self, gate: std::sync::mpsc::Receiver<()>) {
        hold(&self.advisor, gate);
    }

    /// Advice asked for and not yet issued (the worker's queue).
    pub(crate) fn advice_queued(&self) -> usize {
        self.advisor.queued()
    }

    /// The mapping, not kept alive: for checking that it goes with the memory.
    pub(crate) fn arena_weak(&self) -> std::sync::Weak<SlotArena> {
        Arc::downgrade(&self.arena)
    }
}

/// Queues on `worker` a job that waits until `gate` receives (or 30 s pass).
#[cfg(test)]
fn hold(worker: &Copier, gate: std::sync::mpsc::Receiver<()>) {
    worker.queue(
        (usize::MAX, usize::MAX),
        Box::new(move || {
            let _ = gate.recv_timeout(std::time::Duration::from_secs(30));
            Ok(())
        }),
    );
}

impl SlotArena {
    fn new(
        weights: Arc<Weights>,
        moe: &[MoeLayer],
        slots: usize,
        layouts: &[Vec<Option<Arc<dyn CopyLayout>>>],
    ) -> Result<SlotArena, StoreError> {
        let mut layers = Vec::with_capacity(moe.len());
        let mut total = 0usize;
        for (i, l) in moe.iter().enumerate() {
            let mut parts = Vec::with_capacity(l.tensors.len());
            let mut offset = 0;
            for (j, t) in l.tensors.iter().enumerate() {
                parts.push(Part {
                    weight: t.weight,
                    expert_bytes: t.expert_bytes,
                    offset,
                    layout: layouts.get(i).and_then(|l| l.get(j)).cloned().flatten(),
                });
                offset += t.expert_bytes;
            }
            layers.push(SlotLayer {
                parts,
                slot_bytes: offset,
                base: total,
            });
            total = offset
                .checked_mul(slots)
                .and_then(|b| total.checked_add(b))
                .ok_or(StoreError::Alloc {
                    bytes: u64::MAX,
                    reason: "the fast store's size overflows".into(),
                })?;
        }
        let mut arena = if total > 0 {
            let map = anon_arena(total)?;
            if let Err(e) = map.lock() {
                tracing::warn!(
                    bytes = total,
                    "mlock of the fast expert store failed ({e}); its {total} bytes stay pageable \
                     (raise RLIMIT_MEMLOCK, e.g. `ulimit -l`, to lock them)"
                );
            }
            Some(map)
        } else {
            None
        };
        let base = arena
            .as_mut()
            .map_or(std::ptr::null_mut(), |a| a.as_mut_ptr());
        Ok(SlotArena {
            weights,
            layers,
            slots,
            arena,
            base,
        })
    }

    /// The bytes `start .. start + len` of the arena; `None` past its end.
    fn arena_bytes(&self, start: usize, len: usize) -> Option<&[u8]> {
        let end = start.checked_add(len)?;
        if self.base.is_null() || end > self.arena.as_ref()?.len() {
            return None;
        }
        // SAFETY: in bounds of the mapping `base` points into (checked above); no write to
        // these bytes runs while `&self` is borrowed except through `fill_unread`, whose
        // caller guarantees that nobody reads its slot meanwhile.
        Some(unsafe { std::slice::from_raw_parts(self.base.add(start), len) })
    }

    /// Starts reading expert `expert` of MoE layer `layer` from the file into the page cache
    /// (`madvise(MADV_WILLNEED)` over each of its tensors' slices, [`Weights::prefetch_pages`]),
    /// so that a kernel reading it from the host store later finds it there instead of faulting
    /// it in page by page. Nothing for an expert out of range.
    fn read_ahead_host(&self, layer: usize, expert: u32) {
        let Some(l) = self.layers.get(layer) else {
            return;
        };
        for p in &l.parts {
            let src = self
                .weights
                .view(p.weight)
                .and_then(|v| v.get(expert as usize * p.expert_bytes..))
                .and_then(|v| v.get(..p.expert_bytes));
            if let Some(src) = src {
                self.weights.prefetch_pages(src);
            }
        }
    }

    /// Writes expert `expert` of MoE layer `layer` into slot `slot`, as [`SlotMemory::fill`]
    /// does, through a shared reference: a read-ahead copy beside a running step.
    ///
    /// # Safety
    /// Nothing else reads or writes slot `slot` of layer `layer` until this returns: the expert
    /// store took the slot for this copy ([`crate::store::expert_store::ExpertStore::read_ahead`])
    /// and publishes it only afterwards, and every other writer cleared the slot of the copy
    /// worker's copies ([`Copier::clear`]) or is the worker itself.
    ///
    /// Errors: [`StoreError::Slot`] out of range, or when the layout refuses the bytes.
    pub(crate) unsafe fn fill_unread(
        &self,
        layer: usize,
        slot: usize,
        expert: u32,
    ) -> Result<(), StoreError> {
        let bad = |reason: String| StoreError::Slot {
            layer,
            slot,
            reason,
        };
        let l = crate::store::slot_layer(&self.layers, self.slots, layer, slot)?;
        let arena_len = self.arena.as_ref().map_or(0, |a| a.len());
        for p in &l.parts {
            let src = self
                .weights
                .view(p.weight)
                .and_then(|v| v.get(expert as usize * p.expert_bytes..))
                .and_then(|v| v.get(..p.expert_bytes))
                .ok_or_else(|| bad(format!("expert {expert} is outside its tensor")))?;
            let start = l.base + slot * l.slot_bytes + p.offset;
            if self.base.is_null() || start + p.expert_bytes > arena_len {
                return Err(bad("the fast store has no memory for this slot".into()));
            }
            // SAFETY: in bounds (checked above); the caller guarantees this slot's bytes are
            // neither read nor written by anyone else until we return.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(self.base.add(start), p.expert_bytes) };
            // The whole expert read from the disk at once, not page by page as the copy faults.
            self.weights.prefetch_pages(src);
            match &p.layout {
                Some(layout) => layout.write(src, dst).map_err(bad)?,
                None => dst.copy_from_slice(src),
            }
            self.weights.release_pages(src);
        }
        Ok(())
    }

    /// The copy of tensor `tensor` of the expert in slot `slot` of MoE layer `layer`, and
    /// whether it is in the backend's own layout (else the file's bytes).
    pub(crate) fn copy(&self, layer: usize, slot: usize, tensor: usize) -> Option<(&[u8], bool)> {
        let l = self.layers.get(layer)?;
        let p = l.parts.get(tensor)?;
        if slot >= self.slots {
            return None;
        }
        let start = l.base + slot * l.slot_bytes + p.offset;
        let bytes = self.arena_bytes(start, p.expert_bytes)?;
        Some((bytes, p.layout.is_some()))
    }
}

impl SlotMemory for HostSlots {
    fn slots(&self) -> usize {
        self.arena.slots
    }

    fn bytes(&self) -> u64 {
        self.arena.arena.as_ref().map_or(0, |a| a.len() as u64)
    }

    fn slot_bytes(&self) -> u64 {
        self.arena.layers.iter().map(|l| l.slot_bytes as u64).sum()
    }

    fn fill(&mut self, layer: usize, slot: usize, expert: u32) -> Result<(), StoreError> {
        self.copier.clear((layer, slot));
        // SAFETY: `&mut self`: no kernel reads a slot now (they borrow `&self`), and the slot
        // was just cleared of the worker's copies, which take no other slot's bytes.
        unsafe { self.arena.fill_unread(layer, slot, expert) }
    }

    fn read_back(&self, layer: usize, slot: usize, tensor: usize) -> Result<Vec<u8>, StoreError> {
        let bad = |reason: String| StoreError::Slot {
            layer,
            slot,
            reason,
        };
        let (bytes, own) = self
            .copy(layer, slot, tensor)
            .ok_or_else(|| bad(format!("no tensor {tensor} in this slot")))?;
        let mut out = bytes.to_vec();
        if own {
            let layout = self.arena.layers[layer].parts[tensor]
                .layout
                .as_ref()
                .ok_or_else(|| bad("no layout".into()))?;
            layout.read(bytes, &mut out).map_err(bad)?;
        }
        Ok(out)
    }

    fn settle_copies(&self, cancel: bool) {
        self.copier.settle(cancel);
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Where one dense weight's copy lies in [`DenseCopies`].
#[derive(Clone, Copy, Debug)]
struct DenseAt {
    start: usize,
    len: usize,
    /// In the backend's own layout; else the file's bytes.
    own: bool,
}

/// Copies of dense weights a host backend's kernels read instead of the file's views, in the
/// huge pages of one arena.
#[derive(Debug, Default)]
pub(crate) struct DenseCopies {
    arena: Option<MmapMut>,
    /// `[n_weights]`: where each copied weight is.
    at: Vec<Option<DenseAt>>,
}

/// Bytes of a plain dense copy between two releases of the file's pages.
const COPY_CHUNK: usize = 8 << 20;

impl DenseCopies {
    /// Copies each weight of `chosen`, in the layout given with it (`None`: the file's bytes).
    /// Each is copied in turn, a chunk at a time for the file's layout, and each copied chunk's
    /// mapped pages released ([`Weights::release_pages`]), so the copies replace the file's
    /// pages in the resident set instead of doubling them, even for a moment. A weight whose
    /// layout refuses it is left to the file. The copy is a step of `progress`, counted in
    /// bytes.
    ///
    /// Errors: [`StoreError::Alloc`].
    pub(crate) fn new(
        weights: &Weights,
        chosen: &[(WeightId, Option<Arc<dyn CopyLayout>>)],
        progress: &mut dyn Progress,
    ) -> Result<DenseCopies, StoreError> {
        let mut at: Vec<Option<DenseAt>> = vec![None; weights.len()];
        let mut total = 0usize;
        for (w, layout) in chosen {
            let Some(view) = weights.view(*w) else {
                continue;
            };
            at[*w] = Some(DenseAt {
                start: total,
                len: view.len(),
                own: layout.is_some(),
            });
            total += view.len().next_multiple_of(64);
        }
        if total == 0 {
            return Ok(DenseCopies { arena: None, at });
        }
        let mut map = anon_arena(total)?;
        let sizes = at.iter().flatten().map(|c| c.len as u64).sum();
        progress.step("copying dense weights", Count::Bytes(sizes));
        for (w, layout) in chosen {
            let (Some(src), Some(copy)) = (weights.view(*w), at[*w]) else {
                continue;
            };
            let dst = &mut map[copy.start..copy.start + copy.len];
            match layout {
                Some(layout) => {
                    let written = layout.write(src, dst);
                    progress.advance(src.len() as u64);
                    if written.is_err() {
                        at[*w] = None;
                        continue;
                    }
                    weights.release_pages(src);
                }
                None => {
                    for (d, c) in dst.chunks_mut(COPY_CHUNK).zip(src.chunks(COPY_CHUNK)) {
                        d.copy_from_slice(c);
                        weights.release_pages(c);
                        progress.advance(c.len() as u64);
                    }
                    // The pages that straddle two chunks, whole in neither.
                    weights.release_pages(src);
                }
            }
        }
        tracing::info!(
            weights = at.iter().flatten().count(),
            bytes = total,
            "dense weights copied"
        );
        Ok(DenseCopies {
            arena: Some(map),
            at,
        })
    }

    /// The copy of weight `w` and whether it is in the backend's own layout; `None` when it was
    /// not copied.
    pub(crate) fn get(&self, w: WeightId) -> Option<(&[u8], bool)> {
        let c = (*self.at.get(w)?)?;
        let bytes = self.arena.as_ref()?.get(c.start..c.start + c.len)?;
        Some((bytes, c.own))
    }

    /// Whether weight `w` was copied.
    pub(crate) fn holds(&self, w: WeightId) -> bool {
        matches!(self.at.get(w), Some(Some(_)))
    }

    /// Bytes of the copies.
    pub(crate) fn bytes(&self) -> u64 {
        self.at.iter().flatten().map(|c| c.len as u64).sum()
    }
}
