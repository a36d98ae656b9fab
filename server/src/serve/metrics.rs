//! Server metrics in the Prometheus text exposition format (version 0.0.4), kept in a
//! `prometheus` registry of the server's own (one per server, so tests can run several).
//!
//! Families: requests answered by route and status (a response whose body was not sent to its end
//! counts as status 499, nginx's "client closed request", except a HEAD answer, which sends none;
//! a stream that failed after its 200 head counts as 500), request duration and time-to-first-token histograms, prompt / completion token
//! counters, prefill and decode rate histograms (one observation per request), the engine's step
//! counter, the queue depth, running and in-flight requests, open connections, the latent KV
//! cache's usage, the expert store's counters and last served ratio, the read-ahead's counters
//! (`--prefetch-budget`: experts loaded ahead, their bytes, routed slots they served, late and
//! pending; zero without a budget), and the process metrics (`process_resident_memory_bytes`,
//! `process_open_fds`, ... on Linux).

use aubier_runtime::store::expert_store::StoreReport;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Status label of a response whose body the client did not take to its end.
pub const STATUS_CLIENT_CLOSED: u16 = 499;

/// Buckets of the duration histograms, seconds.
const SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Buckets of the token-rate histograms, tokens per second.
const RATE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5,
];

/// Counters, gauges and histograms shared by the HTTP side and the engine thread.
///
/// The four `AtomicUsize` gauges are read by admission decisions as well, so they are plain
/// atomics copied into the registry when `/metrics` is rendered.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_seconds: HistogramVec,
    ttft_seconds: Histogram,
    prefill_rate: Histogram,
    decode_rate: Histogram,
    prompt_tokens: IntCounter,
    completion_tokens: IntCounter,
    engine_steps: IntCounter,
    kv_cache_usage: Gauge,
    expert_served_ratio: Gauge,
    expert_routed: IntCounter,
    expert_fast_hits: IntCounter,
    expert_promotions: IntCounter,
    expert_host_bytes: IntCounter,
    read_ahead_loads: IntCounter,
    read_ahead_bytes: IntCounter,
    read_ahead_served: IntCounter,
    read_ahead_late: IntCounter,
    read_ahead_pending: IntCounter,
    /// Registry mirrors of `queue_depth`, `running`, `open_connections`, `requests_in_flight`.
    mirrors: [IntGauge; 4],
    /// Requests waiting for the single-flight engine.
    pub queue_depth: AtomicUsize,
    /// Requests the engine is running (0 or 1).
    pub running: AtomicUsize,
    /// Open TCP connections.
    pub open_connections: AtomicUsize,
    /// HTTP requests being served (from the head to the end of the response body), `/health`
    /// and `/metrics` excluded.
    pub requests_in_flight: AtomicUsize,
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .unwrap_or_else(|e| unreachable!("histogram {name}: {e}"))
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).unwrap_or_else(|e| unreachable!("counter {name}: {e}"))
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).unwrap_or_else(|e| unreachable!("gauge {name}: {e}"))
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// Every family registered, all at zero. The names and labels are fixed, so registration
    /// cannot fail.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "aubier_requests_total",
                "HTTP requests answered, by route and status (499: body not sent to its end).",
            ),
            &["route", "status"],
        )
        .unwrap_or_else(|e| unreachable!("requests: {e}"));
        let request_seconds = HistogramVec::new(
            HistogramOpts::new(
                "aubier_request_duration_seconds",
                "Time from a request's head to the end of its response body, by route.",
            )
            .buckets(SECONDS_BUCKETS.to_vec()),
            &["route"],
        )
        .unwrap_or_else(|e| unreachable!("request_seconds: {e}"));
        let m = Metrics {
            requests,
            request_seconds,
            ttft_seconds: histogram(
                "aubier_time_to_first_token_seconds",
                "Time from a generation request's head to its first generated token.",
                SECONDS_BUCKETS,
            ),
            prefill_rate: histogram(
                "aubier_prefill_tokens_per_second",
                "Prefill rate of each finished request, tok/s.",
                RATE_BUCKETS,
            ),
            decode_rate: histogram(
                "aubier_decode_tokens_per_second",
                "Decode rate of each finished request, tok/s.",
                RATE_BUCKETS,
            ),
            prompt_tokens: counter(
                "aubier_prompt_tokens_total",
                "Prompt tokens of finished requests.",
            ),
            completion_tokens: counter(
                "aubier_completion_tokens_total",
                "Generated tokens of finished requests.",
            ),
            engine_steps: counter(
                "aubier_engine_steps_total",
                "Engine steps (prefill or decode calls) since boot.",
            ),
            kv_cache_usage: Gauge::new(
                "aubier_kv_cache_usage_ratio",
                "Latent KV cache rows held / capacity (0..1), after the last engine run.",
            )
            .unwrap_or_else(|e| unreachable!("kv usage: {e}")),
            expert_served_ratio: Gauge::new(
                "aubier_expert_served_ratio",
                "Routed expert slots served from the fast store / all routed, last request.",
            )
            .unwrap_or_else(|e| unreachable!("served ratio: {e}")),
            expert_routed: counter(
                "aubier_expert_routed_total",
                "Routed (token, layer, expert) slots of finished requests.",
            ),
            expert_fast_hits: counter(
                "aubier_expert_fast_hits_total",
                "Routed expert slots served from the fast store.",
            ),
            expert_promotions: counter(
                "aubier_expert_promotions_total",
                "Experts copied into the fast store by the placement policy.",
            ),
            expert_host_bytes: counter(
                "aubier_expert_host_bytes_total",
                "Bytes of the routed experts read from the host store (over the bus on a GPU).",
            ),
            read_ahead_loads: counter(
                "aubier_expert_read_ahead_loads_total",
                "Predicted experts the read-ahead loaded into the fast store (--prefetch-budget).",
            ),
            read_ahead_bytes: counter(
                "aubier_expert_read_ahead_bytes_total",
                "Bytes of the experts the read-ahead loaded (the file's bytes).",
            ),
            read_ahead_served: counter(
                "aubier_expert_read_ahead_served_total",
                "Routed expert slots of the step that loaded their expert, served from the fast \
                 store because the read-ahead's copy was done in time.",
            ),
            read_ahead_late: counter(
                "aubier_expert_read_ahead_late_total",
                "Routed expert slots of the step that loaded their expert, read from the host \
                 store because the read-ahead's copy was not done when the experts ran.",
            ),
            read_ahead_pending: counter(
                "aubier_expert_read_ahead_pending_total",
                "Routed expert slots of later steps read from the host store because a \
                 read-ahead copy of their expert was still in flight.",
            ),
            mirrors: [
                gauge("aubier_queue_depth", "Requests waiting for the engine."),
                gauge("aubier_requests_running", "Requests the engine is running."),
                gauge("aubier_open_connections", "Open TCP connections."),
                gauge(
                    "aubier_requests_in_flight",
                    "HTTP requests being served (health and metrics probes excluded).",
                ),
            ],
            queue_depth: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            open_connections: AtomicUsize::new(0),
            requests_in_flight: AtomicUsize::new(0),
            registry,
        };
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(m.requests.clone()),
            Box::new(m.request_seconds.clone()),
            Box::new(m.ttft_seconds.clone()),
            Box::new(m.prefill_rate.clone()),
            Box::new(m.decode_rate.clone()),
            Box::new(m.prompt_tokens.clone()),
            Box::new(m.completion_tokens.clone()),
            Box::new(m.engine_steps.clone()),
            Box::new(m.kv_cache_usage.clone()),
            Box::new(m.expert_served_ratio.clone()),
            Box::new(m.expert_routed.clone()),
            Box::new(m.expert_fast_hits.clone()),
            Box::new(m.expert_promotions.clone()),
            Box::new(m.expert_host_bytes.clone()),
            Box::new(m.read_ahead_loads.clone()),
            Box::new(m.read_ahead_bytes.clone()),
            Box::new(m.read_ahead_served.clone()),
            Box::new(m.read_ahead_late.clone()),
            Box::new(m.read_ahead_pending.clone()),
        ];
        for c in collectors.into_iter().chain(
            m.mirrors
                .iter()
                .map(|g| Box::new(g.clone()) as Box<dyn prometheus::core::Collector>),
        ) {
            m.registry
                .register(c)
                .unwrap_or_else(|e| unreachable!("registering: {e}"));
        }
        #[cfg(target_os = "linux")]
        m.registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .unwrap_or_else(|e| unreachable!("process collector: {e}"));
        m
    }

    /// Counts one answered request on `route` (the matched route pattern) with HTTP `status`
    /// that took `elapsed` from its head to the end of its body.
    pub fn count_request(&self, route: &str, status: u16, elapsed: Duration) {
        self.requests
            .with_label_values(&[route, &status.to_string()])
            .inc();
        self.request_seconds
            .with_label_values(&[route])
            .observe(elapsed.as_secs_f64());
    }

    /// Records the time from a request's head to its first generated token.
    pub fn observe_first_token(&self, elapsed: Duration) {
        self.ttft_seconds.observe(elapsed.as_secs_f64());
    }

    /// Records a finished generation: its token counts and rates (tok/s).
    pub fn record_generation(
        &self,
        prompt_tokens: usize,
        completion_tokens: usize,
        prefill_tok_s: f64,
        decode_tok_s: f64,
    ) {
        self.prompt_tokens.inc_by(prompt_tokens as u64);
        self.completion_tokens.inc_by(completion_tokens as u64);
        if prefill_tok_s.is_finite() && prefill_tok_s > 0.0 {
            self.prefill_rate.observe(prefill_tok_s);
        }
        if decode_tok_s.is_finite() && decode_tok_s > 0.0 {
            self.decode_rate.observe(decode_tok_s);
        }
    }

    /// Publishes the engine's step counter (`steps` since boot; it never goes down).
    pub fn set_engine_steps(&self, steps: u64) {
        let seen = self.engine_steps.get();
        if steps > seen {
            self.engine_steps.inc_by(steps - seen);
        }
    }

    /// Engine steps published so far.
    pub fn engine_steps(&self) -> u64 {
        self.engine_steps.get()
    }

    /// Publishes the latent KV cache's usage: `used` rows held of `capacity`.
    pub fn set_kv_usage(&self, used: usize, capacity: usize) {
        self.kv_cache_usage
            .set(used as f64 / capacity.max(1) as f64);
    }

    /// Records a finished request's expert-store counters, its read-ahead's included.
    pub fn record_store(&self, r: &StoreReport) {
        self.expert_served_ratio.set(r.served_fraction);
        self.expert_routed.inc_by(r.routed);
        self.expert_fast_hits.inc_by(r.fast_hits);
        self.expert_promotions.inc_by(r.promotions);
        self.expert_host_bytes.inc_by(r.host_bytes);
        self.read_ahead_loads.inc_by(r.prefetches);
        self.read_ahead_bytes.inc_by(r.prefetch_bytes);
        self.read_ahead_served.inc_by(r.prefetch_served);
        self.read_ahead_late.inc_by(r.prefetch_late);
        self.read_ahead_pending.inc_by(r.prefetch_pending);
    }

    /// Renders every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        let sources = [
            &self.queue_depth,
            &self.running,
            &self.open_connections,
            &self.requests_in_flight,
        ];
        for (g, v) in self.mirrors.iter().zip(sources) {
            g.set(i64::try_from(v.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
        }
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!("encoding /metrics: {e}");
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_with_type_lines() {
        let m = Metrics::default();
        m.count_request("/v1/models", 200, Duration::from_millis(3));
        m.count_request("/v1/models", 200, Duration::from_millis(30));
        m.record_generation(12, 3, 100.0, 2.5);
        m.record_generation(1, 1, 0.0, 4000.0);
        m.set_engine_steps(7);
        m.set_engine_steps(9);
        m.set_kv_usage(200, 256);
        m.set_kv_usage(64, 256);
        m.record_store(&StoreReport {
            served_fraction: 0.75,
            fast_hits: 3,
            routed: 4,
            promotions: 1,
            prefetches: 5,
            prefetch_bytes: 500,
            prefetch_served: 2,
            prefetch_late: 3,
            prefetch_pending: 1,
            ..StoreReport::default()
        });
        m.record_store(&StoreReport {
            served_fraction: 0.5,
            fast_hits: 1,
            routed: 2,
            host_bytes: 640,
            prefetches: 2,
            prefetch_bytes: 200,
            prefetch_late: 1,
            ..StoreReport::default()
        });
        let text = m.render();
        for line in [
            "aubier_requests_total{route=\"/v1/models\",status=\"200\"} 2\n",
            "aubier_request_duration_seconds_bucket{route=\"/v1/models\",le=\"0.005\"} 1\n",
            "aubier_request_duration_seconds_bucket{route=\"/v1/models\",le=\"0.05\"} 2\n",
            "aubier_request_duration_seconds_count{route=\"/v1/models\"} 2\n",
            "aubier_prompt_tokens_total 13\n",
            "aubier_completion_tokens_total 4\n",
            // A zero rate (nothing decoded) is no observation.
            "aubier_prefill_tokens_per_second_count 1\n",
            "aubier_decode_tokens_per_second_bucket{le=\"2\"} 0\n",
            "aubier_decode_tokens_per_second_bucket{le=\"5\"} 1\n",
            "aubier_decode_tokens_per_second_count 2\n",
            "aubier_engine_steps_total 9\n",
            "aubier_kv_cache_usage_ratio 0.25\n",
            "aubier_expert_served_ratio 0.5\n",
            "aubier_expert_routed_total 6\n",
            "aubier_expert_fast_hits_total 4\n",
            "aubier_expert_promotions_total 1\n",
            "aubier_expert_host_bytes_total 640\n",
            "aubier_expert_read_ahead_loads_total 7\n",
            "aubier_expert_read_ahead_bytes_total 700\n",
            "aubier_expert_read_ahead_served_total 2\n",
            "aubier_expert_read_ahead_late_total 4\n",
            "aubier_expert_read_ahead_pending_total 1\n",
            "# TYPE aubier_expert_read_ahead_late_total counter\n",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|f| text.contains(&format!("# TYPE {f} histogram")))
                .unwrap_or(name);
            assert!(text.contains(&format!("# TYPE {family} ")), "{name}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_metrics_report_this_process() {
        let text = Metrics::default().render();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
        };
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let vm_rss_kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        let rss = value("process_resident_memory_bytes");
        assert!(
            (rss - vm_rss_kib * 1024.0).abs() < 0.5 * vm_rss_kib * 1024.0,
            "{rss} vs VmRSS {vm_rss_kib} kB"
        );
        assert!(value("process_open_fds") >= 3.0);
    }
}
