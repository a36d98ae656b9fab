//! The cpu backend's f32 steps that keep the oracle's bits — attention over the latent cache
//! (`scores_qk`, `weighted_sum`, `softmax`, `scale`, `causal_mask`), `rms_norm`, `silu`,
//! `attn_temperature` and `rope_yarn` — with the oracle's operations in the oracle's order
//! (`kernels-gen/src/cpu/lower.rs`, `emit.rs`'s `dot_f32`) in vector lanes instead of its
//! scalar loops, so that every result has the oracle's bits (NaN payloads aside).
//!
//! Algorithm.
//! - `scores_qk`, `y[r, j] = q[r, :] · k[j, :]`: the oracle's dot keeps eight partial sums
//!   (element `i` into sum `i mod 8`, each product rounded, then added, from `+0.0`), adds a tail
//!   of `w mod 8` elements into sums `0 ..`, and reduces `((s0 + s1) + (s2 + s3)) + ((s4 + s5) +
//!   (s6 + s7))`. Lane `l` is query row `r0 + l` of a group of 16, transposed once (`qt[i]`
//!   holds element `i` of the 16 rows), so each step is a multiply of `qt[i]` by the broadcast
//!   key element and an add, no horizontal reduction.
//!   Work items are (row group, key range); keys after a group's last causal position are
//!   written `0.0` (the plan's `causal_mask` replaces them). Below `SPLIT_ROWS` rows (decode) an
//!   item first asks for its key rows in L2 (`prefetch_l2_of`): the latent cache comes cold.
//! - `weighted_sum`, `y[r, c] = Σ_j p[r, j] · v[j, c]`, `j` ascending from `+0.0`, multiply then
//!   add: lanes are 16 columns `c`, a work item eight rows × 32 columns. At prefill a block of
//!   rows stops at its last nonzero weight, never before a value row that is not finite (the
//!   skipped terms are `±0.0` added to a sum that started at `+0.0`: no change).
//! - `softmax`: the row's maximum (NaN if an element is), `e = exp(x − max)` by the lanes
//!   version of `expf` (the oracle's `exp`: −∞ gives `+0.0`), summed from `+0.0` in index order
//!   (scalar, as the oracle's chain), then `e / sum`. `silu` (and the routed experts'
//!   `silu(g) · u`): `x / (1 + exp(−x))`, the same `exp`.
//! - `scale` (`y = x · c`) and `causal_mask` (`y[t, .., j] = j > pos[t] ? −∞ : x[t, .., j]`): the
//!   oracle's expressions over chunks of rows in parallel (the mask reads no score it replaces).
//! - `attn_temperature`, `rope_yarn`: the oracle's per-token factor (`1 + β ln(1 + ⌊p/L⌋)`) and
//!   per-(token, pair) cos / sin (libm's, as the oracle calls them) computed once per token, then
//!   the oracle's multiplies and adds.
//! - `rms_norm`, `y = (x · inv) · w`, `inv = 1 / sqrt(dot(x, x) / n + eps)`: the dot by
//!   [`crate::gguf::quant::dot_f32`] (the oracle's eight lanes), rows in parallel, element loops left
//!   to the compiler's vectorizer (no reassociation: each element is its own two products).
//!
//! Vectors are AVX-512 where the CPU has it, else two AVX2 vectors where it has that, else
//! `[f32; 16]` arrays, all with the same operations ([`V16`], [`Width`]): all give the same
//! bits.

use aubier_kernels_gen::cpu::expf::expf;
use rayon::prelude::*;

/// Sixteen f32 lanes: the operations the kernels use, each the IEEE operation per lane.
trait V16: Copy {
    /// Whether there are registers for [`KEYS`] keys' eight partial sums at once (AVX-512's 32
    /// registers of 16 lanes); else `scores_qk` takes one key at a time (AVX2's 16 registers of
    /// 8 lanes hold one key's sums: two keys spilled them, and ran slower).
    const WIDE: bool = false;
    fn zero() -> Self;
    fn splat(x: f32) -> Self;
    /// The first `min(16, s.len())` elements of `s`, the rest `0.0`.
    fn load(s: &[f32]) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// Per lane `−x` (the sign flipped, as `fneg`).
    fn neg(self) -> Self;
    fn div(self, o: Self) -> Self;
    /// Per lane `self > o ? self : o` (so `o` where either is NaN).
    fn max(self, o: Self) -> Self;
    /// Whether a lane is NaN.
    fn has_nan(self) -> bool;
    /// Lanes `0 .. d.len().min(16)` into `d`.
    fn store(self, d: &mut [f32]);
    /// Per lane `expf` (`aubier_kernels_gen::cpu::expf`, the oracle's `exp`): its f64
    /// operations lane by lane, so its bits.
    fn exp(self) -> Self;
}

