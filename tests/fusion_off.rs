//! The fusion flags against the CPU oracle on the bundled model: a plan compiled with every
//! fusion off, for either target, gives the oracle's logits bit for bit (the runtime's own
//! `Model::load` path is the reference), and a fused plan is refused by the oracle's lowering
//! with the step and op named.

use aubier_compiler::config::Mistral4Config;
use aubier_compiler::plan::Plan;
use aubier_compiler::types::WeightRef;
use aubier_compiler::{compile, CompileOptions, Fusion, Target};
use aubier_kernels_gen::cpu::LowerError;
use aubier_runtime::engine::{EngineError, Model};
use aubier_runtime::gguf::GgufFile;
use aubier_runtime::model::{read_config, weight_refs};
use aubier_runtime::session::{Session, SessionOptions};
use aubier_tests::model_path;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

fn bundled() -> PathBuf {
    model_path("ms4-tiny256-q2k.gguf")
}

fn bind() -> (Arc<GgufFile>, Mistral4Config, BTreeMap<String, WeightRef>) {
    let file = Arc::new(GgufFile::open(bundled()).unwrap());
    let cfg = read_config(&file).unwrap();
    let refs = weight_refs(&file, &cfg).unwrap();
    (file, cfg, refs)
}

fn opts(target: Target, f: Fusion) -> CompileOptions {
    CompileOptions {
        target,
        fuse_phase: f,
        fuse_wkb: f,
        fuse_kqkv: f,
        ..CompileOptions::default()
    }
}

/// Logits bits of a prefill of 5 tokens then one decode token.
fn run(model: Arc<Model>) -> Vec<u32> {
    let mut s = Session::open(model, SessionOptions { kv_max: 64 }).unwrap();
    let mut out = s.step(&[1, 17, 4096, 8000, 3]).unwrap();
    out.extend(s.step(&[42]).unwrap());
    out.into_iter().map(f32::to_bits).collect()
}

#[test]
fn fusions_off_run_bit_identically_on_the_oracle() {
    let reference = run(Model::load(&bundled()).unwrap());
    let (file, cfg, refs) = bind();
    for o in [
        opts(Target::Gpu, Fusion::Off),
        opts(Target::CpuOracle, Fusion::Auto),
    ] {
        let plan = compile(&cfg, &refs, &o).unwrap();
        assert!(plan.steps.iter().all(|s| !s.op.is_fused()), "{o:?}");
        let model = Model::from_plan(Arc::clone(&file), cfg.clone(), plan).unwrap();
        assert_eq!(run(model), reference, "{o:?}");
    }
}

fn refused(plan: Plan, file: &Arc<GgufFile>, cfg: &Mistral4Config) -> (usize, &'static str) {
    let first_fused = plan.steps.iter().position(|s| s.op.is_fused()).unwrap();
    match Model::from_plan(Arc::clone(file), cfg.clone(), plan) {
        Err(EngineError::Lower(LowerError::FusedOp { step, op })) => {
            assert_eq!(step, first_fused);
            (step, op)
        }
        other => panic!("expected FusedOp, got {other:?}"),
    }
}

#[test]
fn the_oracle_refuses_fused_plans() {
    let (file, cfg, refs) = bind();
    let plan = compile(&cfg, &refs, &opts(Target::Gpu, Fusion::Auto)).unwrap();
    let (_, op) = refused(plan, &file, &cfg);
    assert_eq!(op, "phase");
    let wkb_only = CompileOptions {
        fuse_wkb: Fusion::On,
        ..CompileOptions::default()
    };
    let (_, op) = refused(compile(&cfg, &refs, &wkb_only).unwrap(), &file, &cfg);
    assert_eq!(op, "wkb");
    let kqkv_only = CompileOptions {
        fuse_kqkv: Fusion::On,
        ..CompileOptions::default()
    };
    let (_, op) = refused(compile(&cfg, &refs, &kqkv_only).unwrap(), &file, &cfg);
    assert_eq!(op, "kqkv");
}
