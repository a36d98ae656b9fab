//! Helpers shared by the cross-crate tests: where the bundled fixtures live.

use std::path::PathBuf;

pub mod gguf_writer;

/// `tests/data/`, the copies of `shared/fixtures` the tests read (see `tests/data/README.md`).
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data")
}

/// `models/`, the bundled model the server serves by default.
pub fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("models")
}

/// Reads a raw little-endian f32 file (the fixtures' `.f32` arrays).
pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Reads a raw little-endian i32 file (the fixtures' `.i32` arrays).
pub fn read_i32(path: &std::path::Path) -> Vec<i32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Reads a JSON fixture.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// A list of ids from a JSON fixture field. Some headers store lists as their Python `str()`, so both
/// a JSON array and a string holding one are accepted.
pub fn json_ids(v: &serde_json::Value, field: &str) -> Vec<u32> {
    let f = &v[field];
    let arr = match f {
        serde_json::Value::String(s) => serde_json::from_str::<serde_json::Value>(s)
            .unwrap_or_else(|e| panic!("field {field} is not a list: {e}")),
        other => other.clone(),
    };
    arr.as_array()
        .unwrap_or_else(|| panic!("field {field} is not a list"))
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Path of a fixture model GGUF (the q2k one is the bundled model in `models/`).
pub fn model_path(file: &str) -> PathBuf {
    let bundled = models_dir().join(file);
    if bundled.exists() {
        bundled
    } else {
        data_dir().join("models").join(file)
    }
}
