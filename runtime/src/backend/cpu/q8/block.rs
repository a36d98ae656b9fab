//! The Q8_K activation block ([`BlockQ8K`], [`QK_K`] elements), in a file of its own: every
//! kernel file reads it, and none of them imports the parent module for it.

/// Elements of one Q8_K block.
pub const QK_K: usize = 256;

/// One Q8_K activation block: 256 values `x ≈ d · qs[i]`; `bsums[j]` = Σ qs[16j .. 16j+16] (i16).
///
/// The layout (292 bytes, f32 `d` first) is llama.cpp's `block_q8_K` (`ggml-common.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    /// The block scale (`amax / 127`; 0 for an all-zero block, NaN for a non-finite one).
    pub d: f32,
    /// The 256 codes, each in −127..=127.
    pub qs: [i8; QK_K],
    /// `bsums[j] = Σ qs[16j .. 16j + 16]`.
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

impl BlockQ8K {
    /// The block of 256 zeros (`d = 0`).
    pub const ZERO: BlockQ8K = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };
}
