//! Helpers shared by the cross-crate tests: where the bundled fixtures live; [`kernels`], the
//! GPU kernel cases shared by the CPU-execution and the Vulkan test targets.

pub mod kernels;

use std::path::{Path, PathBuf};
use std::process::Command;

/// `tests/data/`, the copies of `shared/fixtures` the tests read (see `tests/data/README.md`).
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data")
}

/// `models/`, the bundled model the server serves by default.
pub fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("models")
}

/// Reads a raw little-endian f32 file (the fixtures' `.f32` arrays).
pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Reads a raw little-endian i32 file (the fixtures' `.i32` arrays).
pub fn read_i32(path: &std::path::Path) -> Vec<i32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Reads a JSON fixture.
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// A list of ids from a JSON fixture field. Some headers store lists as their Python `str()`, so both
/// a JSON array and a string holding one are accepted.
pub fn json_ids(v: &serde_json::Value, field: &str) -> Vec<u32> {
    let f = &v[field];
    let arr = match f {
        serde_json::Value::String(s) => serde_json::from_str::<serde_json::Value>(s)
            .unwrap_or_else(|e| panic!("field {field} is not a list: {e}")),
        other => other.clone(),
    };
    arr.as_array()
        .unwrap_or_else(|| panic!("field {field} is not a list"))
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// One step's line of a command's progress off a terminal (`PREFIX: WHAT (AMOUNT) took T s`).
#[derive(Debug)]
pub struct StepLine {
    /// What the step did.
    pub what: String,
    /// How much it counted (`1.2 MiB`, `40 shaders`), if it counted.
    pub amount: Option<String>,
    /// The seconds it took.
    pub secs: f64,
}

/// The step lines under `prefix` in `stderr`, in order, each checked to end with its time.
pub fn step_lines(stderr: &str, prefix: &str) -> Vec<StepLine> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix(prefix)?.strip_prefix(": "))
        .filter_map(|l| l.strip_suffix(" s")?.rsplit_once(" took "))
        .map(|(step, secs)| {
            let secs: f64 = secs
                .parse()
                .unwrap_or_else(|e| panic!("{step}: time {secs:?}: {e}"));
            let (what, amount) = match step.strip_suffix(')').and_then(|s| s.rsplit_once(" (")) {
                Some((what, amount)) => (what.to_string(), Some(amount.to_string())),
                None => (step.to_string(), None),
            };
            StepLine { what, amount, secs }
        })
        .collect()
}

/// The ids of `models/prompt-shared.json` (mistral-common's tokenization of a real text).
pub fn shared_prompt() -> Vec<u32> {
    json_ids(
        &read_json(&data_dir().join("models/prompt-shared.json")),
        "ids",
    )
}

/// The default store options with a fast store of `n_res` slots per MoE layer.
pub fn slots(n_res: usize) -> aubier_runtime::store::expert_store::StoreOptions {
    aubier_runtime::store::expert_store::StoreOptions {
        budget: aubier_runtime::store::FastBudget::Slots(n_res),
        ..Default::default()
    }
}

/// Path of a fixture model GGUF (the q2k one is the bundled model in `models/`).
pub fn model_path(file: &str) -> PathBuf {
    let bundled = models_dir().join(file);
    if bundled.exists() {
        bundled
    } else {
        data_dir().join("models").join(file)
    }
}

/// The bundled model `models/ms4-tiny256-q2k.gguf` on the default backend (the product path),
/// loaded once per test binary and shared.
pub fn bundled_model() -> std::sync::Arc<aubier_runtime::engine::Model> {
    bundled_model_on(&aubier_runtime::backend::registry::BackendSpec::default())
}

/// The bundled model bound to the backend `backend` names, loaded once per test binary and
/// backend and shared.
pub fn bundled_model_on(
    backend: &aubier_runtime::backend::registry::BackendSpec,
) -> std::sync::Arc<aubier_runtime::engine::Model> {
    use aubier_runtime::engine::Model;
    use std::sync::{Arc, Mutex, OnceLock};
    type Loaded = Mutex<Vec<(String, Arc<Model>)>>;
    static MODELS: OnceLock<Loaded> = OnceLock::new();
    let key = format!("{backend:?}");
    let mut models = MODELS
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, m)) = models.iter().find(|(k, _)| *k == key) {
        return Arc::clone(m);
    }
    let model = Model::load_with(&models_dir().join("ms4-tiny256-q2k.gguf"), backend)
        .expect("bundled model loads");
    models.push((key, Arc::clone(&model)));
    model
}

/// Runs a clang-19 tool (`clang-19`, `clang++-19`) with `args` then `source`. A missing compiler
/// fails the test with the install command (the GPU emitter tests never pass silently); a failed
/// compile fails it with the command and clang's stderr.
pub fn run_clang(tool: &str, args: &[&str], source: &Path) {
    let out = Command::new(tool)
        .args(args)
        .arg(source)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{tool} could not be run ({e}); the GPU emitter tests need clang 19: \
                 apt-get install -y clang-19 lld-19"
            )
        });
    assert!(
        out.status.success(),
        "{tool} {} {} failed:\n{}",
        args.join(" "),
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The AMD targets every generated HIP kernel must compile for (ARCHITECTURE.md § kernels-gen).
pub const HIP_ARCHS: [&str; 3] = ["gfx1201", "gfx1100", "gfx942"];

/// Compiles the header-free HIP file `source` for `arch` into the code object `object` with
/// `clang-19 -x hip --offload-arch=ARCH -nogpuinc -nogpulib --cuda-device-only
/// --no-gpu-bundle-output -O3 -fuse-ld=lld`, and checks the object is a non-empty ELF file.
pub fn compile_hip(source: &Path, arch: &str, object: &Path) {
    // A stale object must not pass for a fresh one.
    let _ = std::fs::remove_file(object);
    let offload = format!("--offload-arch={arch}");
    let object_arg = object.to_str().expect("utf-8 path");
    run_clang(
        "clang-19",
        &[
            "-x",
            "hip",
            &offload,
            "-nogpuinc",
            "-nogpulib",
            "--cuda-device-only",
            "--no-gpu-bundle-output",
            "-O3",
            "-fuse-ld=lld",
            "-o",
            object_arg,
        ],
        source,
    );
    let bytes = std::fs::read(object).unwrap_or_else(|e| panic!("{}: {e}", object.display()));
    assert!(
        bytes.starts_with(b"\x7fELF"),
        "{} is not an ELF code object",
        object.display()
    );
}
