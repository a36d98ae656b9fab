//! The latent KV cache of absorbed MLA (MODEL.md §2.2, §4.3; llama.cpp's K-only cache for
//! `is_mla()` models): per layer, one row of `kv_lora_rank + qk_rope_head_dim` f32 per position —
//! `[RMSNorm(c_kv), RoPE(k_pe)]`, 320 values on the real model — indexed by absolute position.
//! The values `V` are a view of the first `kv_lora_rank` columns, so nothing else is stored.
//!
//! A step writes rows `pos[0..T]` (the plan's `cache_write`) and reads rows `0..S`, `S = pos_last +
//! 1`; every row below `S` was written by the current request chain, because positions restart
//! at 0 after [`LatentKvCache::reset`] (or at `n` after [`LatentKvCache::truncate`] to `n`: a
//! request that reuses the first `n` rows of the previous one, `crate::session`'s prompt cache)
//! and grow contiguously. Both zero every row past the kept ones written since the previous
//! reset, so no value of an earlier request outside the kept prefix survives in memory the
//! engine reads.

/// Errors of [`LatentKvCache::new`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvCacheError {
    /// A zero extent.
    #[error("latent KV cache: {what} must be positive")]
    Empty {
        /// `layers`, `n_ctx` or `width`.
        what: &'static str,
    },
    /// `n_ctx · width` f32 does not fit in memory addressing.
    #[error("latent KV cache: {n_ctx} positions × {width} values per layer overflows")]
    TooLarge {
        /// Positions requested.
        n_ctx: usize,
        /// Values per row.
        width: usize,
    },
}

/// The latent cache: `n_layer` layers of `[n_ctx × width]` f32, row-major, row = absolute
/// position.
#[derive(Clone, Debug)]
pub struct LatentKvCache {
    layers: Vec<Vec<f32>>,
    n_ctx: usize,
    width: usize,
    /// Rows `0..high_water` may hold data of the current request.
    high_water: usize,
}

impl LatentKvCache {
    /// A zeroed cache of `n_layer` layers, `n_ctx` positions (tokens) and `width` values per row
    /// (`kv_lora_rank + qk_rope_head_dim`). Memory: `n_layer · n_ctx · width · 4` bytes
    /// (188 MiB for the real model at 4096 positions), zero pages until first written.
    ///
    /// Errors: [`KvCacheError`] for a zero extent or a layer size that overflows.
    pub fn new(n_layer: usize, n_ctx: usize, width: usize) -> Result<Self, KvCacheError> {
        for (what, n) in [("layers", n_layer), ("n_ctx", n_ctx), ("width", width)] {
            if n == 0 {
                return Err(KvCacheError::Empty { what });
            }
        }
        let per_layer = n_ctx
            .checked_mul(width)
            .filter(|n| n.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or(KvCacheError::TooLarge { n_ctx, width })?;
        Ok(Self {
            layers: (0..n_layer).map(|_| vec![0.0; per_layer]).collect(),
            n_ctx,
            width,
            high_water: 0,
        })
    }

    /// Number of layers.
    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// Capacity in positions (tokens).
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Values per row (`kv_lora_rank + qk_rope_head_dim`).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Layer `layer` as `[n_ctx × width]` f32, or `None` past the last layer.
    pub fn layer(&self, layer: usize) -> Option<&[f32]> {
        self.layers.get(layer).map(Vec::as_slice)
    }

    /// Row `pos` of layer `layer` (`width` values), or `None` when either is out of range.
    pub fn row(&self, layer: usize, pos: usize) -> Option<&[f32]> {
        if pos >= self.n_ctx {
            return None;
        }
        self.layer(layer)
            .and_then(|l| l.get(pos * self.width..(pos + 1) * self.width))
    }

    /// Base pointer of layer `layer` for generated code (`None` past the last layer). Records that
    /// rows `0..rows` are about to be written, so [`Self::reset`] clears them.
    pub(crate) fn layer_ptr(&mut self, layer: usize, rows: usize) -> Option<*mut f32> {
        self.high_water = self.high_water.max(rows.min(self.n_ctx));
        self.layers.get_mut(layer).map(|l| l.as_mut_ptr())
    }

    /// Starts a new request: zeroes every row written since the last reset, in every layer.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Starts a new request that keeps rows `0..rows` (a prefix it shares with the previous
    /// request chain): zeroes every later row written since the last reset, in every layer.
    /// `rows ≥ n_ctx` keeps every row.
    pub fn truncate(&mut self, rows: usize) {
        let keep = rows.min(self.high_water);
        for l in &mut self.layers {
            l[keep * self.width..self.high_water * self.width].fill(0.0);
        }
        self.high_water = keep;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_clears_written_rows_of_every_layer() {
        let mut c = LatentKvCache::new(2, 8, 3).expect("cache");
        for layer in 0..2 {
            let p = c.layer_ptr(layer, 5).expect("layer");
            // SAFETY: rows 0..5 of a [8 × 3] layer.
            unsafe { std::slice::from_raw_parts_mut(p, 15) }.fill(1.5);
        }
        assert_eq!(c.row(1, 4), Some(&[1.5, 1.5, 1.5][..]));
        c.reset();
        for layer in 0..2 {
            assert!(c.layer(layer).expect("layer").iter().all(|&v| v == 0.0));
        }
        assert_eq!(c.row(0, 8), None);
        assert_eq!(c.row(2, 0), None);
    }

    #[test]
    fn truncate_keeps_the_prefix_and_clears_the_rest() {
        let mut c = LatentKvCache::new(2, 8, 3).expect("cache");
        for layer in 0..2 {
            let p = c.layer_ptr(layer, 6).expect("layer");
            // SAFETY: rows 0..6 of a [8 × 3] layer.
            unsafe { std::slice::from_raw_parts_mut(p, 18) }.fill(2.5);
        }
        c.truncate(4);
        for layer in 0..2 {
            let l = c.layer(layer).expect("layer");
            assert!(
                l[..12].iter().all(|&v| v == 2.5),
                "layer {layer}: kept rows"
            );
            assert!(
                l[12..].iter().all(|&v| v == 0.0),
                "layer {layer}: dropped rows"
            );
        }
        c.truncate(9);
        assert_eq!(c.row(1, 3), Some(&[2.5, 2.5, 2.5][..]));
        c.reset();
        assert!(c.layer(0).expect("layer").iter().all(|&v| v == 0.0));
    }

    #[test]
    fn bad_extents_are_errors() {
        assert_eq!(
            LatentKvCache::new(0, 8, 3).unwrap_err(),
            KvCacheError::Empty { what: "layers" }
        );
        assert!(matches!(
            LatentKvCache::new(1, usize::MAX / 2, 3),
            Err(KvCacheError::TooLarge { .. })
        ));
    }
}
