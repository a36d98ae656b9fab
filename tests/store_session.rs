//! The split expert store in the decode loop, on the bundled 2-bit model (3 MoE layers of 16
//! experts, top-4):
//! * the logits of a prompt (prefill, then token-by-token decode) are bitwise identical whatever
//!   the placement — no fast store, a seeded set, every expert resident, 2Q rotating (checked to
//!   have promoted and to have served both from the fast store and from the host alias);
//! * `--reset exact`: a second request after a first is served (served fraction, routing,
//!   logits) exactly as on a fresh boot; `--reset none`: the same second request is served
//!   differently (the first request's rotation carries over).

use aubier_runtime::placement::hotset::HotSet;
use aubier_runtime::placement::policy::PolicyKind;
use aubier_runtime::session::{Session, SessionOptions};
use aubier_runtime::store::expert_store::{ResetMode, StoreOptions, StoreReport};
use aubier_tests::{bundled_model, shared_prompt, slots};

fn open(store: &StoreOptions) -> Session {
    Session::open_with_store(bundled_model(), SessionOptions { kv_max: 64 }, store)
        .expect("session")
}

/// One request: prefill `ids[..prefill]`, then the rest one token per step. Returns the logits'
/// bits, the routing of every step and the store's report.
fn request(s: &mut Session, ids: &[u32], prefill: usize) -> (Vec<u32>, Vec<Vec<i32>>, StoreReport) {
    s.reset();
    let mut logits = s.step(&ids[..prefill]).expect("prefill");
    let mut routing: Vec<Vec<i32>> = s.router_ids().to_vec();
    for &id in &ids[prefill..] {
        logits.extend(s.step(&[id]).expect("decode"));
        routing.extend(s.router_ids().iter().cloned());
    }
    (
        logits.iter().map(|x| x.to_bits()).collect(),
        routing,
        s.store_report(),
    )
}

#[test]
fn logits_do_not_depend_on_placement() {
    let ids = shared_prompt();
    let ids = &ids[..28];
    let (want, want_routing, none) = request(&mut open(&slots(0)), ids, 12);
    assert_eq!((none.n_res, none.fast_hits, none.fast_bytes), (0, 0, 0));
    assert_eq!(none.routed, 28 * 3 * 4);

    let seeded = StoreOptions {
        resident_set: Some(HotSet {
            layers: vec![
                vec![15, 9, 3, 7, 1],
                vec![2, 4, 6, 8, 10],
                vec![11, 0, 5, 13, 14],
            ],
        }),
        policy: PolicyKind::Static,
        ..slots(5)
    };
    let rotating = StoreOptions {
        a1in: 0.0,
        a1out: 1.0,
        ..slots(4)
    };
    for (name, opts) in [
        (
            "identity static",
            StoreOptions {
                policy: PolicyKind::Static,
                ..slots(4)
            },
        ),
        ("seeded static", seeded),
        ("all resident", slots(16)),
        (
            "lru",
            StoreOptions {
                policy: PolicyKind::Lru,
                ..slots(6)
            },
        ),
        ("2q rotating", rotating),
    ] {
        let (got, routing, r) = request(&mut open(&opts), ids, 12);
        assert!(got == want, "{name}: logits differ from the host-only run");
        assert_eq!(routing, want_routing, "{name}: routing");
        assert_eq!(r.routed, none.routed, "{name}");
        match name {
            "all resident" => assert_eq!((r.fast_hits, r.promotions), (r.routed, 0)),
            "2q rotating" | "lru" => {
                assert!(r.promotions > 0, "{name}: no promotion: {r:?}");
                assert!(0 < r.fast_hits && r.fast_hits < r.routed, "{name}: {r:?}");
            }
            _ => assert!(0 < r.fast_hits && r.fast_hits < r.routed, "{name}: {r:?}"),
        }
    }
}

#[test]
fn exact_reset_serves_a_request_as_a_fresh_boot_and_none_does_not() {
    let ids = shared_prompt();
    let (first, second) = (&ids[..40], &ids[100..124]);
    let opts = |reset| StoreOptions {
        reset,
        a1in: 0.0,
        a1out: 1.0,
        ..slots(4)
    };
    let fresh = request(&mut open(&opts(ResetMode::Exact)), second, 8);

    let mut exact = open(&opts(ResetMode::Exact));
    let warm = request(&mut exact, first, 16);
    assert!(
        warm.2.promotions > 0,
        "the first request must rotate: {:?}",
        warm.2
    );
    let again = request(&mut exact, second, 8);
    assert!(again.0 == fresh.0, "exact: logits");
    assert_eq!(again.1, fresh.1, "exact: routing");
    let strip = |r: StoreReport| (r.served_fraction, r.fast_hits, r.routed, r.promotions);
    assert_eq!(strip(again.2), strip(fresh.2), "exact: store counters");
    assert!(again.2.reset_ms > 0.0);

    let mut none = open(&opts(ResetMode::None));
    request(&mut none, first, 16);
    let carried = request(&mut none, second, 8);
    assert!(
        carried.0 == fresh.0,
        "none: the logits never depend on placement"
    );
    assert_eq!(carried.2.reset_ms, 0.0);
    assert_ne!(
        strip(carried.2),
        strip(fresh.2),
        "none: the second request should see the first one's rotation"
    );
}
