//! `aubier-server`: the `aubier` command line and the axum OpenAI server (ARCHITECTURE.md § server).
//! It holds no numerics.

pub mod cli;
pub mod inspect;
pub mod serve;
pub mod replay;
pub mod run;
pub mod gen;
