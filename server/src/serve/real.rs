//! `--engine real` (the default): the model's `Session` driven by
//! `aubier_runtime::generate::generate`, the one decode loop `aubier run` uses too, with the
//! session's prompt cache on unless `--prompt-cache off` (a request reuses the cached rows of the
//! prefix its prompt shares with the previous request's tokens, with a cold run's logits:
//! `aubier_runtime::session`).

use super::engine::{Engine, EngineFailure};
use aubier_runtime::engine::Model;
use aubier_runtime::error::EngineError;
use aubier_runtime::generate::{generate, GenerateOutput, GenerateParams, GeneratedToken};
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::expert_store::{StoreOptions, StoreReport};
use aubier_runtime::text::grammar::Constraint;
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
    /// Opens a session of `kv_max` tokens on `model` with the expert store `store`, running
    /// prompts in passes of at most `ubatch` tokens ([`Session::set_ubatch`]), its prompt cache
    /// on ([`RealEngine::set_prompt_cache`]).
    ///
    /// Errors: the session's [`EngineError`] (e.g. a KV cache that cannot be allocated, a store
    /// that cannot be built).
    pub fn open(
        model: Arc<Model>,
        kv_max: usize,
        store: &StoreOptions,
        ubatch: usize,
    ) -> Result<RealEngine, EngineError> {
        let mut session = crate::progress::open_session(model, SessionOptions { kv_max }, store)?;
        session.set_ubatch(ubatch);
        session.set_prompt_cache(true);
        Ok(RealEngine { session })
    }

    /// Turns the session's prompt cache on or off ([`Session::set_prompt_cache`]).
    pub fn set_prompt_cache(&mut self, on: bool) {
        self.session.set_prompt_cache(on);
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
        constraint: Option<&mut Constraint>,
        on_token: &mut dyn FnMut(&GeneratedToken) -> ControlFlow<()>,
    ) -> Result<GenerateOutput, EngineFailure> {
        Ok(generate(
            &mut self.session,
            prompt,
            params,
            constraint,
            on_token,
        )?)
    }

    fn steps_taken(&self) -> u64 {
        self.session.steps_taken()
    }

    fn kv_used(&self) -> usize {
        self.session.position()
    }

    fn store_report(&self) -> Option<StoreReport> {
        Some(self.session.store_report())
    }
}
