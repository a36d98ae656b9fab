//! `aubier synth` end to end: the written file parses, binds and runs with finite logits (tiny
//! and real dimensions, two quant mixes); the same seed gives the same bytes; bad input is an
//! error, not a panic.

use aubier_runtime::gguf::GgufFile;
use aubier_tests::{models_dir, read_f32};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn aubier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(args)
        .output()
        .expect("runs")
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("aubier-synth-{}-{name}", std::process::id()))
}

/// The bundled model's 8192-token vocab keeps the test files small.
fn small_vocab() -> String {
    models_dir()
        .join("ms4-tiny256-q2k.gguf")
        .display()
        .to_string()
}

fn synth(out: &Path, extra: &[&str]) {
    let mut args = vec!["synth", "--out", out.to_str().unwrap(), "--vocab"];
    let vocab = small_vocab();
    args.push(&vocab);
    args.extend_from_slice(extra);
    let o = aubier(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    // Off a terminal the write says how far it is, a line per tenth, ending at the whole.
    let tenths: Vec<&str> = err.lines().filter(|l| l.contains(" % (")).collect();
    assert!(
        tenths.last().is_some_and(|l| l.contains(": 100 % (")),
        "{err}"
    );
}

/// Runs a prompt through the file and returns the logits of every prompt position.
fn prompt_logits(model: &Path, n_vocab: usize) -> Vec<f32> {
    let logits = model.with_extension("logits.f32");
    let o = aubier(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "Alice was beginning to get very tired of sitting by her sister",
        "--max-tokens",
        "3",
        "--json",
        "--logits-out",
        logits.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["generated_ids"].as_array().map(Vec::len), Some(3));
    let l = read_f32(&logits);
    let _ = std::fs::remove_file(&logits);
    assert_eq!(l.len() % n_vocab, 0);
    assert!(l.len() >= 2 * n_vocab);
    l
}

fn assert_sane(logits: &[f32], what: &str) {
    assert!(
        logits.iter().all(|x| x.is_finite()),
        "{what}: non-finite logits"
    );
    let max = logits.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(max > 0.1 && max < 1e3, "{what}: max |logit| {max}");
}

#[test]
fn tiny_files_bind_run_finite_and_are_deterministic() {
    for quant in ["Q2_K", "IQ2_XXS", "Q4_K_M"] {
        let a = tmp(&format!("tiny-{quant}-a.gguf"));
        let b = tmp(&format!("tiny-{quant}-b.gguf"));
        let c = tmp(&format!("tiny-{quant}-c.gguf"));
        let common = [
            "--tiny",
            "--layers",
            "2",
            "--experts",
            "8",
            "--quant",
            quant,
        ];
        synth(&a, &[&common[..], &["--seed", "5"]].concat());
        synth(&b, &[&common[..], &["--seed", "5"]].concat());
        synth(&c, &[&common[..], &["--seed", "6"]].concat());
        let (ba, bb, bc) = (
            std::fs::read(&a).unwrap(),
            std::fs::read(&b).unwrap(),
            std::fs::read(&c).unwrap(),
        );
        assert_eq!(ba, bb, "{quant}: same seed, same bytes");
        assert_eq!(ba.len(), bc.len());
        assert_ne!(ba, bc, "{quant}: another seed, other weights");

        let file = GgufFile::open(&a).unwrap();
        assert_eq!(file.tensors().len(), 1 + 2 * 16 + 2);
        let inspect = aubier(&["inspect", "--json", a.to_str().unwrap()]);
        assert!(inspect.status.success());
        let report: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
        assert_eq!(report["arch"], "mistral4");
        assert_sane(&prompt_logits(&a, 8192), quant);
        for p in [a, b, c] {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Real Mistral Small 4 dimensions (hidden 4096, 32 heads, q_lora 1024, kv_lora 256, rope 64,
/// expert ff 2048), one layer, four experts: activations stay finite at full width.
#[test]
fn real_dims_one_layer_runs_finite() {
    let out = tmp("real.gguf");
    synth(&out, &["--layers", "1", "--experts", "4", "--seed", "1"]);
    let file = GgufFile::open(&out).unwrap();
    let t = file.tensor("blk.0.ffn_gate_up_exps.weight").unwrap();
    assert_eq!(t.ne, [4096, 4096, 4]);
    assert_eq!(t.ggml_type.name(), "Q2_K");
    assert_eq!(
        file.tensor("blk.0.attn_k_b.weight").unwrap().ne,
        [64, 256, 32]
    );
    assert_eq!(
        file.tensor("output.weight").unwrap().ggml_type.name(),
        "Q6_K"
    );
    assert_sane(&prompt_logits(&out, 8192), "real dims");
    let _ = std::fs::remove_file(&out);
}

#[test]
fn bad_arguments_are_errors() {
    let out = tmp("bad.gguf");
    for (args, needle) in [
        (vec!["--experts", "2"], "experts"),
        (vec!["--layers", "0"], "layers"),
        (vec!["--quant", "Q9_K"], "Q9_K"),
    ] {
        let mut all = vec!["synth", "--tiny", "--out", out.to_str().unwrap()];
        all.extend(args);
        let o = aubier(&all);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle) && !err.contains("panicked"), "{err}");
    }
    let o = aubier(&["synth", "--tiny", "--out", "/nonexistent-dir/x.gguf"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent-dir/x.gguf"));
    let _ = std::fs::remove_file(&out);
}

/// A write that fails part-way (here the shell's file-size limit, with SIGXFSZ ignored so the
/// write returns EFBIG) leaves the old `--out` as it was and no partial file beside it; an
/// `--out` that is not a regular file is refused before anything is written.
#[test]
fn a_failed_write_keeps_the_old_file() {
    let dir = tmp("failed-write");
    std::fs::create_dir_all(&dir).expect("dir");
    let out = dir.join("model.gguf");
    std::fs::write(&out, b"the old file").expect("write");
    let vocab = small_vocab();
    let o = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 200; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_aubier"))
        .args([
            "synth",
            "--tiny",
            "--layers",
            "1",
            "--experts",
            "4",
            "--vocab",
            &vocab,
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("runs");
    assert!(!o.status.success(), "a 100 KiB limit stops the write");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("writing") && !err.contains("panicked"),
        "{err}"
    );
    assert_eq!(std::fs::read(&out).expect("read"), b"the old file");
    let left: Vec<_> = std::fs::read_dir(&dir).expect("dir").collect();
    assert_eq!(left.len(), 1, "only the old file is left: {left:?}");
    let o = aubier(&["synth", "--tiny", "--out", dir.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a regular file"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file the disk has no room for is refused before anything is written (it wrote until the
/// disk was full), and so is a layer count llama.cpp would not load (it spent minutes listing
/// the tensors first: the ffn_down order was a quadratic search).
#[test]
fn a_file_larger_than_the_free_space_is_refused_before_writing() {
    let dir = tmp("no-room");
    std::fs::create_dir_all(&dir).expect("dir");
    let out = dir.join("model.gguf");
    let vocab = small_vocab();
    let o = aubier(&[
        "synth",
        "--layers",
        "512",
        "--experts",
        "100000",
        "--vocab",
        &vocab,
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the file needs") && err.contains("GB free"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 0);
    let o = aubier(&[
        "synth",
        "--tiny",
        "--layers",
        "100000",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--layers 100000 is more than the 512 layers"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts a 40-layer tiny synth (0.42 GB) in `dir`, `ignoring` that signal from its start (as
/// `nohup` starts a process ignoring SIGHUP), sends it `sig` 20 ms after its partial file
/// appears, and returns how it ended and the names left in `dir`.
fn interrupt(
    dir: &Path,
    sig: libc::c_int,
    ignoring: bool,
) -> (std::process::ExitStatus, Vec<String>) {
    use std::os::unix::process::CommandExt;
    std::fs::create_dir_all(dir).expect("dir");
    let vocab = small_vocab();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_aubier"));
    cmd.args([
        "synth", "--tiny", "--layers", "40", "--vocab", &vocab, "--out",
    ])
    .arg(dir.join("model.gguf"))
    .stderr(std::process::Stdio::null());
    if ignoring {
        // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
        unsafe {
            cmd.pre_exec(move || {
                libc::signal(sig, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("spawns");
    let start = std::time::Instant::now();
    let partial_seen = loop {
        let partial = std::fs::read_dir(dir)
            .expect("dir")
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().contains(".partial-"));
        if partial || start.elapsed() > std::time::Duration::from_secs(60) {
            break partial;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert!(partial_seen, "the write started");
    std::thread::sleep(std::time::Duration::from_millis(20));
    // SAFETY: kill(2) on the child's pid.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
    let status = child.wait().expect("waits");
    let left = std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let _ = std::fs::remove_dir_all(dir);
    (status, left)
}

/// SIGTERM (Ctrl-C's SIGINT, `timeout`) during the write removes the partial file: it stayed,
/// hidden, as large as what had been written.
#[test]
fn an_interrupted_write_leaves_no_partial_file() {
    use std::os::unix::process::ExitStatusExt;
    let (status, left) = interrupt(&tmp("interrupted"), libc::SIGTERM, false);
    // 0.42 GB take far longer than the 20 ms the signal waited after the file appeared.
    assert!(
        !status.success(),
        "the write ended before the signal, so nothing was tested: {left:?}"
    );
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert!(left.is_empty(), "{left:?}");
}

/// A signal the process was started ignoring stays ignored (`nohup aubier synth … &`, then the
/// terminal hangs up): the write goes on and the file is whole.
#[test]
fn a_signal_ignored_from_the_start_does_not_stop_the_write() {
    let (status, left) = interrupt(&tmp("nohup"), libc::SIGHUP, true);
    assert!(status.success(), "{status:?}");
    assert_eq!(left, ["model.gguf"]);
}
