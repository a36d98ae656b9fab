//! Helpers shared by the cross-crate tests: where the bundled fixtures live.

use std::path::PathBuf;

/// `tests/data/`, the copies of `shared/fixtures` the tests read (see `tests/data/README.md`).
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data")
}

/// `models/`, the bundled model the server serves by default.
pub fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("models")
}
