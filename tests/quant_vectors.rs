//! Quant blocks against external references: `tests/data/quants/quant_vectors.gguf`.
//!
//! The file (see its README) holds, for every ggml type gguf-py 0.19.0 can dequantize, a tensor
//! `q.<TYPE>` of random valid blocks (8 rows) and `ref.<TYPE>`, its F32 dequantization by
//! `gguf.quants.dequantize` — which llama.cpp's own `to_float` reproduces bit for bit.
//!
//! * Dequantization must be **bit-exact** (`to_bits` equality) with `ref`, for every row of every
//!   listed type, and the set of types checked must equal the file's `quant_vectors.types` list
//!   and the set of types `is_supported` accepts (nothing silently skipped, nothing unchecked).
//! * The dot is checked against the exact sum `Σ w_i·x_i` computed in f64 from the reference
//!   values `w` (each product of two f32 is exact in f64). Error bound, from the dot's documented
//!   order (8 strided lanes of at most ⌈n/8⌉ additions, then a 3-level tree; one rounding per
//!   product; Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2):
//!   `|dot − exact| ≤ γ_k·Σ|w_i·x_i| + n·2^−149 + n·2^−53·Σ|w_i·x_i|` with `k = ⌈n/8⌉ + 4`,
//!   `γ_k = k·u/(1 − k·u)`, `u = 2^−24`. The second term covers products and sums in the
//!   subnormal range (each rounds by at most half a subnormal step, 2^−150), the third the f64
//!   reference's own rounding. Activations are scaled by a power of two so that
//!   `n·max|w|·max|x| ≤ 2^120`, hence no partial sum can overflow f32.
//! * The unchecked `dot_fn(ty)` kernel must equal `dot_row` bit for bit.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use aubier_runtime::ggml_type::GgmlType;
use aubier_runtime::gguf::quant::{dequantize_row, dot_fn, dot_row, is_supported, QuantError};
use aubier_runtime::gguf::GgufFile;
use proptest::prelude::*;

/// One type's vectors.
struct Case {
    ty: GgmlType,
    /// Raw blocks, one entry per row.
    q_rows: Vec<Vec<u8>>,
    /// The gguf-py reference values, one entry per row.
    ref_rows: Vec<Vec<f32>>,
}

/// The file's `quant_vectors.types` list, in file order.
fn listed_types(file: &GgufFile) -> Vec<String> {
    file.get("quant_vectors.types")
        .and_then(|v| v.as_strings())
        .expect("quant_vectors.types is a string array")
        .to_vec()
}

/// Loads every listed type's `q.` and `ref.` tensors (once per test binary).
fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        let path = aubier_tests::data_dir().join("quants/quant_vectors.gguf");
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        listed_types(&file)
            .iter()
            .map(|name| {
                let ty = GgmlType::from_name(name)
                    .unwrap_or_else(|| panic!("listed type {name} is not a ggml type"));
                let q = file
                    .tensor(&format!("q.{name}"))
                    .unwrap_or_else(|| panic!("tensor q.{name} missing"));
                let r = file
                    .tensor(&format!("ref.{name}"))
                    .unwrap_or_else(|| panic!("tensor ref.{name} missing"));
                assert_eq!(q.ggml_type, ty, "q.{name} type");
                assert_eq!(r.ggml_type, GgmlType::F32, "ref.{name} type");
                assert_eq!(q.ne, r.ne, "q.{name} and ref.{name} shapes");
                assert_eq!(q.n_rows(), 8, "q.{name} rows");
                let q_rows: Vec<Vec<u8>> = file
                    .tensor_data(q)
                    .chunks(q.row_bytes())
                    .map(<[u8]>::to_vec)
                    .collect();
                let ref_values: Vec<f32> = file
                    .tensor_data(r)
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let ref_rows: Vec<Vec<f32>> = ref_values
                    .chunks(r.row_len())
                    .map(<[f32]>::to_vec)
                    .collect();
                assert_eq!(q_rows.len(), 8, "q.{name} data rows");
                assert_eq!(ref_rows.len(), 8, "ref.{name} data rows");
                Case {
                    ty,
                    q_rows,
                    ref_rows,
                }
            })
            .collect()
    })
}

