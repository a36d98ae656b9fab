//! Kernel builders: the IR of every GPU kernel, built from plain shape structs (no plan types, so
//! each can be built and tested alone). [`super::generate`] maps plan steps onto them.
//!
//! Algorithm note (shared by all builders). Every builder takes the warp width `W` (a power of
//! two in 4..=64, [`Kernel::check`]) its kernel is built for; the blocks ([`BLOCK`],
//! [`KQKV_TILE`]) are multiples of every such width.
//! - Mat-vec ([`mat_vec`]; serves `mat_mul`, `head_mat_mul` and both WKB directions): one warp
//!   per output row, [`rows_per_block`]` = 256 / W` warps per block,
//!   `grid = (ceil(out / (256 / W)), heads)`. The block first copies its activation row
//!   `x[t, h, 0..n_in]` into shared memory (when it fits [`MAT_VEC_STAGE_BYTES`]; else lanes read
//!   it from global memory), so its `256 / W` rows read `x` from there. Lane `l` dequantizes
//!   16-element chunks `l, l + W, …` of the row ([`Stmt::Dequant16`](super::ir::Stmt): quant
//!   blocks read as 16- or 32-bit words and unpacked in registers, see [`super::quant`]), sums
//!   `w·x` over them in order, then the warp butterfly adds the `W` partials; the staging copies
//!   values, so each output's sum is the same as reading `x` in place. Learned from ggml's Vulkan
//!   mat-vec shaders (`vulkan-shaders/mul_mat_vec_q*_k.comp`, llama.cpp PR #10387: 16-bit
//!   aliases of the quant blocks, words unpacked with byte masks; `B` read as `vec4`): a staged
//!   row of whole chunks is read a quad of elements at a time ([`RowSource::chunk`]), each
//!   product still added in the chunk's order; ggml's several rows per thread would change the
//!   summation order here.
//! - Mat-mat ([`mat_mat`]; the same products for a run of `T > 1` tokens): the mat-vec's lane
//!   partition of K, [`mat_mat_weight_rows`] weight rows per warp and [`mat_mat_tokens`] tokens
//!   per block; K is walked in slices whose activations for the block's tokens are staged in
//!   shared memory (4 tokens' values of one element side by side, read as one vector), each
//!   lane dequantizes a chunk of each of its rows once and adds it into one
//!   accumulator per row and token (each activation read serving every row), and each
//!   (row, token)'s `W` partials take the mat-vec's butterfly, so every output has the mat-vec's bits while a
//!   weight is read once per block of tokens instead of once per token (ggml's
//!   `vulkan-shaders/mul_mm.comp` tiles the same way, with a different order of summation).
//!   [`super::steps::for_step`] gives a weight product both forms, the mat-vec's grid gated to
//!   `T = 1` and the mat-mat's to `T > 1` ([`Size::OneToken`], [`Size::ManyTokens`]). The K
//!   sweep is [`tile_sweep`], which the routed experts' tiled kernels share
//!   ([`super::steps::moe_gate_up_mm`], [`super::steps::moe_down_mm`]: a tile's rows are slots
//!   routed to one expert, listed by [`super::steps::moe_route`]).
//! - Row kernels (RMSNorm, softmax, rope, copies): one block per row, threads stride the row;
//!   reductions are [`block_reduce`] (warp butterflies, then shared-memory rounds).
//! - KQKV ([`kqkv_split`] + [`kqkv_merge`]): flash-decoding. Keys are cut into splits of
//!   [`KQKV_SPLIT`] keys (`grid.x = ceil(S / KQKV_SPLIT)`, `grid.y = T·H / g`); a block takes `g`
//!   heads of one token ([`kqkv_heads`]: the latent cache row of a key serves every head, so the
//!   block reads it once for `g` heads) and walks its split in tiles of [`KQKV_TILE`] keys keeping
//!   each head's online-softmax state `(m, l, acc[C])`: thread `j` scores key `j` of the tile
//!   against the `g` queries (staged in shared memory), the block maxima and sums come from
//!   [`block_reduce_rows`], the weights go to shared memory and thread `c` accumulates
//!   `acc[c] = acc[c]·α + Σ_j p_j·K_j[c]` in key order for each head. Each head's operations are
//!   those of a block of its own, so `g` changes no bit.
//!   The merge kernel combines the splits in ascending order: `M = max m_i`,
//!   `o = Σ e^(m_i − M)·acc_i / Σ e^(m_i − M)·l_i`. Masked keys (`j > pos[t]`) never enter a
//!   sum, so the result is the same for any cache contents past the window.

use super::ir::{
    block_reduce, block_reduce_rows, bx, by, ci, keys, reduce_scratch_len, tid, tokens, Expr,
    IrError, Kb, Kernel, Local, Param, ParamKind, ReduceOp, Scalar, Shared, Size, Var,
};
use crate::ggml_type::GgmlType;
use aubier_compiler::config::{QueryTemperature, YarnParams};

/// Threads per block of row kernels and mat-vecs.
pub const BLOCK: u32 = 256;
/// Keys per KQKV split (a multiple of [`KQKV_TILE`]).
pub const KQKV_SPLIT: usize = 1024;
/// Keys per KQKV tile (= the block size of the KQKV kernels).
pub const KQKV_TILE: usize = 128;

/// Largest fixed extent a builder accepts (2²⁴): with `T` and `S` it keeps every element index
/// of the model's buffers below `i32::MAX` (the largest, the latent cache, is `262 144 · 320`).
pub const MAX_EXTENT: usize = 1 << 24;

pub(crate) type R = Result<Kernel, IrError>;

pub(crate) fn bad(kernel: &str, detail: impl Into<String>) -> IrError {
    IrError {
        kernel: kernel.to_string(),
        detail: detail.into(),
    }
}

/// A weight as a kernel reads it: ggml type and `ne[0]` row length.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WeightSpec {
    /// gguf-py type name (`F32`, `Q2_K`, …).
    pub ggml_type: String,
    /// Elements per row (`ne[0]`).
    pub row_len: usize,
}

impl WeightSpec {
    /// The parameter kind (`experts`: read through an address table).
    ///
    /// Errors: an unknown type, or a row that is not a whole number of blocks.
    pub fn kind(&self, kernel: &str, experts: bool) -> Result<ParamKind, IrError> {
        let ty = GgmlType::from_name(&self.ggml_type)
            .ok_or_else(|| bad(kernel, format!("unknown ggml type {}", self.ggml_type)))?;
        let (be, bb) = (ty.block_size(), ty.type_size());
        if be == 0 || !self.row_len.is_multiple_of(be) {
            return Err(bad(
                kernel,
                format!("{} rows of {} elements", self.ggml_type, self.row_len),
            ));
        }
        if self.ggml_type != "F32" && !self.row_len.is_multiple_of(16) {
            return Err(bad(
                kernel,
                "quantized rows must hold a multiple of 16 elements",
            ));
        }
        let row_bytes = self.row_len / be * bb;
        let (ggml_type, row_len) = (self.ggml_type.clone(), self.row_len);
        Ok(if experts {
            ParamKind::Experts {
                ggml_type,
                row_bytes,
                row_len,
            }
        } else {
            ParamKind::Weight {
                ggml_type,
                row_bytes,
                row_len,
            }
        })
    }
}

