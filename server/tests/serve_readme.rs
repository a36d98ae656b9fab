//! The README's examples as a new user runs them: its curl and openai-python blocks, read from
//! README.md itself, against `aubier serve` on the bundled demo model (no `--model`, the real
//! engine, this build's binary), with only the address `127.0.0.1:8080` replaced by the test
//! server's. And the reason the demo's context is 4096 tokens (`models/README.md`): a tool prompt
//! of an agent (a system prompt and a few tools with descriptions), over the 256 tokens the
//! fixture had, is served.
//!
//! The Python blocks need openai-python, which `cargo test` does not install: that test is
//! ignored by default and `.ci/run` runs it with a virtual environment's interpreter, an
//! absolute path in `$AUBIER_TEST_PYTHON` (the test runs in `server/`; README, "Pass the tests").

mod serve_common;

use serde_json::{json, Value};
use serve_common::process::{scratch_dir, Proc};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The address the README's examples talk to.
const README_URL: &str = "http://127.0.0.1:8080";

/// The README's fenced code blocks of language `lang`, in order, without their fences.
fn readme_blocks(lang: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let open = format!("```{lang}");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match current.as_mut() {
            None if line == open => current = Some(String::new()),
            None => {}
            Some(_) if line == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "README.md: an unclosed ```{lang} block");
    blocks
}

/// `block` talking to `addr` instead of the README's address; panics when it does not name it.
fn retarget(block: &str, addr: SocketAddr) -> String {
    assert!(
        block.contains(README_URL),
        "a README example that does not talk to {README_URL}:\n{block}"
    );
    block.replace(README_URL, &format!("http://{addr}"))
}

/// `aubier serve` on the bundled model (real engine, default backend and `--kv-max`), on an
/// OS-chosen port with a lock file in the scratch directory `dir`; returns the process, its
/// address and its listening line.
fn serve_demo(dir: &Path) -> (Proc, SocketAddr, String) {
    let lock = dir.join("serve.lock");
    let p = Proc::serve(
        &["--port", "0", "--lock-file", lock.to_str().expect("path")],
        dir,
        &[],
    );
    let line = p.listening_line();
    let addr = Proc::listening_address(&line);
    (p, addr, line)
}

/// Runs `cmd` (`what` names it in failures) and returns its standard output; panics unless it
/// exits with 0.
fn run_ok(mut cmd: Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}\nexited {:?}: {}{stdout}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Stops the server with SIGINT and checks it drained and exited cleanly.
fn stop(mut p: Proc) {
    p.signal(libc::SIGINT);
    let (code, lines) = p.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{lines:?}");
}

/// Checks the output of one curl block that sent `requests` requests: every answer is a
/// completion object with choices, or an SSE stream of chunks ending in `[DONE]`.
fn check_curl_output(block: &str, stdout: &str, requests: usize) {
    let mut answers = 0;
    let mut bodies = String::new();
    for line in stdout.lines() {
        match line.strip_prefix("data: ") {
            Some("[DONE]") => answers += 1,
            Some(chunk) => {
                let v: Value = serde_json::from_str(chunk)
                    .unwrap_or_else(|e| panic!("an SSE chunk that is not JSON ({e}): {chunk}"));
                assert_eq!(v["object"], "chat.completion.chunk", "{block}\n{v}");
            }
            None => {
                bodies.push_str(line);
                bodies.push('\n');
            }
        }
    }
    for v in serde_json::Deserializer::from_str(&bodies).into_iter::<Value>() {
        let v = v.unwrap_or_else(|e| panic!("an answer that is not JSON ({e}):\n{stdout}"));
        assert!(
            v["object"] == "chat.completion" || v["object"] == "text_completion",
            "{block}\n{v}"
        );
        assert!(
            v["choices"].as_array().is_some_and(|c| !c.is_empty()),
            "{v}"
        );
        answers += 1;
    }
    assert_eq!(answers, requests, "answers to\n{block}\ngot\n{stdout}");
}

