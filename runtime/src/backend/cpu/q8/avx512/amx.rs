//! The AMX backend of the grid kernels (`grid.rs`): Intel Advanced Matrix Extensions' tile
//! unit computes the integer sums of a block for 16 weight rows × 16 activation rows at a time
//! (`tdpbusd`: u8 × i8, four products added into each i32, exact).
//!
//! Algorithm. Per call the tile configuration is loaded once ([`configure`]: palette 1, all
//! eight tiles 16 rows × 64 bytes). Per 256-element block the 16 unpacked weight rows are loaded
//! as four `A` tiles ([`load_weights`]: `tmm2` to `tmm5`, one per 64 codes); per two activation
//! groups ([`sums`]) their four `B` tiles each (`tmm6`, `tmm7`) meet them in four `tdpbusd` into
//! two `C` tiles (`tmm0`, `tmm1`), which are stored for the shared epilogue. [`release`] frees
//! the tile state at the end of the call. Instructions are written with `asm!` (Rust's AMX
//! intrinsics are unstable); no compiler-generated code touches the tile registers, so they
//! keep their values between the `asm!` blocks of one call.
//!
//! Requirements: CPUID AMX-TILE and AMX-INT8, the AVX-512 features of the VNNI kernels, and the
//! Linux kernel's permission to use the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`), asked once per process. Source for the instruction semantics: Intel 64
//! and IA-32 Architectures Software Developer's Manual, vol. 2, `TDPBUSD`, `TILELOADD`, `LDTILECFG`.

use super::tiles::{CBuf, Q8Tiles, Tile, Unpacked, GROUP};
use std::arch::asm;

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

/// Loads the tile configuration ([`CONFIG`]).
///
/// # Safety
/// [`detected`] returned true (the CPU has AMX and the OS granted the tile state).
pub(crate) unsafe fn configure() {
    // SAFETY: by the caller's contract; `CONFIG` is a valid palette-1 configuration.
    unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
}

/// Frees this thread's tile state.
///
/// # Safety
/// As [`configure`].
pub(crate) unsafe fn release() {
    // SAFETY: by the caller's contract.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Loads one block of the 16 unpacked weight rows `a` (row by row: row `r` at `256r`) as the
/// four `A` tiles `tmm2` to `tmm5`.
///
/// # Safety
/// As [`configure`], after it in this call.
pub(crate) unsafe fn load_weights(a: &Unpacked) {
    const _: () = assert!(std::mem::size_of::<Unpacked>() == GROUP * 256);
    // SAFETY: four 16 × 64-byte reads at `a + 64c` with stride 256: row `r` reads bytes
    // `256r .. 256r + 256` of the 4 KiB block; AMX by the contract.
    unsafe {
        asm!(
            "tileloadd tmm2, [{p} + {s} * 1]",
            "tileloadd tmm3, [{p} + {s} * 1 + 64]",
            "tileloadd tmm4, [{p} + {s} * 1 + 128]",
            "tileloadd tmm5, [{p} + {s} * 1 + 192]",
            p = in(reg) a.0.as_ptr(),
            s = in(reg) 256usize,
            options(nostack, readonly),
        )
    };
}

/// The integer sums of the loaded weight tiles with block `b` of activation group `g` into
/// `c.0[0]`, and of group `g + 1` into `c.0[1]` when it exists: returns the groups done (1 or 2).
///
/// # Safety
/// As [`load_weights`], after it for block `b`; `g` is a group of `x` (checked).
pub(crate) unsafe fn sums(x: &Q8Tiles, g: usize, b: usize, c: &mut CBuf) -> usize {
    let (groups, nb) = (x.groups(), x.blocks());
    assert!(
        g < groups && b < nb,
        "AMX activation tiles outside the packing"
    );
    let first: *const Tile = &x.tiles[(g * nb + b) * 4];
    // SAFETY: four consecutive 1 KiB tiles of group `g` (and `g + 1`), block `b`, inside the
    // packing (asserted); two 1 KiB stores into `c`; AMX by the contract.
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
            2
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
            1
        }
    }
}
