//! `aubier replay`: a routing trace (recorded, or synthetic) through the expert-placement policies,
//! printing each policy's served fraction — the offline half of the expert store
//! (`aubier_runtime::placement`). With `--sweep` it repeats the replay for several slot counts; with
//! `--stats` it prints the trace's routing statistics instead (those of
//! `../shared/design/ROUTING.md`, `aubier_runtime::placement::stats`).

use crate::progress::Steps;
use crate::receipt::{Measured, ReceiptFile};
use anyhow::{bail, Context};
use aubier_runtime::placement::hotset::HotSet;
use aubier_runtime::placement::lrfu::Lrfu;
use aubier_runtime::placement::policy::{Admission, PolicyKind, TwoQParams};
use aubier_runtime::placement::replay::{replay, ReplayOptions};
use aubier_runtime::placement::stats::trace_stats;
use aubier_runtime::placement::synthetic::{synthetic_trace, SyntheticSpec};
use aubier_runtime::placement::trace::Trace;
use aubier_runtime::progress::{Count, Progress};
use clap::Args;
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `aubier replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Routing trace, JSON lines `{"seq", "pos", "n_experts", "top_k", "layers": [[e, …], …]}`.
    #[arg(required_unless_present = "synthetic", conflicts_with = "synthetic")]
    pub trace: Option<PathBuf>,
    /// Replay a generated trace instead: a preset (qwen-like, olmoe-like, mixtral-like,
    /// mistral4-like; calibrated to real routing) and/or `key=value,…` over experts, top_k,
    /// layers, tokens, seq_len, batch, zipf, hot, drift, sigma, tau, topic, carry, rho, seed, e.g.
    /// `qwen-like,seed=1` ("" = 128 experts, top-4, 36 layers, 4096 tokens, Zipf 1).
    #[arg(long)]
    pub synthetic: Option<SyntheticSpec>,
    /// Also write the synthetic trace to this JSONL file.
    #[arg(long, requires = "synthetic")]
    pub write_trace: Option<PathBuf>,
    /// Print the trace's routing statistics (per layer, mean over layers: coverage, lag-1 / lag-8
    /// overlap, reuse distance, drift of the top-25% set) instead of replaying it.
    #[arg(long, conflicts_with_all = ["slots", "sweep", "receipt"])]
    pub stats: bool,
    /// Fast-store slots per layer.
    #[arg(long, required_unless_present_any = ["sweep", "stats"], conflicts_with = "sweep")]
    pub slots: Option<usize>,
    /// Replay once per slot count of this comma-separated list, e.g. 8,16,32,48,64.
    #[arg(long, value_delimiter = ',')]
    pub sweep: Option<Vec<usize>>,
    /// Policies to replay, comma-separated, from 2q, lru, lfu, static, min, arc, lrfu, lecar.
    #[arg(long, value_delimiter = ',', default_value = "2q,lru,lfu,static,min")]
    pub policies: Vec<PolicyKind>,
    /// Print JSON: `{"slots": N, "policies": {"2q": f, …}}`, or a list of those with --sweep;
    /// with --stats, `{"coverage50": f, …}`.
    #[arg(long)]
    pub json: bool,
    /// Also write a receipt of the replay to this file (`--json`'s value as its figures, with
    /// the command, commit, host and time; `src/receipt.rs`), for docs/bench/.
    #[arg(long)]
    pub receipt: Option<PathBuf>,
    /// 2Q: `A1in` (first-seen ids, Kin) as a fraction of the slots.
    #[arg(long, default_value_t = TwoQParams::DEFAULT_A1IN)]
    pub a1in: f64,
    /// 2Q: ghost queue `A1out` (Kout) as a fraction of the slots.
    #[arg(long, default_value_t = TwoQParams::DEFAULT_A1OUT)]
    pub a1out: f64,
    /// 2Q: at most this many promotions into the fast store per token per layer (default: no cap).
    #[arg(long)]
    pub max_promotions: Option<usize>,
    /// 2Q: which re-reference of a non-resident expert promotes it: `ghost` (while in A1out, the
    /// paper's rule) or `remembered` (while in A1in or A1out).
    #[arg(long, default_value_t = TwoQParams::DEFAULT_ADMISSION)]
    pub admission: Admission,
    /// LRFU: decay λ per token, in 0..=1 (0 = LFU, 1 = LRU).
    #[arg(long, default_value_t = Lrfu::DEFAULT_LAMBDA)]
    pub lrfu_lambda: f64,
    /// Seed membership `{"layers": [[e, …], …]}` (hottest first; the first N of each list seed N
    /// slots) for every policy but static (which uses its own set); default: the identity set
    /// 0..N.
    #[arg(long)]
    pub resident_set: Option<PathBuf>,
}

/// Runs `aubier replay`; exit status 1 with a message on stderr when it fails.
pub fn run(args: ReplayArgs) -> ExitCode {
    match replay_command(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aubier replay: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn replay_command(args: &ReplayArgs) -> anyhow::Result<()> {
    let mut progress = Steps::new("aubier replay");
    let reading = match args.trace {
        Some(_) => "reading the trace",
        None => "generating the trace",
    };
    progress.step(reading, Count::Time);
    let (trace, source) = match (&args.trace, &args.synthetic) {
        (Some(path), _) => (
            Trace::read(path).with_context(|| format!("reading {}", path.display()))?,
            path.display().to_string(),
        ),
        (None, Some(spec)) => (synthetic_trace(spec)?, format!("synthetic {spec}")),
        (None, None) => bail!("give a trace file or --synthetic"),
    };
    if let Some(path) = &args.write_trace {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        trace
            .write_to(std::io::BufWriter::new(file))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.stats {
        return print_stats(args, &trace, &source);
    }
    let receipt = args
        .receipt
        .as_deref()
        .map(ReceiptFile::create)
        .transpose()?;
    let resident_set = match &args.resident_set {
        Some(path) => {
            Some(HotSet::read(path).with_context(|| format!("reading {}", path.display()))?)
        }
        None => None,
    };
    let slot_counts = match (&args.sweep, args.slots) {
        (Some(list), _) if list.is_empty() => bail!("--sweep needs at least one slot count"),
        (Some(list), _) => list.clone(),
        (None, Some(n)) => vec![n],
        (None, None) => bail!("give --slots or --sweep"),
    };
    for (i, p) in args.policies.iter().enumerate() {
        if args.policies[..i].contains(p) {
            bail!("--policies lists {p} twice");
        }
    }
    if args.policies.is_empty() {
        bail!("--policies is empty");
    }

    let tokens = trace.tokens() as u64;
    let runs = (slot_counts.len() * args.policies.len()) as u64;
    progress.whole(Count::Items(tokens * runs, "tokens"));
    let mut rows = Vec::with_capacity(slot_counts.len());
    for &slots in &slot_counts {
        let opts = ReplayOptions {
            slots,
            a1in: args.a1in,
            a1out: args.a1out,
            max_promotions: args.max_promotions,
            admission: args.admission,
            lrfu_lambda: args.lrfu_lambda,
            resident_set: resident_set.as_ref(),
        };
        let mut served = Vec::with_capacity(args.policies.len());
        for &kind in &args.policies {
            progress.step(
                &format!("{kind} at {slots} slots"),
                Count::Items(tokens, "tokens"),
            );
            served.push((kind, replay(&trace, kind, &opts)?.fraction()));
            progress.advance(tokens);
        }
        rows.push((slots, served));
    }
    progress.done("replayed");

    let objects: Vec<Value> = rows
        .iter()
        .map(|(slots, served)| {
            let policies: Map<String, Value> = served
                .iter()
                .map(|(k, f)| (k.name().to_string(), json!(f)))
                .collect();
            json!({"slots": slots, "policies": policies})
        })
        .collect();
    let value = match (args.sweep.is_some(), objects.as_slice()) {
        (false, [one]) => one.clone(),
        _ => Value::Array(objects),
    };
    if args.json {
        writeln!(std::io::stdout().lock(), "{value}")?;
    } else {
        print_table(args, &trace, &source, &rows)?;
    }
    if let Some(file) = receipt {
        file.write(&Measured {
            kind: "replay",
            backend: None,
            device: None,
            model: Some(source),
            peer: None,
            figures: value,
        })?;
    }
    Ok(())
}

/// `--stats`: the routing statistics of `trace`, mean over layers, as text or JSON.
fn print_stats(args: &ReplayArgs, trace: &Trace, source: &str) -> anyhow::Result<()> {
    let stats = trace_stats(trace).named();
    let mut out = std::io::stdout().lock();
    if args.json {
        let map: Map<String, Value> = stats
            .iter()
            .map(|(name, v)| (name.to_string(), json!(v)))
            .collect();
        writeln!(out, "{}", Value::Object(map))?;
        return Ok(());
    }
    writeln!(
        out,
        "trace: {source}\n{} tokens, {} layers, {} experts, top-{}; per layer, mean over layers \
         (random overlap: {:.3})",
        trace.tokens(),
        trace.n_layers(),
        trace.n_experts(),
        trace.top_k(),
        f64::from(trace.top_k()) / f64::from(trace.n_experts())
    )?;
    for (name, v) in stats {
        writeln!(out, "{name:>13} {v:>8.3}")?;
    }
    Ok(())
}

/// The text report: the trace, then one row per slot count with each policy's served fraction.
fn print_table(
    args: &ReplayArgs,
    trace: &Trace,
    source: &str,
    rows: &[(usize, Vec<(PolicyKind, f64)>)],
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "trace: {source}\n{} tokens, {} layers, {} experts, top-{}; served fraction = routed slots \
         served from the fast store / all {} routed slots",
        trace.tokens(),
        trace.n_layers(),
        trace.n_experts(),
        trace.top_k(),
        trace.routed_slots()
    )?;
    write!(out, "{:>6}", "slots")?;
    for kind in &args.policies {
        write!(out, " {:>7}", kind.name())?;
    }
    writeln!(out)?;
    for (slots, served) in rows {
        write!(out, "{slots:>6}")?;
        for (_, f) in served {
            write!(out, " {f:>7.4}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}
