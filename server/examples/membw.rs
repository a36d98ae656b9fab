//! A STREAM-like memory bandwidth probe, for the roofline of `docs/BENCHMARKS.md`.
//!
//! Method (after McCalpin's STREAM): two arrays of `--mib` MiB each (default 1024, far larger than
//! any cache), touched once before timing. Two kernels, each timed `--reps` times (default 10),
//! best time kept, as STREAM does:
//! - **copy** `b[i] = a[i]` over f64: counts 2 × size bytes (read + write), STREAM's convention;
//! - **read** `Σ bits(a[i])` with 8 independent integer accumulators: counts size bytes; this is the
//!   access pattern of streaming weights.
//!
//! Each kernel runs on 1 thread and on all rayon threads (the array split in equal contiguous
//! parts). Prints one JSON object with GB/s (10⁹ bytes per second).
//!
//! Run: `cargo run --release -p aubier-server --example membw -- [--mib N] [--reps N]`.

use rayon::prelude::*;
use std::hint::black_box;
use std::time::Instant;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Reads every element once: the f64 bits summed as integers over 8 independent lanes (an
/// integer add never stalls on latency, so the loop is limited by memory, not by FP adds).
fn read_sum(a: &[f64]) -> u64 {
    let mut acc = [0u64; 8];
    for c in a.chunks_exact(8) {
        for (s, x) in acc.iter_mut().zip(c) {
            *s = s.wrapping_add(x.to_bits());
        }
    }
    acc.iter().fold(0, |x, &y| x.wrapping_add(y))
}

/// Best seconds of `reps` runs of `f`.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let mib = arg("--mib", 1024);
    let reps = arg("--reps", 10).max(1);
    let n = mib * (1 << 20) / 8;
    let bytes = (n * 8) as f64;
    let a: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let mut b = vec![0f64; n];
    let threads = rayon::current_num_threads();
    let part = n.div_ceil(threads).max(8);

    let copy_1 = best(reps, || {
        b.copy_from_slice(&a);
        black_box(&b);
    });
    let copy_n = best(reps, || {
        b.par_chunks_mut(part)
            .zip(a.par_chunks(part))
            .for_each(|(d, s)| d.copy_from_slice(s));
        black_box(&b);
    });
    let read_1 = best(reps, || {
        black_box(read_sum(black_box(&a)));
    });
    let read_n = best(reps, || {
        black_box(
            a.par_chunks(part)
                .map(read_sum)
                .reduce(|| 0, u64::wrapping_add),
        );
    });
    let gbs = |bytes: f64, s: f64| bytes / s / 1e9;
    println!(
        "{}",
        serde_json::json!({
            "array_mib": mib,
            "reps": reps,
            "threads": threads,
            "copy_gb_s_1_thread": gbs(2.0 * bytes, copy_1),
            "copy_gb_s_all_threads": gbs(2.0 * bytes, copy_n),
            "read_gb_s_1_thread": gbs(bytes, read_1),
            "read_gb_s_all_threads": gbs(bytes, read_n),
        })
    );
}