#[test]
fn every_listed_type_dequantizes_bit_exact() {
    let mut covered = BTreeSet::new();
    let mut failures = Vec::new();
    for case in cases() {
        for (row, (q, want)) in case.q_rows.iter().zip(&case.ref_rows).enumerate() {
            let mut got = vec![f32::NAN; want.len()];
            dequantize_row(case.ty, q, &mut got)
                .unwrap_or_else(|e| panic!("{} row {row}: {e}", case.ty));
            let diffs: Vec<usize> = (0..want.len())
                .filter(|&i| got[i].to_bits() != want[i].to_bits())
                .collect();
            if let Some(&i) = diffs.first() {
                failures.push(format!(
                    "{} row {row}: {} of {} elements differ; first at {i}: got {:e} ({:#010x}), \
                     want {:e} ({:#010x})",
                    case.ty,
                    diffs.len(),
                    want.len(),
                    got[i],
                    got[i].to_bits(),
                    want[i],
                    want[i].to_bits()
                ));
            }
        }
        covered.insert(case.ty.name().to_string());
    }
    assert!(failures.is_empty(), "{failures:#?}");

    let path = aubier_tests::data_dir().join("quants/quant_vectors.gguf");
    let file = GgufFile::open(&path).expect("fixture opens");
    let listed: BTreeSet<String> = listed_types(&file).into_iter().collect();
    assert_eq!(covered, listed, "types checked vs quant_vectors.types");
    let supported: BTreeSet<String> = GgmlType::ALL
        .iter()
        .filter(|&&t| is_supported(t))
        .map(|t| t.name().to_string())
        .collect();
    assert_eq!(supported, listed, "supported types vs quant_vectors.types");
}

/// The f32 error bound of the module doc for weights `w` and activations `x`.
fn check_dot(ty: GgmlType, w: &[f32], x: &[f32], got: f32) -> Result<(), String> {
    let n = w.len();
    let (exact, abs_sum) = w
        .iter()
        .zip(x)
        .fold((0.0f64, 0.0f64), |(s, a), (&wi, &xi)| {
            let p = f64::from(wi) * f64::from(xi);
            (s + p, a + p.abs())
        });
    let k = (n.div_ceil(8) + 4) as f64;
    let u = 2f64.powi(-24);
    let gamma = k * u / (1.0 - k * u);
    let bound = gamma * abs_sum + n as f64 * 2f64.powi(-149) + n as f64 * 2f64.powi(-53) * abs_sum;
    let err = (f64::from(got) - exact).abs();
    if err <= bound {
        Ok(())
    } else {
        Err(format!(
            "{ty}: dot {got:e} vs exact {exact:e}: error {err:e} > bound {bound:e} (n = {n})"
        ))
    }
}

/// Runs `dot_row` and the raw `dot_fn` kernel on one row; checks the bound and their bit
/// equality.
fn dot_checks(case: &Case, row: usize, x: &[f32]) -> Result<(), String> {
    let q = &case.q_rows[row];
    let w = &case.ref_rows[row];
    let got = dot_row(case.ty, q, x).map_err(|e| e.to_string())?;
    let kernel = dot_fn(case.ty).ok_or_else(|| format!("{}: no dot_fn", case.ty))?;
    // SAFETY: x.len() is the row length (a multiple of the block size, checked by the dot_row
    // call above) and `q` holds exactly that row's bytes; `x` is an aligned f32 slice.
    let raw = unsafe { kernel(q.as_ptr(), x.as_ptr(), x.len()) };
    if raw.to_bits() != got.to_bits() {
        return Err(format!("{}: dot_fn {raw:e} != dot_row {got:e}", case.ty));
    }
    check_dot(case.ty, w, x, got)
}

/// Parameters of one activation value, mapped onto a class of f32 values by [`activation`].
type XSeed = (u8, bool, u32, u32);

/// Largest binary exponent an activation may have for weights with `max|w| = w_max` over `n`
/// elements, so that `n·max|w|·max|x| ≤ 2^120`.
fn exponent_cap(w: &[f32]) -> i32 {
    let w_max = w.iter().fold(0.0f64, |m, v| m.max(f64::from(v.abs())));
    let log_w = if w_max > 0.0 {
        w_max.log2().ceil() as i32
    } else {
        0
    };
    let log_n = (w.len().max(1) as f64).log2().ceil() as i32;
    (120 - log_n - log_w - 1).min(100)
}

