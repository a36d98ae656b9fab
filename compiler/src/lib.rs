//! `aubier-compiler`: the IR of the model (a petgraph `StableDiGraph`), the op table, the pass
//! pipeline and the [`plan::Plan`] every backend executes. It knows nothing of files, devices or
//! HTTP (ARCHITECTURE.md § compiler); [`ggml_type`] is the ggml type table (block sizes and bytes)
//! the plan's weights are typed by, shared with the kernel emitters and the runtime.
//!
//! Pipeline: `build` (the `model!` description → [`ir::Graph`]) then each pass of
//! [`passes::PASSES`] in order, the verifier running after every stage, then
//! [`schedule::schedule`] → [`plan::Plan`]. [`compile_stages`] keeps the graph after each stage
//! for `aubier gen --dump-after`. The fusion passes (`fuse_kqkv`, `fuse_phase`, `fuse_wkb`) run
//! only when their [`Fusion`] flag resolves on ([`CompileOptions::resolve_fusions`]); a pass that
//! does not run leaves no trace, so the plan is byte for byte that of a pipeline without it.

extern crate self as aubier_compiler;

pub mod builder;
pub mod config;
pub mod error;
pub mod ggml_type;
pub mod infer;
pub mod ir;
pub mod model;
pub mod ops;
pub mod passes;
pub mod plan;
pub mod schedule;
pub mod types;
pub mod verify;

pub use aubier_dsl::model;
pub use error::CompileError;

use config::Mistral4Config;
use ir::Graph;
use plan::Plan;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use types::WeightRef;

/// Name of the first stage: the graph exactly as the description builds it.
pub const BUILD_STAGE: &str = "build";

/// Every stage name, in pipeline order (`build`, then each pass, the fusion passes included
/// whether or not a given configuration runs them).
pub fn stage_names() -> Vec<&'static str> {
    std::iter::once(BUILD_STAGE)
        .chain(passes::PASSES.iter().map(|p| p.name))
        .collect()
}

/// Setting of one fusion pass (`--fuse-phase|--fuse-wkb|--fuse-kqkv auto|on|off`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fusion {
    /// On when the [`Target`] executes that fused step ([`Target::fuses`]).
    #[default]
    Auto,
    /// Run the pass; [`CompileError::FusionNoMatch`] when it matches nothing in a graph that has
    /// attention.
    On,
    /// Do not run the pass.
    Off,
}

/// The kind of backend a plan is compiled for; it decides what [`Fusion::Auto`] means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// The cranelift CPU oracle (`aubier_kernels_gen::cpu`), which lowers unfused plans only.
    #[default]
    Oracle,
    /// The CPU backend of hand-written kernels: latent attention fused (`kqkv`), the rest
    /// unfused.
    Cpu,
    /// A GPU backend of generated kernels, which executes every fused step.
    Gpu,
}

impl Target {
    /// Whether `Auto` turns on the fusion pass of `flag` for this target: every fusion for
    /// [`Target::Gpu`], KQKV for [`Target::Cpu`], none for [`Target::Oracle`].
    pub fn fuses(self, flag: FusionFlag) -> bool {
        match self {
            Target::Oracle => false,
            Target::Cpu => flag == FusionFlag::Kqkv,
            Target::Gpu => true,
        }
    }
}

/// The fusion pass a [`Fusion`] flag of [`CompileOptions`] governs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusionFlag {
    /// `fuse_phase` ([`passes::fuse_phase`]).
    Phase,
    /// `fuse_wkb` ([`passes::fuse_wkb`]).
    Wkb,
    /// `fuse_kqkv` ([`passes::fuse_kqkv`]).
    Kqkv,
}

impl FusionFlag {
    /// The pass's stage name.
    pub fn stage(self) -> &'static str {
        match self {
            FusionFlag::Phase => "fuse_phase",
            FusionFlag::Wkb => "fuse_wkb",
            FusionFlag::Kqkv => "fuse_kqkv",
        }
    }

    /// The flag's setting in `opts`.
    pub fn setting(self, opts: &CompileOptions) -> Fusion {
        match self {
            FusionFlag::Phase => opts.fuse_phase,
            FusionFlag::Wkb => opts.fuse_wkb,
            FusionFlag::Kqkv => opts.fuse_kqkv,
        }
    }
}

