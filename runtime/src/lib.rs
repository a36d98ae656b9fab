//! `aubier-runtime`: GGUF files, quant blocks, model binding, the executor and `Session`, sampling,
//! the tokenizer and the chat template. It knows nothing of HTTP (ARCHITECTURE.md § runtime).

pub mod ggml_type;
pub mod gguf;
pub mod quant;