/// Maps a seed to an activation: ±0, the extreme subnormals, a random subnormal, a tiny normal,
/// a moderate normal, or a large magnitude (up to `2^cap`).
fn activation((class, negative, mantissa, exp_seed): XSeed, cap: i32) -> f32 {
    let mantissa = mantissa & 0x007f_ffff;
    let magnitude = match class % 8 {
        0 => 0.0,
        1 => f32::from_bits(1),           // smallest subnormal
        2 => f32::from_bits(0x007f_ffff), // largest subnormal
        3 => f32::from_bits(mantissa.max(1)),
        4 => normal(mantissa, -126, -100, exp_seed),
        5 | 6 => normal(mantissa, -20, 20.min(cap), exp_seed),
        _ => normal(mantissa, (cap - 40).max(-126), cap, exp_seed),
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// A normal f32 with the given mantissa bits and a binary exponent in `lo..=hi`, clamped to the
/// normal range; `hi` wins when the range is empty.
fn normal(mantissa: u32, lo: i32, hi: i32, exp_seed: u32) -> f32 {
    let hi = hi.clamp(-126, 127);
    let lo = lo.clamp(-126, 127).min(hi);
    let span = (hi - lo + 1) as u32;
    let e = lo + (exp_seed % span) as i32;
    f32::from_bits((((e + 127) as u32) << 23) | mantissa)
}

/// A small deterministic generator for the fixed-input dot test (xorshift64*).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn seed(&mut self) -> XSeed {
        let a = self.next();
        let b = self.next();
        (a as u8, (a >> 8) & 1 == 1, (a >> 32) as u32, b as u32)
    }
}

#[test]
fn dot_on_every_fixture_row_is_within_the_f32_bound() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut failures = Vec::new();
    for case in cases() {
        for row in 0..case.q_rows.len() {
            let w = &case.ref_rows[row];
            let cap = exponent_cap(w);
            // All ones (or the largest power of two below one that the cap allows), then three
            // random mixes of every activation class.
            let mut xs = vec![vec![2f32.powi(cap.min(0)); w.len()]];
            for _ in 0..3 {
                xs.push((0..w.len()).map(|_| activation(rng.seed(), cap)).collect());
            }
            for x in &xs {
                if let Err(e) = dot_checks(case, row, x) {
                    failures.push(format!("row {row}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

fn case_and_activations() -> impl Strategy<Value = (usize, usize, Vec<XSeed>)> {
    let n_cases = cases().len();
    (0..n_cases, 0..8usize).prop_flat_map(|(c, row)| {
        let n = cases()[c].ref_rows[row].len();
        (
            Just(c),
            Just(row),
            prop::collection::vec(any::<XSeed>(), n..=n),
        )
    })
}

proptest! {
    #[test]
    fn dot_with_random_activations_is_within_the_f32_bound(
        (c, row, seeds) in case_and_activations()
    ) {
        let case = &cases()[c];
        let cap = exponent_cap(&case.ref_rows[row]);
        let x: Vec<f32> = seeds.iter().map(|&s| activation(s, cap)).collect();
        if let Err(e) = dot_checks(case, row, &x) {
            return Err(TestCaseError::fail(e));
        }
    }
}

#[test]
fn wrong_lengths_on_fixture_rows_are_errors() {
    for case in cases() {
        let q = &case.q_rows[0];
        let n = case.ref_rows[0].len();
        let mut out = vec![0.0f32; n];
        let short = dequantize_row(case.ty, &q[..q.len() - 1], &mut out);
        assert!(
            matches!(short, Err(QuantError::SourceLength { .. })),
            "{}: {short:?}",
            case.ty
        );
        let x = vec![1.0f32; n + 1];
        let bs = case.ty.block_size();
        let long = dot_row(case.ty, q, &x);
        if bs > 1 {
            assert!(
                matches!(long, Err(QuantError::PartialBlock { .. })),
                "{}: {long:?}",
                case.ty
            );
        } else {
            assert!(
                matches!(long, Err(QuantError::SourceLength { .. })),
                "{}: {long:?}",
                case.ty
            );
        }
    }
}
