//! Q8_K activation rows packed for the tile kernels ([`super::q8_grid_fn`]).
//!
//! Algorithm. The rows are cut into groups of [`GROUP`] (zero rows pad the last group: `d8 = 0`,
//! codes 0). For each group and 256-element block the codes are laid out as four 16 × 64-byte
//! tiles in the VNNI order of Intel AMX's `B` operand: tile `c` (codes `64c .. 64c + 64`), row `r`,
//! bytes `4t .. 4t + 4` hold codes `64c + 4r .. 64c + 4r + 4` of the group's row `t` — a 16 × 16
//! transpose of 32-bit words. Beside them, per group and block, the 16 rows' scales `d8`, their
//! block sums as eight i32 words of two i16 each (word `i` of row `t` = `bsum[2i]` in the low
//! half, `bsum[2i + 1]` in the high half: the operand of a `vpdpwssd`), and `−127 · Σ x8` (the
//! offset of the Q3_K kernel's biased weights). Everything is computed once per call site and
//! read by every weight row.

use super::block::BlockQ8K;

/// Activation rows per group (the rows of an AMX `C` tile).
pub const GROUP: usize = 16;

/// Activation rows of a half group (eight i32 lanes, one 256-bit vector): a last group with this
/// many rows or fewer costs the 256-bit grid backends half a group (`avx512/grid.rs`,
/// `avx2_grid.rs`).
pub(super) const HALF: usize = GROUP / 2;

/// One 16 × 64-byte tile.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Tile(pub(super) [u8; 1024]);

/// One block of 16 unpacked weight rows (256 effective weights each): row by row (row `r` at
/// `256r`), or with the rows' words in the lanes (word `k` of row `r` at `64k + 4r`, the
/// interleaved layout's order, `lanes::q2_unpack`).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Unpacked(pub(super) [u8; GROUP * 256]);

impl Unpacked {
    /// Row `r` of a row-by-row block.
    pub(super) fn row(&mut self, r: usize) -> &mut [u8] {
        &mut self.0[256 * r..256 * (r + 1)]
    }
}

/// Two `C` tiles (16 × 16 i32 each, weight row major).
#[repr(C, align(64))]
pub(super) struct CBuf(pub(super) [[i32; GROUP * GROUP]; 2]);

/// `rows` Q8_K activation rows of `nb` blocks each, packed (module note).
pub struct Q8Tiles {
    rows: usize,
    nb: usize,
    /// `[group][block][chunk]`, four per block.
    pub(super) tiles: Vec<Tile>,
    /// `[group][block]`: `d8` of each row of the group.
    pub(super) d8: Vec<[f32; GROUP]>,
    /// `[group][block]`: word `i` of the block sums, lane `t` for row `t`.
    pub(super) pairs: Vec<[[i32; GROUP]; 8]>,
    /// `[group][block]`: `−127 · Σ_j bsum[j]` of each row.
    pub(super) neg127: Vec<[i32; GROUP]>,
}

impl std::fmt::Debug for Q8Tiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Q8Tiles")
            .field("rows", &self.rows)
            .field("nb", &self.nb)
            .finish_non_exhaustive()
    }
}

impl Q8Tiles {
    /// Packs `rows` activation rows stored back to back in `x` (`x.len() / rows` blocks each).
    /// None when `x.len()` is not a multiple of `rows` (or `x` is not empty while `rows` is 0).
    pub fn pack(x: &[BlockQ8K], rows: usize) -> Option<Q8Tiles> {
        if rows == 0 {
            return x.is_empty().then(|| Q8Tiles::empty(0));
        }
        if !x.len().is_multiple_of(rows) {
            return None;
        }
        let nb = x.len() / rows;
        let groups = rows.div_ceil(GROUP);
        let mut p = Q8Tiles {
            rows,
            nb,
            tiles: vec![Tile([0; 1024]); groups * nb * 4],
            d8: vec![[0.0; GROUP]; groups * nb],
            pairs: vec![[[0; GROUP]; 8]; groups * nb],
            neg127: vec![[0; GROUP]; groups * nb],
        };
        if nb == 0 {
            return Some(p);
        }
        // Tile by tile, each tile row written in order: word `16c + r` of the group's rows, one
        // 32-bit word per row (the transpose's strided side reads the rows' blocks, in L1).
        for (g, xg) in x.chunks(GROUP * nb).enumerate() {
            for b in 0..nb {
                let gb = g * nb + b;
                // words[t][k]: word `k` of row `t`'s block (rows past the group's end stay 0).
                let mut words = [[0u32; 64]; GROUP];
                for (wt, xr) in words.iter_mut().zip(xg.chunks_exact(nb)) {
                    for (w, code) in wt.iter_mut().zip(xr[b].qs.as_chunks::<4>().0) {
                        *w = u32::from_ne_bytes(code.map(|q| q as u8));
                    }
                }
                for (c, tile) in p.tiles[gb * 4..gb * 4 + 4].iter_mut().enumerate() {
                    for (r, tile_row) in tile.0.as_chunks_mut::<64>().0.iter_mut().enumerate() {
                        let k = GROUP * c + r;
                        for (dst, wt) in tile_row.as_chunks_mut::<4>().0.iter_mut().zip(&words) {
                            *dst = wt[k].to_ne_bytes();
                        }
                    }
                }
            }
        }
        for (j, xr) in x.chunks_exact(nb).enumerate() {
            let (g, t) = (j / GROUP, j % GROUP);
            for (b, y) in xr.iter().enumerate() {
                let gb = g * nb + b;
                p.d8[gb][t] = y.d;
                for (i, pair) in y.bsums.chunks_exact(2).enumerate() {
                    let word = u32::from(pair[0] as u16) | (u32::from(pair[1] as u16) << 16);
                    p.pairs[gb][i][t] = word as i32;
                }
                let sum: i32 = y.bsums.iter().map(|&s| i32::from(s)).sum();
                p.neg127[gb][t] = -127 * sum;
            }
        }
        Some(p)
    }

    fn empty(rows: usize) -> Q8Tiles {
        Q8Tiles {
            rows,
            nb: 0,
            tiles: Vec::new(),
            d8: Vec::new(),
            pairs: Vec::new(),
            neg127: Vec::new(),
        }
    }

    /// The activation rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.nb
    }

    /// Groups of [`GROUP`] rows (the last one padded).
    pub(super) fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }
}
