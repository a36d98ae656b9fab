//! [`EngineError`]: everything loading a model or running a session can fail with, one variant
//! per layer (file, metadata, compiler, binding, lowering, execution, store) or request field;
//! [`StoreError`]: the split expert store's.

use crate::backend::{BindError, ExecError};
use crate::gguf::GgufError;
use crate::kv_cache::KvCacheError;
use crate::model::ModelError;
use crate::placement::hotset::HotSetError;
use crate::placement::policy::PolicyError;
use aubier_compiler::CompileError;
use aubier_kernels_gen::cpu::LowerError;

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
    /// The CPU lowering refused the plan.
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// The backend has no kernel for a step of the plan.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// A plan weight does not match the file.
    #[error("weight `{name}`: {detail}")]
    Weight {
        /// GGUF tensor name.
        name: String,
        /// What differs.
        detail: String,
    },
    /// The plan lacks an output the session reads.
    #[error("the plan has no output `{0}`")]
    MissingOutput(String),
    /// The executor failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The latent cache cannot be allocated.
    #[error(transparent)]
    KvCache(#[from] KvCacheError),
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
    /// The Vulkan backend failed: no loader or device, a shader the compiler refused, a driver
    /// error.
    #[error("vulkan backend: {0}")]
    Vulkan(#[from] crate::backend::vulkan::VulkanError),
    /// A backend other than the CPU executor failed a step (its own words in `message`).
    #[error("backend: {message}")]
    Backend {
        /// What the backend said.
        message: String,
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

/// Errors of building or driving the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `--n-res` above the experts of a layer.
    #[error("--n-res {n_res} exceeds the {n_expert} experts of a layer")]
    TooManySlots {
        /// Slots asked for.
        n_res: usize,
        /// Experts per layer.
        n_expert: usize,
    },
    /// `--policy min` (needs the future).
    #[error(
        "policy `min` is an offline oracle (it reads the whole trace); use it with `aubier replay`"
    )]
    OfflinePolicy,
    /// The resident set does not fit the model.
    #[error(transparent)]
    HotSet(#[from] HotSetError),
    /// A policy refused its knobs, seed or an access.
    #[error("layer {layer}: {source}")]
    Policy {
        /// 0-based MoE layer.
        layer: usize,
        /// What the policy said.
        source: PolicyError,
    },
    /// The plan's MoE steps are not what the store expects (layers, expert counts).
    #[error("plan: {0}")]
    Plan(String),
    /// A routed id is outside the layer's experts.
    #[error("layer {layer}: routed expert id {id} is outside 0..{n_expert}")]
    Routed {
        /// 0-based MoE layer.
        layer: usize,
        /// The id.
        id: i64,
        /// Experts per layer.
        n_expert: usize,
    },
    /// The fast store cannot be allocated.
    #[error("allocating the fast store ({bytes} bytes): {source}")]
    Alloc {
        /// Bytes asked for.
        bytes: usize,
        /// The OS error.
        source: std::io::Error,
    },
}
