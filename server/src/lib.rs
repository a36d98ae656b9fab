//! `aubier-server`: the `aubier` command line and the axum OpenAI server (ARCHITECTURE.md § server).
//! It holds no numerics.

/// `println!` / `print!` for the one-shot commands' reports: a failed write to stdout (a full
/// disk, `> /dev/full`) returns an error from the calling function (which returns
/// `anyhow::Result`) instead of panicking as `println!` does.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        anyhow::Context::context(
            writeln!(std::io::stdout().lock(), $($arg)*),
            "writing to stdout",
        )?
    }};
}

/// [`outln!`] without the newline.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        anyhow::Context::context(
            write!(std::io::stdout().lock(), $($arg)*),
            "writing to stdout",
        )?
    }};
}

pub mod bench;
pub mod cli;
pub mod devices;
pub mod error_text;
pub mod gen;
pub mod inspect;
pub mod model_file;
pub mod progress;
pub mod quality;
pub mod receipt;
pub mod replay;
pub mod run;
pub mod serve;
pub mod synth;
pub mod trace;
