//! ggml quant blocks: dequantize a row to f32, and dot a row with f32 activations.
//!
//! Algorithm. Every supported type is a *block format*: `QK` elements stored in `B` bytes
//! (F32/F16/BF16 are element formats, `QK = 1`). A decoder turns one block into `QK` f32 values
//! with exactly the f32 operations, in the order, of llama.cpp's reference
//! `dequantize_row_*` (`ggml/src/ggml-quants.c`), so the values are bit-exact with ggml's
//! `to_float` and with gguf-py's `gguf.quants.dequantize` (checked on
//! `tests/data/quants/quant_vectors.gguf` by `tests/quant_vectors.rs`). The families live in
//! the submodules `legacy` (Q4_0 … Q8_0, IQ4_NL, MXFP4, NVFP4), `kquants` (Q2_K … Q6_K),
//! `iquants` (IQ1/IQ2/IQ3, IQ4_XS), `ternary` (TQ1_0, TQ2_0) and `float` (F32, F16, BF16); the
//! lookup tables in `grids` (`aubier_kernels_gen::quant_grids`, shared with the GPU emitters)
//! are generated from gguf-py by `kernels-gen/tools/gen_quant_grids.py`.
//!
//! The dot decodes one block into a stack buffer and accumulates it against the activations.
//! Its reduction order is fixed (it is the CPU oracle's numerics), independent of the type and of
//! the block boundaries:
//!
//! ```text
//! acc[0..8] = +0.0
//! for i in 0..n:  acc[i % 8] = acc[i % 8] + (w[i] * x[i])      // two f32 roundings, no FMA
//! dot = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
//! ```
//!
//! where `w` is the bit-exact dequantized row. Eight independent lanes let the compiler keep the
//! accumulators in two SSE (or one AVX) register(s) without reassociating anything.
//!
//! The entry points come in two forms: the checked [`dequantize_row`] / [`dot_row`] (lengths
//! validated, errors as [`QuantError`]), and the unchecked `extern "C"` kernels from
//! [`dequant_fn`] / [`dot_fn`] that generated code calls as host functions. The checked forms
//! call the very same kernels, so the two are bit-identical.

mod float;
mod iquants;
mod kquants;
mod legacy;
#[cfg(target_arch = "x86_64")]
mod legacy_avx512;
pub mod random;
mod ternary;

use crate::ggml_type::GgmlType;
use aubier_kernels_gen::cpu::{HostSymbols, QuantKernels};
use aubier_kernels_gen::quant_grids as grids;

/// Errors of [`dequantize_row`] and [`dot_row`].
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// The type has no dequantize/dot kernel (see [`is_supported`]).
    #[error("ggml type {0} is not supported by the quant kernels")]
    Unsupported(GgmlType),
    /// The row length is not a whole number of blocks.
    #[error("{ty}: a row of {n} elements is not a multiple of the block size {block_size}")]
    PartialBlock {
        /// The row's type.
        ty: GgmlType,
        /// Elements in the row (the length of `dst` or `x`).
        n: usize,
        /// Elements per block of `ty`.
        block_size: usize,
    },
    /// The byte length of the row does not match its element count.
    #[error("{ty}: a row of {n} elements takes {expected} bytes, but {actual} bytes were given")]
    SourceLength {
        /// The row's type.
        ty: GgmlType,
        /// Elements in the row.
        n: usize,
        /// `ggml_row_size(ty, n)` in bytes.
        expected: usize,
        /// `src.len()` in bytes.
        actual: usize,
    },
    /// Bytes that are not whole groups of rows of the interleaved layout
    /// ([`q8::interleave_rows`]).
    #[error("{ty}: {detail}")]
    Interleave {
        /// The rows' type.
        ty: GgmlType,
        /// What did not fit.
        detail: String,
    },
    /// `ggml_row_size(ty, n)` does not fit in `usize`.
    #[error("{ty}: the byte size of a row of {n} elements overflows usize")]
    RowSizeOverflow {
        /// The row's type.
        ty: GgmlType,
        /// Elements in the row.
        n: usize,
    },
}

