//! Server metrics in the Prometheus text exposition format (version 0.0.4): request counts by
//! route and status, prompt and completion token counts, the last request's prefill / decode tok/s,
//! the queue depth, the running request, open connections, the engine's step counter, and the
//! expert store's served fraction (last request) and routed / fast-hit / promotion counters.

use aubier_runtime::store::expert_store::StoreReport;
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
    /// Served fraction of the last request's routed experts, as `f64::to_bits`.
    pub expert_served_fraction: AtomicU64,
    /// Routed (token, layer, expert) slots of finished requests.
    pub expert_routed: AtomicU64,
    /// Of those, served from the fast store.
    pub expert_fast_hits: AtomicU64,
    /// Experts copied into the fast store by the placement policy.
    pub expert_promotions: AtomicU64,
}

impl Metrics {
    /// Counts one answered request on `route` (the matched route pattern) with HTTP `status`.
    pub fn count_request(&self, route: &str, status: u16) {
        if let Ok(mut map) = self.requests.lock() {
            *map.entry((route.to_owned(), status)).or_insert(0) += 1;
        }
    }

    /// Records a finished request's expert-store counters.
    pub fn record_store(&self, r: &StoreReport) {
        self.expert_served_fraction
            .store(r.served_fraction.to_bits(), Ordering::Relaxed);
        self.expert_routed.fetch_add(r.routed, Ordering::Relaxed);
        self.expert_fast_hits
            .fetch_add(r.fast_hits, Ordering::Relaxed);
        self.expert_promotions
            .fetch_add(r.promotions, Ordering::Relaxed);
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
            (
                "aubier_expert_routed_total",
                "Routed (token, layer, expert) slots of finished requests.",
                &self.expert_routed,
            ),
            (
                "aubier_expert_fast_hits_total",
                "Routed expert slots served from the fast store.",
                &self.expert_fast_hits,
            ),
            (
                "aubier_expert_promotions_total",
                "Experts copied into the fast store by the placement policy.",
                &self.expert_promotions,
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
            (
                "aubier_expert_served_fraction",
                "Routed expert slots served from the fast store / all routed, last request.",
                &self.expert_served_fraction,
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

    fn text_has(m: &Metrics, line: &str) -> bool {
        m.render().contains(line)
    }

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
        m.record_store(&StoreReport {
            served_fraction: 0.75,
            fast_hits: 3,
            routed: 4,
            promotions: 1,
            ..StoreReport::default()
        });
        m.record_store(&StoreReport {
            served_fraction: 0.5,
            fast_hits: 1,
            routed: 2,
            ..StoreReport::default()
        });
        assert!(text_has(&m, "aubier_expert_served_fraction 0.5\n"));
        assert!(text_has(&m, "aubier_expert_routed_total 6\n"));
        assert!(text_has(&m, "aubier_expert_fast_hits_total 4\n"));
        assert!(text_has(&m, "aubier_expert_promotions_total 1\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
        }
    }
}