/// A launch extent as an expression of the kernel's `T` and `S` arguments.
pub fn size_expr(s: &Size) -> Expr {
    match s {
        Size::Const(n) => ci(*n),
        Size::Tokens => tokens(),
        Size::Keys => keys(),
        Size::Mul(a, b) => size_expr(a) * size_expr(b),
        Size::Add(a, b) => size_expr(a) + size_expr(b),
        Size::CeilDiv(a, n) => (size_expr(a) + ci(n - 1)) / ci(*n),
        Size::OneToken(a) => tokens().eq(1).select(size_expr(a), 0),
        Size::ManyTokens(a) => ci(1).lt(tokens()).select(size_expr(a), 0),
    }
}

/// Rows of `T·k` elements: `Size::Tokens · k`.
pub(crate) fn tk(k: usize) -> Size {
    Size::prod(Size::Tokens, Size::Const(k))
}

pub(crate) fn check_dims(name: &str, dims: &[usize]) -> Result<(), IrError> {
    if dims.iter().any(|&d| d == 0 || d > MAX_EXTENT) {
        return Err(bad(
            name,
            format!("extents {dims:?} must be in 1..={MAX_EXTENT}"),
        ));
    }
    Ok(())
}

// ------------------------------------------------------------------------------------ mat-vec

/// A batched matrix-vector product: `y[t, h, o] = W[h·n_out + o, :] · x[t, h, 0..n_in]` for
/// `o < n_out`, plus (when `tail > 0`) `y[t, h, n_out..n_out + tail] = x[t, h, n_in..n_in + tail]`.
/// `x` is `[T, heads, n_in + tail]`, `y` `[T, heads, n_out + tail]`, row-major.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MatVecShape {
    /// Kernel name.
    pub name: String,
    /// The weight (`row_len` = `n_in`).
    pub w: WeightSpec,
    /// Output rows per head.
    pub n_out: usize,
    /// Heads (1 for a plain `mat_mul`).
    pub heads: usize,
    /// Trailing input elements per head copied after the product (WKB IN: the roped q_pe).
    pub tail: usize,
    /// Rows of `x` per head (`T` for the model's projections).
    pub rows: Size,
}

impl MatVecShape {
    /// What the product computes, for a kernel's note.
    fn what(&self) -> String {
        format!(
            "y[t,h,o] = W[h*{}+o,:] . x[t,h,0..{}] ({}), {} head(s){}",
            self.n_out,
            self.w.row_len,
            self.w.ggml_type,
            self.heads,
            if self.tail > 0 {
                format!(", then the {} trailing inputs copied", self.tail)
            } else {
                String::new()
            }
        )
    }

    /// The product's parameters `w`, `x` `[rows, heads, n_in + tail]`, `y`
    /// `[rows, heads, n_out + tail]`.
    ///
    /// Errors: [`IrError`] for an unusable weight.
    fn params(&self, kb: &mut Kb) -> Result<(Param, Param, Param), IrError> {
        let (xw, yw) = (self.w.row_len + self.tail, self.n_out + self.tail);
        let w = kb.param("w", self.w.kind(&self.name, false)?);
        let per_row = |n: usize| Size::prod(self.rows.clone(), Size::Const(self.heads * n));
        let x = kb.input_f32("x", per_row(xw));
        let y = kb.output_f32("y", Some(per_row(yw)));
        Ok((w, x, y))
    }
}

/// Bytes of shared memory a mat-vec stages its activation row in (at most): the 16 KiB every
/// Vulkan device has (`maxComputeSharedMemorySize` ≥ 16384), so rows up to 4096 elements.
pub const MAT_VEC_STAGE_BYTES: usize = 16384;

/// Where a mat-vec block reads its activation row of `n` elements from.
#[derive(Clone, Copy)]
pub(crate) enum RowSource {
    /// Shared memory, filled by [`stage_row`]; `true` where the row holds whole 16-element
    /// chunks, read a quad at a time ([`RowSource::chunk`]).
    Shared(super::ir::Shared, bool),
    /// Global memory: `x[base + i]`.
    Global(Param, Var),
}

impl RowSource {
    /// Whether the row is in shared memory.
    pub(crate) fn is_shared(self) -> bool {
        matches!(self, RowSource::Shared(..))
    }

    /// Element `i` of the row.
    fn read(self, kb: &Kb, i: Expr) -> Expr {
        match self {
            RowSource::Shared(xs, _) => kb.lds(xs, i),
            RowSource::Global(x, base) => kb.load(x, Expr::from(base) + i),
        }
    }

    /// `body(kb, i, x[16·c + i])` for the elements `i` of 16-element chunk `c` of the row (of
    /// `n`), in order. A staged row of whole chunks is read as 4 vector loads of 4 elements
    /// ([`Kb::lds4`]), as ggml's `mul_mat_vec_q*_k.comp` read `B` as `vec4`: on lavapipe each
    /// shared-memory load is a loop over the SIMD lanes, so a chunk costs 4 of them, not 16.
    /// The values, and so every sum over them in this order, are the same.
    pub(crate) fn chunk(
        self,
        kb: &mut Kb,
        c: Expr,
        n: usize,
        mut body: impl FnMut(&mut Kb, Expr, Expr),
    ) {
        match self {
            RowSource::Shared(xs, true) => {
                kb.for_("q", 0, 4, 1, |kb, q| {
                    let xq = kb.lds4("xq", xs, c * 4 + q.clone());
                    for (i, xv) in xq.into_iter().enumerate() {
                        body(kb, q.clone() * 4 + ci(i), xv.into());
                    }
                });
            }
            _ => kb.for_("i", 0, chunk_len(n, c.clone()), 1, |kb, i| {
                let xv = self.read(kb, c * 16 + i.clone());
                body(kb, i, xv);
            }),
        }
    }
}

/// Stages `x[base .. base + n]` (the same for every thread of the block) in shared memory when it
/// fits [`MAT_VEC_STAGE_BYTES`]: the threads copy it in strides of the block, then a barrier. The
/// copy is exact, so sums over it are the sums over `x`. Else the row is read in place.
pub(crate) fn stage_row(kb: &mut Kb, x: Param, base: Var, n: usize) -> RowSource {
    if n * 4 > MAT_VEC_STAGE_BYTES {
        return RowSource::Global(x, base);
    }
    let xs = kb.shared("xrow", Scalar::F32, n);
    kb.for_("j", tid(), ci(n), BLOCK as i32, |kb, j| {
        let v = kb.load(x, Expr::from(base) + j.clone());
        kb.sts(xs, j, v);
    });
    kb.barrier();
    RowSource::Shared(xs, n.is_multiple_of(16))
}