/// Unchecked dot kernel: returns `Σ_i dequant(row)_i · x_i` in the reduction order of the
/// module doc.
///
/// # Safety
/// The caller guarantees that `n` is a multiple of the type's block size, that `row` points to
/// `n / block_size · type_size` readable bytes (no alignment needed), and that `x` points to `n`
/// readable, 4-byte-aligned f32 values. With `n == 0` neither pointer is read.
pub type DotFn = unsafe extern "C" fn(row: *const u8, x: *const f32, n: usize) -> f32;

/// Unchecked dequantize kernel: writes the `n` f32 values of `row` to `y` (bit-exact with
/// ggml's `dequantize_row_*`).
///
/// # Safety
/// The caller guarantees that `n` is a multiple of the type's block size, that `row` points to
/// `n / block_size · type_size` readable bytes (no alignment needed), that `y` points to `n`
/// writable, 4-byte-aligned f32 values, and that the two ranges do not overlap. With `n == 0`
/// neither pointer is touched.
pub type DequantFn = unsafe extern "C" fn(row: *const u8, y: *mut f32, n: usize);

/// A block format: `QK` elements in `B` bytes.
trait BlockFormat<const QK: usize, const B: usize> {
    /// Decodes one block into its `QK` values, in ggml's element order and f32 arithmetic.
    fn decode(block: &[u8; B], out: &mut [f32; QK]);
}

/// An element format (block size 1): one value in `B` bytes.
trait ElemFormat<const B: usize> {
    /// Widens one stored value to f32.
    fn decode(elem: &[u8; B]) -> f32;
}

/// Number of accumulator lanes of the dot (see the module doc).
const LANES: usize = 8;

/// The fixed final reduction of the lanes (module doc).
#[inline(always)]
fn reduce_lanes(acc: &[f32; LANES]) -> f32 {
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}

/// `acc[l] += w[l] * x[l]` for the eight lanes.
#[inline(always)]
fn accumulate(acc: &mut [f32; LANES], w: &[f32; LANES], x: &[f32; LANES]) {
    for l in 0..LANES {
        acc[l] += w[l] * x[l];
    }
}

/// Dot of whole blocks: `src.len() == x.len() / QK * B` is assumed (extra input is ignored).
#[inline(always)]
fn dot_blocks<const QK: usize, const B: usize, F: BlockFormat<QK, B>>(
    src: &[u8],
    x: &[f32],
) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut buf = [0.0f32; QK];
    let (blocks, _) = src.as_chunks::<B>();
    let (xs, _) = x.as_chunks::<QK>();
    for (block, xb) in blocks.iter().zip(xs) {
        F::decode(block, &mut buf);
        let (w8, _) = buf.as_chunks::<LANES>();
        let (x8, _) = xb.as_chunks::<LANES>();
        for (w, xv) in w8.iter().zip(x8) {
            accumulate(&mut acc, w, xv);
        }
    }
    reduce_lanes(&acc)
}

/// The dot of two f32 rows in the module doc's order (the oracle's `dot_f32`, `emit.rs`): over
/// the first `min(w.len(), x.len())` elements.
pub(crate) fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let (w8, w_tail) = w[..n].as_chunks::<LANES>();
    let (x8, x_tail) = x[..n].as_chunks::<LANES>();
    let mut acc = [0.0f32; LANES];
    for (a, b) in w8.iter().zip(x8) {
        accumulate(&mut acc, a, b);
    }
    // The tail starts at a multiple of 8, so element i goes to lane i % 8 = its tail index.
    for ((lane, a), b) in acc.iter_mut().zip(w_tail).zip(x_tail) {
        *lane += a * b;
    }
    reduce_lanes(&acc)
}

/// Dot of an element-format row: `src.len() == x.len() * B` is assumed.
#[inline(always)]
fn dot_elems<const B: usize, F: ElemFormat<B>>(src: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (elems, _) = src.as_chunks::<B>();
    let (e8, e_tail) = elems.as_chunks::<LANES>();
    let (x8, x_tail) = x.as_chunks::<LANES>();
    for (e, xv) in e8.iter().zip(x8) {
        let mut w = [0.0f32; LANES];
        for (wl, el) in w.iter_mut().zip(e) {
            *wl = F::decode(el);
        }
        accumulate(&mut acc, &w, xv);
    }
    // The tail starts at a multiple of 8, so element i goes to lane i % 8 = its tail index.
    for ((lane, e), xv) in acc.iter_mut().zip(e_tail).zip(x_tail) {
        *lane += F::decode(e) * xv;
    }
    reduce_lanes(&acc)
}