#[test]
fn the_readme_curl_examples_run_against_the_demo() {
    let blocks: Vec<String> = readme_blocks("sh")
        .into_iter()
        .filter(|b| b.starts_with("curl "))
        .collect();
    assert!(!blocks.is_empty(), "README.md has no curl example");
    let dir = scratch_dir("serve-readme", "curl");
    let (p, addr, _) = serve_demo(&dir);
    // Each curl fails on an HTTP error status (showing the body), and ends its answer with a
    // newline so that consecutive JSON answers stay apart.
    let shim =
        "set -e\ncurl() { command curl --fail-with-body --show-error \"$@\" || exit $?; echo; }\n";
    for block in &blocks {
        let requests = block.lines().filter(|l| l.starts_with("curl ")).count();
        let mut bash = Command::new("bash");
        bash.arg("-c")
            .arg(format!("{shim}{}", retarget(block, addr)));
        let stdout = run_ok(bash, block);
        check_curl_output(block, &stdout, requests);
    }
    stop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs openai-python: .ci/run runs it with AUBIER_TEST_PYTHON set"]
fn the_readme_python_examples_run_against_the_demo() {
    let python = std::env::var("AUBIER_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let blocks = readme_blocks("python");
    assert!(!blocks.is_empty(), "README.md has no Python example");
    let dir = scratch_dir("serve-readme", "python");
    let (p, addr, _) = serve_demo(&dir);
    // One script, in the README's order: the later blocks use the first one's `client`.
    let script = blocks
        .iter()
        .map(|b| {
            if b.contains(README_URL) {
                retarget(b, addr)
            } else {
                b.clone()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let file = dir.join("readme.py");
    std::fs::write(&file, script).expect("write the script");
    let mut cmd = Command::new(&python);
    cmd.arg(&file);
    let stdout = run_ok(
        cmd,
        &format!("{python} {} (AUBIER_TEST_PYTHON)", file.display()),
    );
    // The last block prints the second turn's prompt tokens and the cached ones: the first
    // turn's prompt, a shared prefix shorter than the whole.
    let last: Vec<u64> = stdout
        .lines()
        .last()
        .unwrap_or_default()
        .split_whitespace()
        .map(|n| n.parse().expect("a count"))
        .collect();
    assert!(
        matches!(last[..], [prompt, cached] if 0 < cached && cached < prompt),
        "{stdout}"
    );
    stop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tool, described as agent frameworks describe theirs.
fn tool(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({"type": "function", "function": {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }})
}

#[tokio::test]
async fn an_agent_tool_prompt_longer_than_256_tokens_is_served() {
    let dir = scratch_dir("serve-readme", "tools");
    let (p, addr, line) = serve_demo(&dir);
    // The default KV capacity is the file's context_length (models/README.md).
    assert!(line.contains("kv_max 4096"), "{line}");
    let tools = json!([
        tool(
            "search_files",
            "Search the files of the current project for a regular expression and return the \
             matching lines with their paths and line numbers, at most `limit` of them.",
            json!({"pattern": {"type": "string", "description": "A regular expression."},
                   "path": {"type": "string", "description": "A folder to search under."},
                   "limit": {"type": "integer", "minimum": 1, "maximum": 100}}),
            &["pattern"],
        ),
        tool(
            "read_file",
            "Read a text file of the project and return its lines from `offset`, numbered.",
            json!({"path": {"type": "string"}, "offset": {"type": "integer", "minimum": 0}}),
            &["path"],
        ),
        tool(
            "run_command",
            "Run a shell command in the project's root folder and return its exit status, its \
             standard output and its standard error, each cut to 4000 characters.",
            json!({"command": {"type": "string"},
                   "timeout_s": {"type": "integer", "minimum": 1, "maximum": 600}}),
            &["command"],
        ),
        tool(
            "get_weather",
            "Get the current weather and a three-day forecast for a city, in the given unit.",
            json!({"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}),
            &["city", "unit"],
        ),
    ]);
    let system = "You are a careful coding assistant working in a software project on the user's \
                  machine. Use the tools to look at the project before answering; never guess a \
                  file's content. Keep answers short, quote the lines you rely on, and say when \
                  you are unsure. When a command fails, read its error before trying again.";
    let body = json!({
        "model": serve_common::MODEL_ID,
        "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": "Where is the latent cache sized, and how?"}],
        "tools": tools,
        "tool_choice": "required",
        "max_tokens": 24,
    });
    let resp = serve_common::raw_request(
        addr,
        "POST",
        "/v1/chat/completions",
        body.to_string().as_bytes(),
    )
    .await;
    resp.assert_status(200, "a tool prompt on the demo");
    let v = resp.json();
    let prompt = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(prompt > 256, "a prompt of {prompt} tokens tests nothing");
    let choice = &v["choices"][0];
    assert!(
        choice["finish_reason"] == "tool_calls" || choice["finish_reason"] == "length",
        "{v}"
    );
    let name = &choice["message"]["tool_calls"][0]["function"]["name"];
    assert!(
        ["search_files", "read_file", "run_command", "get_weather"]
            .iter()
            .any(|n| name == n),
        "{v}"
    );
    stop(p);
    let _ = std::fs::remove_dir_all(&dir);
}
