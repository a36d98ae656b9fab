//! The `vulkan` backend's host store: the stacked expert tensors of the mapped GGUF file, made
//! readable by the device in place (ARCHITECTURE.md § split expert store), so that the memory a
//! small device needs is the resident set and nothing else.
//!
//! Algorithm. Each stacked tensor's bytes are imported as host memory
//! (`VK_EXT_external_memory_host`, [`VulkanContext::import_host`]) in chunks of whole experts:
//! a chunk starts at its first expert's address rounded down to `minImportedHostPointerAlignment`
//! and ends at its last expert's end rounded up, and holds as many experts as keep it within the
//! largest buffer the backend makes; an expert's device address is its chunk's plus its offset
//! in it. Drivers differ on importing a *file* mapping ([`HostMode::Import`]); where the import is
//! refused the store says so once and falls back to an anonymous host allocation holding the
//! stacked tensors, filled from the file by `pread` (one host copy, its bytes reported) and
//! imported the same way ([`HostMode::Copy`]). Where that import is refused too (or the device
//! has no `VK_EXT_external_memory_host`), the store is the file alone ([`HostMode::Stage`]): no
//! expert is readable in place, and the run uploads each step's missed experts through a host
//! staging buffer into device memory before the layer's `moe_ffn` reads them
//! (`backend/vulkan/model.rs`). `--host-store import|copy|stage` forces one of them.

use super::context::{Buffer, VulkanContext};
use super::error::VulkanError;
use crate::progress::{Count, Progress};
use crate::weights::Weights;
use aubier_compiler::plan::MoeLayer;
use memmap2::MmapMut;
use std::sync::Arc;

/// How the host store reaches the device (`--host-store`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostMode {
    /// The file's mapping imported, else [`HostMode::Copy`], else [`HostMode::Stage`].
    Auto,
    /// The file's mapping imported: zero copy.
    Import,
    /// An anonymous host allocation filled from the file, imported: one host copy.
    Copy,
    /// Nothing imported: each step uploads the experts it routes that are not resident, from
    /// the file through a host staging buffer (bytes moved per step, no host copy).
    Stage,
}

impl std::str::FromStr for HostMode {
    type Err = String;

    /// `auto`, `import`, `copy` or `stage`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(HostMode::Auto),
            "import" => Ok(HostMode::Import),
            "copy" => Ok(HostMode::Copy),
            "stage" => Ok(HostMode::Stage),
            _ => Err(format!(
                "unknown host store `{s}` (expected auto, import, copy or stage)"
            )),
        }
    }
}

/// One stacked tensor to place: its weight, its bytes (`n` experts of `expert_bytes`).
#[derive(Clone, Copy, Debug)]
struct Region<'a> {
    weight: usize,
    bytes: &'a [u8],
    expert_bytes: usize,
}

/// Per plan weight, each expert's chunk and byte offset in it (`None`: not a stacked tensor).
type Places = Vec<Option<Vec<(usize, u64)>>>;

/// The stacked expert tensors, readable by the device (in place, or by staging uploads).
pub(crate) struct HostStore {
    /// Imported chunks (none in [`HostMode::Stage`]).
    chunks: Vec<Buffer>,
    /// Where each expert is in `chunks`.
    places: Places,
    /// The anonymous copy of [`HostMode::Copy`], imported by `chunks` (dropped after them).
    copy: Option<MmapMut>,
    /// The mode it runs in ([`HostMode::Import`], [`HostMode::Copy`] or [`HostMode::Stage`]).
    mode: HostMode,
    /// The file's weights, the source of a staging upload.
    weights: Arc<Weights>,
    /// Per plan weight, the bytes of one expert (`None`: not a stacked tensor).
    expert_bytes: Vec<Option<usize>>,
}

impl std::fmt::Debug for HostStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStore")
            .field("mode", &self.mode)
            .field("chunks", &self.chunks.len())
            .field("copied_bytes", &self.copied_bytes())
            .finish()
    }
}