#[inline(always)]
fn dequant_blocks<const QK: usize, const B: usize, F: BlockFormat<QK, B>>(
    src: &[u8],
    y: &mut [f32],
) {
    let (blocks, _) = src.as_chunks::<B>();
    let (ys, _) = y.as_chunks_mut::<QK>();
    for (block, yb) in blocks.iter().zip(ys) {
        F::decode(block, yb);
    }
}

#[inline(always)]
fn dequant_elems<const B: usize, F: ElemFormat<B>>(src: &[u8], y: &mut [f32]) {
    let (elems, _) = src.as_chunks::<B>();
    for (e, v) in elems.iter().zip(y.iter_mut()) {
        *v = F::decode(e);
    }
}

/// `extern "C"` dot over a block format; the contract is [`DotFn`]'s.
unsafe extern "C" fn dot_raw_blocks<const QK: usize, const B: usize, F: BlockFormat<QK, B>>(
    row: *const u8,
    x: *const f32,
    n: usize,
) -> f32 {
    if n == 0 {
        return 0.0;
    }
    // SAFETY: the caller guarantees (DotFn) n/QK*B readable bytes at `row` and n aligned,
    // readable f32 at `x`.
    let (src, x) = unsafe {
        (
            std::slice::from_raw_parts(row, n / QK * B),
            std::slice::from_raw_parts(x, n),
        )
    };
    dot_blocks::<QK, B, F>(src, x)
}

/// `extern "C"` dot over an element format; the contract is [`DotFn`]'s.
unsafe extern "C" fn dot_raw_elems<const B: usize, F: ElemFormat<B>>(
    row: *const u8,
    x: *const f32,
    n: usize,
) -> f32 {
    if n == 0 {
        return 0.0;
    }
    // SAFETY: the caller guarantees (DotFn) n*B readable bytes at `row` and n aligned,
    // readable f32 at `x`.
    let (src, x) = unsafe {
        (
            std::slice::from_raw_parts(row, n * B),
            std::slice::from_raw_parts(x, n),
        )
    };
    dot_elems::<B, F>(src, x)
}

/// `extern "C"` dequantize over a block format; the contract is [`DequantFn`]'s.
unsafe extern "C" fn dequant_raw_blocks<const QK: usize, const B: usize, F: BlockFormat<QK, B>>(
    row: *const u8,
    y: *mut f32,
    n: usize,
) {
    if n == 0 {
        return;
    }
    // SAFETY: the caller guarantees (DequantFn) n/QK*B readable bytes at `row` and n aligned,
    // writable f32 at `y` that do not overlap `row`.
    let (src, y) = unsafe {
        (
            std::slice::from_raw_parts(row, n / QK * B),
            std::slice::from_raw_parts_mut(y, n),
        )
    };
    dequant_blocks::<QK, B, F>(src, y);
}

/// `extern "C"` dequantize over an element format; the contract is [`DequantFn`]'s.
unsafe extern "C" fn dequant_raw_elems<const B: usize, F: ElemFormat<B>>(
    row: *const u8,
    y: *mut f32,
    n: usize,
) {
    if n == 0 {
        return;
    }
    // SAFETY: the caller guarantees (DequantFn) n*B readable bytes at `row` and n aligned,
    // writable f32 at `y` that do not overlap `row`.
    let (src, y) = unsafe {
        (
            std::slice::from_raw_parts(row, n * B),
            std::slice::from_raw_parts_mut(y, n),
        )
    };
    dequant_elems::<B, F>(src, y);
}