/// Elements of 16-element chunk `c` inside a row of `n`: the constant 16 when `n` is a multiple
/// of 16 (every quantized row; the loop then unrolls), else `min(n − 16c, 16)`.
pub(crate) fn chunk_len(n: usize, c: Expr) -> Expr {
    if n.is_multiple_of(16) {
        ci(16)
    } else {
        (ci(n) - c * 16).min(16)
    }
}

/// Warps (output rows) per mat-vec block of warps of `warp` lanes (at least 1).
pub fn rows_per_block(warp: u32) -> usize {
    (BLOCK / warp.max(1)).max(1) as usize
}

/// Builds the mat-vec kernel for warps of `warp` lanes. Params: `w`, `x`, `y`.
///
/// Errors: [`IrError`] for an unusable weight, extent or warp width.
pub fn mat_vec(s: &MatVecShape, warp: u32) -> R {
    let n_in = s.w.row_len;
    check_dims(&s.name, &[n_in, s.n_out, s.heads, s.tail + 1])?;
    let (xw, yw) = (n_in + s.tail, s.n_out + s.tail);
    let rows = rows_per_block(warp);
    let note = format!(
        "mat-vec: {what}; one warp per row,\n\
         lanes take 16-element chunks l, l+{warp}, ..., then a butterfly sum; one block row per (token, head){stage}.",
        what = s.what(),
        stage = if n_in * 4 <= MAT_VEC_STAGE_BYTES {
            "; x staged in shared memory"
        } else {
            ""
        },
    );
    let grid = [
        Size::Const(s.n_out.div_ceil(rows)),
        Size::prod(s.rows.clone(), Size::Const(s.heads)),
    ];
    let mut kb = Kb::new(&s.name, note, grid, BLOCK, warp);
    let (w, x, y) = s.params(&mut kb)?;
    let buf = kb.local("chunk", 16);
    let w32 = warp as i32;
    let lane = kb.let_("lane", tid() % w32);
    let o = kb.let_("o", bx() * ci(rows) + tid() / w32);
    let h = kb.let_("h", by() % ci(s.heads));
    let row = kb.let_(
        "row",
        Expr::from(h) * ci(s.n_out) + Expr::from(o).min(ci(s.n_out - 1)),
    );
    let n_chunks = n_in.div_ceil(16);
    // `by` is `t·heads + h`: the row of x and y that this block reads and writes.
    let xb = kb.let_("xb", by() * ci(xw));
    let staged = stage_row(&mut kb, x, xb, n_in);
    let acc = kb.let_("acc", 0.0f32);
    // A warp past the last row (a product of fewer rows than a block has warps, as the 8-row
    // router) sweeps no chunks: its row is clamped and never stored.
    let end = kb.let_(
        "c_end",
        Expr::from(o).lt(ci(s.n_out)).select(ci(n_chunks), ci(0)),
    );
    kb.for_("c", lane, end, w32, |kb, c| {
        kb.dequant16(w, None, row, c.clone(), buf);
        staged.chunk(kb, c, n_in, |kb, i, xv| {
            let wv = kb.ldl(buf, i);
            kb.set(acc, Expr::from(acc) + wv * xv);
        });
    });
    kb.warp_reduce(ReduceOp::Sum, acc);
    let yb = kb.let_("yb", by() * ci(yw));
    kb.if_(
        Expr::from(lane).eq(0).and(Expr::from(o).lt(ci(s.n_out))),
        |kb| kb.store(y, Expr::from(yb) + o, acc),
    );
    if s.tail > 0 {
        kb.if_(bx().eq(0), |kb| {
            kb.for_("j", tid(), ci(s.tail), BLOCK as i32, |kb, j| {
                let v = kb.load(x, Expr::from(xb) + ci(n_in) + j.clone());
                kb.store(y, Expr::from(yb) + ci(s.n_out) + j, v);
            });
        });
    }
    kb.finish()
}

/// Elements of `x` a mat-mat block stages per token and K slice for warps of `warp` lanes:
/// `16 · max(32, W)`, so every lane takes the same number of 16-element chunks of a slice
/// (`max(32, W) / W`) and a slice starts at chunk `l` of lane `l`'s sequence.
fn mat_mat_slice(warp: u32) -> usize {
    16 * (warp.max(32) as usize)
}

/// Tokens per mat-mat block for warps of `warp` lanes: the tokens whose K slices
/// ([`mat_mat_slice`]) fill [`MAT_VEC_STAGE_BYTES`] of shared memory (8 for `W ≤ 32`, 4 for 64;
/// a multiple of 4, as [`tile_sweep`]'s four-token vectors need).
pub fn mat_mat_tokens(warp: u32) -> usize {
    (MAT_VEC_STAGE_BYTES / (4 * mat_mat_slice(warp))).max(1)
}

/// Weight rows each lane of a mat-mat sweeps together for warps of `warp` lanes
/// ([`tile_sweep`]'s `ws`, counting a fused gate and up as two): every activation vector a lane
/// reads from shared memory serves that many rows' products. 8 at `W ≤ 8`, 4 from `W = 16` up.
/// A shared-memory read costs llvmpipe (lavapipe's 8-lane subgroups) a loop over the SIMD lanes,
/// as a global one does, and its per-thread registers live in CPU vector registers and the
/// stack, so there each read serving 8 rows pays (docs/BENCHMARKS.md, "Vector shared loads and 8
/// rows per warp");
/// on a GPU, 8 rows' 16-element chunk arrays and their 64 accumulators would take about 200 of a
/// thread's registers, so hardware widths keep 4.
pub fn mat_mat_weight_rows(warp: u32) -> usize {
    if warp <= 8 {
        8
    } else {
        4
    }
}

/// Output rows per warp `R` of a mat-mat of `n_out` rows that reads `weights` weights per row
/// (1, or 2 for the experts' gate and up), for warps of `warp` lanes:
/// [`mat_mat_weight_rows`]` / weights`, at least 1, and no more than one block needs to cover
/// `n_out` rows (`ceil(n_out / (256 / W))`: a warp's rows past `n_out` would repeat the last
/// row's work). Warp `g` of block `bx` takes rows `(bx·R + r)·(256 / W) + g`, `r < R`
/// ([`mat_mat_row`]).
pub fn mat_mat_rows_per_warp(weights: usize, n_out: usize, warp: u32) -> usize {
    let cover = n_out.div_ceil(rows_per_block(warp)).max(1);
    (mat_mat_weight_rows(warp) / weights.max(1)).clamp(1, cover)
}

