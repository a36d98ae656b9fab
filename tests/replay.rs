//! Expert-placement policies against references that do not come from the policies themselves:
//! 2Q against sequences worked by hand from the paper's rules (Johnson & Shasha, VLDB 1994, §2.2
//! "full version"), Belady's MIN against exhaustive search over every admit/evict choice, MIN as the
//! ceiling of the other policies, and a replay of the routing that transformers recorded for the
//! tiny model (`tests/data/models/ms4-tiny.transformers.router_ids.i32`).

use aubier_runtime::placement::arc::ArcCache;
use aubier_runtime::placement::lecar::LeCaR;
use aubier_runtime::placement::lrfu::Lrfu;
use aubier_runtime::placement::policy::PolicyKind;
use aubier_runtime::placement::policy::{
    Access, Admission, Lfu, Lru, Min, Policy, StaticSet, TwoQ, TwoQParams,
};
use aubier_runtime::placement::replay::{replay, ReplayOptions};
use aubier_runtime::placement::trace::{Trace, TraceRecord, TraceWriter};
use proptest::prelude::*;

const HIT: Access = Access::Hit;
const BYPASS: Access = Access::Miss {
    admit: false,
    evict: None,
};
const fn admit(evict: Option<u32>) -> Access {
    Access::Miss { admit: true, evict }
}

fn outcomes(p: &mut dyn Policy, steps: &[Vec<u32>]) -> Vec<Access> {
    let mut out = Vec::new();
    let mut all = Vec::new();
    for s in steps {
        p.access_step(s, &mut out).expect("valid step");
        all.extend_from_slice(&out);
    }
    all
}

fn hits(p: &mut dyn Policy, steps: &[Vec<u32>]) -> u64 {
    outcomes(p, steps).iter().filter(|a| **a == HIT).count() as u64
}

fn singles(ids: &[u32]) -> Vec<Vec<u32>> {
    ids.iter().map(|&e| vec![e]).collect()
}

/// 2Q with slots 2, Kin 1, Kout 2, empty start; one expert per token. Queues written head first.
#[test]
fn two_q_hand_worked_correlated_reference_and_promotion() {
    let params = TwoQParams {
        slots: 2,
        a1in: 1,
        a1out: 2,
        max_promotions: None,
        admission: Admission::Ghost,
    };
    let mut p = TwoQ::new(8, params, &[]).unwrap();
    let seq = singles(&[1, 2, 1, 3, 2, 1, 3, 4, 3, 2, 1]);
    let expected = [
        // t0  1: in no queue -> A1in [1]                                    (Am [])
        BYPASS,
        // t1  2: A1in [2 1] > Kin -> tail 1 to A1out [1]; A1in [2]
        BYPASS,
        // t2  1: in A1out -> promote to Am [1] (free slot)
        admit(None),
        // t3  3: A1in [3 2] > Kin -> 2 to A1out [2]; A1in [3]
        BYPASS,
        // t4  2: in A1out -> promote, Am [2 1]
        admit(None),
        // t5  1: in Am -> hit, Am [1 2]
        HIT,
        // t6  3: in A1in -> do nothing (correlated reference)
        BYPASS,
        // t7  4: A1in [4 3] > Kin -> 3 to A1out [3]; A1in [4]
        BYPASS,
        // t8  3: in A1out -> promote; Am full -> evict tail 2 (forgotten); Am [3 1]
        admit(Some(2)),
        // t9  2: forgotten, in no queue -> A1in [2 4] > Kin -> 4 to A1out [4]; A1in [2]
        BYPASS,
        // t10 1: in Am -> hit, Am [1 3]
        HIT,
    ];
    assert_eq!(outcomes(&mut p, &seq), expected);
    assert_eq!(p.resident(), vec![1, 3]);
    assert_eq!(p.a1in(), vec![2]);
    assert_eq!(p.a1out(), vec![4]);
}

/// 2Q resists a scan where LRU does not: slots 2 seeded [0 1], Kin 0, Kout 1.
#[test]
fn two_q_hand_worked_scan_resistance() {
    let params = TwoQParams {
        slots: 2,
        a1in: 0,
        a1out: 1,
        max_promotions: None,
        admission: Admission::Ghost,
    };
    let mut p = TwoQ::new(8, params, &[0, 1]).unwrap();
    let seq = singles(&[0, 1, 5, 6, 7, 0, 1, 5, 5, 0]);
    let expected = [
        // t0 0: hit, Am [0 1]; t1 1: hit, Am [1 0]
        HIT,
        HIT,
        // t2 5: A1in [5] > Kin 0 -> A1out [5]
        BYPASS,
        // t3 6: -> A1out [6 5] > Kout 1 -> drop 5; A1out [6]
        BYPASS,
        // t4 7: -> A1out [7]
        BYPASS,
        // t5 0, t6 1: still resident (the scan 5 6 7 never entered Am)
        HIT,
        HIT,
        // t7 5: forgotten -> A1out [5]
        BYPASS,
        // t8 5: in A1out -> promote, evict Am tail 0; Am [5 1], A1out []
        admit(Some(0)),
        // t9 0: forgotten -> A1out [0]
        BYPASS,
    ];
    assert_eq!(outcomes(&mut p, &seq), expected);
    // LRU on the same sequence: the scan flushes 0 and 1, so t5 and t6 miss; only t0, t1, t8 hit.
    let mut lru = Lru::new(8, 2, &[0, 1]).unwrap();
    assert_eq!(hits(&mut lru, &seq), 3);
}

