//! The signatures of the Q8_K kernels (the function pointer types every kernel file hands out)
//! and the most activation planes a decode kernel takes, apart from the parent module so that
//! the kernel files name them without importing it.

use super::block::BlockQ8K;
use super::tiles::Q8Tiles;

/// Dot of one weight row (raw GGUF bytes of `x.len()` blocks of its type) with a quantized
/// activation row: `Σ_b value(b)` as the [`q8`](super) module doc defines it per type.
///
/// A "block of its type" is 256 elements: 84 bytes (Q2_K), 110 (Q3_K), 144 (Q4_K), 176 (Q5_K),
/// 210 (Q6_K), 66 (IQ2_XXS), 74 (IQ2_XS), 8 × 18 (Q4_0), 8 × 34 (Q8_0) — `ggml_row_size(ty, 256)`.
/// The caller guarantees `row.len() == x.len() · that size`; a kernel checks it once
/// (`debug_assert` in debug builds) and returns `f32::NAN` when it fails, so no input can read
/// out of bounds.
pub type Q8DotFn = fn(row: &[u8], x: &[BlockQ8K]) -> f32;

/// `y[j] = dot(row, x[j·nb .. (j+1)·nb])` for `j` in `0..y.len()`, `nb` the blocks of `row`:
/// one weight row (as [`Q8DotFn`]) against `y.len()` activation rows of `nb` blocks each,
/// stored back to back in `x`. Each `y[j]` has exactly the bits of the [`Q8DotFn`] of the same
/// type on `x[j·nb .. (j+1)·nb]`. Lengths: `row.len() = nb · block bytes` and
/// `x.len() = nb · y.len()`; a mismatch gives NaN in every `y[j]` (`debug_assert` in debug
/// builds); `y` empty is a no-op.
pub type Q8DotManyFn = fn(row: &[u8], x: &[BlockQ8K], y: &mut [f32]);

/// `y[i·R + j] = dot(row_i, x_j)` for the `n = y.len() / R` weight rows stored back to back in
/// `w` and the `R = x.rows()` activation rows packed in `x`: many weight rows against many
/// activation rows in one call (prefill). Each `y[i·R + j]` has exactly the bits of the
/// [`Q8DotFn`] of the same type on row `i` and activation row `j`. Lengths: `w.len() = n ·
/// x.blocks() · block bytes`, `y.len() = n · R`; a mismatch gives NaN in every `y` entry
/// (`debug_assert` in debug builds).
pub type Q8GridFn = fn(w: &[u8], x: &Q8Tiles, y: &mut [f32]);

/// `y[i] = Σ_p dot(row_i, x[p·nb .. (p + 1)·nb])` for the `n = y.len()` weight rows stored back
/// to back in `w` and the `planes` Q8_K planes of one activation row in `x` (plane `p` is blocks
/// `p·nb .. (p + 1)·nb`): decode, many weight rows against one token. The plane dots are added
/// in plane order (`d_0 + d_1`), each with exactly the bits of the [`Q8DotFn`] of the same type,
/// so `y[i]` is what the single-row kernel gives row by row and plane by plane. `planes` is 1
/// or 2 (the cpu backend's `q8` and `q8x2`). Lengths: `x.len() = planes · nb`, `w.len() = n · nb ·
/// block bytes`; a mismatch or another plane count gives NaN in every `y[i]` (`debug_assert` in
/// debug builds); `y` empty (and `w` empty) is a no-op.
pub type Q8RowsFn = fn(w: &[u8], x: &[BlockQ8K], planes: usize, y: &mut [f32]);

/// `y[i·m + j] = Σ_p dot(row_i, x_{j,p})` for the `n = y.len() / m` weight rows of `w` in the
/// interleaved layout ([`interleave_rows`], whole groups) and `m = tokens` activation rows of
/// `planes` Q8_K planes each (`x` token-major, then plane-major: plane `p` of token `j` is blocks
/// `(j·planes + p)·nb .. + nb`): prefill of a few tokens, each output the bits of the
/// [`Q8RowsFn`] on its token. Lengths: `x.len() = m · planes · nb`, `w.len() = n · nb · block
/// bytes`, `n` a multiple of [`INTERLEAVE_ROWS`]; a mismatch gives NaN in every `y` entry
/// (`debug_assert` in debug builds); no blocks gives `+0.0`.
///
/// [`interleave_rows`]: super::interleave_rows
/// [`INTERLEAVE_ROWS`]: super::INTERLEAVE_ROWS
pub type Q8TokensFn = fn(w: &[u8], x: &[BlockQ8K], planes: usize, tokens: usize, y: &mut [f32]);

/// The most planes a [`Q8RowsFn`] takes.
pub const MAX_PLANES: usize = 2;