impl V16 for [f32; 16] {
    #[inline(always)]
    fn zero() -> Self {
        [0.0; 16]
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        [x; 16]
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let mut v = [0.0; 16];
        let n = s.len().min(16);
        v[..n].copy_from_slice(&s[..n]);
        v
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        std::array::from_fn(|i| self[i] + o[i])
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        std::array::from_fn(|i| self[i] - o[i])
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        std::array::from_fn(|i| self[i] * o[i])
    }
    #[inline(always)]
    fn neg(self) -> Self {
        self.map(|x| -x)
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        std::array::from_fn(|i| self[i] / o[i])
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        std::array::from_fn(|i| if self[i] > o[i] { self[i] } else { o[i] })
    }
    #[inline(always)]
    fn has_nan(self) -> bool {
        self.iter().any(|x| x.is_nan())
    }
    #[inline(always)]
    fn store(self, d: &mut [f32]) {
        let n = d.len().min(16);
        d[..n].copy_from_slice(&self[..n]);
    }
    #[inline(always)]
    fn exp(self) -> Self {
        self.map(expf)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use crate::backend::cpu::exact::V16;
    use aubier_kernels_gen::cpu::expf::{
        EXP_C2, EXP_C3, EXP_C4, EXP_HI, EXP_INV_LN2_N, EXP_LN2_N, EXP_LO, EXP_TABLE,
    };
    use std::arch::x86_64::*;

    /// `expf`'s f64 path on eight lanes (inputs inside `[EXP_LO, EXP_HI]`): the same operations
    /// in the same order, the table looked up by two 16-entry permutes and a blend on bit 4.
    #[inline(always)]
    fn exp8(xd: __m512d) -> __m512d {
        // SAFETY: (every intrinsic here) the CPU has AVX-512F (the module's contract); the table
        // loads read 8 of the 32 entries at offsets 0, 8, 16, 24.
        unsafe {
            let t = |i: usize| _mm512_loadu_pd(EXP_TABLE[i..].as_ptr());
            // Round to nearest, ties to even, no exceptions (`round_ties_even`).
            let kd = _mm512_roundscale_pd::<0x08>(_mm512_mul_pd(xd, _mm512_set1_pd(EXP_INV_LN2_N)));
            let r = _mm512_sub_pd(xd, _mm512_mul_pd(kd, _mm512_set1_pd(EXP_LN2_N)));
            let mut p = _mm512_add_pd(
                _mm512_mul_pd(r, _mm512_set1_pd(EXP_C4)),
                _mm512_set1_pd(EXP_C3),
            );
            p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(EXP_C2));
            p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(1.0));
            p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(1.0));
            let k = _mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(kd));
            let j = _mm512_and_si512(k, _mm512_set1_epi64(31));
            let low = _mm512_permutex2var_pd(t(0), j, t(8));
            let high = _mm512_permutex2var_pd(t(16), j, t(24));
            let tj =
                _mm512_mask_blend_pd(_mm512_test_epi64_mask(j, _mm512_set1_epi64(16)), low, high);
            let e = _mm512_add_epi64(_mm512_srai_epi64::<5>(k), _mm512_set1_epi64(1023));
            let s = _mm512_castsi512_pd(_mm512_slli_epi64::<52>(e));
            _mm512_mul_pd(_mm512_mul_pd(p, tj), s)
        }
    }

    /// `expf` on sixteen lanes: NaN stays, above `EXP_HI` +∞, below `EXP_LO` `+0.0`, the rest by
    /// [`exp8`] on the two halves (inputs clamped first so that no lane leaves the table's range),
    /// each rounded once to f32.
    #[inline(always)]
    pub(super) fn exp16(x: __m512) -> __m512 {
        // SAFETY: (every intrinsic here) the CPU has AVX-512F (the module's contract).
        unsafe {
            let xc = _mm512_max_ps(
                _mm512_min_ps(x, _mm512_set1_ps(EXP_HI)),
                _mm512_set1_ps(EXP_LO),
            );
            let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(xc));
            let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(xc),
            )));
            let (ylo, yhi) = (_mm512_cvtpd_ps(exp8(lo)), _mm512_cvtpd_ps(exp8(hi)));
            let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castps_pd(_mm512_castps256_ps512(ylo)),
                _mm256_castps_pd(yhi),
            ));
            let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(EXP_HI));
            let small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_LO));
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            let y = _mm512_mask_blend_ps(big, y, _mm512_set1_ps(f32::INFINITY));
            let y = _mm512_mask_blend_ps(small, y, _mm512_setzero_ps());
            _mm512_mask_blend_ps(nan, y, x)
        }
    }

    /// AVX-512F lanes; only constructed inside functions compiled with `avx512f`, on a CPU
    /// that has it ([`super::avx512_detected`]).
    #[derive(Clone, Copy)]
    pub(super) struct Z(__m512);

    /// The mask of the first `n.min(16)` lanes.
    #[inline(always)]
    fn first(n: usize) -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    impl V16 for Z {
        const WIDE: bool = true;
        #[inline(always)]
        fn zero() -> Self {
            // SAFETY: (every intrinsic here) the CPU has AVX-512F (the type's contract).
            Z(unsafe { _mm512_setzero_ps() })
        }
        #[inline(always)]
        fn splat(x: f32) -> Self {
            // SAFETY: the CPU has AVX-512F (the type's contract).
            Z(unsafe { _mm512_set1_ps(x) })
        }
        #[inline(always)]
        fn load(s: &[f32]) -> Self {
            // SAFETY: 16 elements of `s`, or (masked) only its first `len`.
            Z(unsafe {
                if s.len() >= 16 {
                    _mm512_loadu_ps(s.as_ptr())
                } else {
                    _mm512_maskz_loadu_ps(first(s.len()), s.as_ptr())
                }
            })
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            // SAFETY: the CPU has AVX-512F (the type's contract).
            Z(unsafe { _mm512_add_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            // SAFETY: the CPU has AVX-512F (the type's contract).
            Z(unsafe { _mm512_sub_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            // SAFETY: the CPU has AVX-512F (the type's contract).
            Z(unsafe { _mm512_mul_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn neg(self) -> Self {
            // The sign bit flipped (integer xor: AVX-512F has no f32 xor).
            // SAFETY: the CPU has AVX-512F (the type's contract).
            Z(unsafe {
                _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(self.0),
                    _mm512_set1_epi32(i32::MIN),
                ))
            })
        }
        #[inline(always)]
        fn div(self, o: Self) -> Self {
            // SAFETY: the CPU has AVX-512F (the type's contract).
            Z(unsafe { _mm512_div_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            // SAFETY: the CPU has AVX-512F (the type's contract).
            Z(unsafe { _mm512_max_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn has_nan(self) -> bool {
            // SAFETY: the CPU has AVX-512F (the type's contract).
            unsafe { _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(self.0, self.0) != 0 }
        }
        #[inline(always)]
        fn exp(self) -> Self {
            Z(exp16(self.0))
        }
        #[inline(always)]
        fn store(self, d: &mut [f32]) {
            // SAFETY: 16 elements of `d`, or (masked) only its first `len`.
            unsafe {
                if d.len() >= 16 {
                    _mm512_storeu_ps(d.as_mut_ptr(), self.0)
                } else {
                    _mm512_mask_storeu_ps(d.as_mut_ptr(), first(d.len()), self.0)
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::backend::cpu::exact::V16;
    use aubier_kernels_gen::cpu::expf::{
        EXP_C2, EXP_C3, EXP_C4, EXP_HI, EXP_INV_LN2_N, EXP_LN2_N, EXP_LO, EXP_TABLE,
    };
    use std::arch::x86_64::*;

    /// `expf`'s f64 path on four lanes (inputs inside `[EXP_LO, EXP_HI]`): the same operations
    /// in the same order (no fused multiply-add), the table read by a gather, the exponent's
    /// `k >> 5` and `k & 31` in i32 (`|k| ≤ 5910`, so the same as the scalar's i64).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn exp4(xd: __m256d) -> __m256d {
        // SAFETY: the gather reads entries `k & 31` of the 32 of `EXP_TABLE`.
        unsafe {
            let c = _mm256_set1_pd;
            // Round to nearest, ties to even, no exceptions (`round_ties_even`).
            let kd = _mm256_round_pd::<0x08>(_mm256_mul_pd(xd, c(EXP_INV_LN2_N)));
            let r = _mm256_sub_pd(xd, _mm256_mul_pd(kd, c(EXP_LN2_N)));
            let mut p = _mm256_add_pd(_mm256_mul_pd(r, c(EXP_C4)), c(EXP_C3));
            p = _mm256_add_pd(_mm256_mul_pd(p, r), c(EXP_C2));
            p = _mm256_add_pd(_mm256_mul_pd(p, r), c(1.0));
            p = _mm256_add_pd(_mm256_mul_pd(p, r), c(1.0));
            let k = _mm256_cvtpd_epi32(kd);
            let j = _mm_and_si128(k, _mm_set1_epi32(31));
            let tj = _mm256_i32gather_pd::<8>(EXP_TABLE.as_ptr(), j);
            let e = _mm_add_epi32(_mm_srai_epi32::<5>(k), _mm_set1_epi32(1023));
            let s = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_cvtepi32_epi64(e)));
            _mm256_mul_pd(_mm256_mul_pd(p, tj), s)
        }
    }

    /// `expf` on eight lanes: NaN stays, above `EXP_HI` +∞, below `EXP_LO` `+0.0`, the rest by
    /// [`exp4`] on the two halves (inputs clamped first so that no lane leaves the table's
    /// range), each rounded once to f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn exp8(x: __m256) -> __m256 {
        let (hi, lo) = (_mm256_set1_ps(EXP_HI), _mm256_set1_ps(EXP_LO));
        let xc = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
        let ylo = _mm256_cvtpd_ps(exp4(_mm256_cvtps_pd(_mm256_castps256_ps128(xc))));
        let yhi = _mm256_cvtpd_ps(exp4(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(xc))));
        let y = _mm256_insertf128_ps::<1>(_mm256_castps128_ps256(ylo), yhi);
        let y = _mm256_blendv_ps(
            y,
            _mm256_set1_ps(f32::INFINITY),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, hi),
        );
        let y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo));
        _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
    }

    /// Sixteen lanes as two AVX2 vectors; only constructed inside functions compiled with AVX2,
    /// on a CPU that has it. (The `[f32; 16]` arrays compiled for AVX2 went through the stack
    /// between operations: `scores_qk` ran at 7 GFLOP/s a core.)
    #[derive(Clone, Copy)]
    pub(super) struct Y([__m256; 2]);

    impl V16 for Y {
        #[inline(always)]
        fn zero() -> Self {
            // SAFETY: (every intrinsic in this impl) the CPU has AVX2 (the type's contract).
            let z = unsafe { _mm256_setzero_ps() };
            Y([z, z])
        }
        #[inline(always)]
        fn splat(x: f32) -> Self {
            // SAFETY: see `zero`.
            let v = unsafe { _mm256_set1_ps(x) };
            Y([v, v])
        }
        #[inline(always)]
        fn load(s: &[f32]) -> Self {
            let mut a = [0f32; 16];
            let src = if s.len() >= 16 {
                &s[..16]
            } else {
                let n = s.len();
                a[..n].copy_from_slice(s);
                &a[..]
            };
            // SAFETY: 16 readable f32 (`src` has 16); see `zero`.
            unsafe {
                Y([
                    _mm256_loadu_ps(src.as_ptr()),
                    _mm256_loadu_ps(src.as_ptr().add(8)),
                ])
            }
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            // SAFETY: see `zero`.
            unsafe {
                Y([
                    _mm256_add_ps(self.0[0], o.0[0]),
                    _mm256_add_ps(self.0[1], o.0[1]),
                ])
            }
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            // SAFETY: see `zero`.
            unsafe {
                Y([
                    _mm256_sub_ps(self.0[0], o.0[0]),
                    _mm256_sub_ps(self.0[1], o.0[1]),
                ])
            }
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            // SAFETY: see `zero`.
            unsafe {
                Y([
                    _mm256_mul_ps(self.0[0], o.0[0]),
                    _mm256_mul_ps(self.0[1], o.0[1]),
                ])
            }
        }
        #[inline(always)]
        fn neg(self) -> Self {
            // SAFETY: see `zero`.
            unsafe {
                let sign = _mm256_set1_ps(-0.0);
                Y([
                    _mm256_xor_ps(self.0[0], sign),
                    _mm256_xor_ps(self.0[1], sign),
                ])
            }
        }
        #[inline(always)]
        fn div(self, o: Self) -> Self {
            // SAFETY: see `zero`.
            unsafe {
                Y([
                    _mm256_div_ps(self.0[0], o.0[0]),
                    _mm256_div_ps(self.0[1], o.0[1]),
                ])
            }
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            // `maxps` returns its second operand where either is NaN or they are equal: the
            // arrays' `self > o ? self : o`.
            // SAFETY: see `zero`.
            unsafe {
                Y([
                    _mm256_max_ps(self.0[0], o.0[0]),
                    _mm256_max_ps(self.0[1], o.0[1]),
                ])
            }
        }
        #[inline(always)]
        fn has_nan(self) -> bool {
            // SAFETY: see `zero`.
            unsafe {
                let u = _mm256_or_ps(
                    _mm256_cmp_ps::<_CMP_UNORD_Q>(self.0[0], self.0[0]),
                    _mm256_cmp_ps::<_CMP_UNORD_Q>(self.0[1], self.0[1]),
                );
                _mm256_movemask_ps(u) != 0
            }
        }
        #[inline(always)]
        fn store(self, d: &mut [f32]) {
            let mut a = [0f32; 16];
            let n = d.len().min(16);
            let dst = if n == 16 { &mut d[..16] } else { &mut a[..] };
            // SAFETY: 16 writable f32 (`dst` has 16); see `zero`.
            unsafe {
                _mm256_storeu_ps(dst.as_mut_ptr(), self.0[0]);
                _mm256_storeu_ps(dst.as_mut_ptr().add(8), self.0[1]);
            }
            if n < 16 {
                d[..n].copy_from_slice(&a[..n]);
            }
        }
        #[inline(always)]
        fn exp(self) -> Self {
            // SAFETY: see `zero`.
            unsafe { Y([exp8(self.0[0]), exp8(self.0[1])]) }
        }
    }
}

/// What the lane kernels compile to: AVX-512 vectors ([`avx512::Z`]) where [`crate::isa`]
/// reports AVX-512F; else two AVX2 vectors ([`avx2::Y`]) where it reports AVX2; else `[f32; 16]`
/// arrays at the target's baseline. Every width computes each lane's IEEE operations, so the
/// same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Width {
    Arrays,
    Avx2,
    Avx512,
}

impl Width {
    /// The widest width this process's ISA allows.
    pub(super) fn detected() -> Width {
        let isa = crate::isa::isa();
        if isa.avx512f {
            Width::Avx512
        } else if isa.avx2 && std::env::var_os("AUBIER_NO_AVX2_LANES").is_none() {
            Width::Avx2
        } else {
            Width::Arrays
        }
    }

    /// Its name in a kernel's variant: `scalar`, `avx2` or `avx512`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Width::Arrays => "scalar",
            Width::Avx2 => "avx2",
            Width::Avx512 => "avx512",
        }
    }

    /// Every width this CPU runs, narrowest first (for tests).
    #[cfg(test)]
    fn available() -> Vec<Width> {
        let isa = crate::isa::isa();
        let mut widths = vec![Width::Arrays];
        if isa.avx2 {
            widths.push(Width::Avx2);
        }
        if isa.avx512f {
            widths.push(Width::Avx512);
        }
        widths
    }
}

/// `$generic::<lanes>(args)` at `$width` ([`Width`]): with the AVX-512 lanes inside a function
/// compiled for AVX-512F, with the AVX2 lanes inside one compiled for AVX2, or with arrays.
macro_rules! lanes_call {
    ($width:expr, $generic:ident $(::<$($c:tt),*>)?, ($($a:ident: $t:ty),* $(,)?)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f")]
            fn with_avx512($($a: $t),*) {
                $generic::<avx512::Z $($(, $c)*)?>($($a),*)
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            fn with_avx2($($a: $t),*) {
                $generic::<avx2::Y $($(, $c)*)?>($($a),*)
            }
            match $width {
                // SAFETY: `Width::Avx512` only where the CPU has AVX-512F (`Width::detected`).
                Width::Avx512 => unsafe { with_avx512($($a),*) },
                // SAFETY: `Width::Avx2` only where the CPU has AVX2, FMA and F16C.
                Width::Avx2 => unsafe { with_avx2($($a),*) },
                Width::Arrays => $generic::<[f32; 16] $($(, $c)*)?>($($a),*),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = $width;
            $generic::<[f32; 16] $($(, $c)*)?>($($a),*);
        }
    }};
}

/// Query rows per group of `scores_qk`: the lanes.
const ROWS: usize = 16;
/// Keys per pass over a group's transposed rows where the lanes are wide ([`V16::WIDE`]).
const KEYS: usize = 2;
/// Rows and 16-column vectors per work item of `weighted_sum`.
const WS_ROWS: usize = 4;
const WS_VECS: usize = 4;

/// Below this many rows of `scores_qk` / `weighted_sum` (decode) the keys or columns are also
/// split among the threads.
const SPLIT_ROWS: usize = 64;

/// `scores_qk`: `y[r, j] = q[r, :] · k[j, :]`, `q` `[rows, w]`, `k` `[S, w]`, `y` `[rows, S]`,
/// each the oracle's dot (module note).
///
/// `causal = Some(pos)`: `pos` `[T]`, the rows token-major (`rows / T` a token), and a
/// `causal_mask` by `pos` replaces every score of a key `j > pos[t]` (checked by the caller,
/// `CpuKernel::Scores`): a row group's keys after its tokens' last position are written `0.0`
/// instead of computed.
///
/// # Panics
/// If `y.len() != rows · S`.
pub(crate) fn scores(q: &[f32], k: &[f32], y: &mut [f32], w: usize, causal: Option<&[i32]>) {
    scores_with(q, k, y, w, causal, Width::detected());
}

fn scores_with(
    q: &[f32],
    k: &[f32],
    y: &mut [f32],
    w: usize,
    causal: Option<&[i32]>,
    width: Width,
) {
    if w == 0 {
        y.fill(0.0);
        return;
    }
    let (rows, s) = (q.len() / w, k.len() / w);
    assert!(y.len() == rows * s, "scores_qk extents");
    if rows == 0 || s == 0 {
        return;
    }
    // Keys each row needs: all, or up to its token's position.
    let seen = |r: usize| match causal {
        Some(pos) if !pos.is_empty() && rows.is_multiple_of(pos.len()) => {
            let p = i64::from(pos[r / (rows / pos.len())]);
            usize::try_from(p + 1).unwrap_or(0).min(s)
        }
        _ => s,
    };
    let groups = rows.div_ceil(ROWS);
    let threads = rayon::current_num_threads();
    let key_chunk = if rows < SPLIT_ROWS {
        s.div_ceil((threads * 4).div_ceil(groups))
            .next_multiple_of(KEYS)
    } else {
        s
    };
    let out = SharedOut::new(y);
    let items: Vec<(usize, usize)> = (0..groups)
        .flat_map(|g| (0..s).step_by(key_chunk).map(move |j0| (g, j0)))
        .collect();
    items.into_par_iter().for_each(|(g, j0)| {
        let r0 = g * ROWS;
        let nr = ROWS.min(rows - r0);
        let j1 = (j0 + key_chunk).min(s);
        let live = (r0..r0 + nr).map(seen).max().unwrap_or(s).clamp(j0, j1);
        let qg = &q[r0 * w..(r0 + nr) * w];
        if rows < SPLIT_ROWS {
            crate::backend::cpu::q8::prefetch_l2_of(&k[j0 * w..live * w]);
        }
        let keys = (j0, live);
        let at = (r0, s);
        let out = &out;
        lanes_call!(
            width,
            scores_group,
            (qg: &[f32], k: &[f32], w: usize, keys: (usize, usize), out: &SharedOut, at: (usize, usize))
        );
        for r in r0..r0 + nr {
            for j in live..j1 {
                // SAFETY: (r, j) belongs to this item only.
                unsafe { out.put(r * s + j, 0.0) };
            }
        }
    });
}

/// Scores of the ≤ 16 rows `qg` (`[nr, w]`, rows `r0 ..` of the output with `s` keys per row)
/// against keys `j0 .. j1` of `k`, into `out`.
#[inline(always)]
fn scores_group<V: V16>(
    qg: &[f32],
    k: &[f32],
    w: usize,
    (j0, j1): (usize, usize),
    out: &SharedOut,
    (r0, s): (usize, usize),
) {
    let nr = qg.len() / w;
    // qt[i] = element i of the group's rows (lanes past `nr` 0.0).
    let mut qt = vec![[0f32; ROWS]; w];
    for (r, row) in qg.chunks_exact(w).enumerate() {
        for (t, &x) in qt.iter_mut().zip(row) {
            t[r] = x;
        }
    }
    let qt: Vec<V> = qt.iter().map(|t| V::load(t)).collect();
    let n8 = w - w % 8;
    let mut lanes = [0f32; ROWS];
    let mut put = |j: usize, d: V| {
        d.store(&mut lanes);
        for (r, &v) in lanes.iter().enumerate().take(nr) {
            // SAFETY: (r0 + r, j) belongs to the calling item only.
            unsafe { out.put((r0 + r) * s + j, v) };
        }
    };
    if V::WIDE {
        key_steps::<V, KEYS>(&qt, k, w, n8, (j0, j1), &mut put);
    } else {
        key_steps::<V, 1>(&qt, k, w, n8, (j0, j1), &mut put);
    }
}

/// [`dots`] of the transposed rows `qt` with keys `j0 .. j1` of `k` (rows of `w`), `N` keys at
/// a time and the rest one by one, each key's lanes handed to `put`.
#[inline(always)]
fn key_steps<V: V16, const N: usize>(
    qt: &[V],
    k: &[f32],
    w: usize,
    n8: usize,
    (j0, j1): (usize, usize),
    put: &mut impl FnMut(usize, V),
) {
    let mut j = j0;
    while j + N <= j1 {
        let ks: [&[f32]; N] = std::array::from_fn(|c| &k[(j + c) * w..(j + c + 1) * w]);
        for (c, d) in dots::<V, N>(qt, ks, n8).into_iter().enumerate() {
            put(j + c, d);
        }
        j += N;
    }
    for j in j..j1 {
        let [d] = dots::<V, 1>(qt, [&k[j * w..(j + 1) * w]], n8);
        put(j, d);
    }
}

/// The oracle's dot of the transposed rows `qt` with each of the `N` key rows `ks`: eight
/// partial sums (element `i` into sum `i mod 8`), the tail after `n8` into sums `0 ..`, then
/// `((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))`.
#[inline(always)]
fn dots<V: V16, const N: usize>(qt: &[V], ks: [&[f32]; N], n8: usize) -> [V; N] {
    let mut acc = [[V::zero(); 8]; N];
    // Whole chunks of eight on both sides, so the element loop indexes constant offsets.
    let kc: [&[[f32; 8]]; N] = ks.map(|k| k[..n8].as_chunks::<8>().0);
    for (i, qc) in qt[..n8].as_chunks::<8>().0.iter().enumerate() {
        let kr: [&[f32; 8]; N] = std::array::from_fn(|c| &kc[c][i]);
        for l in 0..8 {
            for (a, kr) in acc.iter_mut().zip(&kr) {
                a[l] = a[l].add(qc[l].mul(V::splat(kr[l])));
            }
        }
    }
    for (l, qv) in qt[n8..].iter().enumerate() {
        for (a, kr) in acc.iter_mut().zip(&ks) {
            a[l] = a[l].add(qv.mul(V::splat(kr[n8 + l])));
        }
    }
    // A loop rather than `map`: a closure may stay outside the AVX-512 function, uninlined.
    let mut out = [V::zero(); N];
    for (o, a) in out.iter_mut().zip(&acc) {
        let s01 = a[0].add(a[1]);
        let s23 = a[2].add(a[3]);
        let s45 = a[4].add(a[5]);
        let s67 = a[6].add(a[7]);
        *o = s01.add(s23).add(s45.add(s67));
    }
    out
}

/// `weighted_sum`: `y[r, :] = Σ_j p[r, j] · v[j, 0..len]`, `p` `[rows, S]`, `v` `[S, w]`, `y`
/// `[rows, len]`, `j` ascending (module note); at prefill each block of rows stops at its last
/// nonzero weight, never before the last value row that is not finite.
///
/// # Panics
/// If the extents disagree (`p.len() != rows · S` or `len > w`).
pub(crate) fn weighted_sum(p: &[f32], v: &[f32], y: &mut [f32], w: usize, len: usize) {
    weighted_sum_with(p, v, y, w, len, Width::detected());
}

fn weighted_sum_with(p: &[f32], v: &[f32], y: &mut [f32], w: usize, len: usize, width: Width) {
    if len == 0 || w == 0 {
        return;
    }
    let (rows, s) = (y.len() / len, v.len() / w);
    assert!(p.len() == rows * s && len <= w, "weighted_sum extents");
    if s == 0 {
        // No keys: every sum is its `+0.0` start, as the oracle's.
        y.fill(0.0);
        return;
    }
    if rows == 0 {
        return;
    }
    // Keys `0 .. finite_from` are the ones a cut may not skip (only cut at prefill).
    let finite_from = if rows >= SPLIT_ROWS {
        (0..s)
            .rev()
            .find(|&j| !v[j * w..j * w + len].iter().all(|x| x.is_finite()))
            .map_or(0, |j| j + 1)
    } else {
        s
    };
    let cols = 16 * WS_VECS;
    let threads = rayon::current_num_threads();
    let col_chunk = if rows < SPLIT_ROWS {
        let blocks = rows.div_ceil(WS_ROWS);
        len.div_ceil((threads * 4).div_ceil(blocks))
            .next_multiple_of(cols)
    } else {
        len.next_multiple_of(cols)
    };
    let out = SharedOut::new(y);
    let items: Vec<(usize, usize)> = (0..rows)
        .step_by(WS_ROWS)
        .flat_map(|r0| (0..len).step_by(col_chunk).map(move |c0| (r0, c0)))
        .collect();
    items.into_par_iter().for_each(|(r0, c0)| {
        let nr = WS_ROWS.min(rows - r0);
        let pr = &p[r0 * s..(r0 + nr) * s];
        let used = if rows >= SPLIT_ROWS {
            pr.chunks_exact(s)
                .map(|row| row.iter().rposition(|&x| x != 0.0).map_or(0, |j| j + 1))
                .max()
                .unwrap_or(s)
                .max(finite_from)
        } else {
            s
        };
        let cs = (c0, (c0 + col_chunk).min(len));
        let out = &out;
        if nr == WS_ROWS {
            let at = (r0, len);
            lanes_call!(
                width,
                weighted_block::<WS_ROWS>,
                (pr: &[f32], v: &[f32], w: usize, used: usize, cs: (usize, usize), out: &SharedOut, at: (usize, usize))
            );
        } else {
            for (r, pr) in pr.chunks_exact(s).enumerate() {
                let at = (r0 + r, len);
                lanes_call!(
                    width,
                    weighted_block::<1>,
                    (pr: &[f32], v: &[f32], w: usize, used: usize, cs: (usize, usize), out: &SharedOut, at: (usize, usize))
                );
            }
        }
    });
}

/// The `R` rows `pr` (`[R, S]`, output rows `r0 ..` of `len` columns) of `weighted_sum` over
/// keys `0 .. used`, columns `c0 .. c1`, into `out`.
#[inline(always)]
fn weighted_block<V: V16, const R: usize>(
    pr: &[f32],
    v: &[f32],
    w: usize,
    used: usize,
    (c0, c1): (usize, usize),
    out: &SharedOut,
    (r0, len): (usize, usize),
) {
    let s = pr.len() / R;
    let prs: [&[f32]; R] = std::array::from_fn(|r| &pr[r * s..r * s + used]);
    let mut lanes = [0f32; 16];
    for cb in (c0..c1).step_by(16 * WS_VECS) {
        let nc = (c1 - cb).min(16 * WS_VECS);
        let acc = if nc == 16 * WS_VECS {
            weighted_steps::<V, R, true>(prs, v, w, cb, nc)
        } else {
            weighted_steps::<V, R, false>(prs, v, w, cb, nc)
        };
        for (r, a) in acc.iter().enumerate() {
            for (c, ac) in a.iter().enumerate() {
                let n = nc.saturating_sub(16 * c).min(16);
                ac.store(&mut lanes[..n]);
                for (i, &x) in lanes[..n].iter().enumerate() {
                    // SAFETY: (r0 + r, cb + 16c + i) belongs to the calling item only.
                    unsafe { out.put((r0 + r) * len + cb + 16 * c + i, x) };
                }
            }
        }
    }
}

/// The sums of [`weighted_block`] for columns `cb .. cb + nc` (`FULL`: all `16 · WS_VECS`, so
/// that every load is whole and the loop has no length tests): per key `j`, each row's weight
/// `prs[r][j]` times value row `j`, added in `j` order from `+0.0`.
#[inline(always)]
fn weighted_steps<V: V16, const R: usize, const FULL: bool>(
    prs: [&[f32]; R],
    v: &[f32],
    w: usize,
    cb: usize,
    nc: usize,
) -> [[V; WS_VECS]; R] {
    let mut acc = [[V::zero(); WS_VECS]; R];
    let used = prs.first().map_or(0, |p| p.len());
    for j in 0..used {
        let vv: [V; WS_VECS] = if FULL {
            let vr: &[f32; 16 * WS_VECS] = v[j * w + cb..][..16 * WS_VECS]
                .try_into()
                .expect("a whole block of columns");
            std::array::from_fn(|c| V::load(&vr[16 * c..16 * c + 16]))
        } else {
            let vr = &v[j * w + cb..j * w + cb + nc];
            std::array::from_fn(|c| V::load(vr.get(16 * c..).unwrap_or(&[])))
        };
        for (a, p) in acc.iter_mut().zip(&prs) {
            let pv = V::splat(p[j]);
            for (ac, x) in a.iter_mut().zip(&vv) {
                *ac = ac.add(pv.mul(*x));
            }
        }
    }
    acc
}

/// `softmax` of each row of `n` elements of `x` into `y` (rows in parallel), the oracle's bits
/// (module note).
///
/// # Panics
/// If `x` and `y` differ in length.
pub(crate) fn softmax(x: &[f32], y: &mut [f32], n: usize) {
    softmax_with(x, y, n, Width::detected());
}

fn softmax_with(x: &[f32], y: &mut [f32], n: usize, width: Width) {
    assert!(x.len() == y.len(), "softmax extents");
    if n == 0 {
        return;
    }
    y.par_chunks_mut(n)
        .zip(x.par_chunks(n))
        .with_min_len(4)
        .for_each(|(yr, xr)| lanes_call!(width, softmax_row, (xr: &[f32], yr: &mut [f32])));
}

#[inline(always)]
fn softmax_row<V: V16>(xr: &[f32], yr: &mut [f32]) {
    // The maximum: a NaN anywhere makes it NaN (cranelift's `fmax`); otherwise the largest
    // value (of equal zeros either one: `x − max` is then the same for every `x`).
    let (full, tail) = xr.split_at(xr.len() - xr.len() % 16);
    let mut mv = V::splat(f32::NEG_INFINITY);
    let mut nan = false;
    for c in full.chunks_exact(16) {
        let v = V::load(c);
        nan |= v.has_nan();
        mv = v.max(mv);
    }
    let mut lanes = [0f32; 16];
    mv.store(&mut lanes);
    let mut m = lanes.iter().chain(tail).fold(f32::NEG_INFINITY, |m, &v| {
        nan |= v.is_nan();
        if v > m {
            v
        } else {
            m
        }
    });
    if nan {
        m = f32::NAN;
    }
    let mv = V::splat(m);
    for (e, x) in yr.chunks_mut(16).zip(xr.chunks(16)) {
        V::load(x).sub(mv).exp().store(e);
    }
    let mut sum = 0.0f32;
    for &e in yr.iter() {
        sum += e;
    }
    let sv = V::splat(sum);
    for c in yr.chunks_mut(16) {
        V::load(c).div(sv).store(c);
    }
}

/// `g[i] = silu(g[i]) · u[i]` with `silu(x) = x / (1 + e^(−x))` (`emit.rs`'s expression, its
/// `exp` [`expf`]) in vector lanes, on the calling thread (`moe_ffn`'s gate and up products).
///
/// # Panics
/// If `u` differs in length from `g`.
pub(crate) fn silu_mul(g: &mut [f32], u: &[f32]) {
    assert!(u.len() == g.len(), "silu extents");
    let (width, u) = (Width::detected(), Some(u));
    lanes_call!(width, silu_chunk, (g: &mut [f32], u: Option<&[f32]>));
}

/// The `silu` step, `y = silu(x)` (the expression of [`silu_mul`]), chunks of elements in
/// parallel.
///
/// # Panics
/// If `x` and `y` differ in length.
pub(crate) fn silu(x: &[f32], y: &mut [f32]) {
    silu_with(x, y, Width::detected());
}

fn silu_with(x: &[f32], y: &mut [f32], width: Width) {
    assert!(x.len() == y.len(), "silu extents");
    y.par_chunks_mut(ELEMENT_CHUNK)
        .zip(x.par_chunks(ELEMENT_CHUNK))
        .for_each(|(yc, xc)| {
            yc.copy_from_slice(xc);
            let u = None;
            lanes_call!(width, silu_chunk, (yc: &mut [f32], u: Option<&[f32]>));
        });
}

#[inline(always)]
fn silu_chunk<V: V16>(g: &mut [f32], u: Option<&[f32]>) {
    let one = V::splat(1.0);
    for (i, gv) in g.chunks_mut(16).enumerate() {
        let x = V::load(gv);
        let y = x.div(one.add(x.neg().exp()));
        match u {
            Some(u) => y
                .mul(V::load(&u[16 * i..(16 * i + 16).min(u.len())]))
                .store(gv),
            None => y.store(gv),
        }
    }
}

/// Elements per parallel chunk of `scale` and `causal_mask`, so a decoded token's (32 heads ×
/// S ≈ 600 keys) runs on one thread: waking a second thread costs more than the work.
const ELEMENT_CHUNK: usize = 1 << 16;

/// `scale`: `y[i] = x[i] · c`, the oracle's `fmul` (elements in parallel).
///
/// # Panics
/// If `x` and `y` differ in length.
pub(crate) fn scale(x: &[f32], y: &mut [f32], c: f32) {
    assert!(x.len() == y.len(), "scale extents");
    y.par_chunks_mut(ELEMENT_CHUNK)
        .zip(x.par_chunks(ELEMENT_CHUNK))
        .for_each(|(yc, xc)| {
            for (o, &v) in yc.iter_mut().zip(xc) {
                *o = v * c;
            }
        });
}

/// `causal_mask`: `y[t, r, j] = j > pos[t] ? −∞ : x[t, r, j]` for `x`, `y` `[T, rows, S]` and
/// `pos` `[T]` (the comparison signed, as the oracle's `icmp sgt`).
///
/// # Panics
/// If `x` and `y` differ in length or are not `T` whole tokens of rows of `s` keys.
pub(crate) fn causal_mask(x: &[f32], pos: &[i32], y: &mut [f32], s: usize) {
    assert!(
        x.len() == y.len() && s > 0 && !pos.is_empty() && x.len().is_multiple_of(pos.len() * s),
        "causal_mask extents"
    );
    let per_token = x.len() / pos.len();
    let rows_per_chunk = (ELEMENT_CHUNK / s).max(1);
    y.par_chunks_mut(rows_per_chunk * s)
        .zip(x.par_chunks(rows_per_chunk * s))
        .enumerate()
        .for_each(|(c, (yc, xc))| {
            for (i, (yr, xr)) in yc.chunks_exact_mut(s).zip(xc.chunks_exact(s)).enumerate() {
                let row = c * rows_per_chunk + i;
                let p = i64::from(pos[row * s / per_token]);
                // Keys 0 ..= p keep their score, the rest are −∞.
                let keep = usize::try_from(p.saturating_add(1)).unwrap_or(0).min(s);
                yr[..keep].copy_from_slice(&xr[..keep]);
                yr[keep..].fill(f32::NEG_INFINITY);
            }
        });
}

/// `attn_temperature`: `y[t, i] = x[t, i] · f_t` with `f_t = 1 + β · ln(1 + f32(pos[t] / L))`,
/// the division truncating on i64 and `ln` by `f32::ln` (the oracle's `sdiv`, `fcvt_from_sint`
/// and `aubier_logf` call, `lower.rs`): one factor per token instead of the oracle's per-token
/// scalar loop, then one multiply per element; tokens in parallel. `x` and `y` are `[T, n]`,
/// `pos` `[T]`.
///
/// # Panics
/// If `x` and `y` differ in length, `x` is not `T` whole rows, or `length` is not positive.
pub(crate) fn temperature(x: &[f32], pos: &[i32], y: &mut [f32], beta: f32, length: i64) {
    assert!(
        x.len() == y.len() && length > 0 && !pos.is_empty() && x.len().is_multiple_of(pos.len()),
        "attn_temperature extents"
    );
    by_token(x, pos, y, |yr, xr, p| {
        let fl = (i64::from(p) / length) as f32;
        let f = 1.0 + beta * (1.0 + fl).ln();
        for (o, &v) in yr.iter_mut().zip(xr) {
            *o = v * f;
        }
    });
}

/// `f(y_t, x_t, pos[t])` for the `T = pos.len()` equal token parts of `x` and `y` (each
/// `x.len() / T` long, `T ≥ 1`), tokens in parallel (a decoded token on the calling thread).
fn by_token(x: &[f32], pos: &[i32], y: &mut [f32], f: impl Fn(&mut [f32], &[f32], i32) + Sync) {
    let n = x.len() / pos.len();
    if n == 0 {
        return;
    }
    y.par_chunks_mut(n)
        .zip(x.par_chunks(n))
        .zip(pos.par_iter())
        .with_min_len((ELEMENT_CHUNK / n).max(1))
        .for_each(|((yr, xr), &p)| f(yr, xr, p));
}

/// Rotated pairs a fast `rope_yarn` takes at most (`n_rot` ≤ 128; the model's is 64).
pub(crate) const ROPE_MAX_PAIRS: usize = 64;

/// `rope_yarn` of rows of `d` values (`x`, `y` `[T, rows, d]`, `pos` `[T]`): pair `i` of a row
/// (elements `2i`, `2i + 1`, `i < theta.len()`) rotated by the angle `θ_i · f32(pos[t])`, with
/// `c = cos(angle) · af`, `s = sin(angle) · af` by `f32::cos` / `f32::sin` (the oracle's
/// `aubier_cosf` / `aubier_sinf` calls) and `y0 = x0·c − x1·s`, `y1 = x1·c + x0·s` in the
/// oracle's order (`lower.rs`); the elements after the pairs copied. The oracle calls cos and sin
/// for every row; here once per token for all its rows (heads), tokens in parallel.
///
/// # Panics
/// If `x` and `y` differ in length, are not `T` whole tokens of rows of `d`, or the pairs do
/// not fit in `d`.
pub(crate) fn rope(x: &[f32], pos: &[i32], y: &mut [f32], d: usize, theta: &[f32], af: f32) {
    let per_token = x.len() / pos.len().max(1);
    assert!(
        x.len() == y.len()
            && d > 0
            && 2 * theta.len() <= d
            && !pos.is_empty()
            && x.len() == per_token * pos.len()
            && per_token.is_multiple_of(d),
        "rope_yarn extents"
    );
    by_token(x, pos, y, |yt, xt, p| {
        let pf = p as f32;
        let mut cs = [(0f32, 0f32); ROPE_MAX_PAIRS];
        let cs = &mut cs[..theta.len()];
        for (c, &th) in cs.iter_mut().zip(theta) {
            let ang = th * pf;
            *c = (ang.cos() * af, ang.sin() * af);
        }
        for (yr, xr) in yt.chunks_exact_mut(d).zip(xt.chunks_exact(d)) {
            let n = 2 * cs.len();
            for ((yp, xp), &(c, s)) in yr[..n]
                .chunks_exact_mut(2)
                .zip(xr[..n].chunks_exact(2))
                .zip(cs.iter())
            {
                let (x0, x1) = (xp[0], xp[1]);
                yp[0] = x0 * c - x1 * s;
                yp[1] = x1 * c + x0 * s;
            }
            yr[n..].copy_from_slice(&xr[n..]);
        }
    });
}

/// `rms_norm` of each row of `n` elements of `x` by the weight `w` (`[n]`) into `y`, the
/// oracle's expression (module note), rows in parallel (a decoded token's row on one thread).
///
/// # Panics
/// If `x` and `y` differ in length or `w` is not `n` long.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], y: &mut [f32], eps: f32) {
    let n = w.len();
    assert!(x.len() == y.len() && n > 0, "rms_norm extents");
    y.par_chunks_mut(n)
        .zip(x.par_chunks(n))
        .with_min_len((ELEMENT_CHUNK / n).max(1))
        .for_each(|(yr, xr)| {
            let ss = crate::gguf::quant::dot_f32(xr, xr);
            let inv = 1.0 / ((ss / n as f32) + eps).sqrt();
            for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
                *o = (v * inv) * g;
            }
        });
}

