//! `aubier-server`: the `aubier` command line and the axum OpenAI server (ARCHITECTURE.md § server).
//! It holds no numerics.

pub mod bench;
pub mod cli;
pub mod gen;
pub mod inspect;
pub mod quality;
pub mod replay;
pub mod run;
pub mod serve;
pub mod synth;
pub mod trace;
