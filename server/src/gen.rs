//! `aubier gen [--model FILE] [--target oracle|cpu|gpu] [--fuse-phase|--fuse-wkb|--fuse-kqkv
//! auto|on|off] [--out DIR] [--check] [--plan [--backend NAME [--device N|--cpu-numerics q8x2|q8|--cpu-isa LEVEL]]]
//! [--dump-after STAGE [--format text|dot]] [--disable PASS]…`: compile the model of a GGUF file
//! and generate the GPU kernels of its plan.
//!
//! Modes, in order of precedence: `--dump-after STAGE` prints the graph after a pipeline stage;
//! `--plan` prints the scheduled `Plan` as JSON — with `--backend`, compiled for that backend's
//! target and followed by its binding (`backend`, `isa`, and per step the kernel the backend
//! chose and its variant: what runs; `vulkan` binds at its device's subgroup width, or says which
//! width it bound for when the machine has no device); otherwise the HIP, CUDA and Vulkan (GLSL) source of every kernel
//! of the plan (`aubier_kernels_gen::gpu::generate`) is written under `--out` (default
//! `kernels-gen/generated/` of this workspace) with `MANIFEST.json` (the plan's hash, the flags,
//! the command, every file's size and hash), and files of an earlier generation that the plan no
//! longer has are removed. `--check` writes nothing and fails, listing each changed, missing and
//! stale file, when the directory differs from what the current graph produces (CI runs it).
//! Everything is deterministic: the same file and flags give the same bytes.
//!
//! Steps: open the file (`aubier_runtime::gguf`), bind it (`aubier_runtime::model::read_config`
//! and `weight_refs`: [`bind`]), turn the flags into `aubier_compiler::CompileOptions`
//! ([`GenArgs::compile_options`]), then `aubier_compiler::dump_after` or
//! `aubier_compiler::compile`. The target defaults to `gpu`, since `gen` is the generator of GPU
//! kernels, so `auto` fusions are on; `--target oracle` gives the plan the oracle runs (unfused),
//! `--target cpu` the cpu backend's (latent attention fused). The
//! default model is that of every command (`crate::model_file`: the bundled demo). Exit status 0 on
//! success, 1 with the error on stderr otherwise.

use anyhow::Context;
use aubier_compiler::config::Mistral4Config;
use aubier_compiler::plan::Plan;
use aubier_compiler::types::WeightRef;
use aubier_compiler::{compile, dump_after, CompileOptions, DumpFormat, Fusion, Target};
use aubier_kernels_gen::gpu::emit::WARP;
use aubier_kernels_gen::gpu::{fnv1a, generate as generate_kernels, plan_kernels, GeneratedFile};
use aubier_runtime::backend::Backend;
use aubier_runtime::gguf::GgufFile;
use aubier_runtime::model::{read_config, weight_refs};
use clap::{Args, ValueEnum};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where `gen` writes kernels when `--out` is not given: `kernels-gen/generated/` at the
/// workspace root (checked in).
pub fn default_out() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("kernels-gen")
        .join("generated")
}

/// Name of the manifest `gen` writes beside the kernels.
pub const MANIFEST: &str = "MANIFEST.json";