/// The format table: one line per supported type, `TYPE => elem(bytes, format)` or
/// `TYPE => block(elements, bytes, format)`. The sizes are checked against
/// [`GgmlType::block_size`] / [`GgmlType::type_size`] by a unit test.
macro_rules! formats {
    ($( $ty:ident => $kind:ident($($arg:tt)*); )*) => {
        /// The scalar dot kernel of `ty` (the reference the vector kernels of [`dot_fn`]
        /// reproduce), or `None` when [`is_supported`] is false.
        fn scalar_dot_fn(ty: GgmlType) -> Option<DotFn> {
            match ty {
                $( GgmlType::$ty => Some(formats!(@dot $kind $($arg)*)), )*
                _ => None,
            }
        }

        /// The unchecked dequantize kernel of `ty`, or `None` when [`is_supported`] is false.
        ///
        /// The kernel writes the same values, bit for bit, as [`dequantize_row`]; its safety
        /// contract is [`DequantFn`]'s.
        pub fn dequant_fn(ty: GgmlType) -> Option<DequantFn> {
            match ty {
                $( GgmlType::$ty => Some(formats!(@dequant $kind $($arg)*)), )*
                _ => None,
            }
        }

        #[cfg(test)]
        /// `(type, elements per block, bytes per block)` as the format table states them.
        const FORMAT_SIZES: &[(GgmlType, usize, usize)] = &[
            $( (GgmlType::$ty, formats!(@qk $kind $($arg)*), formats!(@bytes $kind $($arg)*)), )*
        ];
    };
    (@dot elem $b:literal, $f:ty) => { dot_raw_elems::<$b, $f> };
    (@dot block $qk:literal, $b:literal, $f:ty) => { dot_raw_blocks::<$qk, $b, $f> };
    (@dequant elem $b:literal, $f:ty) => { dequant_raw_elems::<$b, $f> };
    (@dequant block $qk:literal, $b:literal, $f:ty) => { dequant_raw_blocks::<$qk, $b, $f> };
    (@qk elem $b:literal, $f:ty) => { 1 };
    (@qk block $qk:literal, $b:literal, $f:ty) => { $qk };
    (@bytes elem $b:literal, $f:ty) => { $b };
    (@bytes block $qk:literal, $b:literal, $f:ty) => { $b };
}

formats! {
    F32 => elem(4, float::F32);
    F16 => elem(2, float::F16);
    BF16 => elem(2, float::BF16);
    Q4_0 => block(32, 18, legacy::Q4_0);
    Q4_1 => block(32, 20, legacy::Q4_1);
    Q5_0 => block(32, 22, legacy::Q5_0);
    Q5_1 => block(32, 24, legacy::Q5_1);
    Q8_0 => block(32, 34, legacy::Q8_0);
    IQ4_NL => block(32, 18, legacy::IQ4_NL);
    MXFP4 => block(32, 17, legacy::MXFP4);
    NVFP4 => block(64, 36, legacy::NVFP4);
    Q2_K => block(256, 84, kquants::Q2_K);
    Q3_K => block(256, 110, kquants::Q3_K);
    Q4_K => block(256, 144, kquants::Q4_K);
    Q5_K => block(256, 176, kquants::Q5_K);
    Q6_K => block(256, 210, kquants::Q6_K);
    IQ2_XXS => block(256, 66, iquants::IQ2_XXS);
    IQ2_XS => block(256, 74, iquants::IQ2_XS);
    IQ2_S => block(256, 82, iquants::IQ2_S);
    IQ3_XXS => block(256, 98, iquants::IQ3_XXS);
    IQ3_S => block(256, 110, iquants::IQ3_S);
    IQ1_S => block(256, 50, iquants::IQ1_S);
    IQ1_M => block(256, 56, iquants::IQ1_M);
    IQ4_XS => block(256, 136, iquants::IQ4_XS);
    TQ1_0 => block(256, 54, ternary::TQ1_0);
    TQ2_0 => block(256, 66, ternary::TQ2_0);
}

/// The unchecked dot kernel of `ty`, or `None` when [`is_supported`] is false: the AVX-512
/// kernel of Q4_0 and Q8_0 where the CPU has it (`legacy_avx512`, the scalar kernel's bits),
/// else the scalar one.
///
/// The kernel computes the same value, bit for bit, as [`dot_row`]; its safety contract is
/// [`DotFn`]'s. Meant to be imported as a host function by generated mat-vec code.
pub fn dot_fn(ty: GgmlType) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = legacy_avx512::dot_fn(ty) {
        return Some(f);
    }
    scalar_dot_fn(ty)
}

