//! The sampler's cost per token (`sampler::Sampler::sample`) at Mistral Small 4's vocabulary of
//! 131 072 ids, one thread, under each setting a client sends: greedy; temperature 1 alone (the
//! frameworks' default); top-k 50; top-p 0.95; min-p 0.05; the three together at temperature
//! 0.7; a repetition penalty over a 256-token history.
//!
//! Rows: `zipf` is a peaked row as a language model gives (probability ∝ rank^−1.2 — Zipf's law
//! of token frequencies — the ranks shuffled over the ids by a seeded permutation); `flat` is
//! uniform logits in [0, 1), the worst case of top-p (the nucleus holds most of the vocabulary).
//! Time is the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so other processes on a
//! shared machine do not inflate it. Run: `cargo bench -p aubier-runtime --bench sampler`.

use aubier_runtime::sampler::{Sampler, SamplingParams};
use criterion::{criterion_group, criterion_main, Criterion};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::hint::black_box;
use std::time::Duration;

/// Mistral Small 4's vocabulary.
const N_VOCAB: usize = 131_072;

/// The peaked row: logit = −1.2 · ln(rank), ranks 1..=n shuffled over the ids.
fn zipf_row() -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut ranks: Vec<usize> = (1..=N_VOCAB).collect();
    ranks.shuffle(&mut rng);
    ranks.iter().map(|&r| -1.2 * (r as f32).ln()).collect()
}

/// The flat row: uniform in [0, 1).
fn flat_row() -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    (0..N_VOCAB).map(|_| rng.random::<f32>()).collect()
}

/// CPU time of this thread.
fn thread_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; the clock id is a constant the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `temperature` with a `logit_bias` of 300 entries (OpenAI's cap), spread over the vocabulary.
fn biased(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        logit_bias: (0..300u32)
            .map(|i| {
                (
                    i * 433 % N_VOCAB as u32,
                    if i % 2 == 0 { -100.0 } else { 5.0 },
                )
            })
            .collect(),
        ..SamplingParams::default()
    }
}

fn bench(c: &mut Criterion) {
    let settings: [(&str, SamplingParams); 9] = [
        ("greedy", SamplingParams::default()),
        (
            "t1",
            SamplingParams {
                temperature: 1.0,
                ..SamplingParams::default()
            },
        ),
        (
            "t1_top_k50",
            SamplingParams {
                temperature: 1.0,
                top_k: 50,
                ..SamplingParams::default()
            },
        ),
        (
            "t1_top_p0.95",
            SamplingParams {
                temperature: 1.0,
                top_p: 0.95,
                ..SamplingParams::default()
            },
        ),
        (
            "t1_min_p0.05",
            SamplingParams {
                temperature: 1.0,
                min_p: 0.05,
                ..SamplingParams::default()
            },
        ),
        (
            "t0.7_k40_p0.9_minp0.05",
            SamplingParams {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                min_p: 0.05,
                ..SamplingParams::default()
            },
        ),
        (
            "t1_repetition1.1",
            SamplingParams {
                temperature: 1.0,
                repetition_penalty: 1.1,
                ..SamplingParams::default()
            },
        ),
        ("greedy_logit_bias300", biased(0.0)),
        ("t1_logit_bias300", biased(1.0)),
    ];
    let history: Vec<u32> = (0..256u32).map(|i| i * 509 % N_VOCAB as u32).collect();
    let mut g = c.benchmark_group("sampler");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    for (row_name, row) in [("zipf", zipf_row()), ("flat", flat_row())] {
        for (name, params) in &settings {
            g.bench_function(format!("{row_name}/{name}"), |b| {
                b.iter_custom(|iters| {
                    let mut s = Sampler::new(params.clone())
                        .expect("valid parameters")
                        .with_prompt(&history);
                    let start = thread_time();
                    for _ in 0..iters {
                        black_box(s.sample(black_box(&row)).expect("a token"));
                    }
                    thread_time() - start
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
