//! Throughput of the Q8_K dot kernels (`backend::cpu::q8`), in weight bytes per second, one thread.
//!
//! Shape: a 4096-element activation row, quantized once, dotted with 2048 weight rows of each
//! type (a 4096 × 2048 mat-vec: 2.75 MB of Q2_K … 8.9 MB of Q8_0, streamed from L3/memory).
//! `q8_dot_l2` repeats the first 16 rows (≤ 70 kB, cache-resident) to show the kernels' own
//! speed; `oracle` is the f32 CPU oracle `gguf::quant::dot_row` on the same rows, for contrast.
//! `q8_prefill/<type>` (Q2_K, Q3_K, Q6_K, Q4_K, Q5_K) is the prefill shape: 512 weight rows of 4096 elements against 16
//! activation rows, as the single-row kernel once per weight row and activation row
//! (`per_row`) and as the multi-row kernel once per weight row (`many`), in multiply-adds per
//! second (criterion's "elements"); `many` also at 2, 4 and 8 activation rows; where the CPU has
//! a tile kernel for the type (`q8_grid_fn`: AMX or AVX-512 VNNI for Q2_K and Q3_K, else AVX2
//! for Q2_K, Q3_K and Q6_K), `grid` is it at 2, 4, 8, 16 and 128 activation rows (where it
//! starts to beat `many` sets `GRID_MIN_ROWS` in `fastpath.rs`); (Q2_K, Q3_K) `grid_interleaved`
//! and `tokens_interleaved` are the tile and many-token kernels of the interleaved layout at
//! 16, 32 and 128 activation rows (8, 16, 64 tokens of two planes; where they cross sets the cost
//! model `tokens_model` in `fastpath.rs`).
//! `q8_decode/<type>` (Q2_K, Q3_K, Q6_K) is the decode shape: the 2048 streamed rows (and the 16
//! cache-resident ones, `l2_`) against one token of one plane (`q8`) or two (`q8x2`), by the
//! decode kernel (`rows`) and, for contrast, by the multi-row kernel once per weight row
//! (`by_row`, the decode path before the decode kernels), and (Q2_K, Q3_K) by the decode kernel
//! of the interleaved layout (`interleaved`), in weight bytes per second.
//! Time is the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time, so
//! other processes on a shared machine do not inflate it (they still share its caches).
//! Run: `cargo bench -p aubier-runtime --bench q8_dot`; `AUBIER_CPU_ISA=avx2` (any `--cpu-isa`
//! level) caps the kernels handed out, so that a narrower host's kernels are measured here.

use aubier_runtime::backend::cpu::q8::{
    interleave_rows, q8_dot_fn, q8_dot_many_fn, q8_grid_fn, q8_grid_interleaved_fn,
    q8_interleaved_fn, q8_interleaved_tokens_fn, q8_rows_fn, q8_rows_fn_by_row, quantize_row_q8k,
    BlockQ8K, Q8Tiles, QK_K,
};
use aubier_runtime::ggml_type::GgmlType;
use aubier_runtime::gguf::quant::dot_row;
use aubier_runtime::gguf::quant::random::BlockSampler;
use aubier_runtime::isa::IsaLevel;
use criterion::{criterion_group, criterion_main, Bencher, BenchmarkId, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::hint::black_box;
use std::time::Duration;

/// Elements per row.
const K: usize = 4096;
/// Rows of the streamed mat-vec.
const ROWS: usize = 2048;
/// Rows of the cache-resident case.
const ROWS_L2: usize = 16;
/// Weight rows of the prefill case (the first `PREFILL_ROWS` of the streamed matrix).
const PREFILL_ROWS: usize = 512;
/// Activation rows (tokens) of the prefill case.
const TOKENS: usize = 16;

const TYPES: &[GgmlType] = &[
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q6_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::Q4_0,
    GgmlType::Q8_0,
];

/// `ROWS` random rows of `ty`, back to back; and the bytes of one row.
fn matrix(ty: GgmlType, rng: &mut ChaCha8Rng) -> (Vec<u8>, usize) {
    let row = ty.row_size(K).expect("4096 is whole blocks");
    let mut w = vec![0u8; ROWS * row];
    let sampler = BlockSampler::new(ty).expect("sampler supports the type");
    for r in w.chunks_exact_mut(row) {
        sampler.fill_row(rng, 0.02, K, r).expect("valid row");
    }
    (w, row)
}

/// CPU time consumed so far by this thread.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a Linux constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `b.iter(f)`, timed in thread CPU time.
fn iter_cpu<R>(b: &mut Bencher, mut f: impl FnMut() -> R) {
    b.iter_custom(|iters| {
        let start = thread_cpu_time();
        for _ in 0..iters {
            black_box(f());
        }
        thread_cpu_time() - start
    })
}

fn bench(c: &mut Criterion) {
    if let Ok(level) = std::env::var("AUBIER_CPU_ISA") {
        let level: IsaLevel = level.parse().expect("AUBIER_CPU_ISA: a --cpu-isa level");
        aubier_runtime::isa::limit(level).expect("AUBIER_CPU_ISA");
    }
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let x: Vec<f32> = (0..K).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut xq = vec![BlockQ8K::ZERO; K / QK_K];
    quantize_row_q8k(&x, &mut xq).expect("whole blocks");

    let mut quant = c.benchmark_group("quantize_row_q8k");
    quant.throughput(Throughput::Elements(K as u64));
    quant.bench_function("4096", |b| {
        iter_cpu(b, || quantize_row_q8k(black_box(&x), black_box(&mut xq)))
    });
    quant.finish();

    for &ty in TYPES {
        let (w, row) = matrix(ty, &mut rng);
        let dot = q8_dot_fn(ty).expect("the type has a kernel");
        let mut g = c.benchmark_group(format!("q8_dot/{ty}"));
        g.throughput(Throughput::Bytes((ROWS * row) as u64));
        g.bench_function(BenchmarkId::from_parameter("4096x2048"), |b| {
            iter_cpu(b, || {
                w.chunks_exact(row)
                    .map(|r| dot(black_box(r), black_box(&xq)))
                    .sum::<f32>()
            })
        });
        g.throughput(Throughput::Bytes((ROWS_L2 * row) as u64));
        g.bench_function(BenchmarkId::from_parameter("l2_4096x16"), |b| {
            iter_cpu(b, || {
                w[..ROWS_L2 * row]
                    .chunks_exact(row)
                    .map(|r| dot(black_box(r), black_box(&xq)))
                    .sum::<f32>()
            })
        });
        if matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K) {
            g.throughput(Throughput::Bytes((ROWS * row) as u64));
            g.bench_function(BenchmarkId::from_parameter("oracle_4096x2048"), |b| {
                iter_cpu(b, || {
                    w.chunks_exact(row)
                        .map(|r| dot_row(ty, black_box(r), black_box(&x)).expect("valid row"))
                        .sum::<f32>()
                })
            });
        }
        g.finish();
        if matches!(
            ty,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K | GgmlType::Q4_K | GgmlType::Q5_K
        ) {
            prefill(c, ty, &w[..PREFILL_ROWS * row], row, &mut rng);
        }
        if matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K) {
            decode(c, ty, &w, row, &mut rng);
        }
    }
}

