//! `aubier-kernels-gen`: turns plan steps into code and nothing else (ARCHITECTURE.md § kernels-gen).
//!
//! [`cpu`] is the cranelift lowering of the unfused plan: the CPU oracle the runtime executes and
//! every other backend is judged against.
//!
//! [`gpu`] holds the GPU emitters (dialect-neutral C++ device code); [`quant_grids`] holds the
//! i-quant lookup tables that the emitters and the runtime's CPU decoders share; [`ggml_type`] is
//! the compiler's ggml type table, re-exported for them.

pub mod cpu;
pub use aubier_compiler::ggml_type;
pub mod gpu;
pub mod quant_grids;
