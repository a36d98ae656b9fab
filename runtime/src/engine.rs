//! The engine: a loaded [`Model`] — the mapped GGUF file, its [`Mistral4Config`], the compiled
//! [`Plan`] and the plan lowered to native code by cranelift — shared (`Arc`) by every
//! [`crate::session::Session`] on it.
//!
//! Loading, once per process: `GgufFile::open` (mmap, validated) → [`crate::model::read_config`]
//! → [`crate::model::weight_refs`] → [`aubier_compiler::compile`] for the backend's target →
//! the backend binds the plan (a kernel for every step, [`crate::backend`]) → bind each plan
//! weight to its tensor in the file (name, ggml type, `ne` and byte length checked) →
//! [`CpuProgram::compile_steps`] of the unfused steps, with the quant kernels of
//! [`crate::gguf::quant`] as host functions. Weights stay in the map: the kernels read quantized
//! rows (and only the selected experts' rows) straight from it.

use crate::backend::vulkan::exec::DevicePlan;
use crate::backend::{BackendKind, Binding};
use crate::error::EngineError;
use crate::ggml_type::GgmlType;
use crate::gguf::quant;
use crate::gguf::{GgufFile, TensorInfo};
use aubier_compiler::config::Mistral4Config;
use aubier_compiler::plan::Plan;
use aubier_kernels_gen::cpu::{CpuProgram, HostSymbols, QuantKernels};
use std::path::Path;
use std::sync::Arc;

/// A loaded model, ready for sessions.
pub struct Model {
    /// The mapped GGUF file (weights are read from it in place).
    pub file: Arc<GgufFile>,
    /// Hyper-parameters read from the file.
    pub config: Mistral4Config,
    /// The compiled plan the backend executes.
    pub plan: Plan,
    program: CpuProgram,
    binding: Binding,
    /// `plan.weights[w]`'s tensor in `file`.
    tensors: Vec<TensorInfo>,
    /// The plan made ready on the device of a `vulkan` binding.
    device: Option<DevicePlan>,
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

impl crate::backend::WeightFile for Model {
    fn read(&self, view: &[u8], offset: usize, out: &mut [u8]) -> std::io::Result<()> {
        self.file.read_at(view, offset, out)
    }
}

impl Model {
    /// Loads the GGUF file at `path` for the default backend ([`BackendKind::default`], the
    /// product path): [`Model::load_with`].
    ///
    /// Errors: as [`Model::load_with`].
    pub fn load(path: &Path) -> Result<Arc<Model>, EngineError> {
        Model::load_with(path, BackendKind::default())
    }

    /// Loads the GGUF file at `path` for `backend`: reads its config, compiles the plan for the
    /// backend's target, binds it and lowers its unfused steps to native code (once; sessions
    /// only execute).
    ///
    /// Errors: [`EngineError::Gguf`] (open / parse), [`EngineError::Model`] (metadata, tensor
    /// set), [`EngineError::Compile`], and those of [`Model::from_plan`].
    pub fn load_with(path: &Path, backend: BackendKind) -> Result<Arc<Model>, EngineError> {
        let file = Arc::new(GgufFile::open(path)?);
        let config = crate::model::read_config(&file)?;
        let refs = crate::model::weight_refs(&file, &config)?;
        let plan = aubier_compiler::compile(&config, &refs, &backend.compile_options())?;
        Model::from_plan(file, config, plan, backend)
    }

    /// Binds an already compiled `plan` to `backend` and to `file`'s tensors, and lowers its
    /// unfused steps to native code.
    ///
    /// Errors: [`EngineError::Vulkan`] when a `vulkan` backend has no device or cannot make the
    /// plan ready on it; [`EngineError::Bind`] when the backend has no kernel for a step (a fused
    /// step for the oracle); [`EngineError::Weight`] when a plan weight is absent from the file or differs
    /// in ggml type, `ne` or byte length; [`EngineError::Lower`].
    pub fn from_plan(
        file: Arc<GgufFile>,
        config: Mistral4Config,
        plan: Plan,
        backend: BackendKind,
    ) -> Result<Arc<Model>, EngineError> {
        let backend = backend.resolve();
        // The device first: a machine without one fails before any work.
        let context = match backend {
            BackendKind::Vulkan(choice) => Some(choice.open()?),
            _ => None,
        };
        let binding = backend.backend().bind(&plan)?;
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
        let program =
            CpuProgram::compile_steps(&plan, &host_symbols(), |i| !plan.steps[i].op.is_fused())?;
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
        let device = match context {
            Some(ctx) => {
                let views: Vec<&[u8]> = tensors.iter().map(|t| file.tensor_data(t)).collect();
                Some(DevicePlan::new(ctx, &plan, &views)?)
            }
            None => None,
        };
        tracing::info!(
            steps = plan.steps.len(),
            kernels = program
                .steps()
                .iter()
                .map(|s| s.kernels.len())
                .sum::<usize>(),
            weights = tensors.len(),
            backend = %backend,
            "model compiled and bound"
        );
        Ok(Arc::new(Model {
            file,
            config,
            plan,
            program,
            binding,
            tensors,
            device,
        }))
    }

    /// The plan made ready on the device, for a model bound to the `vulkan` backend.
    pub fn device_plan(&self) -> Option<&DevicePlan> {
        self.device.as_ref()
    }

    /// The backend's kernel for every plan step.
    pub fn binding(&self) -> &Binding {
        &self.binding
    }

    /// The backend the model was bound to.
    pub fn backend(&self) -> BackendKind {
        self.binding.backend
    }

    /// The plan's unfused steps lowered to native code.
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
/// [`crate::gguf::quant`] implements, except `F32` (generated inline).
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
