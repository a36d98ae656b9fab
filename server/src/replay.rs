//! `aubier replay`: a routing trace (recorded, or synthetic) through the expert-placement policies,
//! printing each policy's served fraction and the experts it copies into the fast store (loads, and
//! bytes at `--expert-bytes` each) — the offline half of the expert store
//! (`aubier_runtime::placement`). With `--prefetch-budget` the replay prefetches one layer ahead
//! from a co-occurrence predictor (`placement::replay`). With `--sweep` it repeats the replay for
//! several slot counts; with `--stats` it prints the trace's routing statistics instead (those of
//! `../shared/design/ROUTING.md`, `aubier_runtime::placement::stats`).

use crate::progress::Steps;
use crate::receipt::{Measured, ReceiptFile};
use crate::synth::{routed_expert_bytes, Dims, QuantMix};
use anyhow::{bail, Context};
use aubier_runtime::placement::hotset::HotSet;
use aubier_runtime::placement::lrfu::Lrfu;
use aubier_runtime::placement::policy::{Admission, PolicyKind, TwoQParams};
use aubier_runtime::placement::replay::{replay, ReplayOptions, Served};
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
    /// Print JSON: `{"slots": N, "policies": {"2q": f, …}, "loads_per_token": {"2q": x, …},
    /// "bytes_per_token": {…}, "expert_bytes": B}` (with prefetch also `"prefetch": {"budget",
    /// "recall", "used": {"2q": share of prefetches routed, …}}`), or a list of those with
    /// --sweep; with --stats, `{"coverage50": f, …}`.
    #[arg(long)]
    pub json: bool,
    /// Also write a receipt of the replay to this file (`--json`'s value as its figures, with
    /// the command, commit, host and time; `src/receipt.rs`), for docs/bench/.
    #[arg(long)]
    pub receipt: Option<PathBuf>,
    /// 2Q: `A1in` (first-seen ids, Kin) as a fraction of the slots.
    #[arg(long, default_value_t = TwoQParams::DEFAULT_A1IN)]
    pub a1in: f64,
    /// 2Q: ghost queue `A1out` (Kout) as a fraction of the slots (default: 2 on demand paging,
    /// 0.25 with a prefetch budget).
    #[arg(long)]
    pub a1out: Option<f64>,
    /// 2Q: at most this many promotions into the fast store per token per layer (default: no cap).
    #[arg(long)]
    pub max_promotions: Option<usize>,
    /// 2Q: which re-reference of a non-resident expert promotes it: `ghost` (while in A1out, the
    /// paper's rule), `remembered` (while in A1in or A1out) or `frequency[:W]` (as remembered, when
    /// more frequent than the victim; counts halved every W × experts accesses, W default 2).
    /// Default: `frequency:2` on demand paging, `frequency:32` with a prefetch budget.
    #[arg(long)]
    pub admission: Option<Admission>,
    /// LRFU: decay λ per token, in 0..=1 (0 = LFU, 1 = LRU).
    #[arg(long, default_value_t = Lrfu::DEFAULT_LAMBDA, value_parser = parse_lambda)]
    pub lrfu_lambda: f64,
    /// Prefetch loads per token per layer, issued one layer ahead from the cross-layer
    /// co-occurrence predictor learned online (0 = demand paging only); static and min take no
    /// prefetch.
    #[arg(long, default_value_t = 0)]
    pub prefetch_budget: usize,
    /// Bytes of one expert, to turn loads into bytes moved; default: a routed expert of Mistral
    /// Small 4 in llama-quantize's Q2_K mix (gate/up Q2_K, down Q3_K), 9,109,504 bytes.
    #[arg(long)]
    pub expert_bytes: Option<u64>,
    /// File of the seed membership, JSON `{"layers": [[e, …], …]}` (hottest first; the first N of each list seed N
    /// slots) for every policy but static (which uses its own set); default: the identity set
    /// 0..N.
    #[arg(long)]
    pub resident_set: Option<PathBuf>,
}

