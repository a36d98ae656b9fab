//! `aubier quality`: the quality instrument (ARCHITECTURE.md § Numerics policy). It compares two
//! model configurations, A and B, on the same tokens by their teacher-forced negative
//! log-likelihoods, and says whether B is BETTER, WORSE, EQUIVALENT (within a margin) or whether
//! the text is too short to tell (INSUFFICIENT).
//!
//! Algorithm.
//! 1. Tokens: `--text FILE` tokenized with the file's tokenizer (BOS first when the file says
//!    so), or `--ids FILE` (token ids separated by commas or whitespace); cut to `--max-tokens`
//!    (default: the session's KV capacity, `min(context_length, 4096)`).
//! 2. For each configuration (its flags parsed like command-line flags, [`ModelFlags`]): load the
//!    model, open one session, and prefill the tokens in chunks of `--chunk` tokens with
//!    `Session::step`, which returns the logits of every position; position `i` scores token
//!    `i + 1`: `NLL_i = logsumexp(logits_i) − logits_i[t_{i+1}]` (in f64, the runtime's `sampler::logsumexp`; a NaN logit is an error), for `i = 0 .. T−2`.
//! 3. Paired differences `d_i = NLL_B,i − NLL_A,i`; their mean `d̄`, sample standard deviation `s`
//!    and the 95% confidence interval of the mean by the **paired t** method:
//!    `d̄ ± t_{0.975, n−1} · s / √n` (Student's t quantile from `statrs`). Positions of one text
//!    are not independent (the errors are autocorrelated), so the interval is optimistic; use
//!    long texts.
//! 4. Verdict, in this order: fewer than 2 positions → INSUFFICIENT; the whole interval inside
//!    `[−margin, +margin]` → EQUIVALENT; the interval below 0 → BETTER (B assigns the text a
//!    higher likelihood); above 0 → WORSE; otherwise INSUFFICIENT.

use crate::progress::Steps;
use crate::receipt::{Measured, ReceiptFile};
use anyhow::{bail, Context};
use aubier_runtime::engine::Model;
use aubier_runtime::gguf::{GgufFile, MetaValue};
use aubier_runtime::model::{read_config, weight_refs};
use aubier_runtime::progress::{Count, Progress};
use aubier_runtime::sampler::logsumexp;
use aubier_runtime::session::SessionOptions;
use aubier_runtime::store::expert_store::StoreOptions;
use aubier_runtime::store::FastBudget;
use aubier_runtime::text::tokenizer::Tokenizer;
use clap::{Args, Parser};
use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A metadata override: `KEY=TYPE:VALUE` as llama.cpp's `--override-kv` spells it, TYPE one of
/// `int`, `float`, `bool`, `str`.
#[derive(Clone, Debug, PartialEq)]
pub struct KvOverride {
    /// The metadata key (`mistral4.expert_used_count`).
    pub key: String,
    /// The new value.
    pub value: OverrideValue,
}

/// The value of a [`KvOverride`].
#[derive(Clone, Debug, PartialEq)]
pub enum OverrideValue {
    /// `int:N`.
    Int(i64),
    /// `float:X`.
    Float(f64),
    /// `bool:true|false`.
    Bool(bool),
    /// `str:TEXT`.
    Str(String),
}