/// Output row `r` (`r <` [`mat_mat_rows_per_warp`]` = rpw`) of the current warp of a mat-mat
/// block for warps of `warp` lanes: `(bx·rpw + r)·(256 / W) + tid / W`.
pub(crate) fn mat_mat_row(warp: u32, rpw: usize, r: usize) -> Expr {
    (bx() * ci(rpw) + ci(r)) * ci(rows_per_block(warp)) + tid() / warp as i32
}

/// A weight a [`tile_sweep`] reads: the parameter, the expert (for an experts parameter), the
/// row, and the 16-element register array its chunks are dequantized into.
pub(crate) struct TileWeight {
    pub(crate) w: Param,
    pub(crate) expert: Option<Expr>,
    pub(crate) row: Expr,
    pub(crate) buf: Local,
}

/// The activation rows of a mat-mat tile: `valid(r)` says whether tile row `r` (an i32
/// expression, `r < TT`) holds a row, `base(kb, r)` where element 0 of that row is in `x`
/// (evaluated only where `valid(r)` holds, so it may read an index list that ends there).
pub(crate) struct TileRows<'a> {
    pub(crate) valid: &'a dyn Fn(Expr) -> Expr,
    pub(crate) base: &'a dyn Fn(&Kb, Expr) -> Expr,
}

/// The K sweep of a mat-mat tile (the algorithm of [`mat_mat`]): for each weight row of `ws`
/// (several rows of one weight, or of several; each activation element read from shared memory
/// serves all of them), one accumulator per tile row (`[weight][row]`, [`mat_mat_tokens`] rows),
/// each lane's
/// accumulator summing `w·x` over its chunks `l, l + W, …` of the row in order, as the
/// mat-vec's single accumulator does (`lane` = `tid % W`); the caller reduces them with the
/// butterfly. `x` rows hold
/// `n_in` elements at the bases `rows` gives; invalid rows stage zeros. The staged slice holds
/// each position's four consecutive tile rows as one four-element vector, so a lane reads the
/// activations of 4 tokens with one vector load ([`Kb::lds4`]): one lane loop on llvmpipe instead
/// of four, one 128-bit load on a GPU, consecutive lanes on consecutive 16-byte words. Ends with
/// a barrier.
pub(crate) fn tile_sweep(
    kb: &mut Kb,
    lane: Var,
    x: Param,
    n_in: usize,
    rows: &TileRows<'_>,
    ws: &[TileWeight],
) -> Vec<Vec<Var>> {
    let warp = kb.warp();
    let tt = mat_mat_tokens(warp);
    let slice = mat_mat_slice(warp).min(n_in.next_multiple_of(16));
    let w32 = warp as i32;
    let xs = kb.shared("xtile", Scalar::F32, tt * slice);
    let accs: Vec<Vec<Var>> = (0..ws.len())
        .map(|n| {
            (0..tt)
                .map(|j| kb.let_(&format!("acc{n}_{j}"), 0.0f32))
                .collect()
        })
        .collect();
    kb.for_("k0", 0, ci(n_in), slice as i32, |kb, k0| {
        // Row `r`'s element `16·cl + i` of the slice sits at position `p = i·(slice / 16) + cl`
        // (the lanes of a warp, each on its own chunk `cl`, read consecutive positions), and
        // position `p` of rows `4g .. 4g + 4` is the four-element vector `g·slice + p`: thread
        // `j` fills element `j` (row `4·(j / 4 / slice) + j % 4`, position `j / 4 % slice`).
        kb.for_("j", tid(), ci(tt * slice), BLOCK as i32, |kb, j| {
            let r = kb.let_("r", (j.clone() / ci(4 * slice)) * 4 + j.clone() % 4);
            let p = kb.let_("p", (j.clone() / 4) % ci(slice));
            let k = kb.let_(
                "k",
                k0.clone() + (Expr::from(p) % ci(slice / 16)) * 16 + Expr::from(p) / ci(slice / 16),
            );
            kb.if_else(
                (rows.valid)(r.into()).and(Expr::from(k).lt(ci(n_in))),
                |kb| {
                    let src = (rows.base)(kb, r.into()) + k;
                    let v = kb.load(x, src);
                    kb.sts(xs, j.clone(), v);
                },
                |kb| kb.sts(xs, j.clone(), 0.0f32),
            );
        });
        kb.barrier();
        let c0 = kb.let_("c0", k0.clone() / 16);
        let c_end = ((k0.clone() + ci(slice)).min(ci(n_in)) + 15) / 16;
        kb.for_("c", Expr::from(c0) + lane, c_end, w32, |kb, c| {
            for tw in ws {
                kb.dequant16(tw.w, tw.expert.clone(), tw.row.clone(), c.clone(), tw.buf);
            }
            let cl = kb.let_("cl", c.clone() - c0);
            kb.for_("i", 0, chunk_len(n_in, c.clone()), 1, |kb, i| {
                let wvs: Vec<Var> = ws
                    .iter()
                    .enumerate()
                    .map(|(n, tw)| kb.let_(&format!("wv{n}"), kb.ldl(tw.buf, i.clone())))
                    .collect();
                let at = kb.let_("at", i * ci(slice / 16) + cl);
                for g in 0..tt / 4 {
                    let xv = kb.lds4("xv", xs, ci(g * slice) + Expr::from(at));
                    for (c, &xv) in xv.iter().enumerate() {
                        for (acc, &wv) in accs.iter().zip(&wvs) {
                            let a = acc[4 * g + c];
                            kb.set(a, Expr::from(a) + Expr::from(wv) * xv);
                        }
                    }
                }
            });
        });
        // Every warp is done with this slice before the next one overwrites it.
        kb.barrier();
    });
    accs
}

