//! The engine: a loaded [`Model`] — the mapped GGUF file, its [`Mistral4Config`], the compiled
//! [`Plan`] and the plan lowered to native code by cranelift — shared (`Arc`) by every
//! [`crate::session::Session`] on it.
//!
//! Loading, once per process: `GgufFile::open` (mmap, validated) → [`crate::model::read_config`]
//! → [`crate::model::weight_refs`] → [`aubier_compiler::compile`] → bind each plan weight to its
//! tensor in the file (name, ggml type, `ne` and byte length checked) → [`CpuProgram::compile`]
//! with the quant kernels of [`crate::quant`] as host functions. Weights stay in the map: the
//! generated code reads quantized rows (and only the selected experts' rows) straight from it.

use crate::executor::ExecError;
use crate::ggml_type::GgmlType;
use crate::gguf::{GgufError, GgufFile, TensorInfo};
use crate::kv_cache::KvCacheError;
use crate::model::ModelError;
use crate::quant;
use aubier_compiler::config::Mistral4Config;
use aubier_compiler::plan::Plan;
use aubier_compiler::{CompileError, CompileOptions};
use aubier_kernels_gen::cpu::{CpuProgram, HostSymbols, LowerError, QuantKernels};
use std::path::Path;
use std::sync::Arc;

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
    Store(#[from] crate::store::expert_store::StoreError),
    /// Bad session options.
    #[error("kv_max = {kv_max}: {reason}")]
    BadKvMax {
        /// The requested capacity (tokens).
        kv_max: usize,
        /// Why it is refused.
        reason: String,
    },
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

/// A loaded model, ready for sessions.
pub struct Model {
    /// The mapped GGUF file (weights are read from it in place).
    pub file: Arc<GgufFile>,
    /// Hyper-parameters read from the file.
    pub config: Mistral4Config,
    /// The compiled plan the CPU program executes.
    pub plan: Plan,
    program: CpuProgram,
    /// `plan.weights[w]`'s tensor in `file`.
    tensors: Vec<TensorInfo>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("arch", &self.config.arch)
            .field("steps", &self.plan.steps.len())
            .field("weights", &self.tensors.len())
            .finish()
    }
}

impl crate::executor::WeightFile for Model {
    fn read(&self, view: &[u8], offset: usize, out: &mut [u8]) -> std::io::Result<()> {
        self.file.read_at(view, offset, out)
    }
}

impl Model {
    /// Loads the GGUF file at `path`: reads its config, compiles the plan and lowers it to native
    /// code (once; sessions only execute).
    ///
    /// Errors: [`EngineError::Gguf`] (open / parse), [`EngineError::Model`] (metadata, tensor
    /// set), [`EngineError::Compile`], [`EngineError::Weight`], [`EngineError::Lower`].
    pub fn load(path: &Path) -> Result<Arc<Model>, EngineError> {
        let file = Arc::new(GgufFile::open(path)?);
        let config = crate::model::read_config(&file)?;
        let refs = crate::model::weight_refs(&file, &config)?;
        let plan = aubier_compiler::compile(&config, &refs, &CompileOptions::default())?;
        Model::from_plan(file, config, plan)
    }

    /// Binds an already compiled `plan` to `file`'s tensors and lowers it to native code.
    ///
    /// Errors: [`EngineError::Weight`] when a plan weight is absent from the file or differs in
    /// ggml type, `ne` or byte length; [`EngineError::Lower`].
    pub fn from_plan(
        file: Arc<GgufFile>,
        config: Mistral4Config,
        plan: Plan,
    ) -> Result<Arc<Model>, EngineError> {
        let mut tensors = Vec::with_capacity(plan.weights.len());
        for w in &plan.weights {
            let bad = |detail: String| EngineError::Weight {
                name: w.name.clone(),
                detail,
            };
            let info = file
                .tensor(&w.name)
                .ok_or_else(|| bad("not in the file".into()))?;
            if info.ggml_type.name() != w.ggml_type || info.ne != w.ne {
                return Err(bad(format!(
                    "the plan reads {} {:?}, the file has {} {:?}",
                    w.ggml_type,
                    w.ne,
                    info.ggml_type.name(),
                    info.ne
                )));
            }
            tensors.push(info.clone());
        }
        let program = CpuProgram::compile(&plan, &host_symbols())?;
        for ((w, info), &expected) in plan
            .weights
            .iter()
            .zip(&tensors)
            .zip(program.weight_bytes())
        {
            let got = file.tensor_data(info).len();
            if got != expected {
                return Err(EngineError::Weight {
                    name: w.name.clone(),
                    detail: format!("{got} bytes in the file, the program reads {expected}"),
                });
            }
        }
        tracing::info!(
            steps = plan.steps.len(),
            kernels = program
                .steps()
                .iter()
                .map(|s| s.kernels.len())
                .sum::<usize>(),
            weights = tensors.len(),
            "model compiled for the CPU oracle"
        );
        Ok(Arc::new(Model {
            file,
            config,
            plan,
            program,
            tensors,
        }))
    }

    /// The plan lowered to native code.
    pub fn program(&self) -> &CpuProgram {
        &self.program
    }

    /// The byte view of plan weight `w` in the map (zero-copy); `None` past the plan's weights.
    pub fn weight_view(&self, w: usize) -> Option<&[u8]> {
        self.tensors.get(w).map(|t| self.file.tensor_data(t))
    }

    /// Releases this process's resident pages of `view`, a slice of a weight view whose bytes
    /// were copied elsewhere ([`GgufFile::release_pages`]); returns the bytes released.
    pub fn release_host_pages(&self, view: &[u8]) -> usize {
        self.file.release_pages(view)
    }

    /// Starts reading `view`, a weight view, into the page cache without mapping it
    /// ([`GgufFile::prefetch_pages`]); returns the bytes advised.
    pub fn prefetch_host_pages(&self, view: &[u8]) -> usize {
        self.file.prefetch_pages(view)
    }

    /// Maps this process's pages of `view`, a slice of a weight view, now
    /// ([`GgufFile::populate_pages`]); returns the bytes populated.
    pub fn populate_host_pages(&self, view: &[u8]) -> usize {
        self.file.populate_pages(view)
    }

    /// Byte views of every plan weight in the map, indexed by `WeightId` (zero-copy).
    pub fn weight_views(&self) -> Vec<&[u8]> {
        self.tensors
            .iter()
            .map(|t| self.file.tensor_data(t))
            .collect()
    }
}

/// The host functions generated code may call: dot and dequantize of every ggml type that
/// [`crate::quant`] implements, except `F32` (generated inline).
pub fn host_symbols() -> HostSymbols {
    let mut host = HostSymbols::new();
    for &ty in GgmlType::ALL {
        if ty == GgmlType::F32 {
            continue;
        }
        if let (Some(dot), Some(dequant)) = (quant::dot_fn(ty), quant::dequant_fn(ty)) {
            host.insert(
                ty.name(),
                QuantKernels {
                    block_elems: ty.block_size(),
                    block_bytes: ty.type_size(),
                    dot,
                    dequant,
                },
            );
        }
    }
    host
}