/// Parses `KEY=TYPE:VALUE`. Errors name the part that is wrong.
pub fn parse_kv_override(s: &str) -> Result<KvOverride, String> {
    let (key, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected KEY=TYPE:VALUE"))?;
    let (ty, val) = rest
        .split_once(':')
        .ok_or_else(|| format!("`{s}`: expected KEY=TYPE:VALUE"))?;
    if key.is_empty() {
        return Err(format!("`{s}`: empty key"));
    }
    let bad = |what: &str| format!("`{s}`: `{val}` is not {what}");
    let value = match ty {
        "int" => OverrideValue::Int(val.parse().map_err(|_| bad("an integer"))?),
        "float" => OverrideValue::Float(val.parse().map_err(|_| bad("a number"))?),
        "bool" => OverrideValue::Bool(match val {
            "true" => true,
            "false" => false,
            _ => return Err(bad("true or false")),
        }),
        "str" => OverrideValue::Str(val.to_owned()),
        other => {
            return Err(format!(
                "`{s}`: unknown type `{other}` (int, float, bool or str)"
            ));
        }
    };
    Ok(KvOverride {
        key: key.to_owned(),
        value,
    })
}

/// The model-loading flags of one configuration (`aubier quality --a/--b`).
#[derive(Args, Clone, Debug, Default, PartialEq)]
pub struct ModelFlags {
    /// Override a metadata key before the model's config is read, as llama.cpp does:
    /// KEY=TYPE:VALUE with TYPE int, float, bool or str (e.g.
    /// `mistral4.expert_used_count=int:2`). Repeatable.
    #[arg(long = "override-kv", value_name = "KEY=TYPE:VALUE", value_parser = parse_kv_override)]
    pub override_kv: Vec<KvOverride>,
    /// The backend of this configuration.
    #[command(flatten)]
    pub backend: crate::run::BackendArgs,
}

/// A configuration string parsed as command-line flags.
#[derive(Parser, Debug)]
#[command(no_binary_name = true, disable_help_flag = true)]
struct ConfigLine {
    #[command(flatten)]
    flags: ModelFlags,
}

impl ModelFlags {
    /// Parses flags from one string, split at whitespace (`"--override-kv K=int:2"`).
    ///
    /// Errors: clap's message for an unknown flag or a bad value.
    pub fn parse_line(line: &str) -> anyhow::Result<ModelFlags> {
        match ConfigLine::try_parse_from(line.split_whitespace()) {
            Ok(c) => Ok(c.flags),
            // One line: clap's usage block named the library's binary (`aubier-server`).
            Err(e) => {
                let text = e.render().to_string();
                let parts: Vec<&str> = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| {
                        !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more")
                    })
                    .collect();
                anyhow::bail!("{}", parts.join("; ").trim_start_matches("error: "))
            }
        }
    }

    /// Loads `path` with these flags: opens the GGUF, applies the overrides to its metadata
    /// (an integer or float override keeps the key's existing type), then reads the config,
    /// compiles the plan for the configuration's backend and binds it as `Model::load_with`
    /// does.
    ///
    /// Errors: the file, an override of a key the file does not have (a misspelt key would
    /// otherwise change nothing) or that does not fit the key's type, the model binding.
    pub fn load(&self, path: &Path) -> anyhow::Result<Arc<Model>> {
        let mut file =
            GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
        for o in &self.override_kv {
            let Some(existing) = file.get(&o.key) else {
                bail!(
                    "--override-kv {}: {} has no such key (an override replaces a key's value; \
                     `aubier inspect` lists them)",
                    o.key,
                    path.display()
                );
            };
            let value = override_value(existing, &o.value)
                .with_context(|| format!("--override-kv {}", o.key))?;
            file.set_metadata(&o.key, value);
        }
        let config = read_config(&file)?;
        let refs = weight_refs(&file, &config)?;
        let backend = self.backend.spec()?.make()?;
        let opts = aubier_compiler::CompileOptions {
            target: backend.target(),
            ..aubier_compiler::CompileOptions::default()
        };
        let plan = aubier_compiler::compile(&config, &refs, &opts)?;
        let mut progress = crate::progress::Steps::load(path);
        let model = Model::from_plan_observed(
            Arc::new(file),
            config,
            plan,
            backend,
            FastBudget::Auto,
            &mut progress,
        )?;
        progress.done("loaded");
        Ok(model)
    }
}