/// Options of [`compile`]. The default (the oracle's target, every fusion `Auto`) runs no fusion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CompileOptions {
    /// Passes to skip, by stage name (`cse`, `dce`, or a fusion pass, which is then off);
    /// `build` cannot be skipped.
    pub disable: Vec<String>,
    /// The backend the plan is for (resolves `Auto`).
    pub target: Target,
    /// PHASE: RoPE, query temperature, c_kv RMSNorm and the latent-cache write as one `phase`.
    pub fuse_phase: Fusion,
    /// WKB: the absorbed per-head projections as `wkb` nodes.
    pub fuse_wkb: Fusion,
    /// KQKV: latent attention as one `kqkv`.
    pub fuse_kqkv: Fusion,
    /// Adds the `predicted_ids.{L}` outputs of [`passes::predict_experts`] (layer `L`'s router on
    /// the residual before its attention, for every MoE layer `L ≥ 1`); off by default. Left out
    /// of the serialized options when off, so that the default's form is unchanged.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub predict_experts: bool,
    /// How many layers ahead [`passes::predict_experts`] predicts: layer `L`'s router on the
    /// residual before layer `max(L − lead + 1, 1)`'s attention, so that `lead` layers run
    /// between a prediction and its experts (its module note). 1 (the default) is the residual
    /// at the end of layer `L − 1`; at most the layer count ([`CompileError::PrefetchLead`]
    /// otherwise, and for 0). Left out of the serialized options when 1.
    #[serde(skip_serializing_if = "is_one")]
    pub prefetch_lead: usize,
}

/// Whether `n` is 1 (the default [`CompileOptions::prefetch_lead`], left out of the JSON form).
fn is_one(n: &usize) -> bool {
    *n == 1
}

impl Default for CompileOptions {
    /// The oracle's target, every fusion `Auto`, nothing disabled, no expert prediction (lead 1
    /// when it is turned on).
    fn default() -> Self {
        CompileOptions {
            disable: Vec::new(),
            target: Target::default(),
            fuse_phase: Fusion::default(),
            fuse_wkb: Fusion::default(),
            fuse_kqkv: Fusion::default(),
            predict_experts: false,
            prefetch_lead: 1,
        }
    }
}

/// Whether each fusion pass runs, once `Auto` is resolved against the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedFusions {
    /// `fuse_phase` runs.
    pub phase: bool,
    /// `fuse_wkb` runs.
    pub wkb: bool,
    /// `fuse_kqkv` runs.
    pub kqkv: bool,
}

impl ResolvedFusions {
    /// Whether the pass of `flag` runs.
    pub fn get(&self, flag: FusionFlag) -> bool {
        match flag {
            FusionFlag::Phase => self.phase,
            FusionFlag::Wkb => self.wkb,
            FusionFlag::Kqkv => self.kqkv,
        }
    }
}

impl CompileOptions {
    /// Resolves the three flags: `On` runs the pass, `Off` (or naming it in `disable`) does not,
    /// `Auto` runs it when [`Target::fuses`] says so. PHASE needs KQKV (a `phase` replaces the cache
    /// write only when every reader of the cache is a `kqkv`), so `fuse_phase` `Auto` is off
    /// whenever KQKV is.
    ///
    /// Errors: [`CompileError::FusionOptions`] when a pass is both `On` and disabled, or
    /// `fuse_phase` is `On` while KQKV does not run.
    pub fn resolve_fusions(&self) -> Result<ResolvedFusions, CompileError> {
        let runs = |flag: FusionFlag| -> Result<bool, CompileError> {
            let disabled = self.disable.iter().any(|d| d == flag.stage());
            match flag.setting(self) {
                Fusion::On if disabled => Err(CompileError::FusionOptions {
                    detail: format!("`{}` is set on and also disabled", flag.stage()),
                }),
                Fusion::On => Ok(true),
                Fusion::Off => Ok(false),
                Fusion::Auto => Ok(self.target.fuses(flag) && !disabled),
            }
        };
        let kqkv = runs(FusionFlag::Kqkv)?;
        let wkb = runs(FusionFlag::Wkb)?;
        let phase = runs(FusionFlag::Phase)?;
        if phase && !kqkv && self.fuse_phase == Fusion::On {
            return Err(CompileError::FusionOptions {
                detail: "`fuse_phase` is on but `fuse_kqkv` is off: a phase writes the latent \
                         cache with no cache value for unfused attention to read"
                    .to_string(),
            });
        }
        Ok(ResolvedFusions {
            phase: phase && kqkv,
            wkb,
            kqkv,
        })
    }
}

/// The graph after one stage.
#[derive(Clone, Debug)]
pub struct StageGraph {
    /// Stage name.
    pub name: String,
    /// Nodes the stage changed or removed (0 for `build`).
    pub changed: usize,
    /// The verified graph after the stage.
    pub graph: Graph,
}

