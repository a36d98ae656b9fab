//! `aubier trace`: records the routing of every token of one generation as a JSONL routing trace
//! (`aubier_runtime::placement::trace` format: one object per token, in order), for
//! `aubier replay`.

use crate::run::{BackendArgs, Loaded, PromptArgs};
use anyhow::Context;
use aubier_runtime::generate::{generate, GenerateParams};
use aubier_runtime::placement::trace::{TraceRecord, TraceWriter};
use aubier_runtime::sampler::SamplingParams;
use aubier_runtime::session::SessionOptions;
use aubier_runtime::store::expert_store::StoreOptions;
use clap::Args;
use std::ops::ControlFlow;
use std::path::PathBuf;

/// Arguments of `aubier trace`.
#[derive(Args, Debug)]
pub struct TraceArgs {
    /// Model and prompt.
    #[command(flatten)]
    pub input: PromptArgs,
    /// Tokens to generate (greedy) after the prompt; their routing is recorded too.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Keep generating past EOS.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Where to write the trace (JSONL).
    #[arg(long)]
    pub out: PathBuf,
    /// The backend whose routing is recorded.
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Runs `aubier trace`: prefill + greedy decode with routing recorded, then one trace line per
/// token (prompt tokens first). The last generated token is never fed back, so it has no routing.
pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    let Loaded {
        model,
        tokenizer,
        prompt,
        ..
    } = args.input.load(&args.backend.spec()?, None, false)?;
    let cfg = model.config.clone();
    let mut session = crate::progress::open_session(
        model,
        SessionOptions::for_config(&cfg),
        &StoreOptions::default(),
    )?;
    session.set_ubatch(args.backend.ubatch);
    session.record_routing(true);
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        sampling: SamplingParams::default(),
        min_tokens: 0,
        stop_token_ids: Vec::new(),
        ignore_eos: args.ignore_eos,
        eos_ids: tokenizer
            .as_ref()
            .map(|t| vec![t.eos_id()])
            .unwrap_or_default(),
        keep_prompt_logits: false,
        logprobs: None,
    };
    generate(&mut session, &prompt, &params, None, &mut |_| {
        ControlFlow::Continue(())
    })?;
    let file = std::fs::File::create(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut writer = TraceWriter::new(std::io::BufWriter::new(file));
    for token in session.take_routing() {
        writer.write(&TraceRecord {
            seq: 0,
            pos: token.pos as u64,
            n_experts: cfg.n_expert as u32,
            top_k: cfg.n_expert_used as u32,
            layers: token.layers,
        })?;
    }
    writer.flush()?;
    eprintln!(
        "wrote {} tokens × {} layers of routing to {}",
        writer.written(),
        cfg.n_layer,
        args.out.display()
    );
    Ok(())
}