/// The metadata value for an override of a key whose current value is `existing`: the same
/// type, or an error.
fn override_value(existing: &MetaValue, v: &OverrideValue) -> anyhow::Result<MetaValue> {
    use MetaValue as M;
    let range = |i: i64, ty: &str| anyhow::anyhow!("{i} does not fit the key's type {ty}");
    let not = |what: &str| anyhow::anyhow!("the key holds a {}, not {what}", existing.type_name());
    Ok(match (v, existing) {
        (OverrideValue::Int(i), e) => {
            let i = *i;
            match e {
                M::U8(_) => M::U8(u8::try_from(i).map_err(|_| range(i, "u8"))?),
                M::I8(_) => M::I8(i8::try_from(i).map_err(|_| range(i, "i8"))?),
                M::U16(_) => M::U16(u16::try_from(i).map_err(|_| range(i, "u16"))?),
                M::I16(_) => M::I16(i16::try_from(i).map_err(|_| range(i, "i16"))?),
                M::U32(_) => M::U32(u32::try_from(i).map_err(|_| range(i, "u32"))?),
                M::I32(_) => M::I32(i32::try_from(i).map_err(|_| range(i, "i32"))?),
                M::U64(_) => M::U64(u64::try_from(i).map_err(|_| range(i, "u64"))?),
                M::I64(_) => M::I64(i),
                _ => return Err(not("an integer")),
            }
        }
        (OverrideValue::Float(f), M::F64(_)) => M::F64(*f),
        (OverrideValue::Float(f), M::F32(_)) => M::F32(*f as f32),
        (OverrideValue::Float(_), _) => return Err(not("a float")),
        (OverrideValue::Bool(b), M::Bool(_)) => M::Bool(*b),
        (OverrideValue::Bool(_), _) => return Err(not("a bool")),
        (OverrideValue::Str(s), M::String(_)) => M::String(s.clone()),
        (OverrideValue::Str(_), _) => return Err(not("a string")),
    })
}

/// Arguments of `aubier quality`.
#[derive(Args, Debug)]
pub struct QualityArgs {
    /// GGUF file both configurations load (default: $AUBIER_MODEL, else the bundled
    /// models/ms4-tiny256-q2k.gguf of the binary's workspace, else ./models).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Flags of configuration A, as one string (e.g. "" for the defaults).
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    pub a: String,
    /// Flags of configuration B (e.g. "--override-kv mistral4.expert_used_count=int:2"); a
    /// `tokenizer.*` override is refused, as B scores A's tokens.
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    pub b: String,
    /// Text file to score, tokenized with the model's tokenizer.
    #[arg(long, required_unless_present = "ids", conflicts_with = "ids")]
    pub text: Option<PathBuf>,
    /// File of token ids to score, separated by commas or whitespace (used as given, no BOS added).
    #[arg(long)]
    pub ids: Option<PathBuf>,
    /// Equivalence margin on the mean NLL difference, in nats per token.
    #[arg(long, default_value_t = 0.01)]
    pub margin: f64,
    /// Score at most this many tokens (default and maximum: the session's KV capacity).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Tokens per prefill step.
    #[arg(long, default_value_t = 256)]
    pub chunk: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also write a receipt of the comparison to this file (`--json`'s object as its figures,
    /// with the command, commit, host and time; `src/receipt.rs`), for docs/bench/.
    #[arg(long)]
    pub receipt: Option<PathBuf>,
}

/// The verdict of a comparison (module doc, step 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    /// B's NLL is lower: the interval lies below 0 (and not inside the margin).
    Better,
    /// B's NLL is higher: the interval lies above 0 (and not inside the margin).
    Worse,
    /// The whole interval lies inside ±margin.
    Equivalent,
    /// The interval is too wide to decide, or there are fewer than 2 positions.
    Insufficient,
}

impl Verdict {
    /// The verdict as printed and in JSON (`"BETTER"`, `"WORSE"`, `"EQUIVALENT"`,
    /// `"INSUFFICIENT"`).
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Better => "BETTER",
            Verdict::Worse => "WORSE",
            Verdict::Equivalent => "EQUIVALENT",
            Verdict::Insufficient => "INSUFFICIENT",
        }
    }
}

/// Summary statistics of the paired differences.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PairedStats {
    /// Positions compared.
    pub n: usize,
    /// Mean of `d_i = NLL_B − NLL_A` (nats/token).
    pub mean: f64,
    /// Sample standard deviation of `d_i` (nats/token); 0 for n < 2.
    pub sd: f64,
    /// 95% interval of the mean (paired t), `None` for n < 2.
    pub ci95: Option<(f64, f64)>,
    /// The verdict for the margin.
    pub verdict: Verdict,
}

