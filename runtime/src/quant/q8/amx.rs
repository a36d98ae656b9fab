//! AMX tile kernels (Intel Advanced Matrix Extensions, `tdpbusd`): many weight rows against many
//! packed Q8_K activation rows ([`Q8Tiles`]), with the integer sums and f32 expressions of the
//! scalar kernels, so every output has the single-row kernel's bits.
//!
//! Algorithm. Weight rows go 16 at a time (a `C` tile's rows), activation rows 16 at a time (its
//! columns; [`Q8Tiles`] holds them as `B` tiles). The 16 weight rows are first unpacked whole, row
//! by row (sequential reads of the weights), into the u8 effective weights of the VNNI kernels
//! (`vnni.rs`; Q2_K `q·sc`, Q3_K `(q3 − 4)·(sc − 32) + 127`), 256 bytes per block. Then for each
//! 256-element block:
//! - the block's 16 unpacked rows are loaded as four `A` tiles (`tileloadd`, stride `nb · 256`);
//! - for each two activation groups, `tdpbusd` (u8 × i8, four products added into each i32,
//!   exact) four times into two `C` tiles: the block's integer sum for all 16 × 16 pairs of each
//!   group (Q3_K: before its `−127·Σ x8` offset);
//! - epilogue: the `C` tiles are stored and, per weight row, 16 lanes of AVX-512 compute the
//!   block's value exactly as the scalar helper does per pair (`d8·(d·f32(S) − dmin·f32(M))` with
//!   `M = Σ_j m_j·bsum_j` by eight `vpdpwssd`, or `d8·(d·f32(S))`), added into the pair's f32
//!   accumulator, blocks in order from `+0.0`.
//!
//! The unpacking is paid once per weight block for all activation rows of the call, and the
//! multiply-adds run on the tile unit. Tile registers: `tmm0`, `tmm1` the two `C` tiles, `tmm2` to
//! `tmm5` the `A` tiles, `tmm6`, `tmm7` the `B` tiles; every tile is 16 rows × 64 bytes.
//! Instructions are written with `asm!` (Rust's AMX intrinsics are unstable); no compiler-generated
//! code touches the tile registers, so they keep their values between the `asm!` blocks of one call,
//! which loads the tile configuration first and releases the tile state last.
//!
//! Requirements: CPUID AMX-TILE and AMX-INT8, the AVX-512 features of the VNNI kernels, and the
//! Linux kernel's permission to use the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`), asked once per process. Source for the instruction semantics: Intel 64
//! and IA-32 Architectures Software Developer's Manual, vol. 2, `TDPBUSD`, `TILELOADD`, `LDTILECFG`.

use super::tiles::{Q8Tiles, Tile, GROUP};
use super::vnni::{q2_prep, q3_prep};
use super::Q8GridFn;
use crate::ggml_type::GgmlType;
use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Whether this CPU and OS run the tile kernels (module note), checked once.
pub(super) fn detected() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[allow(unused_unsafe)]
        // SAFETY: CPUID is available on every x86_64 CPU; leaf 7 is read only when the maximum
        // basic leaf includes it.
        let leaf7 = unsafe { (__get_cpuid_max(0).0 >= 7).then(|| __cpuid_count(7, 0)) };
        let amx = leaf7.is_some_and(|l| l.edx & (1 << 24) != 0 && l.edx & (1 << 25) != 0);
        amx && super::vnni::detected() && permitted()
    })
}

/// Asks Linux for the AMX tile data state (`ARCH_REQ_XCOMP_PERM` = 0x1023,
/// `XFEATURE_XTILEDATA` = 18; `arch/x86/include/uapi/asm/prctl.h`): true when granted.
#[cfg(target_os = "linux")]
fn permitted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: this request only extends the process's permitted XSAVE features; it reads and
    // writes no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn permitted() -> bool {
    false
}

/// The 64-byte tile configuration: palette 1, all eight tiles 16 rows × 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = GROUP as u8;
        t += 1;
    }
    Config(c)
};

