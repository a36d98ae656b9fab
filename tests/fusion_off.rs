//! The fusion flags against the host backends on the bundled model: a plan compiled with every
//! fusion off, for any target, gives the oracle's logits bit for bit (the runtime's own
//! `Model::load_with` path is the reference), and a fused plan is refused by the oracle's binding
//! with the step and op named; the cpu backend's fused latent attention (`kqkv`) gives the bits
//! of its unfused attention steps, and it refuses the GPU's fusions by name.

use aubier_compiler::config::Mistral4Config;
use aubier_compiler::plan::Plan;
use aubier_compiler::types::WeightRef;
use aubier_compiler::{compile, CompileOptions, Fusion, Target};
use aubier_runtime::backend::cpu::{CpuBackend, CpuNumerics};
use aubier_runtime::backend::oracle::OracleBackend;
use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::backend::{Backend, BindError};
use aubier_runtime::engine::Model;
use aubier_runtime::error::EngineError;
use aubier_runtime::gguf::GgufFile;
use aubier_runtime::model::{read_config, weight_refs};
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::FastBudget;
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
    let reference = run(Model::load_with(&bundled(), &BackendSpec::named("oracle")).unwrap());
    let (file, cfg, refs) = bind();
    for o in [
        opts(Target::Gpu, Fusion::Off),
        opts(Target::Cpu, Fusion::Off),
        opts(Target::Oracle, Fusion::Auto),
    ] {
        let plan = compile(&cfg, &refs, &o).unwrap();
        assert!(plan.steps.iter().all(|s| !s.op.is_fused()), "{o:?}");
        let oracle = Arc::new(OracleBackend);
        let model = Model::from_plan(
            Arc::clone(&file),
            cfg.clone(),
            plan,
            oracle,
            FastBudget::Auto,
        )
        .unwrap();
        assert_eq!(run(model), reference, "{o:?}");
    }
}

/// The cpu backend on its own target (`kqkv` fused: one step per layer) against the same backend
/// on a plan with `fuse_kqkv` off (scores, scale, mask, softmax and weighted sum as five steps),
/// for both numerics: the same logits bits, prefill and decode.
#[test]
fn the_cpu_backends_fused_attention_gives_the_bits_of_its_unfused_steps() {
    let (file, cfg, refs) = bind();
    let fused = compile(&cfg, &refs, &opts(Target::Cpu, Fusion::Auto)).unwrap();
    let kqkv = fused.steps.iter().filter(|s| s.op.name() == "kqkv").count();
    assert_eq!(kqkv, cfg.n_layer, "one kqkv per layer");
    assert!(fused
        .steps
        .iter()
        .all(|s| !s.op.is_fused() || s.op.name() == "kqkv"));
    let unfused = compile(&cfg, &refs, &opts(Target::Cpu, Fusion::Off)).unwrap();
    for numerics in [CpuNumerics::Q8x2, CpuNumerics::Q8] {
        let cpu = Arc::new(CpuBackend::new(numerics));
        let load = |plan: &Plan| {
            let backend = Arc::clone(&cpu) as Arc<dyn Backend>;
            Model::from_plan(
                Arc::clone(&file),
                cfg.clone(),
                plan.clone(),
                backend,
                FastBudget::Auto,
            )
            .unwrap()
        };
        assert_eq!(run(load(&fused)), run(load(&unfused)), "{numerics}");
    }
}

/// The first fused step of `plan` and its op, as `backend` refuses it at bind time.
fn refused(
    plan: Plan,
    file: &Arc<GgufFile>,
    cfg: &Mistral4Config,
    backend: Arc<dyn Backend>,
) -> (usize, &'static str) {
    let first = match backend.name().as_str() {
        "oracle" => plan.steps.iter().position(|s| s.op.is_fused()),
        _ => plan
            .steps
            .iter()
            .position(|s| s.op.is_fused() && s.op.name() != "kqkv"),
    }
    .unwrap();
    match Model::from_plan(
        Arc::clone(file),
        cfg.clone(),
        plan,
        backend,
        FastBudget::Auto,
    ) {
        Err(EngineError::Bind(BindError { step, op, .. })) => {
            assert_eq!(step, first);
            (step, op)
        }
        other => panic!("expected a bind error, got {other:?}"),
    }
}

#[test]
fn the_oracle_refuses_fused_plans() {
    let (file, cfg, refs) = bind();
    let oracle: Arc<dyn Backend> = Arc::new(OracleBackend);
    let plan = compile(&cfg, &refs, &opts(Target::Gpu, Fusion::Auto)).unwrap();
    let (_, op) = refused(plan, &file, &cfg, Arc::clone(&oracle));
    assert_eq!(op, "phase");
    let wkb_only = CompileOptions {
        fuse_wkb: Fusion::On,
        ..CompileOptions::default()
    };
    let (_, op) = refused(
        compile(&cfg, &refs, &wkb_only).unwrap(),
        &file,
        &cfg,
        Arc::clone(&oracle),
    );
    assert_eq!(op, "wkb");
    let kqkv_only = CompileOptions {
        fuse_kqkv: Fusion::On,
        ..CompileOptions::default()
    };
    let (_, op) = refused(
        compile(&cfg, &refs, &kqkv_only).unwrap(),
        &file,
        &cfg,
        oracle,
    );
    assert_eq!(op, "kqkv");
}

#[test]
fn the_cpu_backend_refuses_the_gpu_fusions_by_name() {
    let (file, cfg, refs) = bind();
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::default());
    let plan = compile(&cfg, &refs, &opts(Target::Gpu, Fusion::Auto)).unwrap();
    let (_, op) = refused(plan, &file, &cfg, Arc::clone(&cpu));
    assert_eq!(op, "phase");
    let wkb = opts(Target::Cpu, Fusion::Auto);
    let wkb = CompileOptions {
        fuse_wkb: Fusion::On,
        ..wkb
    };
    let (_, op) = refused(compile(&cfg, &refs, &wkb).unwrap(), &file, &cfg, cpu);
    assert_eq!(op, "wkb");
}
