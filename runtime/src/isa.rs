//! The CPU's instruction sets, probed once per process: the one probe every SIMD kernel of the
//! runtime dispatches on (the cpu backend's Q8_K kernels and f32 lanes, the reference dots'
//! AVX-512 rows). A kernel that needs a set is handed out only when [`isa`] reports it, so the
//! `#[target_feature]` functions behind it run only on CPUs that have their features.
//!
//! AMX also needs the OS: Linux grants the tile data state on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), asked here once.

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

/// The [`Isa`] of this process's CPU, probed on first use.
pub fn isa() -> &'static Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    ISA.get_or_init(probe)
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
}