/// The tile kernel of `ty` (Q2_K, Q3_K), or None (another type, or no AMX).
pub(super) fn grid_fn(ty: GgmlType) -> Option<Q8GridFn> {
    if !detected() {
        return None;
    }
    // SAFETY (both wrappers): `kernel` enables exactly the AVX-512 features `detected()` found,
    // and the AMX instructions run only after `detected()` saw them and got the OS permission.
    macro_rules! wrap {
        ($b:literal, $mins:literal, $prep:ident) => {{
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            fn kernel(w: &[u8], x: &Q8Tiles, y: &mut [f32]) {
                grid::<$b, $mins>(w, x, y, |block, dst| {
                    let p = $prep(block);
                    for (k, v) in p.w.iter().enumerate() {
                        // SAFETY: 32 bytes at `32k`, inside the 256-byte row.
                        unsafe { _mm256_storeu_si256(dst[32 * k..].as_mut_ptr().cast(), *v) };
                    }
                    p.into()
                })
            }
            fn w(w: &[u8], x: &Q8Tiles, y: &mut [f32]) {
                // SAFETY: see above.
                unsafe { kernel(w, x, y) }
            }
            w as Q8GridFn
        }};
    }
    match ty {
        GgmlType::Q2_K => Some(wrap!(84, true, q2_prep)),
        GgmlType::Q3_K => Some(wrap!(110, false, q3_prep)),
        _ => None,
    }
}

/// A weight block's scales for the epilogue: `d`, `dmin` and the 16 mins as eight i32 words of
/// two i16 (Q2_K), or `d` alone (Q3_K).
#[derive(Clone, Copy)]
struct Scales {
    d: f32,
    dmin: f32,
    mins: [i32; 8],
}

impl Scales {
    const ZERO: Scales = Scales {
        d: 0.0,
        dmin: 0.0,
        mins: [0; 8],
    };
}

impl From<super::vnni::Q2> for Scales {
    fn from(p: super::vnni::Q2) -> Scales {
        let mut mins = [0i32; 8];
        // SAFETY: 32 bytes into an [i32; 8].
        unsafe { _mm256_storeu_si256(mins.as_mut_ptr().cast(), p.mins) };
        Scales {
            d: p.d,
            dmin: p.dmin,
            mins,
        }
    }
}

impl From<super::vnni::Q3> for Scales {
    fn from(p: super::vnni::Q3) -> Scales {
        Scales {
            d: p.d,
            ..Scales::ZERO
        }
    }
}

/// One unpacked weight block (256 effective weights).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Unpacked([u8; 256]);

/// Two stored `C` tiles (16 × 16 i32 each, weight row major).
#[repr(C, align(64))]
struct CBuf([[i32; GROUP * GROUP]; 2]);

/// The rows of `w` for a grid call with block bytes `bytes`: `Some(n)`, or None after filling `y`
/// with NaN when the lengths disagree (`debug_assert` in debug builds) — see
/// [`super::Q8GridFn`].
fn grid_rows(w: &[u8], x: &Q8Tiles, y: &mut [f32], bytes: usize) -> Option<usize> {
    let rows = x.rows();
    let n = y.len().checked_div(rows).unwrap_or(0);
    let ok = n * rows == y.len() && w.len() == n * x.blocks() * bytes;
    debug_assert!(
        ok,
        "Q8_K grid: weight bytes {} / packed rows {} of {} blocks / outputs {} (block {bytes} bytes)",
        w.len(),
        rows,
        x.blocks(),
        y.len()
    );
    if !ok {
        y.fill(f32::NAN);
        return None;
    }
    Some(n)
}

