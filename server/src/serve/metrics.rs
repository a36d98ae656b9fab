//! Server metrics in the Prometheus text exposition format (version 0.0.4): request counts by
//! route and status, prompt and completion token counts, the last request's prefill / decode tok/s,
//! the queue depth, the running request, open connections and the engine's step counter.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Counters and gauges shared by the HTTP side and the engine thread.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: AtomicU64,
    /// Generated tokens of finished requests.
    pub completion_tokens: AtomicU64,
    /// Last request's prefill rate, tok/s, as `f64::to_bits`.
    pub prefill_tok_s: AtomicU64,
    /// Last request's decode rate, tok/s, as `f64::to_bits`.
    pub decode_tok_s: AtomicU64,
    /// Requests waiting for the single-flight engine.
    pub queue_depth: AtomicUsize,
    /// Requests the engine is running (0 or 1).
    pub running: AtomicUsize,
    /// Admitted open TCP connections.
    pub open_connections: AtomicUsize,
    /// Engine steps (`Session::step` calls) since boot, published after each request.
    pub engine_steps: AtomicU64,
}

impl Metrics {
    /// Counts one answered request on `route` (the matched route pattern) with HTTP `status`.
    pub fn count_request(&self, route: &str, status: u16) {
        if let Ok(mut map) = self.requests.lock() {
            *map.entry((route.to_owned(), status)).or_insert(0) += 1;
        }
    }

    /// Renders every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP aubier_requests_total HTTP requests answered, by route and status."
        );
        let _ = writeln!(out, "# TYPE aubier_requests_total counter");
        if let Ok(map) = self.requests.lock() {
            for ((route, status), n) in map.iter() {
                let _ = writeln!(
                    out,
                    "aubier_requests_total{{route=\"{}\",status=\"{status}\"}} {n}",
                    escape_label(route)
                );
            }
        }
        let counters = [
            (
                "aubier_prompt_tokens_total",
                "Prompt tokens of finished requests.",
                &self.prompt_tokens,
            ),
            (
                "aubier_completion_tokens_total",
                "Generated tokens of finished requests.",
                &self.completion_tokens,
            ),
            (
                "aubier_engine_steps_total",
                "Engine steps (prefill or decode calls) since boot.",
                &self.engine_steps,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", v.load(Ordering::Relaxed));
        }
        let rates = [
            (
                "aubier_prefill_tokens_per_second",
                "Prefill rate of the last request, tok/s.",
                &self.prefill_tok_s,
            ),
            (
                "aubier_decode_tokens_per_second",
                "Decode rate of the last request, tok/s.",
                &self.decode_tok_s,
            ),
        ];
        for (name, help, v) in rates {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {}", f64::from_bits(v.load(Ordering::Relaxed)));
        }
        let gauges = [
            (
                "aubier_queue_depth",
                "Requests waiting for the engine.",
                &self.queue_depth,
            ),
            (
                "aubier_requests_running",
                "Requests the engine is running.",
                &self.running,
            ),
            (
                "aubier_open_connections",
                "Admitted open connections.",
                &self.open_connections,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {}", v.load(Ordering::Relaxed));
        }
        out
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_with_type_lines() {
        let m = Metrics::default();
        m.count_request("/v1/models", 200);
        m.count_request("/v1/models", 200);
        m.prompt_tokens.store(12, Ordering::Relaxed);
        m.decode_tok_s.store(2.5f64.to_bits(), Ordering::Relaxed);
        let text = m.render();
        assert!(text.contains("aubier_requests_total{route=\"/v1/models\",status=\"200\"} 2\n"));
        assert!(text.contains("aubier_prompt_tokens_total 12\n"));
        assert!(text.contains("aubier_decode_tokens_per_second 2.5\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
        }
    }
}