/// The exact optimum of the cache model by exhaustive search: from each reachable resident set
/// `S` (a bitmask), step `t` scores `|S ∩ R_t|` and may move to any subset of `S ∪ R_t` of at most
/// `slots` experts — every combination of admissions, bypasses and evictions, and more (evicting
/// without admitting). `max_only` restricts the moves to subsets of size `min(slots, |S ∪ R_t|)`,
/// which loses nothing: a superset of resident experts can copy every later move of a subset.
fn brute_force(steps: &[Vec<u32>], slots: usize, initial: &[u32], max_only: bool) -> u64 {
    let mask = |ids: &[u32]| ids.iter().fold(0u32, |m, &e| m | (1 << e));
    let n_states = 1usize << 16;
    let mut best = vec![-1i64; n_states];
    let mut live = vec![mask(initial)];
    best[mask(initial) as usize] = 0;
    for step in steps {
        let r = mask(step);
        let mut next = vec![-1i64; n_states];
        let mut next_live = Vec::new();
        for &s in &live {
            let v = best[s as usize] + (s & r).count_ones() as i64;
            let pool = s | r;
            let keep = (slots as u32).min(pool.count_ones());
            let mut sub = pool;
            loop {
                let size = sub.count_ones();
                if size <= slots as u32 && (!max_only || size == keep) {
                    if next[sub as usize] < 0 {
                        next_live.push(sub);
                    }
                    next[sub as usize] = next[sub as usize].max(v);
                }
                if sub == 0 {
                    break;
                }
                sub = (sub - 1) & pool;
            }
        }
        best = next;
        live = next_live;
    }
    live.iter().map(|&s| best[s as usize]).max().unwrap_or(0) as u64
}

/// A random trace: `tokens` steps of `k` distinct experts out of `n`.
fn arb_steps(
    n: u32,
    k: usize,
    tokens: std::ops::Range<usize>,
) -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(
        prop::sample::subsequence((0..n).collect::<Vec<_>>(), k).prop_shuffle(),
        tokens,
    )
}

