//! The model file of every command that takes one (`serve`, `run`, `trace`, `bench`, `quality`,
//! `gen`): `--model FILE` if given, else `$AUBIER_MODEL`, else the bundled demo model
//! `models/ms4-tiny256-q2k.gguf` of the workspace the binary was built in (found from the
//! executable's path, then from this crate's build-time location), else `./models/`.

use std::path::{Path, PathBuf};

/// File name of the bundled demo model (random weights, real architecture and tokenizer).
pub const BUNDLED_MODEL: &str = "ms4-tiny256-q2k.gguf";

/// Why no model file was found.
#[derive(Debug, thiserror::Error)]
pub enum ModelFileError {
    /// No model file was given and the bundled one was not found.
    #[error("no --model given and the bundled model {BUNDLED_MODEL} was not found; looked in: {}", .0.join(", "))]
    NoModel(Vec<String>),
    /// `$AUBIER_MODEL` names a missing file.
    #[error("$AUBIER_MODEL is {0}, which does not exist")]
    EnvModel(String),
}

/// The model file: `explicit` if given, else `$AUBIER_MODEL`, else the bundled one (module note).
///
/// Errors: [`ModelFileError::EnvModel`] when `$AUBIER_MODEL` names a missing file,
/// [`ModelFileError::NoModel`] listing every place looked in.
pub fn resolve_model(explicit: Option<&Path>) -> Result<PathBuf, ModelFileError> {
    if let Some(p) = explicit {
        return Ok(p.to_owned());
    }
    if let Some(env) = std::env::var_os("AUBIER_MODEL") {
        let p = PathBuf::from(&env);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(ModelFileError::EnvModel(p.display().to_string()))
        };
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        candidates.extend(
            exe.ancestors()
                .skip(1)
                .map(|d| d.join("models").join(BUNDLED_MODEL)),
        );
    }
    candidates.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("models")
            .join(BUNDLED_MODEL),
    );
    candidates.push(PathBuf::from("models").join(BUNDLED_MODEL));
    match candidates.iter().find(|p| p.is_file()) {
        Some(p) => Ok(p.clone()),
        None => Err(ModelFileError::NoModel(
            std::iter::once("$AUBIER_MODEL (unset)".to_owned())
                .chain(candidates.iter().map(|p| p.display().to_string()))
                .collect(),
        )),
    }
}
