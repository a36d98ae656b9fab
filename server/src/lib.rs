//! `aubier-server`: the `aubier` command line and the axum OpenAI server (ARCHITECTURE.md § server).
//! It holds no numerics.

pub mod cli;
pub mod gen;
pub mod inspect;
pub mod replay;
pub mod run;
pub mod serve;
pub mod trace;