/// The prefill case of `ty` on the weight rows `w` (`row` bytes each).
fn prefill(c: &mut Criterion, ty: GgmlType, w: &[u8], row: usize, rng: &mut ChaCha8Rng) {
    let x: Vec<f32> = (0..TOKENS * K)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let mut xq = vec![BlockQ8K::ZERO; TOKENS * K / QK_K];
    quantize_row_q8k(&x, &mut xq).expect("whole blocks");
    let nb = K / QK_K;
    let dot = q8_dot_fn(ty).expect("the type has a kernel");
    let many = q8_dot_many_fn(ty).expect("the type has a kernel");
    let mut y = vec![0.0f32; TOKENS];
    let mut g = c.benchmark_group(format!("q8_prefill/{ty}"));
    g.throughput(Throughput::Elements((PREFILL_ROWS * TOKENS * K) as u64));
    g.bench_function(BenchmarkId::new("per_row", "4096x512x16"), |b| {
        iter_cpu(b, || {
            let mut sum = 0.0f32;
            for r in w.chunks_exact(row) {
                for xj in xq.chunks_exact(nb) {
                    sum += dot(black_box(r), black_box(xj));
                }
            }
            sum
        })
    });
    for tokens in [2usize, 4, 8] {
        let mut y = vec![0.0f32; tokens];
        let xs = &xq[..tokens * nb];
        g.throughput(Throughput::Elements((PREFILL_ROWS * tokens * K) as u64));
        g.bench_function(
            BenchmarkId::new("many", format!("4096x512x{tokens}")),
            |b| {
                iter_cpu(b, || {
                    let mut sum = 0.0f32;
                    for r in w.chunks_exact(row) {
                        many(black_box(r), black_box(xs), &mut y);
                        sum += y[0];
                    }
                    sum
                })
            },
        );
    }
    g.throughput(Throughput::Elements((PREFILL_ROWS * TOKENS * K) as u64));
    g.bench_function(BenchmarkId::new("many", "4096x512x16"), |b| {
        iter_cpu(b, || {
            let mut sum = 0.0f32;
            for r in w.chunks_exact(row) {
                many(black_box(r), black_box(&xq), &mut y);
                sum += y[0];
            }
            sum
        })
    });
    if let Some(grid) = q8_grid_fn(ty) {
        for tokens in [2, 4, 8, TOKENS, 8 * TOKENS] {
            let (_, tiles) = random_tiles(tokens, rng);
            let mut y = vec![0.0f32; PREFILL_ROWS * tokens];
            g.throughput(Throughput::Elements((PREFILL_ROWS * tokens * K) as u64));
            g.bench_function(
                BenchmarkId::new("grid", format!("4096x512x{tokens}")),
                |b| {
                    iter_cpu(b, || {
                        grid(black_box(w), black_box(&tiles), &mut y);
                        y[0]
                    })
                },
            );
        }
    }
    interleaved_prefill(&mut g, ty, w, row, rng);
    g.finish();
}

