//! `aubier-compiler`: the IR of the model (a petgraph `StableDiGraph`), the op table, the pass
//! pipeline and the [`plan::Plan`] every backend executes. It knows nothing of files, devices or
//! HTTP (ARCHITECTURE.md § compiler).

extern crate self as aubier_compiler;

pub mod config;
pub mod ops;
pub mod plan;
pub mod types;