/// Builds the matrix-matrix form of [`mat_vec`] for warps of `warp` lanes: the same parameters
/// (`w`, `x`, `y`), the same outputs bit for bit, each weight chunk dequantized once per block of
/// [`mat_mat_tokens`] tokens instead of once per token. `grid = (ceil(out / (R·256 / W)),
/// ceil(rows / TT)·heads)`, `R` = [`mat_mat_rows_per_warp`] output rows per warp.
///
/// Algorithm: the mat-vec's lane partition of K, each warp taking `R` output rows
/// ([`mat_mat_row`]); block row `by = tb·heads + h` takes tokens `tb·TT .. tb·TT + TT` of head
/// `h`. K is cut into slices of [`mat_mat_slice`] elements; per slice the block copies the slice
/// of its `TT` activation rows into shared memory (zeros past the last token), element
/// `16·c + i` of a token's slice at position `i·(slice / 16) + c` so that the lanes of a warp,
/// each on its own chunk `c`, read consecutive words (no gather on a SIMD CPU, no bank conflicts
/// on a GPU), the same position of 4 consecutive tokens side by side as one vector read by one
/// 16-byte load, then lane `l` dequantizes each of its chunks of the slice (chunks `l, l + W, …` of the row, as
/// in the mat-vec) of each of its `R` rows once into registers and adds `w·x` of its 16 elements,
/// in order, into one accumulator per row and token; each activation element read from shared
/// memory serves the `R` rows. So each (row, token) accumulator in each lane sums the same
/// products in the same order as the mat-vec's single accumulator, and the same butterfly then
/// reduces its `W` partials: every output has the mat-vec's bits. Learned from ggml's Vulkan
/// `vulkan-shaders/mul_mm.comp`, which tiles outputs by rows × tokens, walks K in shared-memory
/// slices so a weight is read once per tile, and keeps a register tile of several rows per
/// thread so each value read from shared memory serves several products, and reads its shared
/// tiles as vectors (`FLOAT_TYPEV2`/`FLOAT_TYPEV4` `buf_b`, `cache_b`); ggml sums each output
/// along K within one thread, which would change the order of every sum here, so the lane
/// partition of K and the butterfly stay the mat-vec's.
///
/// Errors: [`IrError`] for an unusable weight, extent or warp width.
pub fn mat_mat(s: &MatVecShape, warp: u32) -> R {
    let n_in = s.w.row_len;
    check_dims(&s.name, &[n_in, s.n_out, s.heads, s.tail + 1])?;
    let (xw, yw) = (n_in + s.tail, s.n_out + s.tail);
    let rpw = mat_mat_rows_per_warp(1, s.n_out, warp);
    let rows = rows_per_block(warp) * rpw;
    let tt = mat_mat_tokens(warp);
    let slice = mat_mat_slice(warp).min(n_in.next_multiple_of(16));
    let note = format!(
        "mat-mat: {what}; {rpw} rows per warp,\n\
         {tt} tokens per block; per K slice of {slice} the block stages x of its tokens in shared memory, lanes\n\
         dequantize chunks l, l+{warp}, ... of each row once and accumulate each token in order, then a butterfly\n\
         per row and token (each output's sum in the mat-vec's order).",
        what = s.what(),
    );
    let grid = [
        Size::Const(s.n_out.div_ceil(rows)),
        Size::prod(Size::ceil_div(s.rows.clone(), tt), Size::Const(s.heads)),
    ];
    let mut kb = Kb::new(&s.name, note, grid, BLOCK, warp);
    let (w, x, y) = s.params(&mut kb)?;
    let w32 = warp as i32;
    let n_rows = kb.let_("n_rows", size_expr(&s.rows));
    let lane = kb.let_("lane", tid() % w32);
    let h = kb.let_("h", by() % ci(s.heads));
    let t0 = kb.let_("t0", (by() / ci(s.heads)) * ci(tt));
    let mut os = Vec::with_capacity(rpw);
    let mut tws = Vec::with_capacity(rpw);
    for r in 0..rpw {
        let o = kb.let_(&format!("o{r}"), mat_mat_row(warp, rpw, r));
        let row = kb.let_(
            &format!("row{r}"),
            Expr::from(h) * ci(s.n_out) + Expr::from(o).min(ci(s.n_out - 1)),
        );
        os.push(o);
        tws.push(TileWeight {
            w,
            expert: None,
            row: row.into(),
            buf: kb.local(&format!("chunk{r}"), 16),
        });
    }
    let rows_of = TileRows {
        valid: &|r| (Expr::from(t0) + r).lt(n_rows),
        base: &|_, r| ((Expr::from(t0) + r) * ci(s.heads) + h) * ci(xw),
    };
    let accs = tile_sweep(&mut kb, lane, x, n_in, &rows_of, &tws);
    for (&o, accs) in os.iter().zip(&accs) {
        for (j, &acc) in accs.iter().enumerate() {
            kb.warp_reduce(ReduceOp::Sum, acc);
            let t = Expr::from(t0) + ci(j);
            kb.if_(
                Expr::from(lane)
                    .eq(0)
                    .and(Expr::from(o).lt(ci(s.n_out)))
                    .and(t.clone().lt(n_rows)),
                |kb| {
                    let yb = (t * ci(s.heads) + h) * ci(yw);
                    kb.store(y, yb + o, acc);
                },
            );
        }
    }
    if s.tail > 0 {
        kb.if_(bx().eq(0), |kb| {
            kb.for_("j", tid(), ci(tt * s.tail), BLOCK as i32, |kb, j| {
                let t = kb.let_("t", Expr::from(t0) + j.clone() / ci(s.tail));
                let jj = kb.let_("jj", j % ci(s.tail));
                kb.if_(Expr::from(t).lt(n_rows), |kb| {
                    let b = Expr::from(t) * ci(s.heads) + h;
                    let v = kb.load(x, b.clone() * ci(xw) + ci(n_in) + jj);
                    kb.store(y, b * ci(yw) + ci(s.n_out) + jj, v);
                });
            });
        });
    }
    kb.finish()
}

// ------------------------------------------------------------------------------------ PHASE

/// The PHASE fusion: per token, RoPE + temperature on the query and the latent-cache write.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseShape {
    /// Kernel name.
    pub name: String,
    /// Heads `H`.
    pub heads: usize,
    /// `qk_nope_head_dim` `N`.
    pub nope: usize,
    /// `kv_lora_rank` `C`.
    pub kv_lora: usize,
    /// `qk_rope_head_dim` `R` (the rotated part is its first `rope.n_rot` dims).
    pub rope_dim: usize,
    /// YaRN RoPE.
    pub rope: YarnParams,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Llama-4 query temperature, if the model has it.
    pub temperature: Option<QueryTemperature>,
}

/// RoPE of one element: `j` is the index inside the rotated part, the pair `(x0, x1)` at
/// `2·(j/2)`, `2·(j/2)+1`: `y = j even ? x0·c − x1·s : x1·c + x0·s`, `c = cos(θ·p)·af`, `s = …`.
pub(crate) fn rope_elem(
    kb: &mut Kb,
    theta: usize,
    af: f32,
    pf: Expr,
    j: Expr,
    x0: Expr,
    x1: Expr,
) -> Expr {
    let ang = kb.let_("ang", kb.tab(theta, j.clone() / 2) * pf);
    let c = kb.let_("cs", Expr::from(ang).cos() * af);
    let sn = kb.let_("sn", Expr::from(ang).sin() * af);
    (j % 2)
        .eq(0)
        .select(x0.clone() * c - x1.clone() * sn, x1 * c + x0 * sn)
}

/// Llama-4 temperature factor of position `p`: `1 + β·ln(1 + floor(p / L))`.
pub(crate) fn temperature_factor(kb: &mut Kb, p: Expr, q: &QueryTemperature) -> Expr {
    let fl = (p / ci(q.length)).to_f32();
    let v = kb.let_(
        "temp",
        Expr::F(1.0) + Expr::F(q.scale) * (Expr::F(1.0) + fl).ln(),
    );
    v.into()
}