impl ReplayArgs {
    /// 2Q's `Kout` fraction and admission: as given, else the defaults of demand paging or, with
    /// a prefetch budget, of prefetch ([`TwoQParams::default_knobs`]).
    fn two_q_knobs(&self) -> (f64, Admission) {
        let (a1out, admission) = TwoQParams::default_knobs(self.prefetch_budget > 0);
        (
            self.a1out.unwrap_or(a1out),
            self.admission.unwrap_or(admission),
        )
    }
}

/// The receipt's `model`: the trace, then the settings that change its figures when not the
/// defaults (2Q's knobs when 2q is replayed, the prefetch budget), so that receipts of one trace
/// under other settings are told apart.
fn receipt_model(args: &ReplayArgs, source: String) -> String {
    let mut model = source;
    let two_q_knobs = args.a1in != TwoQParams::DEFAULT_A1IN
        || args.a1out.is_some()
        || args.max_promotions.is_some()
        || args.admission.is_some();
    if two_q_knobs && args.policies.contains(&PolicyKind::TwoQ) {
        let (a1out, admission) = args.two_q_knobs();
        model += &format!(
            "; 2q a1in {} a1out {a1out} admission {admission}",
            args.a1in
        );
        if let Some(cap) = args.max_promotions {
            model += &format!(" max-promotions {cap}");
        }
    }
    if args.prefetch_budget > 0 {
        model += &format!("; prefetch budget {}", args.prefetch_budget);
    }
    model
}

/// `--lrfu-lambda`: a number in `0..=1`, checked when parsed rather than when (and only if)
/// the lrfu policy is replayed.
fn parse_lambda(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not in 0..=1 (0 is LFU, 1 is LRU)"))
    }
}

