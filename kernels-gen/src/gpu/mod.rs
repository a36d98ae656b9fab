//! GPU kernels: a small kernel IR ([`ir`]), its CPU execution in the GPU's order ([`cpu_exec`]),
//! the one printer of the three dialects ([`emit`]: HIP, CUDA, and Vulkan GLSL with what it spells
//! differently in [`glsl`]), the kernel builders
//! ([`kernels`], [`steps`]) and [`generate`], which turns a [`Plan`] into one source file per
//! distinct kernel and dialect (ARCHITECTURE.md § kernels-gen).
//!
//! Algorithm note of [`generate`]: every plan step is mapped to its kernels ([`steps::for_step`],
//! at the dialects' warp width [`emit::WARP`]); each kernel is named `<kind>_<hash>`, the hash
//! (FNV-1a 64) taken over the kernel's IR with an empty name (the width enters only when it is
//! not 32, so the 32-lane kernels keep their names), so steps that differ only in layer (36
//! layers, one shape) share one kernel, and a change of shape, type, attribute or width gives a
//! new name. Kernels are kept in first-use order, then each is printed once per dialect (HIP,
//! CUDA, Vulkan GLSL); files are sorted by path. The same plan always gives the same bytes. Launches are plain kernel
//! launches with no host synchronisation inside a step.

pub mod cpu_exec;
pub mod emit;
mod error;
pub mod glsl;
pub mod ir;
pub mod kernels;
pub mod launch;
pub mod math;
pub mod quant;
pub mod steps;

#[cfg(test)]
mod tests;

use aubier_compiler::plan::Plan;
pub use emit::render;
use emit::{Cuda, Dialect, Hip};
pub use error::GenError;
use glsl::Glsl;
use ir::Kernel;

/// One generated source file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedFile {
    /// Path relative to the output directory (`hip/phase_1a2b3c4d.hip`, `cuda/….cu`).
    pub path: String,
    /// The file's text.
    pub contents: String,
}

/// FNV-1a 64 of `bytes` (a stable hash for names and headers; not for security).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The `Debug` text of `k`'s IR without its warp width (the text a name is hashed from).
fn ir_text(k: &Kernel) -> String {
    struct NoWarp<'a>(&'a Kernel);
    impl std::fmt::Debug for NoWarp<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let Kernel {
                name,
                note,
                params,
                vars,
                shared,
                locals,
                tables,
                grid,
                block,
                warp: _,
                body,
            } = self.0;
            f.debug_struct("Kernel")
                .field("name", name)
                .field("note", note)
                .field("params", params)
                .field("vars", vars)
                .field("shared", shared)
                .field("locals", locals)
                .field("tables", tables)
                .field("grid", grid)
                .field("block", block)
                .field("body", body)
                .finish()
        }
    }
    format!("{:?}", NoWarp(k))
}

/// Names `k` `<base>_<hash of its IR>` (8 hex digits); the width is hashed when it is not
/// [`emit::WARP`].
pub(crate) fn name_by_content(mut k: Kernel) -> Kernel {
    let base = std::mem::take(&mut k.name);
    let mut text = ir_text(&k);
    if k.warp != emit::WARP {
        text.push_str(&format!(" warp {}", k.warp));
    }
    let h = fnv1a(text.as_bytes());
    k.name = format!("{base}_{:08x}", h as u32);
    k
}

/// Every distinct kernel of `plan` built for warps of `warp` lanes, in first-use order, named by
/// content, with the steps that launch each (`(kernel, step indices)`).
///
/// Errors: [`GenError::Step`] / [`GenError::Kernel`] from the step mapping (a `warp` that is not
/// a power of two in 4..=64 is a [`GenError::Kernel`]).
pub fn plan_kernels(plan: &Plan, warp: u32) -> Result<Vec<(Kernel, Vec<usize>)>, GenError> {
    let mut out: Vec<(Kernel, Vec<usize>)> = Vec::new();
    for (i, _) in plan.steps.iter().enumerate() {
        for k in steps::for_step(plan, i, warp)? {
            let k = name_by_content(k);
            match out.iter_mut().find(|(o, _)| o.name == k.name) {
                Some((_, uses)) => {
                    if uses.last() != Some(&i) {
                        uses.push(i);
                    }
                }
                None => out.push((k, vec![i])),
            }
        }
    }
    Ok(out)
}

/// Generates the HIP, CUDA and Vulkan (GLSL) source of every distinct kernel of `plan`: files
/// `hip/<kernel>.hip`, `cuda/<kernel>.cu` and `vulkan/<kernel>.comp`, sorted by path. A file
/// depends on its kernel alone (its header names the generator, the kernel's algorithm note and
/// launch shape; which steps launch it is [`plan_kernels`]' answer, recorded in `aubier gen`'s
/// manifest), so an edit of the graph rewrites exactly the kernels it reaches. Deterministic: the same plan gives the same
/// bytes.
///
/// Errors: [`GenError`] when a step cannot be mapped or a weight type has no device function.
pub fn generate(plan: &Plan) -> Result<Vec<GeneratedFile>, GenError> {
    let header = ["Generated by `aubier gen` (aubier-kernels-gen); do not edit.".to_string()];
    let mut files = Vec::new();
    for (k, _) in plan_kernels(plan, emit::WARP)? {
        files.push(file(&Hip, &k, &header)?);
        files.push(file(&Cuda, &k, &header)?);
        files.push(file(&Glsl, &k, &header)?);
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// `<dialect>/<kernel>.<ext>`: kernel `k` in dialect `d`.
fn file<D: Dialect>(d: &D, k: &Kernel, header: &[String]) -> Result<GeneratedFile, GenError> {
    Ok(GeneratedFile {
        path: format!("{}/{}.{}", d.name(), k.name, d.ext()),
        contents: render(d, k, header)?,
    })
}
