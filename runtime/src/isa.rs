//! The CPU's instruction sets, probed once per process: the one probe every SIMD kernel of the
//! runtime dispatches on (the cpu backend's Q8_K kernels and f32 lanes, the reference dots'
//! AVX-512 rows). A kernel that needs a set is handed out only when [`isa`] reports it, so the
//! `#[target_feature]` functions behind it run only on CPUs that have their features.
//!
//! AMX also needs the OS: Linux grants the tile data state on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), asked here once.
//!
//! Override. [`limit`] caps what [`isa`] reports at an [`IsaLevel`] (`--cpu-isa`), for the whole
//! process and before anything has read it, so that every kernel family below the machine's own
//! can be run and measured on it (an AVX2 host's kernels on an AVX-512 one). A cap only removes
//! features: a kernel handed out under it still runs only where the CPU has its features.

use std::sync::OnceLock;

/// What this CPU (and OS, for AMX) offers, as the kernels group it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Isa {
    /// AVX2 with FMA and F16C.
    pub avx2: bool,
    /// AVX-512F (the f32 lanes, the reference dots' AVX-512 rows).
    pub avx512f: bool,
    /// AVX-512F and BW (the Q8_K quantizer).
    pub avx512bw: bool,
    /// AVX-512 F/BW/VL/VNNI with the AVX2 set: the VNNI dots, decode and tile kernels.
    pub avx512_vnni: bool,
    /// AMX-TILE and AMX-INT8 granted by the OS, with the VNNI set: the AMX tile kernels.
    pub amx: bool,
}

impl Isa {
    /// The widest tier the Q8_K kernels run on here: `amx`, `avx512-vnni`, `avx2` or `scalar`.
    pub fn tier(&self) -> &'static str {
        if self.amx {
            "amx"
        } else if self.avx512_vnni {
            "avx512-vnni"
        } else if self.avx2 {
            "avx2"
        } else {
            "scalar"
        }
    }
}

/// A kernel family `--cpu-isa` names, each with exactly the features its kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum IsaLevel {
    /// No SIMD beyond the target's baseline (SSE2 on x86_64): the scalar kernels. (The f32
    /// GEMM of prefill, `matrixmultiply::sgemm`, picks its own kernels by the CPU at every level.)
    Scalar,
    /// AVX2, FMA and F16C.
    Avx2,
    /// The AVX2 set and AVX-512 F, BW, VL and VNNI.
    Avx512Vnni,
    /// The AVX-512 VNNI set and AMX-TILE, AMX-INT8 with the OS's grant of the tile state.
    Amx,
}

impl IsaLevel {
    /// Every level, lowest first.
    pub const ALL: [IsaLevel; 4] = [
        IsaLevel::Scalar,
        IsaLevel::Avx2,
        IsaLevel::Avx512Vnni,
        IsaLevel::Amx,
    ];

    /// Its name: `scalar`, `avx2`, `avx512-vnni` or `amx` (as [`Isa::tier`]).
    pub fn name(self) -> &'static str {
        match self {
            IsaLevel::Scalar => "scalar",
            IsaLevel::Avx2 => "avx2",
            IsaLevel::Avx512Vnni => "avx512-vnni",
            IsaLevel::Amx => "amx",
        }
    }

    /// The features it needs, as a message names them.
    fn features(self) -> &'static str {
        match self {
            IsaLevel::Scalar => "none",
            IsaLevel::Avx2 => "AVX2, FMA and F16C",
            IsaLevel::Avx512Vnni => "AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI",
            IsaLevel::Amx => "AVX-512 VNNI and AMX-TILE/AMX-INT8 granted by the OS",
        }
    }
}

impl std::str::FromStr for IsaLevel {
    type Err = String;

    /// `scalar`, `avx2`, `avx512-vnni` or `amx`.
    fn from_str(s: &str) -> Result<Self, String> {
        IsaLevel::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| format!("unknown ISA `{s}` (expected scalar, avx2, avx512-vnni or amx)"))
    }
}

impl std::fmt::Display for IsaLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why [`limit`] refused a level.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// The CPU (or OS) lacks a feature of the level.
    #[error("--cpu-isa {level}: this CPU lacks it (it needs {needs}; this one offers {offers})")]
    Missing {
        /// The level asked for.
        level: IsaLevel,
        /// Its features, in words.
        needs: &'static str,
        /// The widest tier this CPU has.
        offers: &'static str,
    },
    /// The process had already fixed its ISA otherwise (a kernel had read it, or another cap).
    #[error("--cpu-isa {level}: this process already runs its kernels at {fixed}; the ISA is one per process")]
    Fixed {
        /// The level asked for.
        level: IsaLevel,
        /// The tier in force.
        fixed: &'static str,
    },
}

impl Isa {
    /// This ISA capped at `level`: the features above it removed.
    ///
    /// Errors: [`IsaError::Missing`] when this ISA lacks a feature `level` needs.
    pub fn limited_to(self, level: IsaLevel) -> Result<Isa, IsaError> {
        let has = match level {
            IsaLevel::Scalar => true,
            IsaLevel::Avx2 => self.avx2,
            IsaLevel::Avx512Vnni => self.avx512_vnni,
            IsaLevel::Amx => self.amx,
        };
        if !has {
            return Err(IsaError::Missing {
                level,
                needs: level.features(),
                offers: self.tier(),
            });
        }
        let wide = level >= IsaLevel::Avx512Vnni;
        Ok(Isa {
            avx2: level >= IsaLevel::Avx2,
            avx512f: wide,
            avx512bw: wide,
            avx512_vnni: wide,
            amx: level == IsaLevel::Amx,
        })
    }
}

