//! Two `aubier serve` replicas on the bundled model behind HAProxy with the repository's
//! configuration (deploy/haproxy/aubier.cfg), all on 127.0.0.1: the replicas on ports of their
//! own choosing, the proxy on listening sockets it inherits (`fd@N`), the health checks every
//! 200 ms. A fixed load: 4 conversations × 3 turns, two keyed by `X-Session-ID` and two by the
//! body's `user`, one conversation after the other (a replica's prompt cache keeps the chain of its
//! last request, so turns of conversations that share a replica must not interleave for the reuse
//! to show), then a burst of 4 keyless streams at once. It checks that every turn of a
//! conversation is served by one replica (the `X-Aubier-Replica` header), also a body whose `user`
//! comes after more than HAProxy's default 16 KiB buffer; that turns ≥ 2 report
//! `usage.prompt_tokens_details.cached_tokens` of at least the previous turn's prompt tokens (the
//! bare `> 0` holds on any replica: conversations share the chat template's first tokens); that
//! the burst gets only 200s from both replicas (round robin) and queued in the proxy
//! (`haproxy_backend_max_queue` of its Prometheus exporter ≥ 1); that every stream sends content
//! before `[DONE]`. Then one replica is stopped
//! (SIGTERM): its conversations get 200s from the other, before and after the checks mark it
//! down, and the proxy's `/health` stays 200; with both stopped it is 503. Children are stopped by
//! PID and killed when dropped. Without `haproxy` the test fails saying how to install it.

mod serve_common;

use serde_json::{json, Value};
use serve_common::process::{scratch_dir, Proc};
use serve_common::{chat_stream_text, raw_request, raw_request_with, RawResponse, MODEL_ID};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const INSTALL: &str = "sudo apt-get install -y haproxy";

/// The replicas' names in the configuration, in the order of `AUBIER_REPLICA_1`, `_2`.
const NAMES: [&str; 2] = ["r1", "r2"];

/// Completion tokens per turn: few, so that a conversation's 5 turns stay quick on the debug
/// build.
const MAX_TOKENS: u32 = 8;

/// HAProxy's default `tune.bufsize`: a `user` field past it is found only with the configured one.
const DEFAULT_BUFSIZE: usize = 16 * 1024;

fn config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/haproxy/aubier.cfg")
}

/// The `haproxy` program: on PATH, else in an sbin directory (Debian installs it in /usr/sbin,
/// which is not on a user's PATH); fails the test, with the install command, where there is none.
fn haproxy() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("haproxy"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "this test runs HAProxy in front of two `aubier serve` and cannot run without \
                 it: no haproxy on PATH, in /usr/sbin or /usr/local/sbin; install it: {INSTALL}"
            )
        })
}

