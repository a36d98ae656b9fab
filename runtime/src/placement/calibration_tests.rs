//! The calibrated presets against the statistics of real routing in
//! `../shared/design/ROUTING.md`, on the held-out seed (the presets' own; tuned on
//! [`Preset::TUNING_SEED`]). The targets below are typed in from that file — external reference
//! values, measured by others on traces this repository does not have: the table "What real MoE
//! routing looks like" (per layer, mean over layers; a range is taken at its midpoint) and the
//! table of hit rates "at two cache sizes" — and from issue 34, which gives `aubier replay`'s own
//! figures on the same real traces at 37.5 % slots (ROUTING.md's replay has conventions of its own:
//! its LFU is 1.8 / 4.0 points above `aubier replay`'s `lfu` on Qwen / OLMoE, its MIN 1.7 / 1.9
//! below). Tolerances are the issue's: each statistic within ±10 % of its target, each hit rate
//! within ±3 points.

use super::policy::{Admission, PolicyKind, TwoQParams};
use super::replay::{replay, ReplayOptions};
use super::stats::{trace_stats, RoutingStats};
use super::synthetic::{synthetic_trace, Preset};
use super::trace::Trace;

/// ROUTING.md's statistics of a source model (midpoints of ranges).
fn target(p: Preset) -> RoutingStats {
    match p {
        // Qwen1.5-MoE-A2.7B: coverage 22–25 / 41–44 / 50–52, overlap 0.114 / 0.080, reuse 9.4 /
        // 33.6, drift 0.24.
        Preset::QwenLike => RoutingStats {
            coverage: [23.5, 42.5, 51.0],
            lag1: 0.114,
            lag8: 0.080,
            reuse_median: 9.4,
            reuse_p90: 33.6,
            drift: 0.24,
        },
        // OLMoE-1B-7B: 17 / 39 / 50, 0.288 / 0.252, 3 / 17, 0.42.
        Preset::OlmoeLike => RoutingStats {
            coverage: [17.0, 39.0, 50.0],
            lag1: 0.288,
            lag8: 0.252,
            reuse_median: 3.0,
            reuse_p90: 17.0,
            drift: 0.42,
        },
        // Mixtral-8x7B: 4 / 6–7 / 7–8, 0.375 / 0.282, 2.1 / 9.1, 0.31.
        Preset::MixtralLike => RoutingStats {
            coverage: [4.0, 6.5, 7.5],
            lag1: 0.375,
            lag8: 0.282,
            reuse_median: 2.1,
            reuse_p90: 9.1,
            drift: 0.31,
        },
        // Qwen's, scaled by the fraction of experts (128 / 60): counts of experts and reuse
        // distances (which grow as experts / top-k at the same top-k) scale by it; overlaps keep
        // their ratio to chance (top-k / experts), so scale by 60 / 128; the drift (a Jaccard
        // index of a quarter of the experts) is kept.
        Preset::Mistral4Like => {
            let q = target(Preset::QwenLike);
            let f = 128.0 / 60.0;
            RoutingStats {
                coverage: q.coverage.map(|c| c * f),
                lag1: q.lag1 / f,
                lag8: q.lag8 / f,
                reuse_median: q.reuse_median * f,
                reuse_p90: q.reuse_p90 * f,
                drift: q.drift,
            }
        }
    }
}

/// The policies of the hit-rate checks, in the order of [`hits`] and [`target_hits`].
const POLICIES: [&str; 5] = ["lru", "lfu", "2q", "static", "min"];

/// ROUTING.md's hit rates (fractions): (slots, [LRU, LFU, 2Q with Kin 25 % and Kout 50 %, best
/// static set (offline), MIN]).
fn target_hits(p: Preset) -> &'static [(usize, [f64; 5])] {
    match p {
        Preset::QwenLike => &[
            (15, [0.309, 0.344, 0.331, 0.341, 0.569]),
            (23, [0.441, 0.491, 0.463, 0.490, 0.713]),
        ],
        Preset::OlmoeLike => &[
            (16, [0.473, 0.517, 0.503, 0.484, 0.654]),
            (24, [0.625, 0.651, 0.641, 0.614, 0.796]),
        ],
        Preset::MixtralLike | Preset::Mistral4Like => &[],
    }
}