/// Paired-t statistics and the verdict for differences `d` and `margin` (module doc, steps 3–4).
pub fn paired_verdict(d: &[f64], margin: f64) -> PairedStats {
    let n = d.len();
    let mean = if n == 0 {
        0.0
    } else {
        d.iter().sum::<f64>() / n as f64
    };
    if n < 2 {
        return PairedStats {
            n,
            mean,
            sd: 0.0,
            ci95: None,
            verdict: Verdict::Insufficient,
        };
    }
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let sd = var.sqrt();
    let t = StudentsT::new(0.0, 1.0, (n - 1) as f64)
        .map(|dist| dist.inverse_cdf(0.975))
        .unwrap_or(f64::NAN);
    let half = t * sd / (n as f64).sqrt();
    let (lo, hi) = (mean - half, mean + half);
    let verdict = if !(lo.is_finite() && hi.is_finite()) {
        Verdict::Insufficient
    } else if -margin <= lo && hi <= margin {
        Verdict::Equivalent
    } else if hi < 0.0 {
        Verdict::Better
    } else if lo > 0.0 {
        Verdict::Worse
    } else {
        Verdict::Insufficient
    };
    PairedStats {
        n,
        mean,
        sd,
        ci95: Some((lo, hi)),
        verdict,
    }
}

/// Teacher-forced NLL of `tokens[i + 1]` at every position `i` (nats), prefilled in chunks, the
/// model's backend, prompt passes of at most `ubatch` tokens
/// ([`aubier_runtime::session::Session::set_ubatch`]); the prefill's progress in tokens on
/// stderr ([`Steps`]).
///
/// Errors: a `chunk` of 0, an id outside the vocabulary (checked before anything runs, with its
/// position), a position whose logits give no finite NLL (NaN or infinite logits), the session
/// (KV capacity, execution).
pub fn teacher_forced_nll(
    model: Arc<Model>,
    ubatch: usize,
    tokens: &[u32],
    chunk: usize,
) -> anyhow::Result<Vec<f64>> {
    if chunk == 0 {
        bail!("--chunk must be at least 1 token");
    }
    let n_vocab = model.config.n_vocab;
    if let Some((i, id)) = tokens
        .iter()
        .enumerate()
        .find(|&(_, &id)| id as usize >= n_vocab)
    {
        bail!("token {i} of the input is id {id}, outside the vocabulary of {n_vocab}");
    }
    let mut session = crate::progress::open_session(
        model,
        SessionOptions {
            kv_max: tokens.len().max(1),
        },
        &StoreOptions::default(),
    )?;
    session.set_ubatch(ubatch);
    let mut progress = Steps::new("scoring");
    progress.step(
        "teacher-forced prefill",
        Count::Items(tokens.len() as u64, "tokens"),
    );
    let mut nll = Vec::with_capacity(tokens.len().saturating_sub(1));
    for (c, part) in tokens.chunks(chunk).enumerate() {
        let logits = session.step(part)?;
        progress.advance(part.len() as u64);
        for (j, row) in logits.chunks_exact(n_vocab).enumerate() {
            let i = c * chunk + j;
            let Some(&next) = tokens.get(i + 1) else {
                break;
            };
            let v = logsumexp(row) - f64::from(row[next as usize]);
            if !v.is_finite() || row.iter().any(|x| x.is_nan()) {
                bail!("position {i}: the logits give no finite NLL (NaN or infinite logits)");
            }
            nll.push(v);
        }
    }
    progress.done("scored");
    Ok(nll)
}

