//! The AVX-512 tier of the Q8_K kernels (x86_64): [`vnni`] (single- and many-row dots with
//! AVX-512 VNNI), [`rows`] (decode: groups of weight rows against one token's planes),
//! [`lanes`] (the interleaved layout's decode and many-token kernels), [`grid`] (tile kernels of
//! 16 weight rows by 16 activation rows) and [`amx`] (the grid's AMX backend). Each gives the bits
//! of the scalar kernel (`super::scalar`, the reference); each is handed out only where
//! [`crate::isa`] reports its features.

pub(super) mod amx;
pub(super) mod grid;
pub(super) mod lanes;
pub(super) mod rows;
pub(super) mod vnni;

// The Q8_K module's shared items (blocks, kernel signatures, lengths checks, prefetch, the AVX2
// helpers, the tiles), as `super::…` for the kernels of this folder.
use super::block::BlockQ8K;
use super::shared::{
    clamped, dot_blocks, each_row, lengths_ok, prefetch_l2, q3_k_raw_scales, row_blocks,
    rows_lengths, value_d,
};
use super::types::{Q8DotFn, Q8DotManyFn, Q8GridFn, Q8RowsFn, Q8TokensFn, MAX_PLANES};
use super::{avx2, avx2_grid, avx2_many, avx2_rows, tiles};