/// Builds PHASE for warps of `warp` lanes. Params: `q` `[T, H, N + R]`, `kv_a` `[T, C + R]`,
/// `w_norm` (F32 `{C}`), `pos` `[T]`, `cache` (the layer's latent cache, rows of `C + R`), `q2`
/// `[T, H, N + R]`. `grid = (T, 1)`.
///
/// Errors: [`IrError`] for odd or zero extents (`n_rot` must be even and equal `R`) or a bad
/// warp width.
pub fn phase(s: &PhaseShape, warp: u32) -> R {
    let (h, n, c, r) = (s.heads, s.nope, s.kv_lora, s.rope_dim);
    let n_rot = s.rope.n_rot;
    check_dims(&s.name, &[h, n + 1, c, r, n_rot])?;
    if !n_rot.is_multiple_of(2) || n_rot > r {
        return Err(bad(&s.name, "n_rot must be even and at most rope_dim"));
    }
    if s.temperature.as_ref().is_some_and(|q| q.length == 0) {
        return Err(bad(&s.name, "temperature length must be positive"));
    }
    let (qw, kw) = (n + r, c + r);
    let note = format!(
        "PHASE: q2[t,h,:{n}] = q*f, q2[t,h,{n}:] = rope_yarn(q[t,h,{n}:])*f (f: Llama-4 temperature{}),\n\
         cache[pos[t]] = [rms_norm(kv_a[t,:{c}])*w, rope_yarn(kv_a[t,{c}:])]; one block per token.",
        if s.temperature.is_some() { "" } else { " = 1" }
    );
    let mut kb = Kb::new(&s.name, note, [Size::Tokens, Size::Const(1)], BLOCK, warp);
    let q = kb.input_f32("q", tk(h * qw));
    let kv = kb.input_f32("kv_a", tk(kw));
    let wn = kb.param(
        "w_norm",
        WeightSpec {
            ggml_type: "F32".into(),
            row_len: c,
        }
        .kind(&s.name, false)?,
    );
    let pos = kb.input_i32("pos", Size::Tokens);
    let cache = kb.output_f32("cache", None);
    let q2 = kb.output_f32("q2", Some(tk(h * qw)));
    let theta = kb.table("theta", crate::cpu::yarn_inv_freq(&s.rope));
    let red = kb.reduce_scratch();
    let af = s.rope.attn_factor;
    let t = kb.let_("t", bx());
    let p = kb.let_("p", kb.load(pos, t));
    let pf = kb.let_("pf", Expr::from(p).to_f32());
    let f = s
        .temperature
        .as_ref()
        .map(|qt| temperature_factor(&mut kb, p.into(), qt));
    kb.for_("idx", tid(), ci(h * qw), BLOCK as i32, |kb, idx| {
        let hh = kb.let_("hh", idx.clone() / ci(qw));
        let d = kb.let_("d", idx.clone() - Expr::from(hh) * ci(qw));
        let base = kb.let_("base", (Expr::from(t) * ci(h) + hh) * ci(qw));
        kb.if_else(
            Expr::from(d).lt(ci(n)),
            |kb| {
                let v = kb.load(q, Expr::from(base) + d);
                let v = match &f {
                    Some(f) => v * f.clone(),
                    None => v,
                };
                kb.store(q2, Expr::from(base) + d, v);
            },
            |kb| {
                let j = kb.let_("j", Expr::from(d) - ci(n));
                let y = kb.let_("y", 0.0f32);
                kb.if_else(
                    Expr::from(j).lt(ci(n_rot)),
                    |kb| {
                        let pair = Expr::from(base) + ci(n) + (Expr::from(j) / 2) * 2;
                        let x0 = kb.load(q, pair.clone());
                        let x1 = kb.load(q, pair + 1);
                        let v = rope_elem(kb, theta, af, pf.into(), j.into(), x0, x1);
                        kb.set(y, v);
                    },
                    |kb| {
                        let v = kb.load(q, Expr::from(base) + d);
                        kb.set(y, v);
                    },
                );
                let v = match &f {
                    Some(f) => Expr::from(y) * f.clone(),
                    None => y.into(),
                };
                kb.store(q2, Expr::from(base) + d, v);
            },
        );
    });
    let kvb = kb.let_("kvb", Expr::from(t) * ci(kw));
    let ss = kb.let_("ss", 0.0f32);
    kb.for_("i", tid(), ci(c), BLOCK as i32, |kb, i| {
        let xv = kb.load(kv, Expr::from(kvb) + i);
        kb.set(ss, Expr::from(ss) + xv.clone() * xv);
    });
    block_reduce(&mut kb, ReduceOp::Sum, ss, red);
    let inv = kb.let_(
        "inv",
        Expr::F(1.0) / (Expr::from(ss) / (c as f32) + s.eps).sqrt(),
    );
    let row = kb.let_("row", Expr::from(p) * ci(kw));
    kb.for_("i", tid(), ci(c), BLOCK as i32, |kb, i| {
        let xv = kb.load(kv, Expr::from(kvb) + i.clone());
        let wv = kb.load(wn, i.clone());
        kb.store(cache, Expr::from(row) + i, (xv * inv) * wv);
    });
    kb.for_("j", tid(), ci(r), BLOCK as i32, |kb, j| {
        kb.if_else(
            j.clone().lt(ci(n_rot)),
            |kb| {
                let pair = Expr::from(kvb) + ci(c) + (j.clone() / 2) * 2;
                let x0 = kb.load(kv, pair.clone());
                let x1 = kb.load(kv, pair + 1);
                let y = rope_elem(kb, theta, af, pf.into(), j.clone(), x0, x1);
                kb.store(cache, Expr::from(row) + ci(c) + j.clone(), y);
            },
            |kb| {
                let v = kb.load(kv, Expr::from(kvb) + ci(c) + j.clone());
                kb.store(cache, Expr::from(row) + ci(c) + j.clone(), v);
            },
        );
    });
    kb.finish()
}

// ------------------------------------------------------------------------------------ KQKV

/// Latent attention over the cache of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct KqkvShape {
    /// Name prefix (`_split` / `_merge` appended).
    pub name: String,
    /// Heads `H`.
    pub heads: usize,
    /// Cached row width `C + R` (= the absorbed query width).
    pub width: usize,
    /// Value columns `C` (leading columns of a cached row).
    pub kv_lora: usize,
    /// Score scale.
    pub kq_scale: f32,
}

/// f32 per split partial: `m`, `l`, then `acc[0..C]`.
fn partial_len(s: &KqkvShape) -> usize {
    s.kv_lora + 2
}

/// Elements of the scratch the split kernel writes: `T·H·ceil(S / KQKV_SPLIT)·(C + 2)`.
pub fn kqkv_scratch(s: &KqkvShape) -> Size {
    Size::prod(
        Size::prod(tk(s.heads), Size::ceil_div(Size::Keys, KQKV_SPLIT)),
        Size::Const(partial_len(s)),
    )
}

/// Most heads one KQKV split block scores against each key row it reads ([`kqkv_heads`]).
pub const KQKV_HEADS: usize = 8;