/// Runs `aubier quality`.
pub fn run(args: QualityArgs) -> anyhow::Result<()> {
    let flags_a = ModelFlags::parse_line(&args.a).context("--a")?;
    let flags_b = ModelFlags::parse_line(&args.b).context("--b")?;
    if let Some(o) = flags_b
        .override_kv
        .iter()
        .find(|o| o.key.starts_with("tokenizer."))
    {
        bail!(
            "--b: --override-kv {} would change nothing: both configurations score the same \
             tokens, A's (override a tokenizer key in --a to change the tokenization)",
            o.key
        );
    }
    if !(args.margin >= 0.0 && args.margin.is_finite()) {
        bail!("--margin must be a finite number ≥ 0");
    }
    let path = crate::model_file::resolve_model(args.model.as_deref())?;
    let receipt = args
        .receipt
        .as_deref()
        .map(ReceiptFile::create)
        .transpose()?;
    let model_a = flags_a.load(&path).context("configuration A")?;
    let mut tokens = match (&args.text, &args.ids) {
        (_, Some(path)) => read_ids(path)?,
        (Some(path), None) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let tok = Tokenizer::from_gguf(&model_a.file)
                .context("--text needs the model's tokenizer; use --ids")?;
            let mut ids = Vec::new();
            if model_a
                .file
                .get("tokenizer.ggml.add_bos_token")
                .and_then(MetaValue::as_bool)
                .unwrap_or(true)
            {
                ids.push(tok.bos_id());
            }
            ids.extend(tok.encode(&text)?);
            ids
        }
        (None, None) => bail!("give --text FILE or --ids FILE"),
    };
    let capacity = SessionOptions::for_config(&model_a.config).kv_max;
    let limit = match args.max_tokens {
        Some(m) if m > model_a.config.n_ctx_train => bail!(
            "--max-tokens {m} exceeds the model's context_length {}",
            model_a.config.n_ctx_train
        ),
        Some(m) => m,
        None => capacity,
    };
    let total = tokens.len();
    tokens.truncate(limit);
    if tokens.len() < 2 {
        // Position i scores token i + 1: no position, no NLL (it printed NaN and exited 0).
        let input = args
            .text
            .as_ref()
            .or(args.ids.as_ref())
            .map_or_else(String::new, |p| p.display().to_string());
        match args.max_tokens {
            Some(m) if m < total => bail!(
                "--max-tokens {m} leaves {} token(s) of {input}: scoring needs at least 2 \
                 (each position scores the next token)",
                tokens.len()
            ),
            _ => bail!(
                "{input} has {total} token(s){}: scoring needs at least 2 (each position \
                 scores the next token)",
                if args.text.is_some() {
                    ", BOS included"
                } else {
                    ""
                }
            ),
        }
    }
    let nll_a = teacher_forced_nll(model_a, flags_a.backend.ubatch, &tokens, args.chunk)
        .context("configuration A")?;
    let model_b = flags_b.load(&path).context("configuration B")?;
    let nll_b = teacher_forced_nll(model_b, flags_b.backend.ubatch, &tokens, args.chunk)
        .context("configuration B")?;
    let d: Vec<f64> = nll_b.iter().zip(&nll_a).map(|(b, a)| b - a).collect();
    let stats = paired_verdict(&d, args.margin);
    let mean = |v: &[f64]| {
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let (mean_a, mean_b) = (mean(&nll_a), mean(&nll_b));
    let v = serde_json::json!({
            "model": path.display().to_string(),
            "tokens": tokens.len(),
            "tokens_in_input": total,
            "positions": stats.n,
            "a": { "flags": args.a, "mean_nll": mean_a },
            "b": { "flags": args.b, "mean_nll": mean_b },
            "mean_diff": stats.mean,
            "sd_diff": stats.sd,
            "ci95": stats.ci95.map(|(lo, hi)| [lo, hi]),
            "ci_method": "paired t",
            "margin": args.margin,
            "verdict": stats.verdict,
    });
    if args.json {
        outln!("{v}");
    } else {
        outln!(
            "{} tokens scored ({} in the input), {} positions",
            tokens.len(),
            total,
            stats.n
        );
        outln!("A [{}]: mean NLL {mean_a:.6} nats/token", args.a);
        outln!("B [{}]: mean NLL {mean_b:.6} nats/token", args.b);
        match stats.ci95 {
            Some((lo, hi)) => outln!(
                "NLL_B − NLL_A: mean {:+.6}, sd {:.6}, 95% CI [{lo:+.6}, {hi:+.6}] (paired t), margin ±{}",
                stats.mean, stats.sd, args.margin
            ),
            None => outln!("NLL_B − NLL_A: fewer than 2 positions, no interval"),
        }
        outln!("verdict: {}", stats.verdict.name());
    }
    if let Some(file) = receipt {
        file.write(&Measured {
            kind: "quality",
            backend: None,
            device: None,
            model: Some(path.display().to_string()),
            peer: None,
            figures: v,
        })?;
    }
    Ok(())
}