/// `rows` random activation rows of `K` elements, quantized, and packed for the tile kernels.
fn random_tiles(rows: usize, rng: &mut ChaCha8Rng) -> (Vec<BlockQ8K>, Q8Tiles) {
    let x: Vec<f32> = (0..rows * K)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let mut xq = vec![BlockQ8K::ZERO; rows * K / QK_K];
    quantize_row_q8k(&x, &mut xq).expect("whole blocks");
    let tiles = Q8Tiles::pack(&xq, rows).expect("whole rows");
    (xq, tiles)
}

/// Activation rows (tokens × planes) of the interleaved prefill kernels' cases: 8, 16 and 64
/// tokens of two planes (`q8x2`).
const INTERLEAVED_ROWS: [usize; 3] = [16, 32, 128];

/// `grid_interleaved` and `tokens_interleaved` (Q2_K, Q3_K): the tile kernel and the
/// many-token kernel of the interleaved layout (what `moe_ffn` and the fast store's dense
/// weights run at prefill) on the `PREFILL_ROWS` rows of `w` interleaved, against
/// [`INTERLEAVED_ROWS`] activation rows (two planes per token), in multiply-adds per second.
fn interleaved_prefill(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    ty: GgmlType,
    w: &[u8],
    row: usize,
    rng: &mut ChaCha8Rng,
) {
    let (Some(grid), Some(tokens_fn)) = (q8_grid_interleaved_fn(ty), q8_interleaved_tokens_fn(ty))
    else {
        return;
    };
    let w = &w[..PREFILL_ROWS * row];
    let mut packed = vec![0u8; w.len()];
    interleave_rows(ty, w, &mut packed, row).expect("whole groups");
    for rows in INTERLEAVED_ROWS {
        let (xq, tiles) = random_tiles(rows, rng);
        let mut y = vec![0.0f32; PREFILL_ROWS * rows];
        g.throughput(Throughput::Elements((PREFILL_ROWS * rows * K) as u64));
        let shape = format!("4096x512x{rows}");
        g.bench_function(BenchmarkId::new("grid_interleaved", &shape), |b| {
            iter_cpu(b, || {
                grid(black_box(&packed), black_box(&tiles), &mut y);
                y[0]
            })
        });
        let mut y = vec![0.0f32; PREFILL_ROWS * rows / 2];
        g.bench_function(BenchmarkId::new("tokens_interleaved", &shape), |b| {
            iter_cpu(b, || {
                tokens_fn(black_box(&packed), black_box(&xq), 2, rows / 2, &mut y);
                y[0]
            })
        });
    }
}

/// The decode case of `ty` on the weight rows `w` (`row` bytes each).
fn decode(c: &mut Criterion, ty: GgmlType, w: &[u8], row: usize, rng: &mut ChaCha8Rng) {
    let x: Vec<f32> = (0..K).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let nb = K / QK_K;
    // Plane 2 is the residual of plane 1 (as the cpu backend's `q8x2`).
    let mut xq = vec![BlockQ8K::ZERO; 2 * nb];
    quantize_row_q8k(&x, &mut xq[..nb]).expect("whole blocks");
    let r: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| v - xq[i / QK_K].d * f32::from(xq[i / QK_K].qs[i % QK_K]))
        .collect();
    quantize_row_q8k(&r, &mut xq[nb..]).expect("whole blocks");
    let rows = q8_rows_fn(ty).expect("the type has a kernel");
    let by_row = q8_rows_fn_by_row(ty).expect("the type has a kernel");
    let lanes = q8_interleaved_fn(ty).map(|f| {
        let mut packed = vec![0u8; w.len()];
        interleave_rows(ty, w, &mut packed, row).expect("whole groups");
        (f, packed)
    });
    let mut g = c.benchmark_group(format!("q8_decode/{ty}"));
    for (planes, name) in [(1usize, "q8"), (2, "q8x2")] {
        let xs = &xq[..planes * nb];
        for (n, shape) in [(ROWS, "4096x2048"), (ROWS_L2, "l2_4096x16")] {
            let ws = &w[..n * row];
            let mut y = vec![0.0f32; n];
            g.throughput(Throughput::Bytes((n * row) as u64));
            g.bench_function(BenchmarkId::new(format!("rows_{name}"), shape), |b| {
                iter_cpu(b, || {
                    rows(black_box(ws), black_box(xs), planes, &mut y);
                    y[0]
                })
            });
            g.bench_function(BenchmarkId::new(format!("by_row_{name}"), shape), |b| {
                iter_cpu(b, || {
                    by_row(black_box(ws), black_box(xs), planes, &mut y);
                    y[0]
                })
            });
            if let Some((f, packed)) = &lanes {
                let ps = &packed[..n * row];
                g.bench_function(
                    BenchmarkId::new(format!("interleaved_{name}"), shape),
                    |b| {
                        iter_cpu(b, || {
                            f(black_box(ps), black_box(xs), planes, &mut y);
                            y[0]
                        })
                    },
                );
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
