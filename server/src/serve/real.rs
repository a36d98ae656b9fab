//! `--engine real` (the default): the model's `Session` driven by
//! `aubier_runtime::generate::generate`, the one decode loop `aubier run` uses too.

use super::engine::{Engine, EngineFailure};
use aubier_runtime::engine::{EngineError, Model};
use aubier_runtime::generate::{generate, GenerateOutput, GenerateParams};
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::expert_store::{StoreOptions, StoreReport};
use std::ops::ControlFlow;
use std::sync::Arc;

/// The real engine: one `Session` on the loaded model.
pub struct RealEngine {
    session: Session,
}

impl std::fmt::Debug for RealEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealEngine")
            .field("kv_max", &self.session.kv_max())
            .finish_non_exhaustive()
    }
}

impl RealEngine {
    /// Opens a session of `kv_max` tokens on `model` with the expert store `store`.
    ///
    /// Errors: the session's [`EngineError`] (e.g. a KV cache that cannot be allocated, a store
    /// that cannot be built).
    pub fn open(
        model: Arc<Model>,
        kv_max: usize,
        store: &StoreOptions,
    ) -> Result<RealEngine, EngineError> {
        Ok(RealEngine {
            session: Session::open_with_store(model, SessionOptions { kv_max }, store)?,
        })
    }

    /// This engine with its session's weight-product kernels and prompt pass size from `kernels`.
    pub fn with_kernels(mut self, kernels: &crate::run::KernelArgs) -> RealEngine {
        kernels.apply(&mut self.session);
        self
    }
}

impl Engine for RealEngine {
    fn kv_max(&self) -> usize {
        self.session.kv_max()
    }

    fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GenerateOutput, EngineFailure> {
        Ok(generate(&mut self.session, prompt, params, on_token)?)
    }

    fn steps_taken(&self) -> u64 {
        self.session.steps_taken()
    }

    fn store_report(&self) -> Option<StoreReport> {
        Some(self.session.store_report())
    }
}
