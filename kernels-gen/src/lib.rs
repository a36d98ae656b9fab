//! `aubier-kernels-gen`: turns plan steps into code and nothing else (ARCHITECTURE.md § kernels-gen).
//!
//! [`cpu`] is the cranelift lowering of the unfused plan: the CPU oracle the runtime executes and
//! every other backend is judged against.

pub mod cpu;