/// Disjoint-index writes from several threads into one f32 buffer.
pub(super) struct SharedOut(pub(super) *mut f32, pub(super) usize);

// SAFETY: the callers partition the indices: each index is written by one work item only, and
// nothing reads the buffer until the parallel loop has joined.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    pub(super) fn new(v: &mut [f32]) -> Self {
        SharedOut(v.as_mut_ptr(), v.len())
    }

    /// The first element, for a kernel that writes a disjoint part through a pointer.
    pub(super) fn base(&self) -> *mut f32 {
        self.0
    }

    /// Writes `v` at `i` (bounds-checked).
    ///
    /// # Safety
    /// No other thread writes or reads index `i` during the parallel loop.
    pub(super) unsafe fn put(&self, i: usize, v: f32) {
        assert!(i < self.1, "write {i} outside {}", self.1);
        // SAFETY: in bounds (checked), exclusive by the caller's contract.
        unsafe { *self.0.add(i) = v }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
    }

    /// `emit.rs`'s `dot_f32`, written out scalar: sums `i mod 8`, the tail into sums `0 ..`,
    /// then the pairwise reduction.
    fn oracle_dot(a: &[f32], b: &[f32]) -> f32 {
        let n8 = a.len() - a.len() % 8;
        let mut s = [0f32; 8];
        for i in 0..n8 {
            s[i % 8] += a[i] * b[i];
        }
        for i in n8..a.len() {
            s[i - n8] += a[i] * b[i];
        }
        ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
    }

    fn same(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }

    /// Both lanes (where the CPU has AVX-512) against the scalar oracle order, over shapes with
    /// every kind of tail: rows not a multiple of 16 or 8, widths not a multiple of 8 or 16.
    #[test]
    fn scores_and_weighted_sum_are_the_oracles_sums() {
        for (rows, s, w, len) in [
            (1, 1, 1, 1),
            (70, 0, 8, 3),
            (32, 7, 320, 256),
            (5, 300, 20, 3),
            (70, 9, 43, 37),
            (16, 33, 8, 8),
        ] {
            let q = noise(rows * w, 1);
            let k = noise(s * w, 2);
            let p = noise(rows * s, 3);
            let mut want_y = vec![0f32; rows * s];
            for r in 0..rows {
                for j in 0..s {
                    want_y[r * s + j] = oracle_dot(&q[r * w..(r + 1) * w], &k[j * w..(j + 1) * w]);
                }
            }
            let mut want_o = vec![0f32; rows * len];
            for r in 0..rows {
                for j in 0..s {
                    for c in 0..len {
                        want_o[r * len + c] += p[r * s + j] * k[j * w + c];
                    }
                }
            }
            for width in Width::available() {
                let mut y = vec![f32::NAN; rows * s];
                scores_with(&q, &k, &mut y, w, None, width);
                assert!(same(&y, &want_y), "scores {rows}x{s}x{w} width {width:?}");
                let mut o = vec![f32::NAN; rows * len];
                weighted_sum_with(&p, &k, &mut o, w, len, width);
                assert!(
                    same(&o, &want_o),
                    "weighted_sum {rows}x{s}x{len} width {width:?}"
                );
            }
        }
    }

    /// With causal positions every score a token's position reaches has the full product's
    /// bits, and the rest is the full product's or `0.0`; a `weighted_sum` whose rows end in zero
    /// weights (a causal softmax) has the full product's bits, and a non-finite value after them
    /// still reaches the sums (`0 · ∞` is NaN in the full product too).
    #[test]
    fn causal_cuts_keep_the_full_products_bits() {
        let (t, heads, w, len) = (70, 3, 24, 9);
        for width in Width::available() {
            for p0 in [0usize, 5] {
                let s = p0 + t;
                let pos: Vec<i32> = (0..t).map(|i| (p0 + i) as i32).collect();
                let (q, k) = (noise(t * heads * w, 7), noise(s * w, 8));
                let mut full = vec![f32::NAN; t * heads * s];
                let mut cut = full.clone();
                scores_with(&q, &k, &mut full, w, None, width);
                scores_with(&q, &k, &mut cut, w, Some(&pos), width);
                let mut skipped = 0;
                for (r, (fr, cr)) in full.chunks(s).zip(cut.chunks(s)).enumerate() {
                    let p = pos[r / heads] as usize;
                    assert!(same(&fr[..=p], &cr[..=p]), "row {r}");
                    for (a, b) in fr[p + 1..].iter().zip(&cr[p + 1..]) {
                        assert!(a.to_bits() == b.to_bits() || b.to_bits() == 0, "row {r}");
                        skipped += usize::from(a.to_bits() != b.to_bits());
                    }
                }
                assert!(skipped > t * heads * t / 4, "{skipped} scores skipped");
                let mut p = noise(t * heads * s, 9);
                for (r, row) in p.chunks_mut(s).enumerate() {
                    row[pos[r / heads] as usize + 1..].fill(0.0);
                }
                let mut v = noise(s * w, 10);
                let dense = |p: &[f32], v: &[f32]| {
                    let mut o = vec![0f32; t * heads * len];
                    for (r, orow) in o.chunks_mut(len).enumerate() {
                        for j in 0..s {
                            for (c, oc) in orow.iter_mut().enumerate() {
                                *oc += p[r * s + j] * v[j * w + c];
                            }
                        }
                    }
                    o
                };
                let mut o = vec![f32::NAN; t * heads * len];
                weighted_sum_with(&p, &v, &mut o, w, len, width);
                assert!(same(&o, &dense(&p, &v)));
                v[(s - 1) * w] = f32::INFINITY;
                weighted_sum_with(&p, &v, &mut o, w, len, width);
                let want = dense(&p, &v);
                assert!(want[0].is_nan() && o[0].is_nan(), "0 · ∞ reaches row 0");
                assert!(same(&o, &want));
            }
        }
    }

    /// `softmax` is the oracle's expression (lower.rs) in its order: a masked entry is exactly
    /// `+0.0`, a row with a NaN is NaN throughout, a fully masked row is NaN (−∞ − (−∞)).
    #[test]
    fn softmax_is_the_oracle_expression() {
        for n in [37, 64, 5] {
            let mut x = noise(5 * n, 11);
            x[n + 3..2 * n].fill(f32::NEG_INFINITY);
            x[2 * n + 4] = f32::NAN;
            x[3 * n..4 * n].fill(f32::NEG_INFINITY);
            for width in Width::available() {
                let mut y = vec![0.0f32; x.len()];
                softmax_with(&x, &mut y, n, width);
                for (xr, yr) in x.chunks(n).zip(y.chunks(n)) {
                    let mut m = f32::NEG_INFINITY;
                    let mut nan = false;
                    for &v in xr {
                        nan |= v.is_nan();
                        m = m.max(v);
                    }
                    let m = if nan { f32::NAN } else { m };
                    let e: Vec<f32> = xr.iter().map(|&v| expf(v - m)).collect();
                    let mut sum = 0.0f32;
                    for &v in &e {
                        sum += v;
                    }
                    let want: Vec<f32> = e.iter().map(|&ei| ei / sum).collect();
                    assert!(same(yr, &want), "n {n} width {width:?}");
                }
                assert!(y[n + 3..2 * n].iter().all(|&v| v.to_bits() == 0));
                assert!(y[2 * n..4 * n].iter().all(|v| v.is_nan()));
            }
        }
    }

    /// `e^x` on vector lanes of `x` ([`V16::exp`]) into `y`.
    fn exp_lanes<V: V16>(x: &[f32], y: &mut [f32]) {
        for (yc, xc) in y.chunks_mut(16).zip(x.chunks(16)) {
            V::load(xc).exp().store(yc);
        }
    }

    /// The vector `exp` (AVX-512 and AVX2 where the CPU has them, and the array lanes) gives
    /// `expf`'s bits: every 61st f32 bit pattern (all signs, NaNs, infinities, subnormals, both
    /// clamps) and the edges of the clamps and of the table's range.
    #[test]
    fn vector_exp_has_expf_bits() {
        let mut x: Vec<f32> = (0..=u32::MAX).step_by(61).map(f32::from_bits).collect();
        x.extend([
            0.0,
            -0.0,
            128.0,
            -128.0,
            128.00002,
            -128.00002,
            88.72283,
            88.7229,
            -103.97,
            -87.33655,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        let want: Vec<f32> = x.iter().map(|&v| expf(v)).collect();
        for width in Width::available() {
            let mut y = vec![0f32; x.len()];
            let (xs, ys) = (&x[..], &mut y[..]);
            lanes_call!(width, exp_lanes, (xs: &[f32], ys: &mut [f32]));
            assert!(same(&y, &want), "width {width:?}");
        }
    }

    /// `silu` and `silu_mul` are `emit.rs`'s SiLU, `x / (1 + e^(−x))` with [`expf`], times `u`:
    /// the same bits over lengths with tails, large magnitudes and a NaN.
    #[test]
    fn silu_is_the_oracle_expression() {
        for n in [1, 37, 70_001] {
            let mut x: Vec<f32> = noise(n, 16).iter().map(|v| v * 30.0).collect();
            x[n / 2] = f32::NAN;
            let u = noise(n, 17);
            let s: Vec<f32> = x.iter().map(|&v| v / (1.0 + expf(-v))).collect();
            for width in Width::available() {
                let mut y = vec![0f32; n];
                silu_with(&x, &mut y, width);
                assert!(same(&y, &s), "silu n {n} width {width:?}");
            }
            let mut g = x.clone();
            silu_mul(&mut g, &u);
            let want: Vec<f32> = s.iter().zip(&u).map(|(a, b)| a * b).collect();
            assert!(same(&g, &want), "silu_mul n {n}");
        }
    }

    /// `scale` and `causal_mask` are the oracle's expressions (lower.rs): `x · c`, and −∞ for a
    /// key after the token's position (none kept for a negative position), elsewhere the input.
    #[test]
    fn scale_and_causal_mask_are_the_oracle_expressions() {
        let (t, rows, s) = (3, 5, 40_000);
        let x = noise(t * rows * s, 12);
        let mut y = vec![0f32; x.len()];
        scale(&x, &mut y, 0.37);
        assert!(x
            .iter()
            .zip(&y)
            .all(|(a, b)| (a * 0.37).to_bits() == b.to_bits()));
        let pos = [7, -2, 39_999];
        causal_mask(&x, &pos, &mut y, s);
        for (r, (xr, yr)) in x.chunks(s).zip(y.chunks(s)).enumerate() {
            let p = i64::from(pos[r / rows]);
            for (j, (&a, &b)) in xr.iter().zip(yr).enumerate() {
                let want = if j as i64 > p { f32::NEG_INFINITY } else { a };
                assert_eq!(want.to_bits(), b.to_bits(), "row {r} key {j}");
            }
        }
    }

    /// `attn_temperature` and `rope_yarn` are the oracle's expressions (lower.rs), written out
    /// per element: the factor per token (truncating division, negative positions included),
    /// cos and sin per row and pair, the unrotated tail copied.
    #[test]
    fn temperature_and_rope_are_the_oracle_expressions() {
        let (rows, d) = (3, 10);
        let pos = [0, 2, 3, 7, -4, 40_000];
        let x = noise(pos.len() * rows * d, 15);
        let n = rows * d;
        let mut y = vec![0f32; x.len()];
        temperature(&x, &pos, &mut y, 0.1, 3);
        for (t, &p) in pos.iter().enumerate() {
            let f = 1.0 + 0.1 * (1.0 + ((i64::from(p) / 3) as f32)).ln();
            let want: Vec<f32> = x[t * n..(t + 1) * n].iter().map(|&v| v * f).collect();
            assert!(same(&y[t * n..(t + 1) * n], &want), "temperature token {t}");
        }
        let theta = [1.0, 0.3, 0.01];
        rope(&x, &pos, &mut y, d, &theta, 1.3);
        for (r, (xr, yr)) in x.chunks(d).zip(y.chunks(d)).enumerate() {
            let pf = pos[r / rows] as f32;
            for (i, &th) in theta.iter().enumerate() {
                let ang = th * pf;
                let (c, s) = (ang.cos() * 1.3, ang.sin() * 1.3);
                let (x0, x1) = (xr[2 * i], xr[2 * i + 1]);
                let want = [x0 * c - x1 * s, x1 * c + x0 * s];
                assert!(same(&yr[2 * i..2 * i + 2], &want), "rope row {r} pair {i}");
            }
            assert!(same(&yr[6..], &xr[6..]), "rope row {r} tail");
        }
    }

    /// `rms_norm` is the oracle's expression (lower.rs), with `dot_f32`'s order for the sum of
    /// squares (eight lanes, a tail, the pairwise reduction), for widths with and without a tail.
    #[test]
    fn rms_norm_is_the_oracle_expression() {
        for n in [4096, 43] {
            let x = noise(7 * n, 13);
            let w = noise(n, 14);
            let mut y = vec![0f32; x.len()];
            rms_norm(&x, &w, &mut y, 1e-6);
            for (xr, yr) in x.chunks(n).zip(y.chunks(n)) {
                let ss = oracle_dot(xr, xr);
                let inv = 1.0 / ((ss / n as f32) + 1e-6).sqrt();
                let want: Vec<f32> = xr.iter().zip(&w).map(|(&v, &g)| (v * inv) * g).collect();
                assert!(same(yr, &want), "n {n}");
            }
        }
    }
}