/// The grid loop (module note) for blocks of `B` bytes, `unpack` writing a block's effective
/// weights and returning its scales; `MINS` selects Q2_K's epilogue, else Q3_K's.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn grid<const B: usize, const MINS: bool>(
    w: &[u8],
    x: &Q8Tiles,
    y: &mut [f32],
    mut unpack: impl FnMut(&[u8; B], &mut [u8; 256]) -> Scales,
) {
    let Some(n) = grid_rows(w, x, y, B) else {
        return;
    };
    let (rows, nb, groups) = (x.rows(), x.blocks(), x.groups());
    if y.is_empty() {
        return;
    }
    // The 16 rows of a row group unpacked whole, row by row (sequential reads of the weights):
    // block `b` of row `r` at `a[r·nb + b]`, its scales at `sc[r·nb + b]`.
    let mut a = vec![Unpacked([0; 256]); GROUP * nb];
    let mut sc = vec![Scales::ZERO; GROUP * nb];
    let mut c = CBuf([[0; GROUP * GROUP]; 2]);
    let mut acc = vec![[_mm512_setzero_ps(); GROUP]; groups];
    // SAFETY: the CPU has AMX and the OS granted it (checked before this kernel was handed out);
    // `CONFIG` is a valid palette-1 configuration.
    unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
    for r0 in (0..n).step_by(GROUP) {
        let nr = GROUP.min(n - r0);
        for g in acc.iter_mut() {
            *g = [_mm512_setzero_ps(); GROUP];
        }
        let row_blocks = w[r0 * nb * B..(r0 + nr) * nb * B].as_chunks::<B>().0;
        for ((block, dst), s) in row_blocks.iter().zip(a.iter_mut()).zip(sc.iter_mut()) {
            *s = unpack(block, &mut dst.0);
        }
        if nr < GROUP {
            a[nr * nb..].fill(Unpacked([0; 256]));
            sc[nr * nb..].fill(Scales::ZERO);
        }
        for b in 0..nb {
            // SAFETY: four 16 × 64-byte reads at `a[b] + 64c` with stride `nb · 256`: row `r`
            // reads `a[r·nb + b]`, inside the buffer of 16 · nb blocks.
            unsafe {
                asm!(
                    "tileloadd tmm2, [{p} + {s} * 1]",
                    "tileloadd tmm3, [{p} + {s} * 1 + 64]",
                    "tileloadd tmm4, [{p} + {s} * 1 + 128]",
                    "tileloadd tmm5, [{p} + {s} * 1 + 192]",
                    p = in(reg) a[b].0.as_ptr(),
                    s = in(reg) nb * 256,
                    options(nostack, readonly),
                )
            };
            for g in (0..groups).step_by(2) {
                let first: *const Tile = &x.tiles[(g * nb + b) * 4];
                // SAFETY: four consecutive 1 KiB tiles of group `g` (and `g + 1`), block `b`;
                // two 1 KiB stores into `c`.
                unsafe {
                    if g + 1 < groups {
                        let second: *const Tile = &x.tiles[((g + 1) * nb + b) * 4];
                        asm!(
                            "tilezero tmm0",
                            "tilezero tmm1",
                            "tileloadd tmm6, [{x} + {s} * 1]",
                            "tileloadd tmm7, [{y} + {s} * 1]",
                            "tdpbusd tmm0, tmm2, tmm6",
                            "tdpbusd tmm1, tmm2, tmm7",
                            "tileloadd tmm6, [{x} + {s} * 1 + 1024]",
                            "tileloadd tmm7, [{y} + {s} * 1 + 1024]",
                            "tdpbusd tmm0, tmm3, tmm6",
                            "tdpbusd tmm1, tmm3, tmm7",
                            "tileloadd tmm6, [{x} + {s} * 1 + 2048]",
                            "tileloadd tmm7, [{y} + {s} * 1 + 2048]",
                            "tdpbusd tmm0, tmm4, tmm6",
                            "tdpbusd tmm1, tmm4, tmm7",
                            "tileloadd tmm6, [{x} + {s} * 1 + 3072]",
                            "tileloadd tmm7, [{y} + {s} * 1 + 3072]",
                            "tdpbusd tmm0, tmm5, tmm6",
                            "tdpbusd tmm1, tmm5, tmm7",
                            "tilestored [{c0} + {s} * 1], tmm0",
                            "tilestored [{c1} + {s} * 1], tmm1",
                            x = in(reg) first,
                            y = in(reg) second,
                            c0 = in(reg) c.0[0].as_mut_ptr(),
                            c1 = in(reg) c.0[1].as_mut_ptr(),
                            s = in(reg) 64usize,
                            options(nostack),
                        );
                    } else {
                        asm!(
                            "tilezero tmm0",
                            "tileloadd tmm6, [{x} + {s} * 1]",
                            "tdpbusd tmm0, tmm2, tmm6",
                            "tileloadd tmm6, [{x} + {s} * 1 + 1024]",
                            "tdpbusd tmm0, tmm3, tmm6",
                            "tileloadd tmm6, [{x} + {s} * 1 + 2048]",
                            "tdpbusd tmm0, tmm4, tmm6",
                            "tileloadd tmm6, [{x} + {s} * 1 + 3072]",
                            "tdpbusd tmm0, tmm5, tmm6",
                            "tilestored [{c0} + {s} * 1], tmm0",
                            x = in(reg) first,
                            c0 = in(reg) c.0[0].as_mut_ptr(),
                            s = in(reg) 64usize,
                            options(nostack),
                        );
                    }
                }
                for (h, cg) in c.0.iter().enumerate().take(groups.min(g + 2) - g) {
                    let scales = sc[b..].iter().step_by(nb).take(nr);
                    epilogue::<MINS>(cg, x, (g + h) * nb + b, scales, &mut acc[g + h]);
                }
            }
        }
        let mut lanes = [0f32; GROUP];
        for (g, accg) in acc.iter().enumerate() {
            let t0 = g * GROUP;
            let valid = GROUP.min(rows - t0);
            for (r, v) in accg.iter().enumerate().take(nr) {
                // SAFETY: 16 f32 into a [f32; 16].
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
                let at = (r0 + r) * rows + t0;
                y[at..at + valid].copy_from_slice(&lanes[..valid]);
            }
        }
    }
    // SAFETY: releases this thread's tile state (AMX granted, see above).
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Adds block `gb`'s values for one activation group (the stored `C` tile `c`) into `acc`, one
/// zmm of 16 activation rows per weight row with scales `sc` (module note).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn epilogue<'s, const MINS: bool>(
    c: &[i32; GROUP * GROUP],
    x: &Q8Tiles,
    gb: usize,
    sc: impl Iterator<Item = &'s Scales>,
    acc: &mut [__m512; GROUP],
) {
    // SAFETY (loads): each reads 16 lanes from an array of 16.
    let d8 = unsafe { _mm512_loadu_ps(x.d8[gb].as_ptr()) };
    let pairs: [__m512i; 8] =
        std::array::from_fn(|i| unsafe { _mm512_loadu_si512(x.pairs[gb][i].as_ptr().cast()) });
    let neg127 = unsafe { _mm512_loadu_si512(x.neg127[gb].as_ptr().cast()) };
    for ((s, a), cr) in sc.zip(acc.iter_mut()).zip(c.chunks_exact(GROUP)) {
        let sum = unsafe { _mm512_loadu_si512(cr.as_ptr().cast()) };
        let d = _mm512_set1_ps(s.d);
        let v = if MINS {
            let mut m = _mm512_setzero_si512();
            for (p, &mn) in pairs.iter().zip(&s.mins) {
                m = _mm512_dpwssd_epi32(m, *p, _mm512_set1_epi32(mn));
            }
            _mm512_sub_ps(
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(sum)),
                _mm512_mul_ps(_mm512_set1_ps(s.dmin), _mm512_cvtepi32_ps(m)),
            )
        } else {
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(sum, neg127)))
        };
        *a = _mm512_add_ps(*a, _mm512_mul_ps(d8, v));
    }
}