/// Arguments of `aubier gen`.
#[derive(Args, Debug)]
pub struct GenArgs {
    /// GGUF model file (default: $AUBIER_MODEL, else the bundled models/ms4-tiny256-q2k.gguf
    /// of the binary's workspace, else ./models).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Kind of backend the plan is for: `auto` fusions are all on for gpu, KQKV only for cpu,
    /// none for oracle.
    #[arg(long, value_enum, default_value_t = TargetArg::Gpu)]
    pub target: TargetArg,
    /// With --plan: `--backend NAME` (and its options) compiles for that backend's target and
    /// prints its binding, the kernel of every step as it runs.
    #[command(flatten)]
    pub backend: crate::run::BackendChoice,
    /// PHASE fusion: RoPE, query temperature, c_kv RMSNorm and latent-cache write as one step.
    #[arg(long, value_enum, default_value_t = FusionArg::Auto)]
    pub fuse_phase: FusionArg,
    /// WKB fusion: the absorbed per-head projections (W_kb in, W_vb out) as one step each.
    #[arg(long, value_enum, default_value_t = FusionArg::Auto)]
    pub fuse_wkb: FusionArg,
    /// KQKV fusion: scores, causal mask, softmax and weighted sum over the latent cache.
    #[arg(long, value_enum, default_value_t = FusionArg::Auto)]
    pub fuse_kqkv: FusionArg,
    /// Expert predictor: every MoE layer L ≥ 1's router on the residual before its attention,
    /// as the plan outputs `predicted_ids.L` (the `predict_experts` pass; off by default).
    #[arg(long)]
    pub predict_experts: bool,
    /// How many layers ahead --predict-experts predicts (1 ..= the model's layer count; see
    /// `aubier run --prefetch-lead`).
    #[arg(long, default_value_t = 1, requires = "predict_experts")]
    pub prefetch_lead: usize,
    /// Print the graph after this pipeline stage (build, cse, fuse_kqkv, fuse_phase, fuse_wkb,
    /// dce, predict_experts, mark_head) instead of the plan.
    #[arg(long, value_name = "STAGE")]
    pub dump_after: Option<String>,
    /// Format of the --dump-after graph.
    #[arg(long, value_enum, default_value_t = Format::Text, requires = "dump_after")]
    pub format: Format,
    /// Skip this pass (repeatable; `build` cannot be skipped).
    #[arg(long, value_name = "STAGE")]
    pub disable: Vec<String>,
    /// Print the plan as JSON instead of generating kernels.
    #[arg(long, conflicts_with_all = ["out", "check"])]
    pub plan: bool,
    /// Directory of the generated kernels (default: the workspace's kernels-gen/generated).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Write nothing; fail when the directory differs from what the current graph produces.
    #[arg(long)]
    pub check: bool,
}

impl GenArgs {
    /// The backend of `--backend` (with its options), if given.
    ///
    /// Errors: `--backend` without `--plan` or with `--target`; an option the backend does not
    /// take; no such backend.
    pub fn backend(&self) -> anyhow::Result<Option<Arc<dyn Backend>>> {
        let given = self.backend.backend.is_some() || !self.backend.options.is_empty();
        if !given {
            return Ok(None);
        }
        if !self.plan {
            anyhow::bail!("--backend (and its options) apply to --plan");
        }
        if self.target != TargetArg::Gpu {
            anyhow::bail!("--backend sets the target: give --backend or --target, not both");
        }
        Ok(Some(self.backend.spec().make()?))
    }

    /// The compiler options these flags ask for.
    ///
    /// Errors: as [`GenArgs::backend`].
    pub fn compile_options(&self) -> anyhow::Result<CompileOptions> {
        let target = match self.backend()? {
            Some(b) => b.target(),
            None => self.target.into(),
        };
        Ok(CompileOptions {
            disable: self.disable.clone(),
            target,
            fuse_phase: self.fuse_phase.into(),
            fuse_wkb: self.fuse_wkb.into(),
            fuse_kqkv: self.fuse_kqkv.into(),
            predict_experts: self.predict_experts,
            prefetch_lead: self.prefetch_lead,
        })
    }
}

/// `--target`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetArg {
    /// The oracle (unfused plans).
    Oracle,
    /// The cpu backend (latent attention fused).
    Cpu,
    /// A GPU backend of generated kernels (every fusion).
    Gpu,
}

impl From<TargetArg> for Target {
    fn from(t: TargetArg) -> Target {
        match t {
            TargetArg::Oracle => Target::Oracle,
            TargetArg::Cpu => Target::Cpu,
            TargetArg::Gpu => Target::Gpu,
        }
    }
}

/// `--fuse-phase`, `--fuse-wkb`, `--fuse-kqkv`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusionArg {
    /// As the target says (all on for gpu, KQKV for cpu, none for oracle).
    Auto,
    /// Always run the pass (an error when it finds nothing to fuse).
    On,
    /// Never run the pass.
    Off,
}