impl HostStore {
    /// Places every stacked tensor of `moe` in host memory the device reads, in `mode`, no
    /// chunk over `max_bytes`.
    ///
    /// Errors, in a forced [`HostMode::Import`] or [`HostMode::Copy`]:
    /// [`VulkanError::Unsupported`] without `VK_EXT_external_memory_host`, or when one expert
    /// (with the alignment's padding) is over `max_bytes`; the import's error when it is
    /// refused; those of the anonymous allocation and the file's reads. [`HostMode::Auto`]
    /// falls back to [`HostMode::Stage`] instead, saying why once; [`VulkanError::Invalid`] for
    /// a stacked tensor that is not a weight of `weights`.
    pub(crate) fn new(
        ctx: &VulkanContext,
        weights: &Arc<Weights>,
        moe: &[MoeLayer],
        max_bytes: u64,
        mode: HostMode,
        progress: &mut dyn Progress,
    ) -> Result<HostStore, VulkanError> {
        let mut expert_bytes = vec![None; weights.len()];
        for t in moe.iter().flat_map(|l| &l.tensors) {
            *expert_bytes.get_mut(t.weight).ok_or_else(|| {
                VulkanError::Invalid(format!("no weight {} for the experts", t.weight))
            })? = Some(t.expert_bytes);
        }
        let staged = HostStore {
            chunks: Vec::new(),
            places: vec![None; weights.len()],
            copy: None,
            mode: HostMode::Stage,
            weights: Arc::clone(weights),
            expert_bytes,
        };
        match mode {
            HostMode::Stage => Ok(staged),
            HostMode::Import | HostMode::Copy => {
                staged.imported(ctx, moe, max_bytes, mode, progress)
            }
            HostMode::Auto => match staged.imported(ctx, moe, max_bytes, mode, progress) {
                Ok(store) => Ok(store),
                Err(e) => {
                    tracing::warn!(
                        "the experts cannot be read from host memory in place ({e}); each step \
                         uploads the non-resident experts it routes through a staging buffer"
                    );
                    HostStore::new(ctx, weights, moe, max_bytes, HostMode::Stage, progress)
                }
            },
        }
    }

    /// This (staged) store's experts imported: the file's mapping, else (unless `mode` is
    /// [`HostMode::Import`]) an anonymous host copy of them, a step of `progress` counted in
    /// bytes.
    ///
    /// Errors: as [`HostStore::new`] in a forced mode.
    fn imported(
        self,
        ctx: &VulkanContext,
        moe: &[MoeLayer],
        max_bytes: u64,
        mode: HostMode,
        progress: &mut dyn Progress,
    ) -> Result<HostStore, VulkanError> {
        let weights = Arc::clone(&self.weights);
        let mut regions = Vec::new();
        for t in moe.iter().flat_map(|l| &l.tensors) {
            let bytes = weights
                .view(t.weight)
                .ok_or_else(|| VulkanError::Invalid(format!("no weight {}", t.weight)))?;
            regions.push(Region {
                weight: t.weight,
                bytes,
                expert_bytes: t.expert_bytes,
            });
        }
        if mode != HostMode::Copy {
            let file = weights.file().bytes();
            // The map's last page is mapped whole: an import may end there.
            let mapped = file.len().next_multiple_of(page_size());
            match import(
                ctx,
                &regions,
                weights.len(),
                max_bytes,
                file.as_ptr(),
                mapped,
            ) {
                Ok((chunks, places)) => {
                    return Ok(HostStore {
                        chunks,
                        places,
                        mode: HostMode::Import,
                        ..self
                    })
                }
                Err(e) if mode == HostMode::Import => return Err(e),
                Err(e) => tracing::warn!(
                    "the device refused to import the model file's mapping ({e}); the experts \
                     go to an anonymous host copy of them, imported instead"
                ),
            }
        }
        let align = ctx
            .info()
            .limits
            .min_imported_host_pointer_alignment
            .unwrap_or(1) as usize;
        let total: usize = regions
            .iter()
            .map(|r| r.bytes.len().next_multiple_of(align))
            .sum();
        let mut copy = MmapMut::map_anon(total.max(align))
            .map_err(|e| VulkanError::Invalid(format!("allocating the host copy: {e}")))?;
        let mut at = 0;
        let mut moved = Vec::with_capacity(regions.len());
        progress.step(
            "copying the experts into host memory",
            Count::Bytes(regions.iter().map(|r| r.bytes.len() as u64).sum()),
        );
        for r in &regions {
            let dst = &mut copy[at..at + r.bytes.len()];
            weights
                .read(r.bytes, 0, dst)
                .map_err(|e| VulkanError::Invalid(format!("reading the experts: {e}")))?;
            progress.advance(r.bytes.len() as u64);
            moved.push((at, r.bytes.len()));
            at += r.bytes.len().next_multiple_of(align);
        }
        let base = copy.as_ptr();
        let copied: Vec<Region<'_>> = regions
            .iter()
            .zip(&moved)
            .map(|(r, &(at, len))| Region {
                // SAFETY: `at .. at + len` lies inside the copy (sized above), which outlives
                // the regions' use here.
                bytes: unsafe { std::slice::from_raw_parts(base.add(at), len) },
                ..*r
            })
            .collect();
        let (chunks, places) = import(ctx, &copied, weights.len(), max_bytes, base, copy.len())?;
        tracing::info!(bytes = total, "the experts' host copy imported");
        Ok(HostStore {
            chunks,
            places,
            copy: Some(copy),
            mode: HostMode::Copy,
            ..self
        })
    }

