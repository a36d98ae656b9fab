//! `aubier-runtime`: GGUF files and quant blocks ([`gguf`]), model binding, the backends
//! ([`backend`]: oracle, cpu) and their executor, expert placement ([`placement`]) and the split
//! expert store ([`store`]), `Session`, sampling, text ([`text`]: the tokenizer, the chat
//! template, the reasoning split). It knows nothing of HTTP (ARCHITECTURE.md § runtime).

pub mod backend;
pub mod engine;
pub mod error;
pub mod executor;
pub mod generate;
pub mod isa;
/// The ggml type table lives in `aubier-kernels-gen` (its GPU emitters need it too).
pub use aubier_kernels_gen::ggml_type;
pub mod gguf;
pub mod kv_cache;
pub mod model;
pub mod placement;
pub mod pool;
pub mod sampler;
pub mod session;
pub mod store;
pub mod text;
