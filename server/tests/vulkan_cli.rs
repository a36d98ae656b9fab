//! `--backend vulkan` through the built binary: `aubier run` on the bundled model gives the
//! oracle's greedy ids on a Vulkan device (lavapipe in CI), every routed expert counted by the
//! store, `aubier gen --plan --backend vulkan` prints the GPU kernels of every step bound at the
//! device's subgroup width, `aubier quality` finds `--backend vulkan` EQUIVALENT to
//! the oracle on real text (the bundled `alice.txt`), `aubier serve --backend vulkan` answers
//! `POST /debug/tokens` with the oracle's greedy ids, and on a machine without a Vulkan driver
//! (the loader pointed at none) `--backend vulkan` fails saying what to install while the default
//! backend (`auto`, which falls back to `cpu`) still runs.

use aubier_tests::{models_dir, step_lines};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};

/// `aubier run` on the bundled model, 16 greedy tokens, JSON out; `no_driver` hides every
/// Vulkan driver from the loader.
fn run(backend: &[&str], no_driver: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_aubier"));
    cmd.args(["run", "--model"])
        .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
        .args(["--prompt-ids", "1,17,4096,8000,3", "--max-tokens", "16"])
        .args(["--temperature", "0", "--ignore-eos", "--json"])
        .args(backend);
    if no_driver {
        // VK_DRIVER_FILES is the newer name of VK_ICD_FILENAMES and wins over it when set.
        cmd.env("VK_ICD_FILENAMES", "/nonexistent")
            .env("VK_DRIVER_FILES", "/nonexistent")
            .env_remove("VK_ADD_DRIVER_FILES");
    }
    cmd.output().expect("runs")
}

fn generated(o: &Output) -> Vec<u64> {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    v["generated_ids"]
        .as_array()
        .expect("generated_ids")
        .iter()
        .map(|x| x.as_u64().expect("an id"))
        .collect()
}

#[test]
fn run_backend_vulkan_gives_the_oracles_greedy_ids() {
    let o = run(&["--backend", "vulkan"], false);
    let vulkan = generated(&o);
    assert_eq!(vulkan.len(), 16);
    // The default budget (the device heap less everything else) holds every expert of the
    // bundled model: every routed expert is served from device memory, and the run says why.
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["store"]["n_res"], 16, "{v}");
    // 5 prompt tokens and 15 decoded ones, 3 MoE layers, top-4.
    assert_eq!(v["store"]["routed"], (5 + 15) * 3 * 4, "{v}");
    assert_eq!(v["store"]["fast_hits"], v["store"]["routed"], "{v}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("vulkan fast store: 16 of 16 experts per layer in device memory")
            && err.contains("the device heap's"),
        "{err}"
    );
    // Off a terminal the load says its shader builds (how many) and the weights' upload (how
    // many bytes), each with its time.
    let loading = format!(
        "loading {}",
        models_dir().join("ms4-tiny256-q2k.gguf").display()
    );
    let steps = step_lines(&err, &loading);
    let amount = |what: &str| {
        let s = steps.iter().find(|s| s.what == what);
        s.and_then(|s| s.amount.clone())
            .unwrap_or_else(|| panic!("no {what:?} step in:\n{err}"))
    };
    let shaders = amount("compiling shaders");
    assert!(
        shaders
            .strip_suffix(" shaders")
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n > 0),
        "{shaders}"
    );
    assert_ne!(amount("uploading dense weights"), "0 B");
    // With a quarter of the experts resident they rotate, read from the host store.
    let o = run(&["--backend", "vulkan", "--n-res", "4"], false);
    assert_eq!(generated(&o), vulkan);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let served = v["store"]["served_fraction"]
        .as_f64()
        .expect("served fraction");
    assert!(served > 0.0 && served < 1.0, "{v}");
    assert!(
        v["store"]["host_bytes"].as_u64().is_some_and(|b| b > 0),
        "{v}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("vulkan fast store: 4 of 16 experts per layer in device memory")
            && err.contains("--n-res 4"),
        "{err}"
    );
    assert_eq!(vulkan, generated(&run(&["--backend", "oracle"], false)));
    // Nothing imported: the missed experts are uploaded during each step, and the run says so.
    let o = run(
        &[
            "--backend",
            "vulkan",
            "--host-store",
            "stage",
            "--n-res",
            "4",
        ],
        false,
    );
    assert_eq!(generated(&o), vulkan);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let (experts, bytes) = (&v["staged"]["experts"], &v["staged"]["bytes"]);
    assert!(
        experts.as_u64().is_some_and(|n| n > 0) && bytes.as_u64().is_some_and(|b| b > 0),
        "{v}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the host store is staged") && err.contains("12 missed experts"),
        "{err}"
    );
}