impl From<FusionArg> for Fusion {
    fn from(f: FusionArg) -> Fusion {
        match f {
            FusionArg::Auto => Fusion::Auto,
            FusionArg::On => Fusion::On,
            FusionArg::Off => Fusion::Off,
        }
    }
}

/// Graph dump format.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One node per line.
    Text,
    /// Graphviz DOT.
    Dot,
}

/// Runs `aubier gen`, printing to stdout.
///
/// Errors: those of the compilation, and a failed write to stdout.
pub fn run(args: GenArgs) -> anyhow::Result<()> {
    let out = generate(&args)?;
    out!("{out}");
    Ok(())
}

/// Runs `aubier gen` and returns what it prints: the graph dump after `--dump-after`, the plan as
/// pretty JSON with `--plan`, or otherwise a one-line summary of the kernels written (or checked
/// with `--check`) under `--out`.
///
/// Errors: the file cannot be opened or bound (naming the key or tensor), an unknown stage, a
/// compile error (naming the weight or node), a step without a kernel, an I/O error naming the
/// path, or with `--check` the list of files that differ.
pub fn generate(args: &GenArgs) -> anyhow::Result<String> {
    let path = crate::model_file::resolve_model(args.model.as_deref())?;
    let (cfg, weights) = bind(&path)?;
    let opts = args.compile_options()?;
    if let Some(stage) = &args.dump_after {
        let format = match args.format {
            Format::Text => DumpFormat::Text,
            Format::Dot => DumpFormat::Dot,
        };
        return Ok(dump_after(&cfg, &weights, &opts, stage, format)?);
    }
    let plan = compile(&cfg, &weights, &opts)?;
    if let Some(backend) = args.backend()? {
        return bound_plan_json(&plan, &*backend);
    }
    let mut json = serde_json::to_string_pretty(&plan)?;
    json.push('\n');
    if args.plan {
        return Ok(json);
    }
    let mut files = generate_kernels(&plan)?;
    let n_kernels = files.len() / 2;
    files.push(manifest(
        args,
        &path,
        &plan,
        fnv1a(json.as_bytes()),
        &files,
    )?);
    let out = args.out.clone().unwrap_or_else(default_out);
    if args.check {
        check_dir(&out, &files)?;
        Ok(format!(
            "{}: up to date ({} files, {n_kernels} kernels)\n",
            out.display(),
            files.len()
        ))
    } else {
        let removed = write_dir(&out, &files)?;
        Ok(format!(
            "{}: wrote {} files ({n_kernels} kernels, HIP, CUDA and Vulkan), removed {removed} stale\n",
            out.display(),
            files.len()
        ))
    }
}

/// `plan` as pretty JSON with `backend`'s binding after it: `backend`, `isa` (the cpu backend's
/// ISA tier on this host) and `binding`, per step `{step, op, out, kernel, variant}`.
///
/// Errors: the backend refuses a step (naming it).
fn bound_plan_json(plan: &Plan, backend: &dyn Backend) -> anyhow::Result<String> {
    let binding = backend.bind(plan)?;
    let steps: Vec<serde_json::Value> = binding
        .steps
        .iter()
        .zip(&plan.steps)
        .enumerate()
        .map(|(i, (b, step))| {
            serde_json::json!({
                "step": i,
                "op": step.op.name(),
                "out": plan.values[step.out].name,
                "kernel": b.choice.kernel,
                "variant": b.choice.variant,
            })
        })
        .collect();
    let mut v = serde_json::to_value(plan)?;
    if let Some(obj) = v.as_object_mut() {
        obj.insert("backend".into(), binding.backend.clone().into());
        obj.insert("isa".into(), aubier_runtime::backend::cpu::isa().into());
        obj.insert("binding".into(), steps.into());
    }
    let mut json = serde_json::to_string_pretty(&v)?;
    json.push('\n');
    Ok(json)
}

