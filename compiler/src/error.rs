//! Errors of graph construction, inference, verification and lowering. Every variant names the
//! node, weight, stage or output it is about, so a bad model file or a broken pass is located by
//! its message alone.

use crate::infer::InferError;
use crate::verify::VerifyError;

/// Everything [`crate::compile`] and the graph builder can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The model description reads a GGUF tensor the file does not have.
    #[error("weight `{name}` is missing from the model file")]
    MissingWeight {
        /// GGUF tensor name, e.g. `blk.0.attn_q_a.weight`.
        name: String,
    },
    /// An op's operands do not fit its signature (shape, dtype or weight layout).
    #[error("node `{node}`: {source}")]
    Infer {
        /// The node's dump name (`%12 (blk.0.q)`).
        node: String,
        /// What is wrong.
        #[source]
        source: InferError,
    },
    /// The graph broke a structural rule after a stage (a pass bug, or a malformed hand-built graph).
    #[error("after stage `{stage}`: {source}")]
    Verify {
        /// The stage that ran last.
        stage: String,
        /// The rule broken.
        #[source]
        source: VerifyError,
    },
    /// Two graph inputs or outputs share a name.
    #[error("{kind} `{name}` is declared twice")]
    DuplicateName {
        /// `input` or `output`.
        kind: &'static str,
        /// The repeated name.
        name: String,
    },
    /// A stage name given to `--dump-after` or [`crate::CompileOptions::disable`] is not in the
    /// pipeline.
    #[error("no stage named `{name}`; stages are: {known}")]
    UnknownStage {
        /// The name asked for.
        name: String,
        /// The pipeline's stage names, comma-separated.
        known: String,
    },
    /// Fusion settings that cannot hold together (a pass both `on` and disabled, or `fuse_phase`
    /// on without `fuse_kqkv`).
    #[error("fusion options: {detail}")]
    FusionOptions {
        /// Which settings conflict and why.
        detail: String,
    },
    /// A fusion pass set `on` matched nothing in a graph that has attention.
    #[error("pass `{pass}` is on but matched nothing in a graph with attention")]
    FusionNoMatch {
        /// The pass's stage name.
        pass: &'static str,
    },
    /// [`crate::CompileOptions::prefetch_lead`] outside `1 ..= n_layer`.
    #[error(
        "prefetch lead {lead} is out of range: the expert prediction runs 1 to {n_layer} layers \
         ahead (the model's layer count)"
    )]
    PrefetchLead {
        /// The lead asked for.
        lead: usize,
        /// The model's layer count.
        n_layer: usize,
    },
    /// A mandatory stage was asked to be disabled.
    #[error("stage `{name}` cannot be disabled")]
    MandatoryStage {
        /// The stage name.
        name: String,
    },
    /// A value reaching the scheduler has no inferred type (the verifier rules this out; seen only
    /// when lowering an unverified graph).
    #[error("node `{node}` reaches the scheduler without an inferred type")]
    Untyped {
        /// The node's dump name.
        node: String,
    },
}
