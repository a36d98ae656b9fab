//! The `oracle` backend: every step of an unfused plan by its cranelift kernels
//! (`aubier_kernels_gen::cpu`), f32 activations and dequantized weights in a fixed reduction
//! order — the numerics reference the other backends are measured against
//! (ARCHITECTURE.md § numerics policy).
//!
//! Binding takes every step whose op has an oracle lowering and refuses a fused step by name:
//! the oracle never takes a fused path. Loading runs on the host executor, with the slots in
//! the file's layout. Its kernels are public: [`aubier_kernels_gen::cpu::CpuProgram`] over the
//! quant kernels of [`crate::gguf::quant::host_symbols`].

use super::host::{self, HostBinding, HostKernel, HostLayout, NoKernel};
use super::{
    Backend, BackendError, BindError, Binding, BoundStep, KernelChoice, LoadInput, Loaded,
};
use crate::progress::Progress;
use aubier_compiler::plan::{Operand, Plan};
use aubier_compiler::Target;

/// The cranelift oracle.
#[derive(Clone, Copy, Debug, Default)]
pub struct OracleBackend;

impl Backend for OracleBackend {
    fn name(&self) -> String {
        "oracle".into()
    }

    fn target(&self) -> Target {
        Target::Oracle
    }

    fn bind(&self, plan: &Plan) -> Result<Binding, BindError> {
        let steps = plan
            .steps
            .iter()
            .enumerate()
            .map(|(i, step)| {
                if step.op.is_fused() || !step.op.has_oracle() {
                    return Err(BindError {
                        backend: self.name(),
                        step: i,
                        op: step.op.name(),
                        reason: "a fused op; the oracle lowers only unfused plans (compile for \
                                 the oracle's target, fusions off)"
                            .into(),
                    });
                }
                Ok(cranelift_step(plan, i))
            })
            .collect::<Result<_, _>>()?;
        let kernels = HostBinding::<NoKernel> {
            kernels: vec![HostKernel::Cranelift; plan.steps.len()],
        };
        Ok(Binding::new(self.name(), steps, kernels))
    }

    fn load(
        &self,
        input: &LoadInput<'_>,
        progress: &mut dyn Progress,
    ) -> Result<Loaded, BackendError> {
        host::load::<NoKernel>(&self.name(), input, HostLayout::default(), progress)
    }
}

/// Step `i` bound to its cranelift kernels: f32 activations, and the ggml type of its first
/// weight operand when it has one (dequantized, dotted in the oracle's order). Cranelift code
/// computes each token's row the same whatever the run's length.
pub(crate) fn cranelift_step(plan: &Plan, i: usize) -> BoundStep {
    let weight = plan.steps[i].args.iter().find_map(|a| match a {
        Operand::Weight(w) => plan.weights.get(*w),
        Operand::Value(_) => None,
    });
    BoundStep {
        choice: KernelChoice {
            kernel: "cranelift",
            variant: match weight {
                Some(w) => format!("f32, {} weight", w.ggml_type),
                None => "f32".into(),
            },
        },
        one_token_matches_prefill: true,
    }
}