/// The command line that regenerates `args`' output, with every flag spelled out (the model by
/// file name only, so the manifest does not depend on where the checkout lives).
fn command_line(args: &GenArgs, model: &Path) -> String {
    let mut cmd = format!(
        "aubier gen --model {} --target {} --fuse-phase {} --fuse-wkb {} --fuse-kqkv {}",
        model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        flag_value(&args.target),
        flag_value(&args.fuse_phase),
        flag_value(&args.fuse_wkb),
        flag_value(&args.fuse_kqkv),
    );
    for d in &args.disable {
        cmd.push_str(&format!(" --disable {d}"));
    }
    cmd
}

/// The `--flag VALUE` spelling of a clap value enum.
fn flag_value<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

/// `MANIFEST.json`: the generator, the command, the model's file name, the plan's hash (FNV-1a 64
/// of its pretty JSON) and stages, each kernel with the plan steps that launch it, and each
/// file's path, size and FNV-1a 64 hash, in path order.
fn manifest(
    args: &GenArgs,
    model: &Path,
    plan: &Plan,
    plan_hash: u64,
    files: &[GeneratedFile],
) -> anyhow::Result<GeneratedFile> {
    let kernels: Vec<serde_json::Value> = plan_kernels(plan, WARP)?
        .into_iter()
        .map(|(k, steps)| serde_json::json!({ "name": k.name, "steps": steps }))
        .collect();
    let entries: Vec<serde_json::Value> = files
        .iter()
        .map(|f| {
            serde_json::json!({
                "path": f.path,
                "bytes": f.contents.len(),
                "fnv1a64": format!("{:016x}", fnv1a(f.contents.as_bytes())),
            })
        })
        .collect();
    let value = serde_json::json!({
        "generator": "aubier gen (aubier-kernels-gen)",
        "command": command_line(args, model),
        "model": model.file_name().map(|n| n.to_string_lossy().into_owned()),
        "plan_fnv1a64": format!("{plan_hash:016x}"),
        "stages": plan.stages,
        "kernels": kernels,
        "files": entries,
    });
    let mut contents = serde_json::to_string_pretty(&value)?;
    contents.push('\n');
    Ok(GeneratedFile {
        path: MANIFEST.to_string(),
        contents,
    })
}

