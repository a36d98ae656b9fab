//! The read-ahead's copies outliving their step (issue 34 item 3), on the bundled model on the
//! `cpu` backend: a fast store of 8 of 16 slots, a 28-token prefill, then one-token decode steps
//! fed the greedy continuation of a run without read-ahead, a budget of 2 loads per layer per
//! step. The slot memory's copy worker is held behind a gate ([`HostSlots::hold_worker`]) so
//! that the copies are in flight for as long as a test needs:
//! * steps return while their copies are queued (the copies still pending after them), an
//!   expert whose copy is in flight gets evicted, the logits are those of the run without
//!   read-ahead bit for bit, and once the worker goes on every member's slot holds the file's
//!   bytes;
//! * a second session opened while copies are in flight waits for the running one, cancels the
//!   queued ones, and both sessions keep the logits and the file's bytes in every slot;
//! * a store dropped with copies in flight leaves the memory usable by the next one, and a model
//!   dropped with copies in flight ends its worker (no hang) and frees its mapping;
//! * with the page-cache read-ahead on (`PageAhead::All`) and its worker held, steps return
//!   with their advice still queued and the logits unchanged.

use super::memory::HostSlots;
use crate::backend::registry::BackendSpec;
use crate::engine::Model;
use crate::placement::policy::Admission;
use crate::progress::Quiet;
use crate::session::{Session, SessionOptions};
use crate::store::copier::{CopyEnd, CopyTicket};
use crate::store::expert_store::{PageAhead, ReadAheadMode, StoreOptions};
use crate::store::FastBudget;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const PROMPT: usize = 28;
const DECODE: usize = 10;

fn model() -> Arc<Model> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/ms4-tiny256-q2k.gguf");
    let backend = BackendSpec::named("cpu").make().expect("cpu backend");
    Model::load_predicting(&path, backend, FastBudget::Slots(8), Some(1), &mut Quiet)
        .expect("bundled model")
}

/// A session with 8 slots; with `budget`, read-ahead of that many loads, in `mode`. 2Q with
/// `ghost` admission and `A1out` half the slots: with these knobs a prefetched expert stays in
/// `Apre` over the next step's prefetches often enough that a later step routes to it while its
/// copy is still in flight, the case these tests need (under frequency admission, or with 4
/// slots, the next step's prefetches evict it first on this model).
fn session_in(model: &Arc<Model>, budget: usize, mode: ReadAheadMode) -> Session {
    let opts = StoreOptions {
        budget: FastBudget::Slots(8),
        prefetch_budget: budget,
        read_ahead: mode,
        admission: Admission::Ghost,
        a1out: 0.5,
        ..StoreOptions::default()
    };
    Session::open_with_store(Arc::clone(model), SessionOptions { kv_max: 64 }, &opts)
        .expect("session")
}

/// [`session_in`] with background read-ahead.
fn session(model: &Arc<Model>, budget: usize) -> Session {
    session_in(model, budget, ReadAheadMode::Background)
}

/// The run without read-ahead: the steps' inputs (the prompt, then the greedy continuation one
/// token at a time) and each step's logits bits.
struct Baseline {
    inputs: Vec<Vec<u32>>,
    logits: Vec<Vec<u32>>,
}

fn baseline(model: &Arc<Model>) -> Baseline {
    let n_vocab = model.config.n_vocab;
    let mut s = session(model, 0);
    let mut next: Vec<u32> = (0..PROMPT).map(|i| (i * 7 % n_vocab) as u32).collect();
    let mut b = Baseline {
        inputs: Vec::new(),
        logits: Vec::new(),
    };
    for _ in 0..=DECODE + 2 {
        let logits = s.step(&next).expect("step");
        b.inputs.push(next);
        b.logits.push(logits.iter().map(|x| x.to_bits()).collect());
        let last = &logits[logits.len() - n_vocab..];
        next = vec![crate::sampler::argmax(last).expect("finite logits")];
    }
    b
}