    /// The file's bytes of expert `e` of the stacked weight `w` (a staging upload's source).
    pub(crate) fn bytes(&self, w: usize, e: usize) -> Option<&[u8]> {
        let n = (*self.expert_bytes.get(w)?)?;
        self.weights.view(w)?.get(e * n..(e + 1) * n)
    }

    /// The device address of expert `e` of the stacked weight `w`.
    pub(crate) fn address(&self, w: usize, e: usize) -> Option<u64> {
        let (chunk, at) = *self.places.get(w)?.as_ref()?.get(e)?;
        Some(self.chunks[chunk].address() + at)
    }

    /// The buffer and byte offset of expert `e` of the stacked weight `w` (a copy's source).
    pub(crate) fn source(&self, w: usize, e: usize) -> Option<(&Buffer, u64)> {
        let (chunk, at) = *self.places.get(w)?.as_ref()?.get(e)?;
        Some((&self.chunks[chunk], at))
    }

    /// The mode it runs in.
    pub(crate) fn mode(&self) -> HostMode {
        self.mode
    }

    /// Bytes of host memory imported (chunks overlap by at most an alignment at their ends).
    pub(crate) fn imported_bytes(&self) -> u64 {
        self.chunks.iter().map(Buffer::size).sum()
    }

    /// Bytes of the host copy ([`HostMode::Copy`]), 0 when the file itself is imported.
    pub(crate) fn copied_bytes(&self) -> u64 {
        self.copy.as_ref().map_or(0, |c| c.len() as u64)
    }
}

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// Imports `regions`, all inside the mapped memory `base .. base + mapped`, in chunks of whole
/// experts of at most `max_bytes`; returns the chunks and, per weight (of `n_weights`), each
/// expert's chunk and offset.
///
/// Errors: [`VulkanError::Unsupported`] when one expert with its padding is over `max_bytes`;
/// those of the import.
fn import(
    ctx: &VulkanContext,
    regions: &[Region<'_>],
    n_weights: usize,
    max_bytes: u64,
    base: *const u8,
    mapped: usize,
) -> Result<(Vec<Buffer>, Places), VulkanError> {
    let align = ctx
        .info()
        .limits
        .min_imported_host_pointer_alignment
        .ok_or_else(|| VulkanError::Unsupported {
            device: ctx.info().index,
            name: ctx.info().name.clone(),
            what: "no VK_EXT_external_memory_host: the experts cannot be read from host memory"
                .into(),
        })? as usize;
    let (lo, hi) = (base as usize, base as usize + mapped);
    let mut chunks = Vec::new();
    let mut places = vec![None; n_weights];
    for r in regions {
        let n = r.bytes.len() / r.expert_bytes.max(1);
        let start_of = |e: usize| r.bytes.as_ptr() as usize + e * r.expert_bytes;
        let mut at = Vec::with_capacity(n);
        let mut e0 = 0;
        while e0 < n {
            let s = start_of(e0) / align * align;
            let mut e1 = e0;
            while e1 < n && ((start_of(e1 + 1).next_multiple_of(align) - s) as u64) <= max_bytes {
                e1 += 1;
            }
            if e1 == e0 {
                return Err(VulkanError::Unsupported {
                    device: ctx.info().index,
                    name: ctx.info().name.clone(),
                    what: format!(
                        "one expert of weight {} ({} bytes with its alignment) is over the \
                         {max_bytes} bytes one buffer may hold",
                        r.weight, r.expert_bytes
                    ),
                });
            }
            let end = start_of(e1).next_multiple_of(align);
            if s < lo || end > hi {
                return Err(VulkanError::Invalid(format!(
                    "weight {}: bytes {s:#x}..{end:#x} are not inside the mapped memory",
                    r.weight
                )));
            }
            // SAFETY: `s .. end` lies inside the mapped memory (checked just above), which the
            // store keeps mapped for the chunk's life (the model's file, or the copy it owns and
            // drops after its chunks).
            let chunk = unsafe { ctx.import_host(s as *const u8, (end - s) as u64)? };
            for e in e0..e1 {
                at.push((chunks.len(), (start_of(e) - s) as u64));
            }
            chunks.push(chunk);
            e0 = e1;
        }
        places[r.weight] = Some(at);
    }
    Ok((chunks, places))
}
