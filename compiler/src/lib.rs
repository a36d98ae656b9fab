//! `aubier-compiler`: the IR of the model (a petgraph `StableDiGraph`), the op table, the pass
//! pipeline and the [`plan::Plan`] every backend executes. It knows nothing of files, devices or
//! HTTP (ARCHITECTURE.md § compiler).
//!
//! Pipeline: `build` (the `model!` description → [`ir::Graph`]) then each pass of
//! [`passes::PASSES`] in order, the verifier running after every stage, then
//! [`schedule::schedule`] → [`plan::Plan`]. [`compile_stages`] keeps the graph after each stage
//! for `aubier gen --dump-after`.

extern crate self as aubier_compiler;

pub mod builder;
pub mod config;
pub mod error;
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

/// Every stage name, in pipeline order (`build`, then each pass).
pub fn stage_names() -> Vec<&'static str> {
    std::iter::once(BUILD_STAGE)
        .chain(passes::PASSES.iter().map(|p| p.name))
        .collect()
}

/// Options of [`compile`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileOptions {
    /// Passes to skip, by stage name (`cse`, `dce`); `build` cannot be skipped.
    pub disable: Vec<String>,
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

fn check_options(opts: &CompileOptions) -> Result<(), CompileError> {
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
    check_options(opts)?;
    let mut g = model::mistral4::build_graph(cfg, weights)?;
    each(BUILD_STAGE, 0, &g);
    let mut stages = vec![BUILD_STAGE.to_string()];
    for pass in passes::PASSES {
        if opts.disable.iter().any(|d| d == pass.name) {
            continue;
        }
        let changed = (pass.run)(&mut g)?;
        verify::verify(&g).map_err(|source| CompileError::Verify {
            stage: pass.name.to_string(),
            source,
        })?;
        each(pass.name, changed, &g);
        stages.push(pass.name.to_string());
    }
    Ok((g, stages))
}

/// Compiles Mistral Small 4 for `cfg` over the GGUF weight map `weights` (tensor name →
/// [`WeightRef`]) into a [`Plan`]. The same inputs always give the same plan, byte for byte in
/// its JSON form.
///
/// Errors: [`CompileError::MissingWeight`] / [`CompileError::Infer`] for a file that lacks a
/// tensor or has one of the wrong `ne`; [`CompileError::UnknownStage`] /
/// [`CompileError::MandatoryStage`] for bad `opts`; [`CompileError::Verify`] when a pass breaks
/// the IR (a compiler bug).
pub fn compile(
    cfg: &Mistral4Config,
    weights: &BTreeMap<String, WeightRef>,
    opts: &CompileOptions,
) -> Result<Plan, CompileError> {
    let (g, stages) = run_pipeline(cfg, weights, opts, |_, _, _| {})?;
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