#[test]
fn without_a_vulkan_driver_the_vulkan_backend_says_what_to_install_and_auto_runs_on_the_cpu() {
    let o = run(&["--backend", "vulkan"], true);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no Vulkan device"), "{err}");
    assert!(err.contains("mesa-vulkan-drivers"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(generated(&run(&[], true)).len(), 16);
}

#[test]
fn gen_plan_backend_vulkan_names_the_gpu_kernels_of_every_step() {
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["gen", "--plan", "--backend", "vulkan"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    for kernel in ["phase", "wkb_in", "kqkv_split", "moe_gate_up", "mat_mul"] {
        assert!(text.contains(kernel), "{kernel} missing");
    }
    assert!(text.contains("glsl"), "{text}");
    // Bound at the subgroup width of the device it runs on (the one `aubier devices` lists
    // first here: lavapipe in CI), which every step's variant names.
    let d = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["devices", "--json"])
        .output()
        .expect("runs");
    let devices: serde_json::Value = serde_json::from_slice(&d.stdout).expect("devices JSON");
    let width = devices[0]["subgroup_size"]
        .as_u64()
        .expect("a subgroup width");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the plan as JSON");
    let backend = v["backend"].as_str().expect("the backend");
    assert!(
        backend.ends_with(&format!("subgroup {width})")),
        "{backend}"
    );
    for b in v["binding"].as_array().expect("binding") {
        let variant = b["variant"].as_str().expect("variant");
        assert!(
            variant == "none (in place)" || variant.ends_with(&format!("; subgroup {width}")),
            "{variant}"
        );
    }
}

#[test]
fn serve_backend_vulkan_answers_with_the_oracles_greedy_ids() {
    let lock =
        std::env::temp_dir().join(format!("aubier-vulkan-serve-{}.lock", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args([
            "serve",
            "--backend",
            "vulkan",
            "--fast-budget",
            "1M",
            "--port",
            "0",
        ])
        .arg("--lock-file")
        .arg(&lock)
        .env_remove("AUBIER_MODEL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn aubier serve");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut seen = String::new();
    let addr = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).expect("stderr") == 0 {
            let _ = child.kill();
            panic!("aubier serve --backend vulkan exited before listening:\n{seen}");
        }
        seen.push_str(&line);
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().expect("address").to_string();
        }
    };
    let body = r#"{"ids": [1, 17, 4096, 8000, 3], "max_tokens": 16, "ignore_eos": true}"#;
    let mut conn = TcpStream::connect(&addr).expect("connect");
    write!(
        conn,
        "POST /debug/tokens HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("request");
    let mut response = String::new();
    conn.read_to_string(&mut response).expect("response");
    let mut conn = TcpStream::connect(&addr).expect("connect");
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("metrics request");
    let mut metrics = String::new();
    conn.read_to_string(&mut metrics).expect("metrics");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&lock);
    let (head, json) = response.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200"), "{response}");
    let v: serde_json::Value = serde_json::from_str(json).expect("a JSON body");
    let ids: Vec<u64> = v["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("an id"))
        .collect();
    assert_eq!(ids, generated(&run(&["--backend", "oracle"], false)));
    // A budget of 1 MiB holds four of the sixteen experts of each layer: the request was served
    // partly from the fast store, partly from the host store.
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} missing in\n{metrics}"))
    };
    let served = value("aubier_expert_served_ratio");
    assert!(served > 0.0 && served < 1.0, "served fraction {served}");
    assert!(value("aubier_expert_host_bytes_total") > 0.0);
    assert!(value("aubier_expert_promotions_total") > 0.0);
}

#[test]
fn quality_finds_the_vulkan_backend_equivalent_to_the_oracle_on_real_text() {
    let text = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/alice.txt");
    let o = Command::new(env!("CARGO_BIN_EXE_aubier"))
        .args(["quality", "--json", "--model"])
        .arg(models_dir().join("ms4-tiny256-q2k.gguf"))
        .arg("--text")
        .arg(&text)
        .args([
            "--a",
            "--backend oracle",
            "--b",
            "--backend vulkan",
            "--margin",
            "0.01",
        ])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    eprintln!(
        "oracle {} vs vulkan {} nats/token: mean diff {}, 95% CI {}",
        v["a"]["mean_nll"], v["b"]["mean_nll"], v["mean_diff"], v["ci95"]
    );
    assert_eq!(v["verdict"], "EQUIVALENT", "{v}");
}