/// Whether `ty` has dequantize and dot kernels: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
/// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_NL,
/// IQ4_XS, TQ1_0, TQ2_0, MXFP4 and NVFP4. Not: the activation-only Q8_1/Q8_K, the integer
/// types and F64.
pub fn is_supported(ty: GgmlType) -> bool {
    dot_fn(ty).is_some()
}

/// Checks that `src_len` bytes hold exactly one row of `n` elements of `ty`.
fn check_row(ty: GgmlType, src_len: usize, n: usize) -> Result<(), QuantError> {
    let block_size = ty.block_size();
    if !n.is_multiple_of(block_size) {
        return Err(QuantError::PartialBlock { ty, n, block_size });
    }
    let expected = (n / block_size)
        .checked_mul(ty.type_size())
        .ok_or(QuantError::RowSizeOverflow { ty, n })?;
    if src_len != expected {
        return Err(QuantError::SourceLength {
            ty,
            n,
            expected,
            actual: src_len,
        });
    }
    Ok(())
}

/// Dequantizes one row: `src` holds the whole blocks of `dst.len()` elements of type `ty`
/// (ggml `ne0` order, `ggml_row_size(ty, dst.len())` bytes), and `dst` receives the values,
/// bit-exact with llama.cpp `dequantize_row_*` (`ggml/src/ggml-quants.c`) and gguf-py
/// `gguf.quants.dequantize`.
///
/// # Errors
/// [`QuantError::Unsupported`] for a type without a kernel; [`QuantError::PartialBlock`] when
/// `dst.len()` is not a multiple of the block size; [`QuantError::SourceLength`] when
/// `src.len()` is not the row's byte size; [`QuantError::RowSizeOverflow`].
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let kernel = dequant_fn(ty).ok_or(QuantError::Unsupported(ty))?;
    check_row(ty, src.len(), dst.len())?;
    // SAFETY: check_row proved that dst.len() is a multiple of the block size and that `src`
    // holds exactly its row size; `dst` is a distinct, aligned &mut [f32] of that length.
    unsafe { kernel(src.as_ptr(), dst.as_mut_ptr(), dst.len()) };
    Ok(())
}

/// Dot of one row with f32 activations: `Σ_i dequant(src)_i · x_i`, `x.len()` elements, in the
/// fixed reduction order of the module doc (8 strided f32 lanes, then a 3-level tree). `src`
/// holds the row's whole blocks, as for [`dequantize_row`].
///
/// # Errors
/// As [`dequantize_row`], with `x.len()` as the element count.
pub fn dot_row(ty: GgmlType, src: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let kernel = dot_fn(ty).ok_or(QuantError::Unsupported(ty))?;
    check_row(ty, src.len(), x.len())?;
    // SAFETY: check_row proved that x.len() is a multiple of the block size and that `src`
    // holds exactly its row size; `x` is an aligned &[f32] of that length.
    Ok(unsafe { kernel(src.as_ptr(), x.as_ptr(), x.len()) })
}

/// `y[r] = dot_row(ty, row_r, x)` for the rows of `src` (back to back, `y.len()` of them), with
/// the lengths checked and the kernel looked up once for all of them: the same bits as
/// [`dot_row`] on each.
///
/// # Errors
/// As [`dot_row`] (for one row of `src.len() / y.len()` bytes), and [`QuantError::SourceLength`]
/// when `src` is not `y.len()` such rows.
pub fn dot_rows(ty: GgmlType, src: &[u8], x: &[f32], y: &mut [f32]) -> Result<(), QuantError> {
    let kernel = dot_fn(ty).ok_or(QuantError::Unsupported(ty))?;
    let rb = src.len() / y.len().max(1);
    check_row(ty, rb, x.len())?;
    if rb * y.len() != src.len() {
        return Err(QuantError::SourceLength {
            ty,
            n: x.len() * y.len(),
            expected: rb * y.len(),
            actual: src.len(),
        });
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(dots) = legacy_avx512::dots_fn(ty) {
        // SAFETY: as below, for all `y.len()` rows of `src` at once.
        unsafe { dots(src.as_ptr(), rb, x.as_ptr(), x.len(), y) };
        return Ok(());
    }
    for (v, row) in y.iter_mut().zip(src.chunks_exact(rb.max(1))) {
        // SAFETY: check_row proved that x.len() is a multiple of the block size and that each
        // `rb`-byte row holds exactly its row size; `x` is an aligned &[f32] of that length.
        *v = unsafe { kernel(row.as_ptr(), x.as_ptr(), x.len()) };
    }
    Ok(())
}

/// Reads the little-endian f16 at byte `at` and widens it to f32 (ggml `GGML_FP16_TO_FP32`;
/// exact, via `half`).
#[inline(always)]
pub(crate) fn f16_at<const B: usize>(block: &[u8; B], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([block[at], block[at + 1]])).to_f32()
}

