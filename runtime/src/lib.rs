//! `aubier-runtime`: GGUF files and quant blocks ([`gguf`]), the model read from them
//! ([`model`], [`weights`]), the backends that run a compiled plan ([`backend`]: the seam, its
//! registry, the built-in oracle, cpu and vulkan), expert placement ([`placement`]) and the split
//! expert store ([`store`]), the engine ([`engine`], its load's [`progress`]) and [`session`]
//! with its decode loop ([`generate`]), sampling, text ([`text`]: the tokenizer, the chat
//! template, the reasoning split, the grammar). It knows nothing of HTTP (ARCHITECTURE.md §
//! runtime).

pub mod backend;
pub mod engine;
pub mod error;
pub mod generate;
pub mod isa;
/// The ggml type table lives in `aubier-compiler` (the plan's weights are typed by it).
pub use aubier_compiler::ggml_type;
pub mod gguf;
pub mod kv_cache;
pub mod model;
pub mod placement;
pub mod pool;
pub mod progress;
pub mod sampler;
pub mod session;
pub mod store;
pub mod text;
pub mod weights;
