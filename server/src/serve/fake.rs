//! `--engine fake`: a CPU-only engine that "generates" a scripted list of token ids, for protocol
//! tests that must not depend on the model's numerics.
//!
//! Algorithm: it walks the same states as `aubier_runtime::generate::generate` — one prefill step,
//! then per token: take the next scripted id (the script running out acts as EOS), stop on an EOS
//! id unless `ignore_eos`, report the id to `on_token` (stop on `Break`), stop at `max_tokens`,
//! else take one decode step. Each step increments the engine's step counter and may sleep
//! `step_delay` (to make a request slow enough to overlap others or be cancelled), and the step
//! numbered `fail_at_step` fails instead. The text side (tokenizer, chat template, stop strings)
//! is the real one, shared with the real engine.

use super::engine::{Engine, EngineFailure};
use aubier_runtime::generate::{FinishReason, GenerateError, GenerateOutput, GenerateParams};
use serde::Deserialize;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the fake engine produces, whatever the prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FakeScript {
    /// Token ids produced in order; after the last one the engine behaves as if EOS was sampled.
    pub ids: Vec<u32>,
    /// Wall time each engine step takes.
    pub step_delay: Duration,
    /// The 1-based engine step (1 = prefill) that fails with [`EngineFailure::Scripted`].
    pub fail_at_step: Option<u64>,
}

/// The JSON file `--fake-script` reads: `{"text": "..."} ` or `{"ids": [..]}`, plus optional
/// `"step_ms"` and `"fail_at_step"`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FakeScriptFile {
    /// Text to encode with the served file's tokenizer.
    pub text: Option<String>,
    /// Token ids, used as given.
    pub ids: Option<Vec<u32>>,
    /// Milliseconds per engine step.
    #[serde(default)]
    pub step_ms: u64,
    /// See [`FakeScript::fail_at_step`].
    pub fail_at_step: Option<u64>,
}

/// Errors of [`FakeScriptFile::read`].
#[derive(Debug, thiserror::Error)]
pub enum FakeScriptError {
    /// The file could not be read.
    #[error("fake script {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a valid script.
    #[error("fake script {path}: {source}")]
    Json {
        /// The file.
        path: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// Both or neither of `text` and `ids` were given.
    #[error("fake script {path}: give exactly one of \"text\" and \"ids\"")]
    Content {
        /// The file.
        path: String,
    },
}

impl FakeScriptFile {
    /// Reads and parses a script file.
    ///
    /// Errors: [`FakeScriptError`] naming the file.
    pub fn read(path: &Path) -> Result<FakeScriptFile, FakeScriptError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| FakeScriptError::Io {
            path: name.clone(),
            source,
        })?;
        let file: FakeScriptFile =
            serde_json::from_slice(&bytes).map_err(|source| FakeScriptError::Json {
                path: name.clone(),
                source,
            })?;
        if file.text.is_some() == file.ids.is_some() {
            return Err(FakeScriptError::Content { path: name });
        }
        Ok(file)
    }
}

/// The scripted engine (see the module note).
#[derive(Debug)]
pub struct FakeEngine {
    script: FakeScript,
    kv_max: usize,
    steps: Arc<AtomicU64>,
}

impl FakeEngine {
    /// A fake engine with a KV capacity of `kv_max` tokens.
    pub fn new(script: FakeScript, kv_max: usize) -> FakeEngine {
        FakeEngine {
            script,
            kv_max,
            steps: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A shared view of the step counter, readable from any thread while the engine runs.
    pub fn step_counter(&self) -> Arc<AtomicU64> {
        self.steps.clone()
    }

    fn step(&mut self) -> Result<(), EngineFailure> {
        let n = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
        if !self.script.step_delay.is_zero() {
            std::thread::sleep(self.script.step_delay);
        }
        if self.script.fail_at_step == Some(n) {
            return Err(EngineFailure::Scripted { step: n });
        }
        Ok(())
    }
}

impl Engine for FakeEngine {
    fn kv_max(&self) -> usize {
        self.kv_max
    }

    fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GenerateOutput, EngineFailure> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt.into());
        }
        if prompt.len() > self.kv_max {
            return Err(GenerateError::PromptTooLong {
                prompt: prompt.len(),
                kv_max: self.kv_max,
            }
            .into());
        }
        let budget = params.max_tokens.min(self.kv_max - prompt.len() + 1);
        self.step()?;
        let mut ids = Vec::new();
        let mut finish = FinishReason::Length;
        while ids.len() < budget {
            let Some(&id) = self.script.ids.get(ids.len()) else {
                finish = FinishReason::Stop;
                break;
            };
            if !params.ignore_eos && params.eos_ids.contains(&id) {
                finish = FinishReason::Stop;
                break;
            }
            ids.push(id);
            if on_token(id).is_break() {
                finish = FinishReason::Cancelled;
                break;
            }
            if ids.len() == budget {
                break;
            }
            self.step()?;
        }
        Ok(GenerateOutput {
            ids,
            finish,
            prefill_tok_s: 0.0,
            decode_tok_s: 0.0,
            prompt_logits: None,
        })
    }

    fn steps_taken(&self) -> u64 {
        self.steps.load(Ordering::SeqCst)
    }
}
