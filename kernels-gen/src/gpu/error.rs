//! The errors of kernel generation ([`GenError`]).

use super::ir::IrError;

/// Errors of [`super::generate`] and the emitters.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GenError {
    /// A step cannot be mapped to a kernel (its operands do not fit its op).
    #[error("step {step} (`{op}`): {detail}")]
    Step {
        /// Step index in the plan.
        step: usize,
        /// The op's name.
        op: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A kernel builder refused its shape.
    #[error(transparent)]
    Kernel(#[from] IrError),
    /// A kernel built for a warp width the dialect does not have.
    #[error(
        "kernel `{kernel}` is built for {warp}-lane warps; HIP and CUDA kernels have {}",
        super::ir::WARP
    )]
    Warp {
        /// Kernel name.
        kernel: String,
        /// The kernel's width.
        warp: u32,
    },
    /// A weight type without a dequant device function.
    #[error("kernel `{kernel}` reads ggml type {ggml_type}, which has no device function")]
    UnsupportedType {
        /// Kernel name.
        kernel: String,
        /// gguf-py type name.
        ggml_type: String,
    },
}
