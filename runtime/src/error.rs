//! [`EngineError`]: everything loading a model or running a session can fail with, one variant
//! per layer (file, metadata, compiler, registry, binding, backend, store) or request field.

use crate::backend::registry::RegistryError;
use crate::backend::{BackendError, BindError, ExecError};
use crate::gguf::GgufError;
use crate::model::ModelError;
use crate::store::StoreError;
use crate::weights::WeightError;
use aubier_compiler::CompileError;

/// Everything loading a model or running a session can fail with; each variant carries the
/// message of the layer that failed (file, metadata, compiler, lowering, execution) or names the
/// offending request field.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The GGUF file cannot be opened or is malformed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The file is not a usable Mistral Small 4 model.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The compiler refused the model.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// The backend registry cannot make the backend asked for.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The backend has no kernel for a step of the plan.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// A plan weight does not match the file.
    #[error(transparent)]
    Weight(#[from] WeightError),
    /// The plan lacks an output the session reads.
    #[error("the plan has no output `{0}`")]
    MissingOutput(String),
    /// A step's results are not what the plan says (an index out of range: NaN activations).
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The backend cannot load the model or run a step.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The expert store cannot be built or refused a step's routing.
    #[error("expert store: {0}")]
    Store(#[from] StoreError),
    /// Bad session options.
    #[error("kv_max = {kv_max}: {reason}")]
    BadKvMax {
        /// The requested capacity (tokens).
        kv_max: usize,
        /// Why it is refused.
        reason: String,
    },
    /// `step` was called with no tokens.
    #[error("a step needs at least one token")]
    EmptyStep,
    /// The step would write past the KV capacity.
    #[error("{tokens} tokens at position {position} exceed the KV capacity of {kv_max} tokens")]
    ContextFull {
        /// Tokens in the step.
        tokens: usize,
        /// The session's position before the step.
        position: usize,
        /// The capacity.
        kv_max: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token {index} of the step is id {id}, outside the vocabulary of {n_vocab}")]
    TokenOutOfRange {
        /// Index in the step's tokens.
        index: usize,
        /// The id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
}
