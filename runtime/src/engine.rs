//! The engine: a loaded [`Model`] — the mapped GGUF file, its [`Mistral4Config`], the compiled
//! [`Plan`], its weights in the file, the backend's binding of the plan and what the backend
//! loaded, and the fast expert store's memory — shared (`Arc`) by every
//! [`crate::session::Session`] on it.
//!
//! Loading, once per process: `GgufFile::open` (mmap, validated) → [`crate::model::read_config`]
//! → [`crate::model::weight_refs`] → [`aubier_compiler::compile`] for the backend's target →
//! [`Backend::bind`] (a kernel for every step) → bind each plan weight to its tensor in the file
//! ([`Weights::bind`]: name, ggml type, `ne` and byte length checked) → [`Backend::load`] (code,
//! pipelines, device weights; the fast store's slots for the budget). Weights stay in the map:
//! the kernels read quantized rows (and only the selected experts' rows) straight from it, or the
//! backend copies what it must.

use crate::backend::registry::BackendSpec;
use crate::backend::{Backend, Binding, LoadInput, LoadedModel};
use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::progress::{Count, Progress, Quiet};
use crate::store::expert_store::{ExpertStore, SharedSlots};
use crate::store::{FastBudget, StoreError};
use crate::weights::Weights;
use aubier_compiler::config::Mistral4Config;
use aubier_compiler::plan::Plan;
use std::path::Path;
use std::sync::Arc;

/// A loaded model, ready for sessions.
pub struct Model {
    /// The mapped GGUF file (weights are read from it in place).
    pub file: Arc<GgufFile>,
    /// Hyper-parameters read from the file.
    pub config: Mistral4Config,
    /// The compiled plan the backend executes.
    pub plan: Arc<Plan>,
    weights: Arc<Weights>,
    binding: Binding,
    loaded: Arc<dyn LoadedModel>,
    slots: SharedSlots,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("arch", &self.config.arch)
            .field("backend", &self.binding.backend)
            .field("steps", &self.plan.steps.len())
            .field("weights", &self.weights.len())
            .finish()
    }
}

impl Model {
    /// Loads the GGUF file at `path` for the default backend (`auto`, the product path) and the
    /// backend's default fast-store budget: [`Model::load_with`].
    ///
    /// Errors: as [`Model::load_with`].
    pub fn load(path: &Path) -> Result<Arc<Model>, EngineError> {
        Model::load_with(path, &BackendSpec::default())
    }

    /// Loads the GGUF file at `path` for the registered backend `spec` names, with the backend's
    /// default fast-store budget: [`Model::load_backend`].
    ///
    /// Errors: [`EngineError::Registry`] when the registry cannot make the backend; those of
    /// [`Model::load_backend`].
    pub fn load_with(path: &Path, spec: &BackendSpec) -> Result<Arc<Model>, EngineError> {
        Model::load_backend(path, spec.make()?, FastBudget::Auto)
    }

    /// Loads the GGUF file at `path` for `backend`: reads its config, compiles the plan for the
    /// backend's target, binds and loads it with a fast store of `budget`.
    ///
    /// Errors: [`EngineError::Gguf`] (open / parse), [`EngineError::Model`] (metadata, tensor
    /// set), [`EngineError::Compile`], and those of [`Model::from_plan`].
    pub fn load_backend(
        path: &Path,
        backend: Arc<dyn Backend>,
        budget: FastBudget,
    ) -> Result<Arc<Model>, EngineError> {
        Model::load_observed(path, backend, budget, &mut Quiet)
    }

    /// [`Model::load_backend`], reporting each step to `progress` as it starts: reading the
    /// file, compiling the plan, binding it, starting the backend, then the backend's own steps
    /// ([`Backend::load`]: weight copies and uploads counted in bytes, shader builds in shaders).
    ///
    /// Errors: those of [`Model::load_backend`].
    pub fn load_observed(
        path: &Path,
        backend: Arc<dyn Backend>,
        budget: FastBudget,
        progress: &mut dyn Progress,
    ) -> Result<Arc<Model>, EngineError> {
        Model::load_predicting(path, backend, budget, None, progress)
    }

    /// [`Model::load_observed`], with the plan's expert predictions
    /// (`aubier_compiler::passes::predict_experts`: every MoE layer `L ≥ 1`'s router applied
    /// before its attention, `Plan::predicted_ids`) when `prediction` is `Some(lead)`, `lead`
    /// layers ahead (`aubier_compiler::CompileOptions::prefetch_lead`, 1 ..= the layer count);
    /// the session then counts their recall ([`crate::session::Session::prediction_report`]). The logits are
    /// the same either way.
    ///
    /// Errors: those of [`Model::load_backend`].
    pub fn load_predicting(
        path: &Path,
        backend: Arc<dyn Backend>,
        budget: FastBudget,
        prediction: Option<usize>,
        progress: &mut dyn Progress,
    ) -> Result<Arc<Model>, EngineError> {
        progress.step("reading the GGUF file", Count::Time);
        let file = Arc::new(GgufFile::open(path)?);
        let config = crate::model::read_config(&file)?;
        let refs = crate::model::weight_refs(&file, &config)?;
        let opts = aubier_compiler::CompileOptions {
            target: backend.target(),
            predict_experts: prediction.is_some(),
            prefetch_lead: prediction.unwrap_or(1),
            ..aubier_compiler::CompileOptions::default()
        };
        progress.step("compiling the plan", Count::Time);
        let plan = aubier_compiler::compile(&config, &refs, &opts)?;
        Model::from_plan_observed(file, config, plan, backend, budget, progress)
    }

