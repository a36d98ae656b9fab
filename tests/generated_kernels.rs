//! The generated GPU kernels as a user meets them: the checked-in snapshot under
//! `kernels-gen/generated/` compiles with clang-19 for every AMD target (and its CUDA dialect to
//! PTX), and editing the model graph then regenerating changes exactly the kernels the edit
//! touches, which still compile ("regenerate after a graph edit", issue 5).
//!
//! Whether the snapshot matches the current graph is `aubier gen --check`
//! (`server/src/gen.rs`, test `checked_in_kernels_match_the_graph`). Without clang-19 these tests
//! fail with the install command.

use aubier_compiler::ir::NodeKind;
use aubier_compiler::ops::Op;
use aubier_compiler::{compile, compile_graph, CompileOptions, Target};
use aubier_kernels_gen::gpu::{generate, GeneratedFile};
use aubier_runtime::gguf::GgufFile;
use aubier_runtime::model::{read_config, weight_refs};
use aubier_tests::{compile_hip, models_dir, run_clang, HIP_ARCHS};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn generated_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("kernels-gen")
        .join("generated")
}

fn work_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("generated_kernels_{test}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// The checked-in files of one dialect directory (`hip`, `cuda`), sorted.
fn checked_in(sub: &str) -> Vec<PathBuf> {
    let dir = generated_dir().join(sub);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (run `aubier gen`)", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no kernels", dir.display());
    files
}

/// Compiles the CUDA dialect file `source` to PTX for sm_90 with clang-19 (no CUDA install).
fn compile_ptx(source: &Path, ptx: &Path) {
    let _ = std::fs::remove_file(ptx);
    run_clang(
        "clang-19",
        &[
            "-x",
            "cuda",
            "--cuda-gpu-arch=sm_90",
            "-nocudainc",
            "-nocudalib",
            "--cuda-device-only",
            "-Xclang",
            "-target-feature",
            "-Xclang",
            "+ptx80",
            "-O3",
            "-S",
            "-o",
            ptx.to_str().expect("utf-8 path"),
        ],
        source,
    );
    let text = std::fs::read_to_string(ptx).unwrap_or_else(|e| panic!("{}: {e}", ptx.display()));
    assert!(
        text.contains(".entry"),
        "{} has no kernel entry",
        ptx.display()
    );
}

#[test]
fn checked_in_hip_kernels_compile_for_every_target() {
    let dir = work_dir("hip");
    for source in checked_in("hip") {
        let stem = source.file_stem().expect("file name").to_string_lossy();
        for arch in HIP_ARCHS {
            compile_hip(&source, arch, &dir.join(format!("{stem}-{arch}.co")));
        }
    }
}

#[test]
fn checked_in_cuda_kernels_compile_to_ptx() {
    let dir = work_dir("cuda");
    for source in checked_in("cuda") {
        let stem = source.file_stem().expect("file name").to_string_lossy();
        compile_ptx(&source, &dir.join(format!("{stem}.ptx")));
    }
}

fn hip_names(files: &[GeneratedFile]) -> BTreeSet<String> {
    files
        .iter()
        .filter(|f| f.path.starts_with("hip/"))
        .map(|f| f.path.clone())
        .collect()
}

/// The user's path: edit the graph (here: drop the Llama-4 query temperature factor of every
/// layer), recompile, regenerate. The PHASE kernel (which applies the factor) must change, every
/// kernel the edit does not reach must stay byte-identical, and the new kernels must compile.
#[test]
fn editing_the_graph_regenerates_the_kernels_it_touches() {
    let file = GgufFile::open(models_dir().join("ms4-tiny256-q2k.gguf")).expect("bundled model");
    let cfg = read_config(&file).expect("config");
    let weights = weight_refs(&file, &cfg).expect("weights");
    assert!(
        cfg.temperature.is_some(),
        "the bundled model states the temperature"
    );
    let opts = CompileOptions {
        target: Target::Gpu,
        ..CompileOptions::default()
    };
    let before = generate(&compile(&cfg, &weights, &opts).expect("plan")).expect("kernels");

    let mut g = aubier_compiler::model::mistral4::build_graph(&cfg, &weights).expect("graph");
    let temps: Vec<_> =
        g.g.node_indices()
            .filter(|&n| {
                matches!(
                    &g.g[n].kind,
                    NodeKind::Op {
                        op: Op::AttnTemperature,
                        ..
                    }
                )
            })
            .collect();
    assert_eq!(temps.len(), cfg.n_layer);
    for n in temps {
        let q = g.operands(n)[0];
        g.replace_uses(n, q);
        g.g.remove_node(n);
    }
    let after = generate(&compile_graph(g, &cfg, &opts).expect("edited plan")).expect("kernels");

    let (b, a) = (hip_names(&before), hip_names(&after));
    let gone: Vec<&String> = b.difference(&a).collect();
    let new: Vec<&String> = a.difference(&b).collect();
    assert!(
        !new.is_empty() && new.iter().all(|p| p.starts_with("hip/phase_")),
        "only the PHASE kernel may change: new {new:?}, gone {gone:?}"
    );
    assert_eq!(gone.len(), new.len(), "gone {gone:?}, new {new:?}");
    for f in after.iter().filter(|f| b.contains(&f.path)) {
        let old = before.iter().find(|o| o.path == f.path).expect("same path");
        assert_eq!(old.contents, f.contents, "{} changed", f.path);
    }

    let dir = work_dir("edit");
    for f in after.iter().filter(|f| new.contains(&&f.path)) {
        let source = dir.join(f.path.replace('/', "_"));
        std::fs::write(&source, &f.contents).expect("write");
        for arch in HIP_ARCHS {
            compile_hip(&source, arch, &source.with_extension(format!("{arch}.co")));
        }
    }
}
