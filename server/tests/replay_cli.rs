//! `aubier replay` end to end: the built binary on small traces whose served fractions are worked
//! out by hand below, plus its error paths.

use aubier_tests::step_lines;
use std::path::PathBuf;
use std::process::{Command, Output};

/// A scratch directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("aubier-replay-cli-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write scratch file");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn aubier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aubier"))
        .arg("replay")
        .args(args)
        .output()
        .expect("run aubier")
}

fn json_stdout(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "aubier replay failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

/// One layer, 4 experts, top-1, four tokens all routed to expert 2.
const REPEAT_2: &str = concat!(
    r#"{"seq": 0, "pos": 0, "n_experts": 4, "top_k": 1, "layers": [[2]]}"#,
    "\n",
    r#"{"seq": 0, "pos": 1, "n_experts": 4, "top_k": 1, "layers": [[2]]}"#,
    "\n",
    r#"{"seq": 0, "pos": 2, "n_experts": 4, "top_k": 1, "layers": [[2]], "extra": "ignored"}"#,
    "\n",
    r#"{"seq": 0, "pos": 3, "n_experts": 4, "top_k": 1, "layers": [[2]]}"#,
    "\n",
);

#[test]
fn served_fractions_match_hand_worked_values() {
    let dir = Scratch::new("hand");
    let trace = dir.file("t.jsonl", REPEAT_2);
    let v = json_stdout(&aubier(&[
        trace.to_str().unwrap(),
        "--slots",
        "1",
        "--expert-bytes",
        "1000",
        "--json",
    ]));
    // 1 slot, identity seed {0}; 2Q's defaults: Kin 0, Kout round(2·1) = 2, frequency admission
    // with counts halved every 2·4 = 8 accesses (never within these 4).
    // lru: t0 misses and admits 2 (evicting 0), t1..t3 hit: 3/4; one load.
    // lfu: t0 misses; 2 (count 1) beats 0 (count 0) and is admitted; then 3 hits: 3/4; one load.
    // static: the best single expert is 2, hit 4 times: 4/4; no load.
    // min: 2 is next used at t1, 0 never: admit 2 at t0, then 3 hits: 3/4; one load.
    // 2q: t0 2 goes through A1in (Kin 0) to A1out; t1 is a second access while remembered and
    //     2's count (2) exceeds the victim 0's (0), so it is promoted (a miss); t2, t3 hit: 2/4;
    //     one load.
    // One load in 4 tokens is 0.25 loads and 250 bytes per token at 1000 bytes per expert.
    let want = serde_json::json!({
        "slots": 1,
        "policies": {"2q": 0.5, "lru": 0.75, "lfu": 0.75, "static": 1.0, "min": 0.75},
        "loads_per_token": {"2q": 0.25, "lru": 0.25, "lfu": 0.25, "static": 0.0, "min": 0.25},
        "bytes_per_token": {"2q": 250.0, "lru": 250.0, "lfu": 250.0, "static": 0.0, "min": 250.0},
        "expert_bytes": 1000
    });
    assert_eq!(v, want);

    // Seeding the fast store with expert 2 makes every access of LRU and MIN a hit.
    let hot = dir.file("hot.json", r#"{"layers": [[2, 1]]}"#);
    let v = json_stdout(&aubier(&[
        trace.to_str().unwrap(),
        "--slots",
        "1",
        "--policies",
        "lru,min",
        "--resident-set",
        hot.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(v["policies"], serde_json::json!({"lru": 1.0, "min": 1.0}));
    assert_eq!(
        v["loads_per_token"],
        serde_json::json!({"lru": 0.0, "min": 0.0})
    );
    // Without --expert-bytes: a Mistral Small 4 expert in the Q2_K mix, gate/up 4096 rows of 16
    // Q2_K blocks (84 bytes), down 4096 rows of 8 Q3_K blocks (110 bytes).
    assert_eq!(v["expert_bytes"], 4096 * 16 * 84 + 4096 * 8 * 110);
}

/// Two layers, 4 experts, top-1, six tokens: layer 0 alternates 0, 1; layer 1 routes 2 after 0
/// and 3 after 1.
fn mapped_trace() -> String {
    (0..6)
        .map(|t| {
            let e = t % 2;
            let layers = serde_json::json!([[e], [e + 2]]);
            format!(r#"{{"seq": 0, "pos": {t}, "n_experts": 4, "top_k": 1, "layers": {layers}}}"#)
                + "\n"
        })
        .collect()
}

#[test]
fn prefetch_counts_match_hand_worked_values() {
    let dir = Scratch::new("prefetch");
    let trace = dir.file("t.jsonl", &mapped_trace());
    let v = json_stdout(&aubier(&[
        trace.to_str().unwrap(),
        "--slots",
        "1",
        "--policies",
        "lru,min",
        "--prefetch-budget",
        "1",
        "--expert-bytes",
        "1000",
        "--json",
    ]));
    // 1 slot, identity seed {0} in both layers; 12 routed slots in 6 tokens.
    // lru, layer 0: t0 hits, t1..t5 miss and are admitted (5 loads). Layer 1: t0, t1 miss and are
    //   admitted (nothing learned yet for 0, then for 1); from t2 on the predictor has seen 0 → 2
    //   and 1 → 3, so it names the one expert the step routes, not resident: prefetched (4 loads),
    //   then hit. Served 5/12; loads 5 + 2 + 4 = 11 in 6 tokens; recall 4/6; every prefetch used.
    // min refuses prefetches: layer 0 keeps 0 and bypasses 1 (hits t0, t2, t4); layer 1 admits 2
    //   at t0 (the seed 0 is never used), bypasses 3 (farther): hits t2, t4. Served 5/12, 1 load.
    let close = |got: &serde_json::Value, want: f64| {
        let got = got.as_f64().expect("a number");
        assert!((got - want).abs() < 1e-12, "{got} != {want}");
    };
    close(&v["policies"]["lru"], 5.0 / 12.0);
    close(&v["policies"]["min"], 5.0 / 12.0);
    close(&v["loads_per_token"]["lru"], 11.0 / 6.0);
    close(&v["loads_per_token"]["min"], 1.0 / 6.0);
    close(&v["bytes_per_token"]["lru"], 11_000.0 / 6.0);
    close(&v["bytes_per_token"]["min"], 1_000.0 / 6.0);
    assert_eq!(
        v["prefetch"],
        serde_json::json!({
            "budget": 1,
            "predictor": "co-occurrence",
            "recall": 4.0 / 6.0,
            "used": {"lru": 1.0}
        })
    );
}

#[test]
fn sweep_prints_one_object_per_slot_count_and_a_text_table() {
    let dir = Scratch::new("sweep");
    let trace = dir.file("t.jsonl", REPEAT_2);
    let v = json_stdout(&aubier(&[
        trace.to_str().unwrap(),
        "--sweep",
        "1,2",
        "--policies",
        "static",
        "--json",
    ]));
    // With 2 slots static keeps {2, 0}: still 4/4.
    let rows: Vec<(u64, f64)> = v
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            (
                r["slots"].as_u64().unwrap(),
                r["policies"]["static"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, [(1, 1.0), (2, 1.0)]);
    let out = aubier(&[trace.to_str().unwrap(), "--sweep", "1,2"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("slots"))
        .expect("table header");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["slots", "2q", "lru", "lfu", "static", "min"]
    );
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .expect("row for 1 slot")
        .split_whitespace()
        .collect();
    assert_eq!(
        row,
        ["1", "served", "0.5000", "0.7500", "0.7500", "1.0000", "0.7500"]
    );
    let loads: Vec<&str> = text
        .lines()
        .find(|l| l.trim_start().starts_with("loads/tok"))
        .expect("loads row")
        .split_whitespace()
        .collect();
    assert_eq!(loads, ["loads/tok", "0.25", "0.25", "0.25", "0.00", "0.25"]);
}

#[test]
fn synthetic_trace_written_and_replayed_gives_the_same_numbers() {
    let dir = Scratch::new("synthetic");
    let written = dir.0.join("syn.jsonl");
    let spec = "experts=16,top_k=2,layers=2,tokens=300,seq_len=100,zipf=1.1,hot=4,drift=0.1,seed=7";
    let a = json_stdout(&aubier(&[
        "--synthetic",
        spec,
        "--write-trace",
        written.to_str().unwrap(),
        "--slots",
        "4",
        "--json",
    ]));
    let b = json_stdout(&aubier(&[
        written.to_str().unwrap(),
        "--slots",
        "4",
        "--json",
    ]));
    assert_eq!(a, b);
    let lines = std::fs::read_to_string(&written).unwrap();
    assert_eq!(lines.lines().count(), 300);
    let policies = a["policies"].as_object().unwrap();
    let min = policies["min"].as_f64().unwrap();
    for (name, f) in policies {
        let f = f.as_f64().unwrap();
        assert!((0.0..=1.0).contains(&f), "{name} = {f}");
        if name != "static" {
            assert!(f <= min, "{name} = {f} > min = {min}");
        }
    }
}

#[test]
fn presets_replay_every_policy_and_print_their_statistics() {
    let v = json_stdout(&aubier(&[
        "--synthetic",
        "mixtral-like,layers=2,tokens=300",
        "--slots",
        "3",
        "--policies",
        "2q,lru,lfu,arc,lrfu,lecar,min",
        "--json",
    ]));
    let policies = v["policies"].as_object().unwrap();
    assert_eq!(policies.len(), 7);
    let min = policies["min"].as_f64().unwrap();
    for (name, f) in policies {
        let f = f.as_f64().unwrap();
        assert!((0.0..=min).contains(&f), "{name} = {f}, min = {min}");
    }
    let s = json_stdout(&aubier(&[
        "--synthetic",
        "mixtral-like,layers=2,tokens=300",
        "--stats",
        "--json",
    ]));
    let mut keys: Vec<&str> = s.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "coverage50",
            "coverage80",
            "coverage90",
            "drift",
            "lag1",
            "lag8",
            "reuse_median",
            "reuse_p90"
        ]
    );
    // 8 experts: each coverage is a count of experts in 1..=8, the overlaps are shares.
    for k in ["coverage50", "coverage80", "coverage90"] {
        assert!((1.0..=8.0).contains(&s[k].as_f64().unwrap()), "{k}");
    }
    for k in ["lag1", "lag8", "drift"] {
        assert!((0.0..=1.0).contains(&s[k].as_f64().unwrap()), "{k}");
    }
}

fn stderr_of_failure(args: &[&str]) -> String {
    let out = aubier(args);
    assert!(!out.status.success(), "expected failure for {args:?}");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn bad_input_fails_with_a_message_naming_it() {
    let dir = Scratch::new("errors");
    let bad_id = dir.file(
        "bad_id.jsonl",
        &format!(
            "{}{}\n",
            REPEAT_2, r#"{"seq": 0, "pos": 4, "n_experts": 4, "top_k": 1, "layers": [[4]]}"#
        ),
    );
    let err = stderr_of_failure(&[bad_id.to_str().unwrap(), "--slots", "1"]);
    assert!(
        err.contains("trace line 5: layers[0][0] = 4 is not below n_experts = 4"),
        "{err}"
    );

    let ragged = dir.file(
        "ragged.jsonl",
        &format!(
            "{}{}\n",
            REPEAT_2, r#"{"seq": 0, "pos": 4, "n_experts": 4, "top_k": 1, "layers": [[1], [2]]}"#
        ),
    );
    let err = stderr_of_failure(&[ragged.to_str().unwrap(), "--slots", "1"]);
    assert!(err.contains("trace line 5: field `layers` is 2"), "{err}");

    let trace = dir.file("t.jsonl", REPEAT_2);
    let err = stderr_of_failure(&[trace.to_str().unwrap(), "--slots", "5"]);
    assert!(err.contains("slots = 5 must be in 1..=4"), "{err}");

    let err = stderr_of_failure(&[
        trace.to_str().unwrap(),
        "--slots",
        "1",
        "--policies",
        "clock",
    ]);
    assert!(err.contains("unknown policy `clock`"), "{err}");

    let hot = dir.file("hot.json", r#"{"layers": [[1], [2]]}"#);
    let err = stderr_of_failure(&[
        trace.to_str().unwrap(),
        "--slots",
        "1",
        "--resident-set",
        hot.to_str().unwrap(),
    ]);
    assert!(
        err.contains("resident set has 2 layers, the trace has 1"),
        "{err}"
    );

    let err = stderr_of_failure(&["/nonexistent/trace.jsonl", "--slots", "1"]);
    assert!(err.contains("/nonexistent/trace.jsonl"), "{err}");

    let err = stderr_of_failure(&["--synthetic", "experts=4,hot=9", "--slots", "1"]);
    assert!(err.contains("hot = 9 must be in 1..experts (4)"), "{err}");
}

/// Each cause is printed once (`{:#}` repeated a cause already in its message: "slots = 5 must
/// be in 1..=4: slots = 5 must be in 1..=4"), on one line.
#[test]
fn an_error_names_each_cause_once() {
    let dir = Scratch::new("once");
    let trace = dir.file("t.jsonl", REPEAT_2);
    let trace = trace.to_str().unwrap();
    let missing = dir.0.join("missing.json");
    let not_json = dir.file("hot.txt", "hello");
    for (args, once) in [
        (vec![trace, "--slots", "5"], "slots = 5 must be in 1..=4"),
        (
            vec![trace, "--slots", "1", "--a1out", "NaN"],
            "a1out = NaN must be a finite fraction",
        ),
        (
            vec![
                trace,
                "--slots",
                "1",
                "--resident-set",
                missing.to_str().unwrap(),
            ],
            "No such file or directory",
        ),
        (
            vec![
                trace,
                "--slots",
                "1",
                "--resident-set",
                not_json.to_str().unwrap(),
            ],
            "expected value at line 1 column 1",
        ),
    ] {
        let err = stderr_of_failure(&args);
        let last = err.lines().last().unwrap_or_default();
        assert_eq!(last.matches(once).count(), 1, "{args:?}: {err}");
        assert!(last.starts_with("aubier replay: "), "{args:?}: {err}");
    }
}

/// `--lrfu-lambda` is checked when parsed, whichever policies run, and said to be LRFU's decay
/// (the policy's check called it "2Q lambda", "a finite fraction >= 0 of the slots", and
/// refused 2 with that message).
#[test]
fn lrfu_lambda_outside_zero_to_one_is_refused_as_lrfus() {
    let dir = Scratch::new("lambda");
    let trace = dir.file("t.jsonl", REPEAT_2);
    for v in ["2", "-0.5", "NaN"] {
        let out = aubier(&[trace.to_str().unwrap(), "--slots", "1", "--lrfu-lambda", v]);
        assert_eq!(out.status.code(), Some(2), "{v}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--lrfu-lambda") && err.contains("is not in 0..=1"),
            "{v}: {err}"
        );
    }
}

/// Off a terminal, a replay says each step on stderr as it ends, with its time: making the
/// trace, then every policy at every slot count with the tokens it replayed; then the whole
/// replay's time. Stdout keeps the JSON.
#[test]
fn replay_reports_each_run_off_a_terminal() {
    let out = aubier(&[
        "--synthetic",
        "experts=16,top_k=2,layers=2,tokens=300,seed=7",
        "--sweep",
        "2,4",
        "--policies",
        "lru,2q",
        "--json",
    ]);
    json_stdout(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    let steps = step_lines(&err, "aubier replay");
    let names: Vec<(&str, Option<&str>)> = steps
        .iter()
        .map(|s| (s.what.as_str(), s.amount.as_deref()))
        .collect();
    assert_eq!(
        names,
        [
            ("generating the trace", None),
            ("lru at 2 slots", Some("300 tokens")),
            ("2q at 2 slots", Some("300 tokens")),
            ("lru at 4 slots", Some("300 tokens")),
            ("2q at 4 slots", Some("300 tokens")),
        ],
        "{err}"
    );
    assert!(steps.iter().all(|s| s.secs >= 0.0), "{err}");
    assert!(
        err.lines().any(|l| l
            .strip_prefix("aubier replay: replayed in ")
            .and_then(|t| t.strip_suffix(" s")?.parse::<f64>().ok())
            .is_some()),
        "{err}"
    );
}

/// With a prefetch budget and no 2Q knobs given, `aubier replay` runs 2Q with the read-ahead's
/// knobs (`Kout` 25 %, `frequency:32`), on demand paging with the demand ones (`Kout` 200 %,
/// `frequency:2`): each default gives what its knobs given by flag give, and the two differ
/// on this trace.
#[test]
fn two_q_defaults_follow_the_prefetch_budget() {
    let served = |extra: &[&str]| {
        let mut args = vec![
            "--synthetic",
            "olmoe-like,rho=0.8,tokens=512,layers=4",
            "--sweep",
            "16",
            "--policies",
            "2q",
            "--json",
        ];
        args.extend_from_slice(extra);
        json_stdout(&aubier(&args))[0]["policies"]["2q"]
            .as_f64()
            .expect("a served fraction")
    };
    let prefetch_knobs = ["--admission", "frequency:32", "--a1out", "0.25"];
    let demand_knobs = ["--admission", "frequency:2", "--a1out", "2"];
    let budget = ["--prefetch-budget", "2"];
    let prefetch_default = served(&budget);
    assert_eq!(
        prefetch_default,
        served(&[&budget[..], &prefetch_knobs].concat())
    );
    assert_ne!(
        prefetch_default,
        served(&[&budget[..], &demand_knobs].concat())
    );
    let demand_default = served(&[]);
    assert_eq!(demand_default, served(&demand_knobs));
    assert_ne!(demand_default, served(&prefetch_knobs));
}