/// Whether a KQKV split block of `g` heads stages its `g` query rows (`g · W` f32) beside the
/// tile's weights (`g · KQKV_TILE`) and the reduction scratch (`g` registers) within
/// [`MAT_VEC_STAGE_BYTES`] of shared memory.
fn kqkv_stages(s: &KqkvShape, warp: u32, g: usize) -> bool {
    let red = reduce_scratch_len(KQKV_TILE as u32, warp);
    g * (KQKV_TILE + red + s.width) * 4 <= MAT_VEC_STAGE_BYTES
}

/// Heads per KQKV split block: the largest divisor `g` of `H`, at most [`KQKV_HEADS`], whose
/// block stages its `g` query rows within [`MAT_VEC_STAGE_BYTES`] of shared memory (the 16 KiB
/// every Vulkan device has); 1 when none does. The latent cache is one row per key for every
/// head (MLA), so a block of `g` heads reads each key row once where `g` blocks read it `g`
/// times — FlashMLA's grouping of a token's heads (DeepSeek, 2025), and what ggml's flash
/// attention does for the heads that share a KV head.
pub fn kqkv_heads(s: &KqkvShape, warp: u32) -> usize {
    (1..=KQKV_HEADS.min(s.heads))
        .rev()
        .find(|&g| s.heads.is_multiple_of(g) && kqkv_stages(s, warp, g))
        .unwrap_or(1)
}

/// `body(kb, r, v)` for `v` = element `i` of each of the `g` rows `r` held `g`-interleaved in
/// `a` (row `r`'s element `i` at `i·g + r`), in row order: vector loads of 4 rows
/// ([`Kb::lds4`]: one lane loop on llvmpipe) when `g` is a multiple of 4, else one load each.
fn rows_at(kb: &mut Kb, a: Shared, g: usize, i: Expr, mut body: impl FnMut(&mut Kb, usize, Expr)) {
    if g.is_multiple_of(4) {
        for r4 in 0..g / 4 {
            let v = kb.lds4("rv", a, i.clone() * ci(g / 4) + ci(r4));
            for (c, x) in v.into_iter().enumerate() {
                body(kb, 4 * r4 + c, x.into());
            }
        }
    } else {
        for r in 0..g {
            let x = kb.lds(a, i.clone() * ci(g) + ci(r));
            body(kb, r, x);
        }
    }
}

/// Builds the KQKV split kernel for warps of `warp` lanes. Params: `q` `[T, H, W]`, `pos` `[T]`,
/// `cache` (rows of `W`), `part` (scratch, [`kqkv_scratch`]).
/// `grid = (ceil(S / KQKV_SPLIT), T·H / g)`, `g` = [`kqkv_heads`]: block `(x, y)` takes heads
/// `(y mod H/g)·g ..` of token `y / (H/g)`, each head's operations those of a block of its own.
///
/// Errors: [`IrError`] for zero extents, `C > W` or a bad warp width.
pub fn kqkv_split(s: &KqkvShape, warp: u32) -> R {
    kqkv_split_heads(s, warp, kqkv_heads(s, warp))
}

