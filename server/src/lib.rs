//! `aubier-server`: the `aubier` command line and the axum OpenAI server (ARCHITECTURE.md § server).
//! It holds no numerics.

pub mod cli;