/// Output format of [`dump_after`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpFormat {
    /// One node per line ([`Graph::to_text`]).
    Text,
    /// Graphviz DOT ([`Graph::to_dot`]).
    Dot,
}

fn check_options(opts: &CompileOptions, cfg: &Mistral4Config) -> Result<(), CompileError> {
    if opts.prefetch_lead == 0 || opts.prefetch_lead > cfg.n_layer {
        return Err(CompileError::PrefetchLead {
            lead: opts.prefetch_lead,
            n_layer: cfg.n_layer,
        });
    }
    let names = stage_names();
    for d in &opts.disable {
        if d == BUILD_STAGE {
            return Err(CompileError::MandatoryStage { name: d.clone() });
        }
        if !names.contains(&d.as_str()) {
            return Err(CompileError::UnknownStage {
                name: d.clone(),
                known: names.join(", "),
            });
        }
    }
    Ok(())
}

/// Builds the Mistral Small 4 graph for `cfg` over `weights` and runs the enabled passes,
/// verifying after each; `each` sees every stage's name, change count and graph.
fn run_pipeline(
    cfg: &Mistral4Config,
    weights: &BTreeMap<String, WeightRef>,
    opts: &CompileOptions,
    mut each: impl FnMut(&str, usize, &Graph),
) -> Result<(Graph, Vec<String>), CompileError> {
    check_options(opts, cfg)?;
    let fusions = opts.resolve_fusions()?;
    let mut g = model::mistral4::build_graph(cfg, weights)?;
    each(BUILD_STAGE, 0, &g);
    let mut stages = vec![BUILD_STAGE.to_string()];
    stages.extend(run_passes(&mut g, opts, fusions, each)?);
    Ok((g, stages))
}

/// Runs the passes of [`passes::PASSES`] that `opts` and `fusions` enable on `g`, verifying
/// after each; returns their names in order. A fusion set `On` that changes nothing in a graph
/// with a latent-cache write (attention) is an error.
fn run_passes(
    g: &mut Graph,
    opts: &CompileOptions,
    fusions: ResolvedFusions,
    mut each: impl FnMut(&str, usize, &Graph),
) -> Result<Vec<String>, CompileError> {
    let has_attention = g.count_op(ops::Op::CacheWrite) > 0;
    let mut stages = Vec::new();
    for pass in passes::PASSES {
        let runs = match pass.flag {
            Some(flag) => fusions.get(flag),
            None => {
                pass.opt_in.is_none_or(|on| on(opts))
                    && !opts.disable.iter().any(|d| d == pass.name)
            }
        };
        if !runs {
            continue;
        }
        let changed = (pass.run)(g, opts)?;
        let forced = pass.flag.is_some_and(|f| f.setting(opts) == Fusion::On);
        if forced && changed == 0 && has_attention {
            return Err(CompileError::FusionNoMatch { pass: pass.name });
        }
        verify::verify(g).map_err(|source| CompileError::Verify {
            stage: pass.name.to_string(),
            source,
        })?;
        each(pass.name, changed, g);
        stages.push(pass.name.to_string());
    }
    Ok(stages)
}

/// Compiles Mistral Small 4 for `cfg` over the GGUF weight map `weights` (tensor name →
/// [`WeightRef`]) into a [`Plan`]. The same inputs always give the same plan, byte for byte in
/// its JSON form.
///
/// Errors: [`CompileError::MissingWeight`] / [`CompileError::Infer`] for a file that lacks a
/// tensor or has one of the wrong `ne`; [`CompileError::UnknownStage`] /
/// [`CompileError::MandatoryStage`] / [`CompileError::FusionOptions`] /
/// [`CompileError::PrefetchLead`] for bad `opts`;
/// [`CompileError::FusionNoMatch`] for a fusion set `On` that finds nothing to fuse;
/// [`CompileError::Verify`] when a pass breaks the IR (a compiler bug).
pub fn compile(
    cfg: &Mistral4Config,
    weights: &BTreeMap<String, WeightRef>,
    opts: &CompileOptions,
) -> Result<Plan, CompileError> {
    let (g, stages) = run_pipeline(cfg, weights, opts, |_, _, _| {})?;
    schedule::schedule(&g, cfg, stages)
}

