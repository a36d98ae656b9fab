//! The `aubier` binary: see `aubier --help`.

fn main() -> std::process::ExitCode {
    aubier_server::cli::main()
}