    /// Binds an already compiled `plan` to `backend` and to `file`'s tensors, and loads it with a
    /// fast store of `budget`.
    ///
    /// Errors: [`EngineError::Bind`] when the backend has no kernel for a step (a fused step for
    /// the oracle); [`EngineError::Weight`] when a plan weight is absent from the file or differs
    /// in ggml type, `ne` or byte length; [`EngineError::Backend`] when the backend cannot load
    /// it (no device, code it cannot build, memory it cannot allocate, a budget over the
    /// experts).
    pub fn from_plan(
        file: Arc<GgufFile>,
        config: Mistral4Config,
        plan: Plan,
        backend: Arc<dyn Backend>,
        budget: FastBudget,
    ) -> Result<Arc<Model>, EngineError> {
        Model::from_plan_observed(file, config, plan, backend, budget, &mut Quiet)
    }

    /// [`Model::from_plan`], reporting each of its steps to `progress` as it starts (binding,
    /// starting the backend, the backend's own: [`Model::load_observed`]).
    ///
    /// Errors: those of [`Model::from_plan`].
    pub fn from_plan_observed(
        file: Arc<GgufFile>,
        config: Mistral4Config,
        plan: Plan,
        backend: Arc<dyn Backend>,
        budget: FastBudget,
        progress: &mut dyn Progress,
    ) -> Result<Arc<Model>, EngineError> {
        progress.step("binding the weights", Count::Time);
        let binding = backend.bind(&plan)?;
        let plan = Arc::new(plan);
        let weights = Arc::new(Weights::bind(Arc::clone(&file), &plan)?);
        progress.step("starting the backend", Count::Time);
        let loaded = backend.load(
            &LoadInput {
                plan: &plan,
                binding: &binding,
                weights: &weights,
                budget,
            },
            progress,
        )?;
        tracing::info!(
            steps = plan.steps.len(),
            weights = weights.len(),
            backend = %binding.backend,
            fast_store_slots = loaded.slots.slots(),
            fast_store_bytes = loaded.slots.bytes(),
            "model compiled, bound and loaded"
        );
        Ok(Arc::new(Model {
            file,
            config,
            plan,
            weights,
            binding,
            loaded: loaded.model,
            slots: SharedSlots::new(loaded.slots),
        }))
    }

    /// The backend's kernel for every plan step.
    pub fn binding(&self) -> &Binding {
        &self.binding
    }

    /// The backend the model was bound to, as it names itself (`cpu (q8x2)`, …).
    pub fn backend_name(&self) -> &str {
        &self.binding.backend
    }

    /// What the backend loaded (for opening runs).
    pub fn loaded(&self) -> &Arc<dyn LoadedModel> {
        &self.loaded
    }

    /// The fast expert store's memory, shared by the sessions' stores.
    pub fn slots(&self) -> &SharedSlots {
        &self.slots
    }

    /// The device the model runs on (`None` on the host).
    pub fn device(&self) -> Option<String> {
        self.loaded.device()
    }

    /// The plan's weights in the mapped file.
    pub fn weights(&self) -> &Arc<Weights> {
        &self.weights
    }

    /// The byte view of plan weight `w` in the map (zero-copy); `None` past the plan's weights.
    pub fn weight_view(&self, w: usize) -> Option<&[u8]> {
        self.weights.view(w)
    }

    /// Byte views of every plan weight in the map, indexed by `WeightId` (zero-copy).
    pub fn weight_views(&self) -> Vec<&[u8]> {
        self.weights.views()
    }

    /// Where `store`'s member experts' slots in this model's memory differ from the file: every
    /// `(MoE layer, expert, tensor)` whose bytes, read back from the slot
    /// ([`ExpertStore::copies`], which waits for the read-ahead copies in flight), are not the
    /// file's slice, and `(layer, u32::MAX, 0)` for a layer whose read-back does not cover each
    /// member's tensors once. Empty when the store keeps its contract (for checking it).
    ///
    /// Errors: [`StoreError::Plan`] for the plan's MoE steps; [`StoreError::Slot`] when a slot
    /// cannot be read back.
    pub fn slot_mismatches(
        &self,
        store: &ExpertStore,
    ) -> Result<Vec<(usize, u32, usize)>, StoreError> {
        let moe = self
            .plan
            .moe_layers()
            .map_err(|e| StoreError::Plan(e.to_string()))?;
        let mut bad = Vec::new();
        for (i, layer) in moe.iter().enumerate() {
            let n = layer.tensors.len();
            let copies = store.copies(i, &mut self.slots.lock(), n)?;
            if copies.len() != n * store.resident(i).len() {
                bad.push((i, u32::MAX, 0));
            }
            for (e, t, fast) in copies {
                let tensor = layer.tensors[t];
                let at = e as usize * tensor.expert_bytes;
                let file = self
                    .weight_view(tensor.weight)
                    .and_then(|v| v.get(at..at + tensor.expert_bytes));
                if file != Some(fast.as_slice()) {
                    bad.push((i, e, t));
                }
            }
        }
        Ok(bad)
    }
}