/// Reads token ids separated by commas and/or whitespace.
fn read_ids(path: &Path) -> anyhow::Result<Vec<u32>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .with_context(|| format!("{}: `{s}` is not a token id", path.display()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_syntax() {
        assert_eq!(
            parse_kv_override("mistral4.expert_used_count=int:2"),
            Ok(KvOverride {
                key: "mistral4.expert_used_count".into(),
                value: OverrideValue::Int(2)
            })
        );
        assert_eq!(
            parse_kv_override("a.b=str:x:y").unwrap().value,
            OverrideValue::Str("x:y".into())
        );
        assert_eq!(
            parse_kv_override("k=float:0.5").unwrap().value,
            OverrideValue::Float(0.5)
        );
        for bad in ["k", "k=int", "=int:1", "k=int:x", "k=bool:yes", "k=u32:1"] {
            assert!(parse_kv_override(bad).is_err(), "{bad}");
        }
        let f = ModelFlags::parse_line("--override-kv a=int:1 --override-kv b=bool:true").unwrap();
        assert_eq!(f.override_kv.len(), 2);
        assert!(ModelFlags::parse_line("--no-such-flag").is_err());
        assert_eq!(ModelFlags::parse_line("").unwrap(), ModelFlags::default());
    }

    #[test]
    fn overrides_keep_the_key_type_and_refuse_misfits() {
        use MetaValue as M;
        let v = override_value(&M::U32(4), &OverrideValue::Int(2)).unwrap();
        assert_eq!(v, M::U32(2));
        assert!(override_value(&M::U32(4), &OverrideValue::Int(-1)).is_err());
        assert!(override_value(&M::String("x".into()), &OverrideValue::Int(1)).is_err());
        assert_eq!(
            override_value(&M::I64(7), &OverrideValue::Int(-3)).unwrap(),
            M::I64(-3)
        );
        assert_eq!(
            override_value(&M::F32(1.0), &OverrideValue::Float(0.25)).unwrap(),
            M::F32(0.25)
        );
        assert!(override_value(&M::Bool(true), &OverrideValue::Float(0.25)).is_err());
    }

    /// Known answers, independent of the model: the t quantile for df = 9 is 2.262157 (tables).
    #[test]
    fn paired_t_interval_and_verdicts() {
        let zeros = paired_verdict(&[0.0; 10], 0.01);
        assert_eq!(zeros.ci95, Some((0.0, 0.0)));
        assert_eq!(zeros.verdict, Verdict::Equivalent);

        // d = 1..10: mean 5.5, sd = sqrt(55/6) = 3.02765, half = 2.262157 * 3.02765 / sqrt(10).
        let d: Vec<f64> = (1..=10).map(f64::from).collect();
        let s = paired_verdict(&d, 0.01);
        let half = 2.262_157 * (55.0f64 / 6.0).sqrt() / 10f64.sqrt();
        let (lo, hi) = s.ci95.unwrap();
        assert!((lo - (5.5 - half)).abs() < 1e-5 && (hi - (5.5 + half)).abs() < 1e-5);
        assert_eq!(s.verdict, Verdict::Worse);
        let neg: Vec<f64> = d.iter().map(|x| -x).collect();
        assert_eq!(paired_verdict(&neg, 0.01).verdict, Verdict::Better);
        assert_eq!(
            paired_verdict(&[-1.0, 1.0, -1.0, 1.0], 0.01).verdict,
            Verdict::Insufficient
        );
        assert_eq!(paired_verdict(&[0.5], 0.01).verdict, Verdict::Insufficient);
        assert_eq!(paired_verdict(&[], 0.01).verdict, Verdict::Insufficient);
        for v in [
            Verdict::Better,
            Verdict::Worse,
            Verdict::Equivalent,
            Verdict::Insufficient,
        ] {
            assert_eq!(serde_json::to_value(v).unwrap(), v.name());
        }
        // Significant but tiny: inside the margin wins.
        let tiny: Vec<f64> = (0..100).map(|i| 0.001 + 1e-5 * f64::from(i % 2)).collect();
        assert_eq!(paired_verdict(&tiny, 0.01).verdict, Verdict::Equivalent);
    }
}