/// Runs steps `range` of `base` on `s`, checking each step's logits against it.
fn steps(s: &mut Session, base: &Baseline, range: std::ops::Range<usize>, who: &str) {
    for i in range {
        let logits = s.step(&base.inputs[i]).expect("step");
        let bits: Vec<u32> = logits.iter().map(|x| x.to_bits()).collect();
        assert!(bits == base.logits[i], "{who}: step {i} changed the logits");
    }
}

/// Holds the model's copy worker until the returned sender sends.
fn hold(model: &Model) -> mpsc::Sender<()> {
    let (open, gate) = mpsc::channel();
    let slots = model.slots().lock();
    let host = slots
        .memory()
        .as_any()
        .downcast_ref::<HostSlots>()
        .expect("host slots");
    host.hold_worker(gate);
    open
}

/// Holds the model's advice worker until the returned sender sends; with it, the advice the
/// worker has not issued.
fn hold_advice(model: &Model) -> (mpsc::Sender<()>, impl Fn() -> usize + '_) {
    let (open, gate) = mpsc::channel();
    let host = |model: &Model| {
        let slots = model.slots().lock();
        let host = slots.memory().as_any().downcast_ref::<HostSlots>();
        host.map(|h| h.advice_queued()).expect("host slots")
    };
    {
        let slots = model.slots().lock();
        let memory = slots.memory().as_any().downcast_ref::<HostSlots>();
        memory.expect("host slots").hold_advisor(gate);
    }
    (open, move || host(model))
}

/// Opens the gate from another thread after a moment, so that a call made meanwhile must wait
/// for the held copy to end.
fn open_later(open: mpsc::Sender<()>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        let _ = open.send(());
    })
}

/// The tickets of every read-ahead copy of `s` not yet published.
fn tickets(s: &Session) -> Vec<Arc<CopyTicket>> {
    let store = s.expert_store();
    (0..store.n_layers())
        .flat_map(|i| store.in_flight(i))
        .filter_map(|(_, _, t)| t)
        .collect()
}

/// Every member expert's slot holds the file's bytes of each of its tensors.
fn check_copies(model: &Model, s: &Session) {
    let bad = model.slot_mismatches(s.expert_store()).expect("read back");
    assert!(bad.is_empty(), "slots that differ from the file: {bad:?}");
}

#[test]
fn copies_in_flight_outlive_their_steps_and_land_in_their_slots() {
    let model = model();
    let base = baseline(&model);
    let mut s = session(&model, 2);
    steps(&mut s, &base, 0..1, "prefill");
    let mut evicted_in_flight = false;
    let mut in_flight = 0;
    // Rounds of two steps with the worker held, each checked once the copies have landed.
    for first in (1..=DECODE).step_by(2) {
        let open = hold(&model);
        for i in first..(first + 2).min(DECODE + 1) {
            steps(&mut s, &base, i..i + 1, "held worker");
            let store = s.expert_store();
            evicted_in_flight |= (0..store.n_layers())
                .flat_map(|l| store.in_flight(l))
                .any(|(_, evicted, _)| evicted);
        }
        let queued = tickets(&s);
        in_flight += queued.len();
        assert!(
            queued.iter().all(|t| matches!(t.poll(), CopyEnd::Pending)),
            "a step waited for its copies"
        );
        let _ = open.send(());
        model.slots().lock().memory().settle_copies(false);
        assert!(queued.iter().all(|t| !matches!(t.poll(), CopyEnd::Pending)));
        check_copies(&model, &s);
    }
    let r = s.store_report();
    assert!(r.prefetches > 0, "the read-ahead loaded nothing");
    assert!(in_flight > 0, "no copy was in flight past its step");
    assert!(
        evicted_in_flight,
        "no expert was evicted while its copy was in flight"
    );
    steps(&mut s, &base, DECODE + 1..DECODE + 3, "after the copies");
    check_copies(&model, &s);

    // The same steps with every copy made in its step: the same decisions, and the hits the
    // held copies lost are exactly the late and pending slots.
    let mut sync = session_in(&model, 2, ReadAheadMode::Sync);
    steps(&mut sync, &base, 0..DECODE + 3, "sync");
    let (b, r) = (s.store_report(), sync.store_report());
    assert_eq!(
        (b.prefetches, b.promotions, b.evictions, b.routed),
        (r.prefetches, r.promotions, r.evictions, r.routed),
        "the held worker changed the decisions"
    );
    assert_eq!((r.prefetch_late, r.prefetch_pending), (0, 0));
    assert_eq!(b.prefetch_served + b.prefetch_late, r.prefetch_served);
    assert_eq!(
        b.fast_hits + b.prefetch_late + b.prefetch_pending,
        r.fast_hits
    );
    assert!(
        b.prefetch_late > 0 && b.prefetch_pending > 0,
        "no routed slot found its copy in flight: late {}, pending {}",
        b.prefetch_late,
        b.prefetch_pending
    );
}