/// Compiles a graph the caller built or edited (e.g. [`model::mistral4::build_graph`] with a node
/// rewired) exactly as [`compile`] compiles the description's: the verifier, then the passes
/// `opts` enable, then the schedule. This is the path of "edit the graph, regenerate the kernels".
///
/// Errors: [`CompileError::Verify`] naming stage `build` when `g` itself is not well formed
/// (a dangling operand, a type that does not re-infer), and those of [`compile`].
pub fn compile_graph(
    mut g: Graph,
    cfg: &Mistral4Config,
    opts: &CompileOptions,
) -> Result<Plan, CompileError> {
    check_options(opts, cfg)?;
    let fusions = opts.resolve_fusions()?;
    verify::verify(&g).map_err(|source| CompileError::Verify {
        stage: BUILD_STAGE.to_string(),
        source,
    })?;
    let mut stages = vec![BUILD_STAGE.to_string()];
    stages.extend(run_passes(&mut g, opts, fusions, |_, _, _| {})?);
    schedule::schedule(&g, cfg, stages)
}

/// Like [`compile`] but returns the graph after every stage that ran, in order.
///
/// Errors: as [`compile`].
pub fn compile_stages(
    cfg: &Mistral4Config,
    weights: &BTreeMap<String, WeightRef>,
    opts: &CompileOptions,
) -> Result<Vec<StageGraph>, CompileError> {
    let mut out = Vec::new();
    run_pipeline(cfg, weights, opts, |name, changed, g| {
        out.push(StageGraph {
            name: name.to_string(),
            changed,
            graph: g.clone(),
        })
    })?;
    Ok(out)
}

/// The graph after stage `stage`, as text or DOT.
///
/// Errors: [`CompileError::UnknownStage`] when no such stage exists (or it was disabled), and
/// those of [`compile`].
pub fn dump_after(
    cfg: &Mistral4Config,
    weights: &BTreeMap<String, WeightRef>,
    opts: &CompileOptions,
    stage: &str,
    format: DumpFormat,
) -> Result<String, CompileError> {
    let stages = compile_stages(cfg, weights, opts)?;
    let known: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    let found =
        stages
            .iter()
            .find(|s| s.name == stage)
            .ok_or_else(|| CompileError::UnknownStage {
                name: stage.to_string(),
                known: known.join(", "),
            })?;
    Ok(match format {
        DumpFormat::Text => found.graph.to_text(),
        DumpFormat::Dot => found.graph.to_dot(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::Builder;
    use crate::types::{DType, Dim, Shape};

    /// Attention over a latent cache whose mask reads other positions than the write, so
    /// KQKV's legality condition fails (and PHASE and WKB have nothing of theirs to match).
    fn unfusable_attention() -> Graph {
        let ws = BTreeMap::new();
        let mut b = Builder::new(&ws);
        let t = |d: &[usize]| {
            Shape(
                std::iter::once(Dim::Tokens)
                    .chain(d.iter().map(|&n| Dim::Fixed(n)))
                    .collect(),
            )
        };
        let run = |b: &mut Builder<'_>| -> Result<(), CompileError> {
            let pos = b.input("pos", DType::I32, t(&[]))?;
            let pos2 = b.input("pos2", DType::I32, t(&[]))?;
            let kv = b.input("kv", DType::F32, t(&[6]))?;
            let q = b.input("q", DType::F32, t(&[2, 6]))?;
            let cache = b.cache_write(kv, pos, 0)?;
            let s = b.scores_qk(q, cache)?;
            let s = b.scale(s, 0.5)?;
            let m = b.causal_mask(s, pos2)?;
            let p = b.softmax(m)?;
            let o = b.weighted_sum(p, cache, 4)?;
            b.output("o", o)
        };
        run(&mut b).unwrap();
        b.finish().unwrap()
    }

    #[test]
    fn a_fusion_set_on_that_matches_nothing_is_an_error_and_auto_is_not() {
        let on = CompileOptions {
            fuse_kqkv: Fusion::On,
            ..CompileOptions::default()
        };
        let mut g = unfusable_attention();
        let err = run_passes(&mut g, &on, on.resolve_fusions().unwrap(), |_, _, _| {});
        assert!(
            matches!(err, Err(CompileError::FusionNoMatch { pass: "fuse_kqkv" })),
            "{err:?}"
        );
        let auto = CompileOptions {
            target: Target::Gpu,
            ..CompileOptions::default()
        };
        let mut g = unfusable_attention();
        let stages = run_passes(&mut g, &auto, auto.resolve_fusions().unwrap(), |_, _, _| {});
        assert_eq!(
            stages.unwrap(),
            [
                "cse",
                "fuse_kqkv",
                "fuse_phase",
                "fuse_wkb",
                "dce",
                "mark_head"
            ]
        );
        assert_eq!(g.count_op(ops::Op::Kqkv), 0);
    }
}