static ISA: OnceLock<Isa> = OnceLock::new();

/// The [`Isa`] this process's kernels use: the CPU's, probed on first use, or as [`limit`]
/// capped it.
pub fn isa() -> &'static Isa {
    ISA.get_or_init(probe)
}

/// Caps [`isa`] at `level` for the rest of the process (`--cpu-isa`).
///
/// Errors: [`IsaError::Missing`] when the CPU lacks the level; [`IsaError::Fixed`] when the
/// process already uses another ISA (read before this call, or capped otherwise). Capping at the
/// ISA already in force is no error.
pub fn limit(level: IsaLevel) -> Result<(), IsaError> {
    let want = probe().limited_to(level)?;
    let fixed = ISA.get_or_init(|| want);
    if *fixed == want {
        Ok(())
    } else {
        Err(IsaError::Fixed {
            level,
            fixed: fixed.tier(),
        })
    }
}

#[cfg(target_arch = "x86_64")]
fn probe() -> Isa {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    let avx512f = has!("avx512f");
    let avx512bw = avx512f && has!("avx512bw");
    let avx512_vnni = avx2 && avx512bw && has!("avx512vl") && has!("avx512vnni");
    Isa {
        avx2,
        avx512f,
        avx512bw,
        avx512_vnni,
        amx: avx512_vnni && amx_int8() && amx_permitted(),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn probe() -> Isa {
    Isa::default()
}

/// CPUID leaf 7: AMX-TILE (EDX bit 24) and AMX-INT8 (bit 25).
#[cfg(target_arch = "x86_64")]
fn amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
    #[allow(unused_unsafe)]
    // SAFETY: CPUID is available on every x86_64 CPU; leaf 7 is read only when the maximum basic
    // leaf includes it.
    let leaf7 = unsafe { (__get_cpuid_max(0).0 >= 7).then(|| __cpuid_count(7, 0)) };
    leaf7.is_some_and(|l| l.edx & (1 << 24) != 0 && l.edx & (1 << 25) != 0)
}

/// Asks Linux for the AMX tile data state (`ARCH_REQ_XCOMP_PERM` = 0x1023,
/// `XFEATURE_XTILEDATA` = 18; `arch/x86/include/uapi/asm/prctl.h`): true when granted.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_permitted() -> bool {
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

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn amx_permitted() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiers nest: each implies the one below, as the kernels assume.
    #[test]
    fn the_tiers_nest() {
        let i = isa();
        assert!(!i.amx || i.avx512_vnni, "{i:?}");
        assert!(!i.avx512_vnni || (i.avx2 && i.avx512bw), "{i:?}");
        assert!(!i.avx512bw || i.avx512f, "{i:?}");
        assert_eq!(isa(), i, "probed once");
        eprintln!("this CPU: {i:?}, tier {}", i.tier());
    }

    /// A cap keeps exactly its level's features, is refused above the CPU's, and names both.
    #[test]
    fn levels_cap_to_exactly_their_features() {
        let full = Isa {
            avx2: true,
            avx512f: true,
            avx512bw: true,
            avx512_vnni: true,
            amx: true,
        };
        for level in IsaLevel::ALL {
            let capped = full.limited_to(level).unwrap();
            assert_eq!(capped.tier(), level.name());
            assert_eq!(level.name().parse::<IsaLevel>().unwrap(), level);
            for lower in IsaLevel::ALL.into_iter().filter(|&l| l <= level) {
                assert_eq!(
                    capped.limited_to(lower).unwrap(),
                    full.limited_to(lower).unwrap()
                );
            }
        }
        assert_eq!(full.limited_to(IsaLevel::Scalar).unwrap(), Isa::default());
        let avx512f_only = Isa {
            avx2: true,
            avx512f: true,
            ..Isa::default()
        };
        assert_eq!(
            avx512f_only.limited_to(IsaLevel::Avx2).unwrap(),
            Isa {
                avx2: true,
                ..Isa::default()
            },
            "AVX-512F without VNNI is dropped at avx2"
        );
        let e = avx512f_only.limited_to(IsaLevel::Avx512Vnni).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--cpu-isa avx512-vnni: this CPU lacks it (it needs AVX2, FMA, F16C and AVX-512 \
             F/BW/VL/VNNI; this one offers avx2)"
        );
        assert!(Isa::default().limited_to(IsaLevel::Avx2).is_err());
        assert!("avx512".parse::<IsaLevel>().is_err());
    }

    /// Capping at the ISA in force is accepted; another cap afterwards is refused.
    #[test]
    fn a_cap_is_one_per_process() {
        let here = *isa();
        for level in IsaLevel::ALL {
            match probe().limited_to(level) {
                Ok(capped) if capped == here => assert_eq!(limit(level), Ok(())),
                Ok(_) => assert_eq!(
                    limit(level),
                    Err(IsaError::Fixed {
                        level,
                        fixed: here.tier()
                    })
                ),
                Err(missing) => assert_eq!(limit(level), Err(missing)),
            }
        }
        assert_eq!(isa(), &here);
    }
}
