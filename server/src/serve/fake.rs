//! `--engine fake`: a CPU-only engine that "generates" a scripted list of token ids, for protocol
//! tests that must not depend on the model's numerics.
//!
//! Algorithm: it runs the one decode loop, `aubier_runtime::generate::generate`, over a scripted
//! [`Stepper`] whose logits put all mass on the next scripted id (the script running out acts as
//! EOS): 0 for that id, [`FLOOR`] for every other, so the other ids have probability 0 exactly
//! (in f64, e^-10000 is 0) yet stay finite — under a grammar that forbids the scripted id the
//! sampler takes an allowed one (greedy: the lowest) instead of finding nothing to draw. Each step increments the engine's step counter and may sleep `step_delay` (to make a
//! request slow enough to overlap others or be cancelled), and the step numbered `fail_at_step`
//! fails instead. The text side (tokenizer, chat template, stop strings)
//! is the real one, shared with the real engine.

use super::engine::{Engine, EngineFailure};
use aubier_runtime::backend::BackendError;
use aubier_runtime::error::EngineError;
use aubier_runtime::generate::{generate, GenerateOutput, GenerateParams, GeneratedToken, Stepper};
use aubier_runtime::text::grammar::Constraint;
use serde::Deserialize;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The logit of every id but the scripted one.
pub const FLOOR: f32 = -10_000.0;

/// What the fake engine produces, whatever the prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FakeScript {
    /// Token ids produced in order; after the last one the engine behaves as if EOS was sampled.
    pub ids: Vec<u32>,
    /// Wall time each engine step takes.
    pub step_delay: Duration,
    /// The 1-based engine step (1 = prefill) that fails (an `EngineError::Backend` naming the step).
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
    stepper: ScriptedStepper,
}

/// The [`Stepper`] under the fake engine: each step's last row of logits is one-hot (0 at the next
/// scripted id, −∞ elsewhere), so the shared decode loop samples exactly the script whatever the
/// sampling parameters; past the script, the one-hot is at EOS.
#[derive(Debug)]
struct ScriptedStepper {
    script: FakeScript,
    kv_max: usize,
    n_vocab: usize,
    eos_id: u32,
    /// Steps since the last reset: the next scripted id is `script.ids[produced - 1]`.
    produced: usize,
    /// Tokens stepped since the last reset (the KV rows a real engine would hold).
    rows: usize,
    steps: Arc<AtomicU64>,
}

impl FakeEngine {
    /// A fake engine with a KV capacity of `kv_max` tokens over a vocabulary of `n_vocab` ids whose
    /// end-of-sequence id is `eos_id` (the served file's tokenizer).
    pub fn new(script: FakeScript, kv_max: usize, n_vocab: usize, eos_id: u32) -> FakeEngine {
        FakeEngine {
            stepper: ScriptedStepper {
                script,
                kv_max,
                n_vocab,
                eos_id,
                produced: 0,
                rows: 0,
                steps: Arc::new(AtomicU64::new(0)),
            },
        }
    }

    /// A shared view of the step counter, readable from any thread while the engine runs.
    pub fn step_counter(&self) -> Arc<AtomicU64> {
        self.stepper.steps.clone()
    }
}

impl Stepper for ScriptedStepper {
    fn reset(&mut self) {
        self.produced = 0;
        self.rows = 0;
    }

    fn kv_max(&self) -> usize {
        self.kv_max
    }

    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let n = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
        if !self.script.step_delay.is_zero() {
            std::thread::sleep(self.script.step_delay);
        }
        if self.script.fail_at_step == Some(n) {
            return Err(EngineError::Backend(BackendError::Device {
                backend: "fake".into(),
                message: format!("scripted failure at engine step {n}"),
            }));
        }
        let next = self
            .script
            .ids
            .get(self.produced)
            .copied()
            .unwrap_or(self.eos_id);
        self.produced += 1;
        self.rows += tokens.len();
        let mut logits = vec![FLOOR; tokens.len() * self.n_vocab];
        let last = (tokens.len().saturating_sub(1)) * self.n_vocab;
        if let Some(l) = logits.get_mut(last + next as usize) {
            *l = 0.0;
        }
        Ok(logits)
    }
}

impl Engine for FakeEngine {
    fn kv_max(&self) -> usize {
        self.stepper.kv_max
    }

    fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        constraint: Option<&mut Constraint>,
        on_token: &mut dyn FnMut(&GeneratedToken) -> ControlFlow<()>,
    ) -> Result<GenerateOutput, EngineFailure> {
        Ok(generate(
            &mut self.stepper,
            prompt,
            params,
            constraint,
            on_token,
        )?)
    }

    fn steps_taken(&self) -> u64 {
        self.stepper.steps.load(Ordering::SeqCst)
    }

    fn kv_used(&self) -> usize {
        self.stepper.rows
    }
}