/// The host functions the oracle's generated code calls (`aubier_kernels_gen::cpu`): dot and
/// dequantize of every ggml type this module implements, except `F32` (generated inline).
pub fn host_symbols() -> HostSymbols {
    let mut host = HostSymbols::new();
    for &ty in GgmlType::ALL {
        if ty == GgmlType::F32 {
            continue;
        }
        if let (Some(dot), Some(dequant)) = (dot_fn(ty), dequant_fn(ty)) {
            host.insert(
                ty.name(),
                QuantKernels {
                    block_elems: ty.block_size(),
                    block_bytes: ty.type_size(),
                    dot,
                    dequant,
                },
            );
        }
    }
    host
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_rows_is_dot_row_per_row_and_checks_lengths() {
        let ty = GgmlType::Q8_0;
        let rb = ty.row_size(64).unwrap();
        let src: Vec<u8> = (0..3 * rb).map(|i| (i * 37 % 251) as u8).collect();
        let x: Vec<f32> = (0..64).map(|i| i as f32 * 0.01 - 0.3).collect();
        let mut y = [0f32; 3];
        dot_rows(ty, &src, &x, &mut y).unwrap();
        for (r, v) in y.iter().enumerate() {
            let want = dot_row(ty, &src[r * rb..(r + 1) * rb], &x).unwrap();
            assert_eq!(v.to_bits(), want.to_bits());
        }
        assert!(dot_rows(ty, &src[..3 * rb - 1], &x, &mut y).is_err());
        assert!(dot_rows(ty, &src, &x[..63], &mut y).is_err());
    }

    #[test]
    fn format_table_matches_ggml_sizes() {
        for &(ty, qk, bytes) in FORMAT_SIZES {
            assert_eq!(ty.block_size(), qk, "{ty} block size");
            assert_eq!(ty.type_size(), bytes, "{ty} bytes per block");
        }
        let supported: Vec<GgmlType> = GgmlType::ALL
            .iter()
            .copied()
            .filter(|&t| is_supported(t))
            .collect();
        assert_eq!(supported.len(), FORMAT_SIZES.len());
        for ty in [
            GgmlType::Q8_1,
            GgmlType::Q8_K,
            GgmlType::I8,
            GgmlType::I32,
            GgmlType::F64,
        ] {
            assert!(!is_supported(ty), "{ty}");
            assert!(dequant_fn(ty).is_none(), "{ty}");
        }
    }

    #[test]
    fn unsupported_type_is_an_error() {
        let mut dst = [0.0f32; 32];
        assert_eq!(
            dequantize_row(GgmlType::Q8_K, &[0u8; 292], &mut dst),
            Err(QuantError::Unsupported(GgmlType::Q8_K))
        );
        assert_eq!(
            dot_row(GgmlType::I8, &[0u8; 32], &dst),
            Err(QuantError::Unsupported(GgmlType::I8))
        );
    }

    #[test]
    fn wrong_lengths_are_errors_for_every_type() {
        for &(ty, qk, bytes) in FORMAT_SIZES {
            let src = vec![0u8; 3 * bytes + 1];
            // A partial block (for block size 1 every length is whole, so skip that case).
            if qk > 1 {
                let mut dst = vec![0.0f32; qk + 1];
                assert_eq!(
                    dequantize_row(ty, &src[..2 * bytes], &mut dst),
                    Err(QuantError::PartialBlock {
                        ty,
                        n: qk + 1,
                        block_size: qk
                    })
                );
                assert!(matches!(
                    dot_row(ty, &src[..2 * bytes], &dst),
                    Err(QuantError::PartialBlock { .. })
                ));
            }
            // Too many, too few and zero bytes for two blocks.
            let mut dst = vec![0.0f32; 2 * qk];
            for len in [3 * bytes + 1, 2 * bytes + 1, 2 * bytes - 1, bytes, 0] {
                let want = Err(QuantError::SourceLength {
                    ty,
                    n: 2 * qk,
                    expected: 2 * bytes,
                    actual: len,
                });
                assert_eq!(dequantize_row(ty, &src[..len], &mut dst), want);
                assert_eq!(dot_row(ty, &src[..len], &dst).map(|_| ()), want);
            }
            // Empty rows are fine.
            assert_eq!(dequantize_row(ty, &[], &mut []), Ok(()));
            assert_eq!(dot_row(ty, &[], &[]), Ok(0.0));
        }
    }

    /// The reduction order of the module doc, on values where the order shows: 2^24 + 1 is not
    /// an f32, so adding eight ones to 2^24 in one lane loses them, while spread over lanes
    /// they survive.
    #[test]
    fn dot_follows_the_documented_reduction_order() {
        let big = 16_777_216.0f32; // 2^24
        let mut x = vec![1.0f32; 17];
        x[0] = big;
        let src: Vec<u8> = [1.0f32; 17].iter().flat_map(|v| v.to_le_bytes()).collect();
        // Lanes: lane 0 = (2^24 + 1) + 1 = 2^24 (each +1 rounds to even), lanes 1..7 = 2.
        // Tree: (2^24 + 2) + (2 + 2) = 2^24 + 6, then + ((2 + 2) + (2 + 2)) = 2^24 + 14.
        let got = dot_row(GgmlType::F32, &src, &x);
        assert_eq!(got, Ok(big + 14.0));
        // Plain left-to-right summation would give 2^24 (every +1 lost).
        assert_ne!(got, Ok(x.iter().fold(0.0f32, |a, v| a + v)));

        // One value per lane pins the tree: ((2^24 + 0) + (1 + 1)) + ((0 + 0) + (0 + 0)) is
        // 2^24 + 2, where a left-to-right sum, or the register-halves tree
        // ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)), gives 2^24.
        let x = [big, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        let got = dot_row(GgmlType::F32, &src[..32], &x);
        assert_eq!(got, Ok(big + 2.0));
    }

    proptest::proptest! {
        /// Any byte and element count: an error exactly when the lengths disagree, never a
        /// panic, for every type (supported or not).
        #[test]
        fn arbitrary_lengths_never_panic(
            t in 0..GgmlType::ALL.len(),
            src_len in 0usize..2000,
            n in 0usize..1100,
        ) {
            let ty = GgmlType::ALL[t];
            let src = vec![0u8; src_len];
            let mut dst = vec![0.0f32; n];
            let fits = n.is_multiple_of(ty.block_size()) && ty.row_size(n) == Some(src_len);
            let deq = dequantize_row(ty, &src, &mut dst);
            let dot = dot_row(ty, &src, &dst);
            proptest::prop_assert_eq!(deq.is_ok(), fits && is_supported(ty));
            proptest::prop_assert_eq!(dot.is_ok(), fits && is_supported(ty));
        }
    }

    #[test]
    fn extern_kernels_accept_zero_length_with_dangling_pointers() {
        for &(ty, _, _) in FORMAT_SIZES {
            let dot = dot_fn(ty).expect("supported");
            let deq = dequant_fn(ty).expect("supported");
            // SAFETY: n == 0, so the kernels read and write nothing (DotFn/DequantFn contract).
            unsafe {
                assert_eq!(dot(std::ptr::null(), std::ptr::null(), 0), 0.0);
                deq(std::ptr::null(), std::ptr::null_mut(), 0);
            }
        }
    }
}
