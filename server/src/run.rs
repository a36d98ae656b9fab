//! `aubier run`: one prompt through the model on the CPU oracle, from the command line. It drives the
//! same `Session` and decode loop (`aubier_runtime::generate`) as the server.

use anyhow::{bail, Context};
use aubier_runtime::engine::Model;
use aubier_runtime::generate::{generate, FinishReason, GenerateParams};
use aubier_runtime::sampler::SamplingParams;
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::tokenizer::Tokenizer;
use clap::Args;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

/// The model and prompt of `aubier run` and `aubier trace`.
#[derive(Args, Debug)]
pub struct PromptArgs {
    /// GGUF file to run.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt as comma-separated token ids (no BOS is added).
    #[arg(long, conflicts_with = "prompt", value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Prompt as text, tokenized with the file's tokenizer (BOS added when the file says so).
    #[arg(long)]
    pub prompt: Option<String>,
}

/// A loaded model, its tokenizer (when the file has one) and the prompt ids.
pub struct Loaded {
    /// The compiled model.
    pub model: Arc<Model>,
    /// The file's tokenizer, if it carries `tokenizer.ggml.*`.
    pub tokenizer: Option<Tokenizer>,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
}

impl PromptArgs {
    /// Loads the model and resolves the prompt. Errors: the file, the tokenizer, or no prompt.
    pub fn load(&self) -> anyhow::Result<Loaded> {
        let model = Model::load(&self.model)
            .with_context(|| format!("loading {}", self.model.display()))?;
        let tokenizer = Tokenizer::from_gguf(&model.file).ok();
        let prompt: Vec<u32> = match (&self.prompt_ids, &self.prompt) {
            (Some(ids), _) => ids.clone(),
            (None, Some(text)) => {
                let tok = tokenizer.as_ref().context(
                    "--prompt needs the file's tokenizer, and this file has none; use --prompt-ids",
                )?;
                let mut ids = Vec::new();
                if add_bos(&model) {
                    ids.push(tok.bos_id());
                }
                ids.extend(tok.encode(text)?);
                ids
            }
            (None, None) => bail!("give the prompt with --prompt-ids 1,2,3 or --prompt TEXT"),
        };
        Ok(Loaded {
            model,
            tokenizer,
            prompt,
        })
    }
}

/// Arguments of `aubier run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Model and prompt.
    #[command(flatten)]
    pub input: PromptArgs,
    /// Tokens to generate; 0 runs the prompt only.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep generating past EOS.
    #[arg(long)]
    pub ignore_eos: bool,
    /// KV cache capacity in tokens (default: min(context_length, 4096)).
    #[arg(long)]
    pub kv_max: Option<usize>,
    /// Write the logits of every prompt position as little-endian f32, row-major [n_prompt × n_vocab].
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `aubier run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let Loaded {
        model,
        tokenizer,
        prompt,
    } = args.input.load()?;
    let opts = match args.kv_max {
        Some(kv_max) => SessionOptions { kv_max },
        None => SessionOptions::for_config(&model.config),
    };
    let mut session = Session::open(model.clone(), opts)?;
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            seed: args.seed,
        },
        ignore_eos: args.ignore_eos,
        eos_ids: tokenizer
            .as_ref()
            .map(|t| vec![t.eos_id()])
            .unwrap_or_default(),
        keep_prompt_logits: args.logits_out.is_some(),
    };
    let stream_text = !args.json && tokenizer.is_some();
    let mut decoder = tokenizer.as_ref().map(|t| t.stream_decoder());
    let mut stdout = std::io::stdout();
    let out = generate(&mut session, &prompt, &params, &mut |id| {
        if stream_text {
            if let Some(d) = decoder.as_mut() {
                let _ = write!(stdout, "{}", d.push(id));
                let _ = stdout.flush();
            }
        }
        ControlFlow::Continue(())
    })?;
    if let (Some(path), Some(logits)) = (&args.logits_out, &out.prompt_logits) {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    let text = tokenizer.as_ref().map(|t| t.decode(&out.ids));
    if args.json {
        let v = serde_json::json!({
            "prompt_ids": prompt,
            "generated_ids": out.ids,
            "text": text,
            "finish_reason": finish_name(out.finish),
            "prefill_tok_s": out.prefill_tok_s,
            "decode_tok_s": out.decode_tok_s,
        });
        println!("{v}");
    } else {
        if let Some(d) = decoder.as_mut() {
            print!("{}", d.finish());
        }
        if tokenizer.is_none() {
            println!("{:?}", out.ids);
        } else {
            println!();
        }
        eprintln!(
            "prefill {:.1} tok/s, decode {:.1} tok/s, finish {}",
            out.prefill_tok_s,
            out.decode_tok_s,
            finish_name(out.finish)
        );
    }
    Ok(())
}

/// `tokenizer.ggml.add_bos_token`; a file without the key gets BOS, as llama.cpp does for the
/// `tekken` pre-tokenizer (`src/llama-vocab.cpp`).
fn add_bos(model: &Model) -> bool {
    match model
        .file
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_bool())
    {
        Some(b) => b,
        None => {
            tracing::info!(
                "tokenizer.ggml.add_bos_token absent: adding BOS as llama.cpp does for tekken"
            );
            true
        }
    }
}

fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "cancelled",
    }
}
