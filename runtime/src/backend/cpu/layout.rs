//! The cpu backend's copies of weights (its share of the store apart from layout): which expert
//! tensors its slots hold in the interleaved layout of its decode kernels, and which dense
//! weights it copies into huge pages.
//!
//! - Experts: a Q2_K / Q3_K expert tensor whose experts are whole groups of
//!   [`INTERLEAVE_ROWS`] rows, where the CPU has interleaved decode kernels
//!   ([`q8_interleaved_fn`]), is held in its slots interleaved ([`interleave_rows`]): decode then
//!   streams each group of rows in address order with no transpose. The cranelift kernels read
//!   such experts from the file.
//! - Dense weights: every weight that is not an expert tensor, is read only as the weight of
//!   `mat_mul` steps and is a matrix is copied, interleaved where its type has such kernels (as
//!   one block of rows), else as the file's bytes where its type has a Q8_K decode kernel (the
//!   output head: 440 MiB of Q6_K on the real model, read in full by every decoded token; from
//!   its 4 KiB file pages two threads read 28.4–29.3 GB/s on Zen 4, from 2 MiB pages
//!   27.6–31.2).

use super::q8::{
    deinterleave_rows, interleave_rows, q8_interleaved_fn, q8_rows_fn, INTERLEAVE_ROWS,
};
use crate::backend::host::{CopyLayout, HostLayout};
use crate::ggml_type::GgmlType;
use aubier_compiler::ops::Op;
use aubier_compiler::plan::{MoeLayer, Operand, Plan};
use aubier_compiler::types::WeightRef;
use std::sync::Arc;

/// The interleaved layout of [`interleave_rows`] for rows of `row_bytes` of type `ty`.
#[derive(Clone, Copy, Debug)]
struct Interleaved {
    ty: GgmlType,
    row_bytes: usize,
}

impl CopyLayout for Interleaved {
    fn write(&self, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
        interleave_rows(self.ty, src, dst, self.row_bytes).map_err(|e| e.to_string())
    }

    fn read(&self, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
        deinterleave_rows(self.ty, src, dst, self.row_bytes).map_err(|e| e.to_string())
    }
}

/// The layout of the cpu backend's copies for `plan` (its MoE layers `moe`, the module note).
pub(crate) fn host_layout(plan: &Plan, moe: &[MoeLayer]) -> HostLayout {
    let experts = moe
        .iter()
        .map(|l| {
            l.tensors
                .iter()
                .map(|t| interleaved(&plan.weights[t.weight], t.expert_bytes))
                .collect()
        })
        .collect();
    let n = plan.weights.len();
    let expert = |w: usize| moe.iter().flat_map(|l| &l.tensors).any(|t| t.weight == w);
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
    let mut dense = Vec::new();
    for (w, r) in plan.weights.iter().enumerate() {
        if expert(w) || !mat_mul[w] || !only_mat_mul[w] || r.ne.len() != 2 {
            continue;
        }
        let Some(ty) = GgmlType::from_name(&r.ggml_type) else {
            continue;
        };
        let bytes =
            r.ne.first()
                .and_then(|&n0| ty.row_size(n0))
                .and_then(|row| row.checked_mul(r.ne[1]));
        let layout = bytes.and_then(|b| interleaved(r, b));
        if layout.is_some() || q8_rows_fn(ty).is_some() {
            dense.push((w, layout));
        }
    }
    HostLayout { experts, dense }
}

/// The interleaved layout of the weight `w` when it has an interleaved decode kernel on this CPU
/// and `block_bytes` (an expert's, or the whole matrix's) are whole groups of its rows.
fn interleaved(w: &WeightRef, block_bytes: usize) -> Option<Arc<dyn CopyLayout>> {
    let ty = GgmlType::from_name(&w.ggml_type)?;
    q8_interleaved_fn(ty)?;
    let row_bytes = ty.row_size(*w.ne.first()?)?;
    let group = INTERLEAVE_ROWS.checked_mul(row_bytes)?;
    (group > 0 && block_bytes.is_multiple_of(group))
        .then(|| Arc::new(Interleaved { ty, row_bytes }) as Arc<dyn CopyLayout>)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::host::memory::DenseCopies;
    use crate::gguf::GgufFile;
    use crate::weights::Weights;
    use aubier_compiler::{compile, CompileOptions, Target};

    /// The bundled model's output head (Q6_K: no interleaved kernel) is copied as the file's
    /// bytes, verbatim; its quantized expert tensors are held interleaved where this CPU has the
    /// kernels. (That the copies keep the logits' bits: `tests/cpu_backend.rs`.)
    #[test]
    fn the_output_head_is_copied_verbatim() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/ms4-tiny256-q2k.gguf");
        let file = std::sync::Arc::new(GgufFile::open(&path).expect("bundled model"));
        let cfg = crate::model::read_config(&file).expect("config");
        let refs = crate::model::weight_refs(&file, &cfg).expect("weights");
        let opts = CompileOptions {
            target: Target::Cpu,
            ..CompileOptions::default()
        };
        let plan = compile(&cfg, &refs, &opts).expect("plan");
        let moe = plan.moe_layers().expect("moe layers");
        let layout = host_layout(&plan, &moe);
        let head = plan
            .weights
            .iter()
            .position(|w| w.name == "output.weight")
            .expect("an output head");
        let chosen = layout.dense.iter().find(|(w, _)| *w == head);
        assert!(
            matches!(chosen, Some((_, None))),
            "the head copied in the file's layout"
        );
        let weights = Weights::bind(std::sync::Arc::clone(&file), &plan).expect("bind");
        let copies =
            DenseCopies::new(&weights, &layout.dense, &mut crate::progress::Quiet).expect("copies");
        let (bytes, own) = copies.get(head).expect("the head is copied");
        assert!(!own);
        assert_eq!(bytes, weights.view(head).expect("view"));
        let interleaved = layout
            .experts
            .iter()
            .flatten()
            .filter(|l| l.is_some())
            .count();
        assert_eq!(
            interleaved > 0,
            q8_interleaved_fn(GgmlType::Q2_K).is_some(),
            "Q2_K experts interleaved exactly where the CPU has the kernels"
        );
    }
}