/// HAProxy's version line.
fn haproxy_version() -> String {
    let o = Command::new(haproxy())
        .arg("-v")
        .output()
        .expect("haproxy -v");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// HAProxy on the repository's configuration.
struct Proxy {
    proc: Proc,
    /// Where clients connect.
    front: SocketAddr,
    /// The Prometheus exporter's listener.
    stats: SocketAddr,
}

impl Proxy {
    /// Starts HAProxy in front of `replicas` (in the order of [`NAMES`]), logging to `log`, once
    /// `haproxy -c` accepts the configuration, and waits for its `/health`.
    fn start(replicas: [SocketAddr; 2], log: &Path) -> Proxy {
        let front = TcpListener::bind("127.0.0.1:0").expect("bind the front");
        let stats = TcpListener::bind("127.0.0.1:0").expect("bind the stats listener");
        let fds = [front.as_raw_fd(), stats.as_raw_fd()];
        let haproxy = |mode: &str| {
            let mut cmd = Command::new(haproxy());
            cmd.arg(mode)
                .arg("-f")
                .arg(config())
                .env("AUBIER_PROXY_BIND", format!("fd@{}", fds[0]))
                .env("AUBIER_PROXY_STATS", format!("fd@{}", fds[1]))
                .env("AUBIER_REPLICA_1", replicas[0].to_string())
                .env("AUBIER_REPLICA_2", replicas[1].to_string())
                .env("AUBIER_PROXY_CHECK_INTER", "200ms");
            // SAFETY: the closure runs in the forked child before exec and calls only fcntl(2),
            // which is async-signal-safe, on two descriptors this process holds open until after
            // the spawn: it clears their close-on-exec flag so that HAProxy inherits the sockets.
            unsafe {
                cmd.pre_exec(move || {
                    for fd in fds {
                        if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
            cmd
        };
        let check = haproxy("-c").output().expect("haproxy -c");
        assert!(
            check.status.success(),
            "haproxy -c refuses {}:\n{}",
            config().display(),
            String::from_utf8_lossy(&check.stderr)
        );
        let mut cmd = haproxy("-db");
        cmd.stdout(Stdio::from(std::fs::File::create(log).expect("log file")));
        let mut proxy = Proxy {
            proc: Proc::spawn(cmd),
            front: front.local_addr().expect("front address"),
            stats: stats.local_addr().expect("stats address"),
        };
        drop((front, stats));
        let t0 = Instant::now();
        while health(proxy.front) != 200 {
            assert!(
                !proxy.proc.exited() && t0.elapsed() < Duration::from_secs(10),
                "the proxy's /health never answered 200: {:?}",
                proxy.proc.lines_so_far()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        proxy
    }

    /// The exporter's value of `metric` (the whole `name{labels}`).
    fn metric(&self, metric: &str) -> f64 {
        let text = String::from_utf8(get(self.stats, "/metrics").body()).expect("UTF-8");
        text.lines()
            .find_map(|l| l.strip_prefix(metric)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{metric} not in the proxy's /metrics:\n{text}"))
    }

    /// Waits (up to 10 s) until the proxy counts `n` replicas up.
    fn wait_active(&self, n: u32) {
        let t0 = Instant::now();
        while self.metric("haproxy_backend_active_servers{proxy=\"aubier\"}") != f64::from(n) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the proxy never counted {n} replicas up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Runs one request future to its end on a runtime of its own.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// POSTs the JSON `body` to `/v1/chat/completions` with `headers` added.
fn chat(addr: SocketAddr, headers: &[(&str, &str)], body: &str) -> RawResponse {
    let mut all = vec![("Host", "127.0.0.1"), ("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    let path = "/v1/chat/completions";
    block_on(raw_request_with(addr, "POST", path, &all, body.as_bytes()))
}

fn get(addr: SocketAddr, path: &str) -> RawResponse {
    block_on(raw_request(addr, "GET", path, b""))
}

/// The status of the proxy's `/health`.
fn health(front: SocketAddr) -> u16 {
    get(front, "/health").status
}

fn replica(resp: &RawResponse) -> String {
    resp.header("x-aubier-replica")
        .unwrap_or_else(|| panic!("no X-Aubier-Replica header: {:?}", resp.headers))
        .to_owned()
}

/// The SSE payloads of a streamed answer, checking that it ends with `[DONE]` and sends content
/// before it.
fn stream_payloads(resp: &RawResponse) -> Vec<String> {
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let body = String::from_utf8(resp.body()).expect("UTF-8 stream");
    let payloads: Vec<String> = body
        .split_terminator("\n\n")
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data event: {e:?}"))
                .to_owned()
        })
        .collect();
    assert_eq!(
        payloads.last().map(String::as_str),
        Some("[DONE]"),
        "{body}"
    );
    let (content, _, _) = chat_stream_text(&payloads);
    assert!(!content.is_empty(), "no content before [DONE]: {body}");
    payloads
}

/// A conversation and the routing key it sends.
struct Conversation {
    key: String,
    /// The key goes in the `X-Session-ID` header (else in the body's `user`).
    header: bool,
    messages: Vec<Value>,
}

/// What one turn got.
struct Turn {
    replica: String,
    prompt_tokens: u64,
    cached_tokens: u64,
}

impl Conversation {
    fn new(i: usize) -> Conversation {
        let header = i < 2;
        Conversation {
            key: format!("{}-{i}", if header { "session" } else { "user" }),
            header,
            messages: Vec::new(),
        }
    }

    /// The request body for the messages so far plus `extra` fields.
    fn body(&self, extra: Value) -> Value {
        let mut body = json!({
            "model": MODEL_ID,
            "messages": self.messages,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        });
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        // Last, after the messages, as openai-python writes it.
        if !self.header {
            body["user"] = json!(self.key);
        }
        body
    }

    fn send(&self, front: SocketAddr, body: &str) -> RawResponse {
        let headers: &[(&str, &str)] = if self.header {
            &[("X-Session-ID", &self.key)]
        } else {
            &[]
        };
        chat(front, headers, body)
    }

    /// Sends the user message `text` (streamed or not), asserts a 200, keeps the reply.
    fn turn(&mut self, front: SocketAddr, text: &str, stream: bool) -> Turn {
        self.messages.push(json!({"role": "user", "content": text}));
        let extra = if stream {
            json!({"stream": true, "stream_options": {"include_usage": true}})
        } else {
            json!({})
        };
        let resp = self.send(front, &self.body(extra).to_string());
        resp.assert_status(200, &self.key);
        let (reply, usage) = if stream {
            let payloads = stream_payloads(&resp);
            let usage = payloads
                .iter()
                .filter(|p| p.as_str() != "[DONE]")
                .map(|p| serde_json::from_str::<Value>(p).expect("chunk"))
                .find(|v| v["usage"].is_object())
                .expect("a usage chunk")["usage"]
                .clone();
            (chat_stream_text(&payloads).0, usage)
        } else {
            let v = resp.json();
            let reply = v["choices"][0]["message"]["content"]
                .as_str()
                .expect("content")
                .to_owned();
            (reply, v["usage"].clone())
        };
        self.messages
            .push(json!({"role": "assistant", "content": reply}));
        let count = |k: &str| usage.pointer(k).and_then(Value::as_u64);
        Turn {
            replica: replica(&resp),
            prompt_tokens: count("/prompt_tokens").expect("prompt_tokens"),
            cached_tokens: count("/prompt_tokens_details/cached_tokens")
                .unwrap_or_else(|| panic!("no cached_tokens: {usage}")),
        }
    }
}

#[test]
fn replicas_behind_haproxy_keep_conversations_queue_bursts_and_fail_over() {
    let version = haproxy_version();
    let t0 = Instant::now();
    let dir = scratch_dir("serve-replicas", "run");
    let mut replicas: Vec<Proc> = NAMES
        .iter()
        .map(|name| {
            let lock = dir.join(format!("{name}.lock"));
            let lock = lock.to_str().expect("path");
            Proc::serve(&["--port", "0", "--lock-file", lock], &dir, &[])
        })
        .collect();
    let addrs = [replicas[0].address(), replicas[1].address()];
    let log = dir.join("haproxy.log");
    eprintln!("{version}; its log: {}", log.display());
    let proxy = Proxy::start(addrs, &log);

    // 4 conversations × 3 turns, the third streamed: each on one replica, whose cache holds the
    // turn before (at least its prompt's rows; other backends than cpu reuse the reply's too).
    let mut conversations: Vec<Conversation> = (0..4).map(Conversation::new).collect();
    let mut home = Vec::new();
    for (n, c) in conversations.iter_mut().enumerate() {
        let mut before = c.turn(
            proxy.front,
            &format!("Tell me about lighthouse {n}."),
            false,
        );
        for (i, text) in ["Who kept it?", "And then?"].iter().enumerate() {
            let t = c.turn(proxy.front, text, i == 1);
            assert_eq!(t.replica, before.replica, "{} moved", c.key);
            assert!(
                t.cached_tokens >= before.prompt_tokens && t.cached_tokens < t.prompt_tokens,
                "{} turn {}: {} of {} prompt tokens cached, the turn before had {}",
                c.key,
                i + 2,
                t.cached_tokens,
                t.prompt_tokens,
                before.prompt_tokens
            );
            before = t;
        }
        home.push(before.replica);
    }
    eprintln!("the conversations' replicas: {home:?}");

    // A `user` after more than HAProxy's default buffer still routes (the replica answers 400:
    // the prompt is longer than the context).
    let mut long = Conversation::new(2);
    long.messages = vec![json!({"role": "user", "content": "lighthouse ".repeat(2000)})];
    let body = long.body(json!({})).to_string();
    assert!(body.rfind("\"user\"").expect("user") > DEFAULT_BUFSIZE);
    for _ in 0..3 {
        let resp = long.send(proxy.front, &body);
        resp.assert_status(400, &long.key);
        assert_eq!(
            replica(&resp),
            home[2],
            "{} with a long body moved",
            long.key
        );
    }

    // A burst of 4 keyless streams: only 200s, from both replicas, some queued in the proxy.
    let burst: Vec<_> = (0..4)
        .map(|i| {
            let body = json!({
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": format!("Burst {i}.")}],
                "max_tokens": 64,
                "temperature": 0,
                "stream": true,
            })
            .to_string();
            let front = proxy.front;
            std::thread::spawn(move || chat(front, &[], &body))
        })
        .collect();
    let mut served = std::collections::BTreeSet::new();
    for b in burst {
        let resp = b.join().expect("burst request");
        resp.assert_status(200, "burst");
        stream_payloads(&resp);
        served.insert(replica(&resp));
    }
    assert_eq!(served.len(), 2, "the keyless burst went to {served:?} only");
    let queued = proxy.metric("haproxy_backend_max_queue{proxy=\"aubier\"}");
    assert!(queued >= 1.0, "the proxy never queued: max queue {queued}");

    // One replica stopped: its conversations go to the other, at once and once it is marked
    // down; the proxy stays healthy.
    let stopped = NAMES
        .iter()
        .position(|n| *n == home[0])
        .expect("a replica name");
    let other = NAMES[1 - stopped];
    replicas[stopped].signal(libc::SIGTERM);
    let (code, lines) = replicas[stopped].wait(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{lines:?}");
    for text in ["Still there?", "Hello?"] {
        for c in &mut conversations {
            let t = c.turn(proxy.front, text, false);
            assert_eq!(t.replica, other, "{}", c.key);
        }
        assert_eq!(health(proxy.front), 200);
        proxy.wait_active(1);
    }
    assert_eq!(health(proxy.front), 200);

    // Both stopped: the proxy's /health is 503.
    replicas[1 - stopped].signal(libc::SIGTERM);
    let (code, lines) = replicas[1 - stopped].wait(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{lines:?}");
    proxy.wait_active(0);
    assert_eq!(health(proxy.front), 503);

    let took = t0.elapsed();
    eprintln!("took {took:?}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}