/// Tiny cases for the exhaustive search: n ≤ 6 experts, k ≤ 2, slots ≤ 3, ≤ 10 tokens, a random
/// initial membership.
fn arb_tiny() -> impl Strategy<Value = (u32, usize, Vec<Vec<u32>>, Vec<u32>)> {
    (2u32..=6, 1usize..=2, 1usize..=3)
        .prop_filter("k <= n, slots <= n", |(n, k, s)| {
            *k as u32 <= *n && *s as u32 <= *n
        })
        .prop_flat_map(|(n, k, slots)| {
            (
                Just(n),
                Just(slots),
                arb_steps(n, k, 1..10),
                prop::sample::subsequence((0..n).collect::<Vec<_>>(), 0..=slots),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn min_equals_exhaustive_search((n, slots, steps, initial) in arb_tiny()) {
        let want = brute_force(&steps, slots, &initial, false);
        let mut min = Min::new(n, slots, &initial, steps.iter().map(|s| s.as_slice())).unwrap();
        prop_assert_eq!(hits(&mut min, &steps), want);
    }
}

/// Random traces for the ceiling test: up to 12 experts, k ≤ 3, up to 80 tokens, random 2Q knobs.
fn arb_trace() -> impl Strategy<Value = (u32, usize, Vec<Vec<u32>>, TwoQParams)> {
    (2u32..=12, 1usize..=3, 1usize..=12)
        .prop_filter("k <= n, slots <= n", |(n, k, s)| {
            *k as u32 <= *n && *s as u32 <= *n
        })
        .prop_flat_map(|(n, k, slots)| {
            (
                Just(n),
                Just(slots),
                arb_steps(n, k, 1..80),
                (
                    0usize..=8,
                    0usize..=8,
                    prop::option::of(0usize..=3),
                    any::<bool>(),
                ),
            )
        })
        .prop_map(|(n, slots, steps, (a1in, a1out, max_promotions, ghost))| {
            let params = TwoQParams {
                slots,
                a1in,
                a1out,
                max_promotions,
                admission: if ghost {
                    Admission::Ghost
                } else {
                    Admission::Remembered
                },
            };
            (n, slots, steps, params)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn min_is_the_ceiling((n, slots, steps, params) in arb_trace()) {
        let seed: Vec<u32> = (0..slots as u32).collect();
        let refs = || steps.iter().map(|s| s.as_slice());
        let min = hits(&mut Min::new(n, slots, &seed, refs()).unwrap(), &steps);
        let others: [(&str, Box<dyn Policy>); 6] = [
            ("2q", Box::new(TwoQ::new(n, params, &seed).unwrap())),
            ("lru", Box::new(Lru::new(n, slots, &seed).unwrap())),
            ("lfu", Box::new(Lfu::new(n, slots, &seed).unwrap())),
            ("arc", Box::new(ArcCache::new(n, slots, &seed).unwrap())),
            ("lrfu", Box::new(Lrfu::new(n, slots, 0.1, &seed).unwrap())),
            ("lecar", Box::new(LeCaR::new(n, slots, &seed).unwrap())),
        ];
        for (name, mut p) in others {
            let h = hits(p.as_mut(), &steps);
            prop_assert!(h <= min, "{} {} > min {}", name, h, min);
        }
        // `static` starts from its own set, so compare it with MIN started from that set.
        let mut st = StaticSet::oracle(n, slots, refs()).unwrap();
        let st_set = st.resident();
        let h = hits(&mut st, &steps);
        let min_same_start = hits(&mut Min::new(n, slots, &st_set, refs()).unwrap(), &steps);
        prop_assert!(h <= min_same_start, "static {} > min {}", h, min_same_start);
    }
}

/// The routing transformers recorded for ms4-tiny (3 layers, 200 tokens, 16 experts, top-4),
/// written through `TraceWriter` and read back through `Trace::read` (in a scratch directory
/// named after the test, as tests run in parallel).
fn fixture_trace(name: &str) -> Trace {
    let path = aubier_tests::data_dir().join("models/ms4-tiny.transformers.router_ids.i32");
    let ids = aubier_tests::read_i32(&path);
    let (layers, tokens, k) = (3usize, 200usize, 4usize);
    assert_eq!(ids.len(), layers * tokens * k, "router_ids is [3, 200, 4]");
    let dir = std::env::temp_dir().join(format!("aubier-replay-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ms4-tiny.trace.jsonl");
    let mut w = TraceWriter::new(std::io::BufWriter::new(
        std::fs::File::create(&file).unwrap(),
    ));
    for t in 0..tokens {
        let rows = (0..layers)
            .map(|l| {
                let at = (l * tokens + t) * k;
                ids[at..at + k].iter().map(|&e| e as u32).collect()
            })
            .collect();
        w.write(&TraceRecord {
            seq: 0,
            pos: t as u64,
            n_experts: 16,
            top_k: k as u32,
            layers: rows,
        })
        .unwrap();
    }
    w.flush().unwrap();
    drop(w);
    let trace = Trace::read(&file).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        (trace.tokens(), trace.n_layers(), trace.n_experts()),
        (200, 3, 16)
    );
    trace
}

#[test]
fn fixture_trace_min_is_optimal_and_the_ceiling() {
    let trace = fixture_trace("min");
    // 25 % of 16 experts: the exhaustive search is cheap enough at 4 slots.
    let slots = 4;
    let opts = ReplayOptions::new(slots);
    let mut optimum = 0;
    for l in 0..3 {
        let steps: Vec<Vec<u32>> = trace.layer_steps(l).unwrap().map(<[u32]>::to_vec).collect();
        optimum += brute_force(&steps, slots, &[0, 1, 2, 3], true);
    }
    let min = replay(&trace, PolicyKind::Min, &opts).unwrap();
    assert_eq!(min.hits, optimum);
    assert_eq!(min.routed, 2400);
    for kind in [PolicyKind::TwoQ, PolicyKind::Lru, PolicyKind::Lfu] {
        let s = replay(&trace, kind, &opts).unwrap();
        assert!(s.hits <= min.hits, "{kind}: {} > {}", s.hits, min.hits);
    }
}

#[test]
fn fixture_trace_static_is_the_top_frequency_set() {
    let trace = fixture_trace("static");
    let ids = aubier_tests::read_i32(
        &aubier_tests::data_dir().join("models/ms4-tiny.transformers.router_ids.i32"),
    );
    for slots in [4usize, 6] {
        // Count straight from the fixture: per layer, the `slots` largest expert counts.
        let mut want = 0u64;
        for layer in ids.chunks(800) {
            let mut count = [0u64; 16];
            for &e in layer {
                count[e as usize] += 1;
            }
            count.sort_unstable_by(|a, b| b.cmp(a));
            want += count[..slots].iter().sum::<u64>();
        }
        let got = replay(&trace, PolicyKind::Static, &ReplayOptions::new(slots)).unwrap();
        assert_eq!(got.hits, want, "slots {slots}");
    }
}