/// Issue 34's hit rates of `aubier replay` on ROUTING.md's real traces at 37.5 % slots (the same
/// code as [`hits`], so the same conventions): (slots, [LRU, LFU, 2Q, static, MIN]), `None`
/// where the issue gives no figure (its 2Q was the default of the day, whose knobs it does not
/// give; static it does not report).
fn target_replayed(p: Preset) -> &'static [(usize, [Option<f64>; 5])] {
    match p {
        Preset::QwenLike => &[(23, [Some(0.441), Some(0.473), None, None, Some(0.730)])],
        Preset::OlmoeLike => &[(24, [Some(0.622), Some(0.611), None, None, Some(0.815)])],
        Preset::MixtralLike | Preset::Mistral4Like => &[],
    }
}

/// The measured hit rates of LRU, LFU, 2Q with the paper's knobs (ROUTING.md's "Kin 25%, Kout
/// 50%"), the offline static set and MIN, in the order of [`POLICIES`].
fn hits(trace: &Trace, slots: usize) -> [f64; 5] {
    let opts = ReplayOptions {
        a1in: TwoQParams::PAPER_A1IN,
        a1out: TwoQParams::PAPER_A1OUT,
        admission: Admission::Ghost,
        ..ReplayOptions::new(slots)
    };
    [
        PolicyKind::Lru,
        PolicyKind::Lfu,
        PolicyKind::TwoQ,
        PolicyKind::Static,
        PolicyKind::Min,
    ]
    .map(|k| replay(trace, k, &opts).unwrap().fraction())
}

/// The checks the held-out seed fails, as `(preset, check)`: olmoe-like's p90 reuse distance
/// (19.75 tokens against 17 ± 1.7) and its MIN at 16 slots (0.708 against 0.654 ± 0.03). No
/// setting of the generator's knobs tried on the tuning seed brought these two within tolerance
/// with the others (every olmoe-like setting tried put MIN 4–5 points above ROUTING.md's; see
/// docs/BENCHMARKS.md). They stay listed here, at the tolerances, so that a change to the
/// generator that fixes them — or that breaks another check — fails this test until the list says
/// so.
const KNOWN_MISSES: &[(Preset, &str)] = &[
    (Preset::OlmoeLike, "reuse_p90"),
    (Preset::OlmoeLike, "16 slots min"),
];

#[test]
fn presets_match_real_routing_on_the_held_out_seed() {
    let mut misses = Vec::new();
    for p in Preset::ALL {
        let trace = synthetic_trace(&p.spec()).unwrap();
        let got = trace_stats(&trace).named();
        for ((name, g), (_, w)) in got.iter().zip(target(p).named()) {
            let ok = (g - w).abs() <= 0.1 * w;
            eprintln!(
                "{p} {name}: {g:.3} (target {w:.3} ± 10 %){}",
                if ok { "" } else { " MISS" }
            );
            if !ok {
                misses.push((p, name.to_string()));
            }
        }
        let mut check_hit = |label: String, g: f64, w: f64| {
            let ok = (g - w).abs() <= 0.03;
            eprintln!(
                "{p} {label}: {g:.3} (target {w:.3} ± 0.03){}",
                if ok { "" } else { " MISS" }
            );
            if !ok {
                misses.push((p, label));
            }
        };
        for &(slots, want) in target_hits(p) {
            let got = hits(&trace, slots);
            for ((name, g), w) in POLICIES.iter().zip(got).zip(want) {
                check_hit(format!("{slots} slots {name}"), g, w);
            }
        }
        for &(slots, want) in target_replayed(p) {
            let got = hits(&trace, slots);
            for ((name, g), w) in POLICIES.iter().zip(got).zip(want) {
                if let Some(w) = w {
                    check_hit(format!("{slots} slots {name} (issue 34)"), g, w);
                }
            }
        }
    }
    let known: Vec<(Preset, String)> = KNOWN_MISSES
        .iter()
        .map(|&(p, c)| (p, c.to_string()))
        .collect();
    assert_eq!(misses, known);
}
