//! Tensors larger than a Vulkan device binds at once, on a real device (lavapipe in CI, whose
//! `maxStorageBufferRange` is 128 MiB and whose largest buffer is 2 GiB):
//! * a one-layer file of the real dimensions and the full 131 072-token vocabulary
//!   (`aubier synth --layers 1 --experts 8`: a 440 MB Q6_K output head and a 176 MB embedding
//!   table) runs through `aubier run --backend vulkan` with the oracle's logits (every row of the
//!   head, so its bytes past the first 128 MiB are read) and greedy ids;
//! * stacked experts split over several device buffers (a buffer limit below one expert tensor)
//!   give the logits of one buffer per tensor, bit for bit, and a dense weight over the limit is
//!   refused by name.
//!
//! Tolerance of the first: the fixtures' against transformers (`tests/vulkan_backend.rs`),
//! |Δlogit| ≤ 1e-4 and the same top-1 at every position, here against the oracle (itself held to
//! transformers), both f32 from the same dequantized weights with sums in different orders.

use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::backend::vulkan_device::select;
use aubier_runtime::engine::Model;
use aubier_runtime::error::EngineError;
use aubier_runtime::gguf::{GgufFile, TensorInfo};
use aubier_runtime::sampler::argmax;
use aubier_runtime::session::{Session, SessionOptions};
use aubier_tests::{models_dir, read_f32};
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("aubier-vulkan-large-{}-{name}", std::process::id()))
}

/// `aubier ARGS`, which must succeed; its stdout.
fn aubier(args: &[&str]) -> Vec<u8> {
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(args)
        .output()
        .expect("runs");
    assert!(
        o.status.success(),
        "aubier {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// The prompt's logits (every position) and 4 greedy ids of `model` on `backend`.
fn run(model: &Path, backend: &str) -> (Vec<f32>, serde_json::Value) {
    let logits = model.with_extension(format!("{backend}.f32"));
    let out = aubier(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--backend",
        backend,
        "--prompt-ids",
        "1,1010,40000,131000,77",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--ignore-eos",
        "--json",
        "--logits-out",
        logits.to_str().unwrap(),
    ]);
    let l = read_f32(&logits);
    let _ = std::fs::remove_file(&logits);
    let v: serde_json::Value = serde_json::from_slice(&out).expect("one JSON object");
    (l, v["generated_ids"].clone())
}

#[test]
fn a_head_over_the_storage_buffer_range_runs_with_the_oracles_logits() {
    let device = select(None, true)
        .unwrap_or_else(|e| panic!("this test needs a Vulkan device (CI installs lavapipe): {e}"));
    let file = tmp("real-1x8.gguf");
    let path = file.to_str().unwrap();
    aubier(&["synth", "--out", path, "--layers", "1", "--experts", "8"]);
    let gguf = GgufFile::open(&file).expect("synthetic file");
    let head = gguf.tensor("output.weight").expect("output head");
    let range = u64::from(device.limits.max_storage_buffer_range);
    assert!(
        gguf.tensor_data(head).len() as u64 > range,
        "the head must exceed {}'s maxStorageBufferRange ({range} bytes)",
        device.name
    );
    let n_vocab = head.ne[1];
    drop(gguf);
    let (want, want_ids) = run(&file, "oracle");
    let (got, got_ids) = run(&file, "vulkan");
    let _ = std::fs::remove_file(&file);
    assert_eq!(got.len(), 5 * n_vocab);
    assert_eq!(want.len(), got.len());
    let mut max = 0f32;
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let d = (a - b).abs();
        assert!(
            d.is_finite(),
            "non-finite logit at flat index {i}: {a} vs {b}"
        );
        max = max.max(d);
    }
    eprintln!("real dims, 1 layer, 8 experts: max |Δlogit| vulkan vs oracle {max:.3e}");
    assert!(max <= 1e-4, "max |Δlogit| {max}");
    for (p, (a, b)) in got.chunks(n_vocab).zip(want.chunks(n_vocab)).enumerate() {
        assert_eq!(argmax(a), argmax(b), "top-1 at position {p}");
    }
    assert_eq!(got_ids, want_ids, "greedy ids");
}

/// The last-position logits of `model` for `prompt` on the vulkan backend making no buffer over
/// `max_bytes` (its `max-buffer-bytes` option).
fn logits_with_buffer_limit(
    model: &Path,
    max_bytes: u64,
    prompt: &[u32],
) -> Result<Vec<f32>, EngineError> {
    let spec = BackendSpec::named("vulkan").with("max-buffer-bytes", max_bytes);
    let model = Model::load_with(model, &spec)?;
    let mut s = Session::open(
        model,
        SessionOptions {
            kv_max: prompt.len(),
        },
    )?;
    s.step_last(prompt)
}

#[test]
fn experts_split_over_buffers_give_the_same_logits_and_a_dense_weight_over_the_limit_is_refused() {
    // The fixtures' dimensions with 128 experts: each stacked expert tensor is larger than the
    // largest dense weight, so a limit the dense weights fit splits it.
    let file = tmp("tiny-1x128.gguf");
    let vocab = models_dir().join("ms4-tiny256-q2k.gguf");
    aubier(&[
        "synth",
        "--out",
        file.to_str().unwrap(),
        "--tiny",
        "--layers",
        "2",
        "--experts",
        "128",
        "--vocab",
        vocab.to_str().unwrap(),
    ]);
    let gguf = GgufFile::open(&file).expect("synthetic file");
    let size = |t: &TensorInfo| gguf.tensor_data(t).len() as u64;
    let stacked = |t: &TensorInfo| t.name.contains("_exps");
    let dense = gguf
        .tensors()
        .iter()
        .filter(|t| !stacked(t))
        .max_by_key(|t| size(t))
        .expect("dense weights");
    let limit = size(dense);
    let smallest_stack = gguf
        .tensors()
        .iter()
        .filter(|t| stacked(t))
        .map(size)
        .min()
        .expect("stacked experts");
    assert!(
        smallest_stack > 2 * limit,
        "every expert tensor in three or more parts: {smallest_stack} vs {limit} bytes"
    );
    let prompt = [1, 17, 4096, 8000, 3, 99, 512];
    let whole = logits_with_buffer_limit(&file, u64::MAX, &prompt).expect("one buffer each");
    let split = logits_with_buffer_limit(&file, limit, &prompt).expect("experts split");
    let n_vocab = gguf.tensor("output.weight").expect("head").ne[1];
    assert_eq!(whole.len(), n_vocab);
    assert!(
        whole
            .iter()
            .zip(&split)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "split experts changed the logits"
    );
    let e = logits_with_buffer_limit(&file, limit - 1, &prompt)
        .expect_err("a dense weight over the limit")
        .to_string();
    let _ = std::fs::remove_file(&file);
    assert!(e.contains("one buffer may hold on this device"), "{e}");
    assert!(e.contains(&format!("`{}`", dense.name)), "{e}");
}
