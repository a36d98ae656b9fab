//! Model descriptions written in the `model!` DSL (ARCHITECTURE.md § dsl). One file per model
//! family; each expands into a `build_graph` function over the family's config and a GGUF weight
//! map.

pub mod mistral4;