/// The generated files already under `dir` (the manifest and every file of the dialect
/// subdirectories), as paths relative to `dir`.
fn existing_files(dir: &Path, wanted: &[GeneratedFile]) -> anyhow::Result<Vec<String>> {
    let mut subdirs: Vec<&str> = wanted
        .iter()
        .filter_map(|f| f.path.split_once('/').map(|(d, _)| d))
        .collect();
    subdirs.sort_unstable();
    subdirs.dedup();
    let mut found = Vec::new();
    if dir.join(MANIFEST).is_file() {
        found.push(MANIFEST.to_string());
    }
    for sub in subdirs {
        let d = dir.join(sub);
        if !d.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let entry = entry.with_context(|| format!("reading {}", d.display()))?;
            if entry.file_type()?.is_file() {
                found.push(format!("{sub}/{}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The files under `dir` of an earlier generation that `files` no longer has.
fn stale_files(dir: &Path, files: &[GeneratedFile]) -> anyhow::Result<Vec<String>> {
    Ok(existing_files(dir, files)?
        .into_iter()
        .filter(|p| !files.iter().any(|f| &f.path == p))
        .collect())
}

/// Writes `files` under `dir` (creating subdirectories) and removes the files of an earlier
/// generation that are no longer produced; returns how many were removed.
///
/// Errors: an I/O error naming the path.
fn write_dir(dir: &Path, files: &[GeneratedFile]) -> anyhow::Result<usize> {
    let stale = stale_files(dir, files)?;
    if !stale.is_empty() && !is_earlier_generation(dir) {
        // `--out` naming a directory of the user's own with a `vulkan/` or `cuda/` in it would
        // otherwise lose every file there that this generation does not write.
        anyhow::bail!(
            "--out {}: {} is not a file of an earlier `aubier gen` (the directory has no \
             {MANIFEST} of one), and would be removed as stale; give a new or empty directory",
            dir.display(),
            stale[0]
        );
    }
    for f in files {
        let path = dir.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, &f.contents)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    for p in &stale {
        let path = dir.join(p);
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(stale.len())
}

/// Whether `dir` holds the manifest of an earlier `aubier gen`, whose stale files it may remove.
fn is_earlier_generation(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(MANIFEST))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|v| v["generator"].as_str().map(|g| g.starts_with("aubier gen")))
        .unwrap_or(false)
}

/// Compares `dir` with `files`.
///
/// Errors: `dir` does not exist or is not a directory (it had been reported as every file
/// missing); the changed, missing and stale files, by path, when any differ.
fn check_dir(dir: &Path, files: &[GeneratedFile]) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => anyhow::bail!("{} is not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "{} does not exist (run `aubier gen` with the same flags, without --check, to \
             generate it)",
            dir.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    }
    let mut changed = Vec::new();
    let mut missing = Vec::new();
    for f in files {
        match std::fs::read(dir.join(&f.path)) {
            Ok(bytes) if bytes == f.contents.as_bytes() => {}
            Ok(_) => changed.push(f.path.as_str()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(f.path.as_str()),
            Err(e) => {
                return Err(e).with_context(|| format!("reading {}", dir.join(&f.path).display()))
            }
        }
    }
    let stale = stale_files(dir, files)?;
    if changed.is_empty() && missing.is_empty() && stale.is_empty() {
        return Ok(());
    }
    let list = |v: &[&str]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let stale: Vec<&str> = stale.iter().map(String::as_str).collect();
    anyhow::bail!(
        "{} differs from what the current graph produces; changed: {}; missing: {}; stale: {} \
         (run `aubier gen` to regenerate)",
        dir.display(),
        list(&changed),
        list(&missing),
        list(&stale)
    )
}

/// The config and GGUF weight map (tensor name → ggml type and `ne`) of the model at `path`.
///
/// Errors: the file cannot be opened or parsed, or its metadata or tensor set do not bind
/// (naming the path, and the key or tensor).
pub fn bind(path: &Path) -> anyhow::Result<(Mistral4Config, BTreeMap<String, WeightRef>)> {
    let file = GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
    let cfg = read_config(&file).with_context(|| format!("binding {}", path.display()))?;
    let weights =
        weight_refs(&file, &cfg).with_context(|| format!("binding {}", path.display()))?;
    Ok((cfg, weights))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aubier_compiler::ops::Op;

    fn args(dump_after: Option<&str>, format: Format) -> GenArgs {
        GenArgs {
            model: None,
            target: TargetArg::Gpu,
            backend: crate::run::BackendChoice::default(),
            fuse_phase: FusionArg::Auto,
            fuse_wkb: FusionArg::Auto,
            fuse_kqkv: FusionArg::Auto,
            predict_experts: false,
            prefetch_lead: 1,
            dump_after: dump_after.map(str::to_string),
            format,
            disable: Vec::new(),
            plan: true,
            out: None,
            check: false,
        }
    }

    fn kernels_to(dir: &Path, check: bool) -> anyhow::Result<String> {
        let mut a = args(None, Format::Text);
        a.plan = false;
        a.out = Some(dir.to_path_buf());
        a.check = check;
        generate(&a)
    }

    #[test]
    fn writes_kernels_with_a_manifest_and_checks_them() {
        let dir = tempfile::tempdir().unwrap();
        let summary = kernels_to(dir.path(), false).unwrap();
        assert!(summary.contains("removed 0 stale"), "{summary}");
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(MANIFEST)).unwrap()).unwrap();
        let files = manifest["files"].as_array().unwrap();
        assert!(!files.is_empty());
        // One HIP, one CUDA and one Vulkan GLSL source per kernel.
        assert_eq!(
            manifest["kernels"].as_array().unwrap().len() * 3,
            files.len()
        );
        assert_eq!(
            manifest["command"],
            "aubier gen --model ms4-tiny256-q2k.gguf --target gpu --fuse-phase auto \
             --fuse-wkb auto --fuse-kqkv auto"
        );
        for f in files {
            let path = dir.path().join(f["path"].as_str().unwrap());
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(bytes.len() as u64, f["bytes"].as_u64().unwrap());
            assert_eq!(format!("{:016x}", fnv1a(&bytes)), f["fnv1a64"]);
        }
        for ext in ["hip/", "cuda/", "vulkan/"] {
            assert!(files
                .iter()
                .any(|f| f["path"].as_str().unwrap().starts_with(ext)));
        }
        kernels_to(dir.path(), true).unwrap();

        let first = dir.path().join(files[0]["path"].as_str().unwrap());
        let second = dir.path().join(files[1]["path"].as_str().unwrap());
        std::fs::write(&first, "edited").unwrap();
        std::fs::remove_file(&second).unwrap();
        let stale = dir.path().join("hip").join("old_kernel.hip");
        std::fs::write(&stale, "stale").unwrap();
        let e = format!("{:#}", kernels_to(dir.path(), true).unwrap_err());
        for name in [
            files[0]["path"].as_str().unwrap(),
            files[1]["path"].as_str().unwrap(),
            "hip/old_kernel.hip",
        ] {
            assert!(e.contains(name), "{name} not in: {e}");
        }
        let summary = kernels_to(dir.path(), false).unwrap();
        assert!(summary.contains("removed 1 stale"), "{summary}");
        assert!(!stale.exists());
        kernels_to(dir.path(), true).unwrap();
    }

    /// A directory that no earlier generation wrote keeps its files: a `vulkan/` of the user's
    /// own under `--out` is refused, not emptied of every file the generation does not write.
    #[test]
    fn a_directory_of_other_files_is_refused_not_emptied() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("vulkan")).unwrap();
        let mine = dir.path().join("vulkan").join("notes.txt");
        std::fs::write(&mine, "mine").unwrap();
        let e = format!("{:#}", kernels_to(dir.path(), false).unwrap_err());
        assert!(
            e.contains("vulkan/notes.txt is not a file of an earlier `aubier gen`"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&mine).unwrap(), "mine");
        assert!(!dir.path().join(MANIFEST).exists(), "nothing written");
    }

    /// `--check` of a directory that does not exist, or of a file, says so alone: it had listed
    /// every generated file as missing.
    #[test]
    fn checking_a_missing_directory_says_it_does_not_exist() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = format!("{:#}", kernels_to(&missing, true).unwrap_err());
        assert_eq!(
            e,
            format!(
                "{} does not exist (run `aubier gen` with the same flags, without --check, to \
                 generate it)",
                missing.display()
            )
        );
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let e = format!("{:#}", kernels_to(&file, true).unwrap_err());
        assert_eq!(e, format!("{} is not a directory", file.display()));
        assert!(!missing.exists(), "--check wrote nothing");
    }

    #[test]
    fn checked_in_kernels_match_the_graph() {
        let mut a = args(None, Format::Text);
        a.plan = false;
        a.check = true;
        if let Err(e) = generate(&a) {
            panic!("{e:#}");
        }
    }

    fn plan_of(a: &GenArgs) -> aubier_compiler::plan::Plan {
        serde_json::from_str(&generate(a).unwrap()).unwrap()
    }

    fn count(plan: &aubier_compiler::plan::Plan, op: Op) -> usize {
        plan.steps.iter().filter(|s| s.op == op).count()
    }

    #[test]
    fn flags_parse_and_reach_the_compiler() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: GenArgs,
        }
        let cli = Cli::try_parse_from([
            "gen",
            "--fuse-phase",
            "off",
            "--fuse-wkb",
            "on",
            "--fuse-kqkv",
            "auto",
            "--target",
            "cpu",
        ])
        .unwrap();
        let opts = cli.args.compile_options().unwrap();
        assert_eq!(opts.target, Target::Cpu);
        assert_eq!(
            (opts.fuse_phase, opts.fuse_wkb, opts.fuse_kqkv),
            (Fusion::Off, Fusion::On, Fusion::Auto)
        );
        let default = Cli::try_parse_from(["gen"]).unwrap().args.compile_options();
        assert_eq!(default.unwrap().target, Target::Gpu);
        let oracle = Cli::try_parse_from(["gen", "--plan", "--backend", "oracle"]).unwrap();
        assert_eq!(
            oracle.args.compile_options().unwrap().target,
            Target::Oracle
        );
        let numerics_without_cpu = Cli::try_parse_from([
            "gen",
            "--plan",
            "--backend",
            "oracle",
            "--cpu-numerics",
            "q8",
        ])
        .unwrap();
        assert!(numerics_without_cpu.args.compile_options().is_err());
        let without_plan = Cli::try_parse_from(["gen", "--backend", "cpu"]).unwrap();
        let e = without_plan.args.compile_options().unwrap_err().to_string();
        assert_eq!(e, "--backend (and its options) apply to --plan");
        let both = Cli::try_parse_from(["gen", "--plan", "--backend", "cpu", "--target", "cpu"]);
        assert!(both.unwrap().args.compile_options().is_err());
        assert!(Cli::try_parse_from(["gen", "--fuse-kqkv", "maybe"]).is_err());
        assert!(Cli::try_parse_from(["gen", "--target", "tpu"]).is_err());
    }

    #[test]
    fn gpu_target_fuses_by_default_cpu_fuses_attention_and_oracle_nothing() {
        let gpu = plan_of(&args(None, Format::Text));
        assert_eq!(
            gpu.stages,
            [
                "build",
                "cse",
                "fuse_kqkv",
                "fuse_phase",
                "fuse_wkb",
                "dce",
                "mark_head"
            ]
        );
        let n_layer = gpu.config.n_layer;
        assert_eq!(count(&gpu, Op::Phase), n_layer);
        assert_eq!(count(&gpu, Op::Wkb), 2 * n_layer);
        assert_eq!(count(&gpu, Op::Kqkv), n_layer);

        let mut cpu_args = args(None, Format::Text);
        cpu_args.target = TargetArg::Cpu;
        let cpu = plan_of(&cpu_args);
        assert_eq!(
            cpu.stages,
            ["build", "cse", "fuse_kqkv", "dce", "mark_head"]
        );
        assert_eq!(count(&cpu, Op::Kqkv), n_layer);
        assert!(cpu
            .steps
            .iter()
            .all(|s| !s.op.is_fused() || s.op == Op::Kqkv));

        let mut oracle_args = args(None, Format::Text);
        oracle_args.target = TargetArg::Oracle;
        let oracle = plan_of(&oracle_args);
        assert_eq!(oracle.stages, ["build", "cse", "dce", "mark_head"]);
        assert!(oracle.steps.iter().all(|s| !s.op.is_fused()));

        let mut wkb_only = oracle_args;
        wkb_only.fuse_wkb = FusionArg::On;
        let plan = plan_of(&wkb_only);
        assert_eq!(
            plan.stages,
            ["build", "cse", "fuse_wkb", "dce", "mark_head"]
        );
        assert_eq!(count(&plan, Op::Wkb), 2 * n_layer);
        assert_eq!(count(&plan, Op::Kqkv), 0);
    }

    /// `gen --plan --backend cpu` records a kernel for every step: the latent attention for each
    /// `kqkv`, one Q8_K plane for the output head (a `mat_mul` the plan marks), two for the
    /// other quantized products.
    #[test]
    fn plan_with_a_backend_prints_every_steps_kernel() {
        let mut a = args(None, Format::Text);
        a.backend.backend = Some("cpu".into());
        let v: serde_json::Value = serde_json::from_str(&generate(&a).unwrap()).unwrap();
        let steps = v["steps"].as_array().unwrap();
        let binding = v["binding"].as_array().unwrap();
        assert_eq!(v["backend"], "cpu (q8x2)");
        assert_eq!(binding.len(), steps.len());
        for (i, (b, s)) in binding.iter().zip(steps).enumerate() {
            assert_eq!(b["step"], i);
            assert_eq!(b["op"], s["op"]);
            assert!(!b["kernel"].as_str().unwrap().is_empty(), "step {i}");
            if s["op"] == "kqkv" {
                assert_eq!(b["kernel"], "latent_attention");
            }
        }
        let head = v["output_head"]["step"].as_u64().unwrap() as usize;
        assert_eq!(steps[head]["op"], "mat_mul");
        assert_eq!(binding[head]["kernel"], "q8_mat_mul");
        let variant = |i: usize| binding[i]["variant"].as_str().unwrap().to_string();
        assert!(variant(head).contains(", 1 plane,"), "{}", variant(head));
        let other = (0..binding.len())
            .find(|&i| i != head && binding[i]["kernel"] == "q8_mat_mul")
            .unwrap();
        assert!(variant(other).contains(", 2 planes,"), "{}", variant(other));

        a.backend.backend = Some("oracle".into());
        let v: serde_json::Value = serde_json::from_str(&generate(&a).unwrap()).unwrap();
        assert!(v["binding"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["kernel"] == "cranelift"));
    }

    #[test]
    fn dump_after_each_fusion_stage_shows_its_nodes() {
        for (stage, op) in [
            ("fuse_kqkv", "= kqkv("),
            ("fuse_phase", "= phase("),
            ("fuse_wkb", "= wkb("),
        ] {
            let text = generate(&args(Some(stage), Format::Text)).unwrap();
            assert!(text.contains(op), "{stage}: {text}");
        }
        let mut oracle = args(Some("fuse_kqkv"), Format::Text);
        oracle.target = TargetArg::Oracle;
        let e = generate(&oracle).unwrap_err();
        assert!(format!("{e:#}").contains("fuse_kqkv"), "{e:#}");
    }

    #[test]
    fn phase_without_kqkv_is_refused_by_name() {
        let mut a = args(None, Format::Text);
        a.fuse_phase = FusionArg::On;
        a.fuse_kqkv = FusionArg::Off;
        let e = format!("{:#}", generate(&a).unwrap_err());
        assert!(e.contains("fuse_phase") && e.contains("fuse_kqkv"), "{e}");
    }

    #[test]
    fn dumps_the_bundled_model_after_each_stage() {
        for stage in aubier_compiler::stage_names() {
            // The opt-in predictor on, so that every stage runs.
            let mut a = args(Some(stage), Format::Text);
            a.predict_experts = true;
            let text = generate(&a).unwrap();
            assert!(text.contains("= input tokens : i32[T]"), "{stage}");
            assert!(text.contains("output logits = %"), "{stage}");
            assert!(text.contains("output router_ids.2 = %"), "{stage}");
        }
        let dot = generate(&args(Some("dce"), Format::Dot)).unwrap();
        assert!(dot.starts_with("digraph aubier {") && dot.ends_with("}\n"));
    }

    #[test]
    fn plan_of_the_bundled_model_is_deterministic_json() {
        let a = generate(&args(None, Format::Text)).unwrap();
        let b = generate(&args(None, Format::Text)).unwrap();
        assert_eq!(a, b);
        let plan: aubier_compiler::plan::Plan = serde_json::from_str(&a).unwrap();
        assert_eq!(plan.config.n_layer, 3);
        assert_eq!(plan.outputs.last().map(|(n, _)| n.as_str()), Some("logits"));
    }

    #[test]
    fn errors_name_the_stage_or_file() {
        let e = generate(&args(Some("fuse_all"), Format::Text)).unwrap_err();
        assert!(format!("{e:#}").contains("fuse_all"));
        let mut missing = args(None, Format::Text);
        missing.model = Some(PathBuf::from("/nonexistent/model.gguf"));
        let e = generate(&missing).unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent/model.gguf"));
    }
}
