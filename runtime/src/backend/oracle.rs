//! The `oracle` backend: every step of an unfused plan by its cranelift kernels
//! (`aubier_kernels_gen::cpu`), f32 activations and dequantized weights in a fixed reduction
//! order — the numerics reference the other backends are measured against
//! (ARCHITECTURE.md § numerics policy).
//!
//! Binding takes every step whose op has an oracle lowering and refuses a fused step by name:
//! the oracle never takes a fused path.

use super::{Backend, BackendKind, BindError, Binding, BoundStep, HostKernel, KernelChoice};
use aubier_compiler::plan::{Operand, Plan};
use aubier_compiler::Target;

/// The cranelift oracle.
#[derive(Clone, Copy, Debug, Default)]
pub struct OracleBackend;

impl Backend for OracleBackend {
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
                        backend: "oracle",
                        step: i,
                        op: step.op.name(),
                        reason: "a fused op; the oracle lowers only unfused plans (compile for \
                                 the oracle's target, fusions off)"
                            .into(),
                    });
                }
                Ok(BoundStep {
                    choice: cranelift_choice(plan, i),
                    kernel: HostKernel::Cranelift,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Binding {
            backend: BackendKind::Oracle,
            steps,
        })
    }
}

/// The record of step `i` run by its cranelift kernels: f32 activations, and the ggml type of
/// its first weight operand when it has one (dequantized, dotted in the oracle's order).
pub(crate) fn cranelift_choice(plan: &Plan, i: usize) -> KernelChoice {
    let weight = plan.steps[i].args.iter().find_map(|a| match a {
        Operand::Weight(w) => plan.weights.get(*w),
        Operand::Value(_) => None,
    });
    KernelChoice {
        kernel: "cranelift",
        variant: match weight {
            Some(w) => format!("f32, {} weight", w.ggml_type),
            None => "f32".into(),
        },
    }
}