#[test]
fn a_second_session_waits_for_the_running_copy_and_cancels_the_queued_ones() {
    let model = model();
    let base = baseline(&model);
    let mut a = session(&model, 2);
    steps(&mut a, &base, 0..4, "first session");
    let opener = open_later(hold(&model));
    steps(&mut a, &base, 4..7, "first session, worker held");
    let queued = tickets(&a);
    assert!(!queued.is_empty(), "no copy in flight");

    let mut b = session(&model, 2);
    opener.join().expect("opener");
    assert!(
        queued
            .iter()
            .all(|t| matches!(t.poll(), CopyEnd::Cancelled)),
        "the second session's store did not cancel the first's queued copies"
    );
    steps(&mut b, &base, 0..DECODE + 3, "second session");
    check_copies(&model, &b);
    steps(
        &mut a,
        &base,
        7..DECODE + 3,
        "first session, after the second",
    );
    check_copies(&model, &a);
}

#[test]
fn stores_and_models_dropped_with_copies_in_flight_neither_hang_nor_leak() {
    let model = model();
    let base = baseline(&model);
    let mut a = session(&model, 2);
    steps(&mut a, &base, 0..1, "first session");
    let open = hold(&model);
    steps(&mut a, &base, 1..DECODE, "first session, worker held");
    assert!(!tickets(&a).is_empty(), "no copy in flight");
    drop(a);
    let _ = open.send(());

    let mut c = session(&model, 2);
    steps(&mut c, &base, 0..1, "next session");
    let opener = open_later(hold(&model));
    steps(&mut c, &base, 1..DECODE, "next session, worker held");
    let queued = tickets(&c);
    assert!(!queued.is_empty(), "no copy in flight");
    let arena = {
        let slots = model.slots().lock();
        let host = slots.memory().as_any().downcast_ref::<HostSlots>();
        host.expect("host slots").arena_weak()
    };
    drop(c);
    drop(model);
    opener.join().expect("opener");
    assert!(
        queued
            .iter()
            .all(|t| matches!(t.poll(), CopyEnd::Cancelled)),
        "a copy queued when the model dropped was made or left pending"
    );
    assert!(
        arena.upgrade().is_none(),
        "the slots' mapping outlived the model"
    );
}

#[test]
fn steps_do_not_wait_for_their_page_cache_advice() {
    let model = model();
    let base = baseline(&model);
    let opts = StoreOptions {
        budget: FastBudget::Slots(8),
        prefetch_budget: 2,
        read_ahead: ReadAheadMode::Sync,
        page_ahead: PageAhead::All,
        ..StoreOptions::default()
    };
    let mut s = Session::open_with_store(Arc::clone(&model), SessionOptions { kv_max: 64 }, &opts)
        .expect("session");
    steps(&mut s, &base, 0..1, "prefill");
    let (open, queued) = hold_advice(&model);
    steps(&mut s, &base, 1..DECODE, "advice worker held");
    let held = queued();
    let _ = open.send(());
    // More than the held job itself, which the worker may not have taken yet.
    assert!(
        held > 1,
        "the steps issued their advice themselves ({held} queued)"
    );
    steps(&mut s, &base, DECODE..DECODE + 3, "advice worker free");
    check_copies(&model, &s);
}
