//! `aubier-kernels-gen`: turns plan steps into code and nothing else (ARCHITECTURE.md § kernels-gen).
//!
//! [`cpu`] is the cranelift lowering of the unfused plan: the CPU oracle the runtime executes and
//! every other backend is judged against.
//!
//! [`gpu`] holds the GPU emitters (dialect-neutral C++ device code); [`ggml_type`] and
//! [`quant_grids`] are the ggml block-layout table and the i-quant lookup tables that the
//! emitters and the runtime's CPU decoders share.

pub mod cpu;
pub mod ggml_type;
pub mod gpu;
pub mod quant_grids;