/// Runs `aubier replay`; exit status 1 with a message on stderr when it fails.
pub fn run(args: ReplayArgs) -> ExitCode {
    match replay_command(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aubier replay: {}", crate::error_text::error_text(&e));
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

    let expert_bytes = match args.expert_bytes {
        Some(b) => b,
        None => routed_expert_bytes(&Dims::real(36, 128, 131_072), QuantMix::Q2K)
            .context("Mistral Small 4's expert size")?,
    };
    let tokens = trace.tokens() as u64;
    let runs = (slot_counts.len() * args.policies.len()) as u64;
    progress.whole(Count::Items(tokens * runs, "tokens"));
    let mut rows = Vec::with_capacity(slot_counts.len());
    let (a1out, admission) = args.two_q_knobs();
    for &slots in &slot_counts {
        let opts = ReplayOptions {
            slots,
            a1in: args.a1in,
            a1out,
            max_promotions: args.max_promotions,
            admission,
            lrfu_lambda: args.lrfu_lambda,
            resident_set: resident_set.as_ref(),
            prefetch_budget: args.prefetch_budget,
        };
        let mut served = Vec::with_capacity(args.policies.len());
        for &kind in &args.policies {
            progress.step(
                &format!("{kind} at {slots} slots"),
                Count::Items(tokens, "tokens"),
            );
            served.push((kind, replay(&trace, kind, &opts)?));
            progress.advance(tokens);
        }
        rows.push((slots, served));
    }
    progress.done("replayed");

    let objects: Vec<Value> = rows
        .iter()
        .map(|(slots, served)| row_json(*slots, served, args, tokens, expert_bytes))
        .collect();
    let value = match (args.sweep.is_some(), objects.as_slice()) {
        (false, [one]) => one.clone(),
        _ => Value::Array(objects),
    };
    if args.json {
        writeln!(std::io::stdout().lock(), "{value}")?;
    } else {
        print_table(args, &trace, &source, &rows, expert_bytes)?;
    }
    if let Some(file) = receipt {
        file.write(&Measured {
            kind: "replay",
            backend: None,
            device: None,
            model: Some(receipt_model(args, source)),
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

/// Loads (or bytes, at `expert_bytes` each) per token, per policy.
fn per_token(
    served: &[(PolicyKind, Served)],
    tokens: u64,
    expert_bytes: u64,
) -> Map<String, Value> {
    served
        .iter()
        .map(|(k, s)| {
            let loads = s.loads() as f64 / tokens.max(1) as f64;
            (k.name().to_string(), json!(loads * expert_bytes as f64))
        })
        .collect()
}

/// One slot count's JSON object (see `--json`).
fn row_json(
    slots: usize,
    served: &[(PolicyKind, Served)],
    args: &ReplayArgs,
    tokens: u64,
    expert_bytes: u64,
) -> Value {
    let fractions: Map<String, Value> = served
        .iter()
        .map(|(k, s)| (k.name().to_string(), json!(s.fraction())))
        .collect();
    let mut row = json!({
        "slots": slots,
        "policies": fractions,
        "loads_per_token": per_token(served, tokens, 1),
        "bytes_per_token": per_token(served, tokens, expert_bytes),
        "expert_bytes": expert_bytes,
    });
    if args.prefetch_budget > 0 {
        let used: Map<String, Value> = served
            .iter()
            .filter(|(_, s)| s.prefetched > 0)
            .map(|(k, s)| {
                let used = s.prefetch_used as f64 / s.prefetched as f64;
                (k.name().to_string(), json!(used))
            })
            .collect();
        let recall = served.iter().find_map(|(_, s)| s.recall());
        row["prefetch"] = json!({
            "budget": args.prefetch_budget,
            "predictor": "co-occurrence",
            "recall": recall,
            "used": used,
        });
    }
    row
}

/// The text report: the trace, then per slot count each policy's served fraction, loads per
/// token and MiB moved per token (and, with prefetch, the predictor's recall).
fn print_table(
    args: &ReplayArgs,
    trace: &Trace,
    source: &str,
    rows: &[(usize, Vec<(PolicyKind, Served)>)],
    expert_bytes: u64,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "trace: {source}\n{} tokens, {} layers, {} experts, top-{}; served fraction = routed slots \
         served from the fast store / all {} routed slots; loads = experts copied into the fast \
         store (demand admissions + prefetches) per token, MiB at {expert_bytes} bytes each",
        trace.tokens(),
        trace.n_layers(),
        trace.n_experts(),
        trace.top_k(),
        trace.routed_slots()
    )?;
    if args.prefetch_budget > 0 {
        writeln!(
            out,
            "prefetch: up to {} loads per token per layer, one layer ahead, co-occurrence predictor",
            args.prefetch_budget
        )?;
    }
    write!(out, "{:>6} {:>9}", "slots", "")?;
    for kind in &args.policies {
        write!(out, " {:>7}", kind.name())?;
    }
    writeln!(out)?;
    let tokens = trace.tokens().max(1) as f64;
    let mib = expert_bytes as f64 / f64::from(1 << 20);
    for (slots, served) in rows {
        write!(out, "{slots:>6} {:>9}", "served")?;
        for (_, s) in served {
            write!(out, " {:>7.4}", s.fraction())?;
        }
        write!(out, "\n{:>6} {:>9}", "", "loads/tok")?;
        for (_, s) in served {
            write!(out, " {:>7.2}", s.loads() as f64 / tokens)?;
        }
        write!(out, "\n{:>6} {:>9}", "", "MiB/tok")?;
        for (_, s) in served {
            write!(out, " {:>7.1}", s.loads() as f64 / tokens * mib)?;
        }
        writeln!(out)?;
        if let Some(recall) = served.iter().find_map(|(_, s)| s.recall()) {
            writeln!(out, "{:>6} {:>9} {recall:>7.4}", "", "recall")?;
        }
    }
    Ok(())
}