/// [`kqkv_split`] with `g` heads per block (the queries staged in shared memory when they fit
/// [`MAT_VEC_STAGE_BYTES`], else read in place).
///
/// Errors: as [`kqkv_split`]; also when `g` does not divide `H`.
pub(crate) fn kqkv_split_heads(s: &KqkvShape, warp: u32, g: usize) -> R {
    let (h, w, c) = (s.heads, s.width, s.kv_lora);
    check_dims(&s.name, &[h, w, c])?;
    if c > w {
        return Err(bad(&s.name, "kv_lora exceeds the row width"));
    }
    if g == 0 || !h.is_multiple_of(g) {
        return Err(bad(&s.name, format!("{g} heads per block for {h} heads")));
    }
    let staged = kqkv_stages(s, warp, g);
    let name = format!("{}_split", s.name);
    let note = format!(
        "KQKV split: per (split of {KQKV_SPLIT} keys, token, {g} heads), online softmax over tiles of {KQKV_TILE} keys of\n\
         kq_scale*q.K_j (j <= pos[t]), each key read once for the {g} heads; writes (m, l, acc[{c}]) to each head's partial."
    );
    let tile = KQKV_TILE as i32;
    let grid = [Size::ceil_div(Size::Keys, KQKV_SPLIT), tk(h / g)];
    let mut kb = Kb::new(&name, note, grid, KQKV_TILE as u32, warp);
    let q = kb.input_f32("q", tk(h * w));
    let pos = kb.input_i32("pos", Size::Tokens);
    let cache = kb.input_f32("cache", Size::prod(Size::Keys, Size::Const(w)));
    let part = kb.output_f32("part", Some(kqkv_scratch(s)));
    let red = kb.reduce_scratch_rows(g);
    let pbuf = kb.shared("pbuf", Scalar::F32, KQKV_TILE * g);
    let qs = staged.then(|| kb.shared("qs", Scalar::F32, g * w));
    let per = c.div_ceil(KQKV_TILE);
    let acc = kb.local("acc", (per * g).max(16));
    let grp = kb.let_("grp", by());
    let t = kb.let_("t", Expr::from(grp) / ci(h / g));
    let p = kb.let_("p", kb.load(pos, t));
    let last = kb.let_("last", Expr::from(p).min(keys() - 1));
    // Rows grp·g .. grp·g + g of q [T·H, W] are heads h0 .. h0 + g of token t.
    let qb = kb.let_("qb", Expr::from(grp) * ci(g * w));
    if let Some(qs) = qs {
        kb.for_("e", tid(), ci(g * w), tile, |kb, e| {
            let v = kb.load(q, Expr::from(qb) + e.clone());
            kb.sts(qs, (e.clone() % ci(w)) * ci(g) + e / ci(w), v);
        });
        kb.barrier();
    }
    let ms: Vec<Var> = (0..g).map(|_| kb.let_("m", f32::NEG_INFINITY)).collect();
    let ls: Vec<Var> = (0..g).map(|_| kb.let_("l", 0.0f32)).collect();
    kb.for_("ci", 0, ci(per * g), 1, |kb, i| kb.stl(acc, i, 0.0f32));
    let start = kb.let_("start", bx() * ci(KQKV_SPLIT));
    kb.for_("tile", 0, ci(KQKV_SPLIT / KQKV_TILE), 1, |kb, ti| {
        let j0 = kb.let_("j0", Expr::from(start) + ti * tile);
        kb.if_(Expr::from(j0).le(last), |kb| {
            let j = kb.let_("j", Expr::from(j0) + tid());
            let scs: Vec<Var> = (0..g).map(|_| kb.let_("s", f32::NEG_INFINITY)).collect();
            kb.if_(Expr::from(j).le(last), |kb| {
                let dots: Vec<Var> = (0..g).map(|_| kb.let_("dot", 0.0f32)).collect();
                kb.for_("i", 0, ci(w), 1, |kb, i| {
                    let kv = kb.let_("kv", kb.load(cache, Expr::from(j) * ci(w) + i.clone()));
                    let add = |kb: &mut Kb, r: usize, qv: Expr| {
                        kb.set(dots[r], Expr::from(dots[r]) + qv * kv);
                    };
                    match qs {
                        Some(qs) => rows_at(kb, qs, g, i, add),
                        None => {
                            for r in 0..g {
                                let qv = kb.load(q, Expr::from(qb) + ci(r * w) + i.clone());
                                add(kb, r, qv);
                            }
                        }
                    }
                });
                for (&sc, &d) in scs.iter().zip(&dots) {
                    kb.set(sc, Expr::from(d) * s.kq_scale);
                }
            });
            let tmax: Vec<Var> = scs.iter().map(|&sc| kb.let_("tmax", sc)).collect();
            block_reduce_rows(kb, ReduceOp::Max, &tmax, red);
            let ninf = Expr::F(f32::NEG_INFINITY);
            let mut alphas = Vec::with_capacity(g);
            let mut pjs = Vec::with_capacity(g);
            for r in 0..g {
                let mn = kb.let_("m_new", Expr::from(ms[r]).max(tmax[r]));
                alphas.push(
                    kb.let_(
                        "alpha",
                        Expr::from(mn)
                            .eq(ninf.clone())
                            .select(1.0f32, (Expr::from(ms[r]) - mn).exp()),
                    ),
                );
                pjs.push(
                    kb.let_(
                        "pj",
                        Expr::from(scs[r])
                            .eq(ninf.clone())
                            .select(0.0f32, (Expr::from(scs[r]) - mn).exp()),
                    ),
                );
                kb.set(ms[r], mn);
            }
            let ps: Vec<Var> = pjs.iter().map(|&pj| kb.let_("ps", pj)).collect();
            block_reduce_rows(kb, ReduceOp::Sum, &ps, red);
            for r in 0..g {
                kb.set(ls[r], Expr::from(ls[r]) * alphas[r] + ps[r]);
                kb.sts(pbuf, tid() * ci(g) + ci(r), pjs[r]);
            }
            kb.barrier();
            let nk = kb.let_("nk", (Expr::from(last) - j0 + 1).min(tile));
            kb.for_("ci", 0, ci(per), 1, |kb, i| {
                let col = kb.let_("col", tid() + i.clone() * tile);
                kb.if_(Expr::from(col).lt(ci(c)), |kb| {
                    let a: Vec<Var> = (0..g)
                        .map(|r| {
                            let v = kb.ldl(acc, ci(r * per) + i.clone()) * alphas[r];
                            kb.let_("a", v)
                        })
                        .collect();
                    kb.for_("jj", 0, nk, 1, |kb, jj| {
                        let kv = kb.let_(
                            "kv",
                            kb.load(cache, (Expr::from(j0) + jj.clone()) * ci(w) + col),
                        );
                        rows_at(kb, pbuf, g, jj, |kb, r, pv| {
                            kb.set(a[r], Expr::from(a[r]) + pv * kv);
                        });
                    });
                    for (r, &ar) in a.iter().enumerate() {
                        kb.stl(acc, ci(r * per) + i.clone(), ar);
                    }
                });
            });
            kb.barrier();
        });
    });
    let ns = (keys() + ci(KQKV_SPLIT - 1)) / ci(KQKV_SPLIT);
    for r in 0..g {
        let row = Expr::from(grp) * ci(g) + ci(r);
        let pb = kb.let_("pb", (row * ns.clone() + bx()) * ci(partial_len(s)));
        kb.if_(tid().eq(0), |kb| {
            kb.store(part, pb, ms[r]);
            kb.store(part, Expr::from(pb) + 1, ls[r]);
        });
        kb.for_("ci", 0, ci(per), 1, |kb, i| {
            let col = tid() + i.clone() * tile;
            kb.if_(col.clone().lt(ci(c)), |kb| {
                let v = kb.ldl(acc, ci(r * per) + i);
                kb.store(part, Expr::from(pb) + 2 + col, v);
            });
        });
    }
    kb.finish()
}

/// Builds the KQKV merge kernel for warps of `warp` lanes. Params: `part` (the split kernel's
/// scratch), `o` `[T, H, C]`. `grid = (T·H, 1)`.
///
/// Errors: as [`kqkv_split`].
pub fn kqkv_merge(s: &KqkvShape, warp: u32) -> R {
    let (h, c) = (s.heads, s.kv_lora);
    check_dims(&s.name, &[h, s.width, c])?;
    let name = format!("{}_merge", s.name);
    let note = format!(
        "KQKV merge: o[t,h,:{c}] = sum_i e^(m_i-M) acc_i / sum_i e^(m_i-M) l_i over the splits in order."
    );
    let mut kb = Kb::new(&name, note, [tk(h), Size::Const(1)], KQKV_TILE as u32, warp);
    let part = kb.input_f32("part", kqkv_scratch(s));
    let o = kb.output_f32("o", Some(tk(h * c)));
    let pl = ci(partial_len(s));
    let row = kb.let_("row", bx());
    let ns = kb.let_("ns", (keys() + ci(KQKV_SPLIT - 1)) / ci(KQKV_SPLIT));
    let base = kb.let_("base", Expr::from(row) * ns * pl.clone());
    let big = kb.let_("big_m", f32::NEG_INFINITY);
    kb.for_("i", 0, ns, 1, |kb, i| {
        let mi = kb.load(part, Expr::from(base) + i * pl.clone());
        kb.set(big, Expr::from(big).max(mi));
    });
    let weight = |kb: &Kb, i: Expr| {
        let mi = kb.load(part, Expr::from(base) + i * pl.clone());
        mi.clone()
            .eq(Expr::F(f32::NEG_INFINITY))
            .select(0.0f32, (mi - big).exp())
    };
    let den = kb.let_("den", 0.0f32);
    kb.for_("i", 0, ns, 1, |kb, i| {
        let wv = weight(kb, i.clone());
        let wi = kb.let_("wi", wv);
        let li = kb.load(part, Expr::from(base) + i * pl.clone() + 1);
        kb.set(den, Expr::from(den) + Expr::from(wi) * li);
    });
    kb.for_("col", tid(), ci(c), KQKV_TILE as i32, |kb, col| {
        let num = kb.let_("num", 0.0f32);
        kb.for_("i", 0, ns, 1, |kb, i| {
            let wv = weight(kb, i.clone());
            let wi = kb.let_("wi", wv);
            let ai = kb.load(part, Expr::from(base) + i * pl.clone() + 2 + col.clone());
            kb.set(num, Expr::from(num) + Expr::from(wi) * ai);
        });
        kb.store(o, Expr::from(row) * ci(c) + col, Expr::from(num) / den);
    });
    kb.finish()
}
