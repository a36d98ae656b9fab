//! Dequant device functions: one function per ggml type that turns 16 consecutive elements of a
//! quantized row into f32, bit-exact with ggml's `dequantize_row_*`, written once and emitted to
//! the three dialects (C++ for HIP and CUDA, GLSL for Vulkan).
//!
//! Algorithm. Every type with a device function is a block format of `QK` elements in `B` bytes
//! (`QK` = 1 for F32/F16/BF16, 32 for the legacy formats and IQ4_NL, 256 for the k- and
//! i-quants; sizes from [`GgmlType`]). `QK` is 1 or a multiple of 16, and in every format each
//! 16-element chunk of a block depends only on the block's shared fields (the f16 `d`/`dmin`)
//! and on its own sub-block scale and quant bits. So `aubier_dq16_<type>(row, c, y)` finds
//! block `⌊16c / QK⌋` at byte `⌊16c / QK⌋·B` of `row`, chunk `s = c mod (QK/16)` inside it,
//! decodes that chunk's scale, and writes elements `16c .. 16c + 16` to `y[0..16]`. A GPU
//! mat-vec calls it with `c` = its lane's chunk, so a warp reads a row in coalesced 16-element
//! pieces and never decodes a whole 256-element super-block per thread.
//!
//! Numerics. Each value is computed with the f32 operations, in the order, of the runtime's CPU
//! decoders (`aubier_runtime::gguf::quant`, which follow llama.cpp `ggml-quants.c` and are
//! bit-exact with gguf-py `gguf.quants.dequantize`): `dl = d·sc`, `y = dl·q − ml`,
//! `db = d·(0.5 + s)·0.25`, the sign applied last. Every product in these formulas is exact in
//! f32 (an f16 significand of 11 bits times integers of at most 13 bits together, e.g. Q5_K
//! `d·sc·q` ≤ 11 + 6 + 5 bits), so a compiler that contracts `dl·q − ml` into an FMA (HIP and
//! CUDA do by default) still rounds once, at the same place: the result does not depend on
//! `-ffp-contract`. f16 is widened by integer bit manipulation (subnormals through an exact
//! int→float conversion), so flush-to-zero modes cannot change a value either.
//!
//! Loads. Quant bytes are read as words and unpacked in registers, never from a repacked copy:
//! the 16 bytes a chunk reads (Q2_K's two-bit planes, Q6_K's `ql` and `qh` runs, a legacy
//! block's nibbles, …) are four words. The k-quants load them by `aubier_load16_w8`: the two or
//! three 8-byte aligned 64-bit words that cover the run, funnel-shifted in registers by the run's
//! offset in its word — 3 loads where Q3_K (110 B) and Q6_K (210 B) took eight 16-bit ones, since
//! their blocks are only 2-byte aligned. Q4_K (144 B) and Q5_K (176 B) blocks are whole 8-byte
//! words, so every run of theirs starts 8-byte aligned: `aubier_load16_a8`, two 64-bit loads and
//! no shift; and their 16-byte head (`d`, `dmin`, the 12 packed scale bytes) is two 64-bit loads,
//! the 6-bit scale and min unpacked from its words in registers (`aubier_scale_min_k4`, no
//! branch), where a chunk took a 32-bit load and three to five byte loads — as ggml's
//! `vulkan-shaders/mul_mat_vec_q5_k.comp` reads `scales` as words (`data_a_packed16`) and masks
//! them in registers. On lavapipe the Q5_K `attn_output` mat-vec took 0.7–0.85× its time
//! (docs/BENCHMARKS.md, "Q4_K and Q5_K heads as words"). Learned from ggml's Vulkan mat-vecs
//! (llama.cpp PR 10387, "vulkan: further optimize mul_mat_vec using larger loads": aliases of the quant blocks
//! as 16-bit words, 32-bit where the block size is a multiple of 4), taken one step further: an
//! aligned word is legal on every GPU whatever the block's alignment, and on lavapipe, where each
//! load is a loop over the SIMD lanes, the count of loads is what a mat-vec pays for. The
//! covering words reach up to 6 bytes before and after the run: before, into the same weight
//! (which starts 8-byte aligned: GGUF's 32-byte data alignment, one device buffer per dense
//! weight, expert slots and imports at multiples of 16 and of the page); after, into the same
//! block (Q4_K and Q5_K runs are 8-byte aligned; a Q2_K, Q3_K or Q6_K run ends at least as many
//! bytes before its block's end as its last word reaches past it: 4, 14 and 18 or more; Q4_K
//! and Q5_K read whole words of their own block).
//! The other types load by `aubier_load16_a4` (four 32-bit loads) where the block size and the
//! run's offset are multiples of 4 (Q4_1, Q5_1, IQ4_XS; F32 rows, four per chunk) and by
//! `aubier_load16_a2` (eight 16-bit loads) where a block is only 2-byte aligned (Q4_0 18 B, Q8_0 34 B, IQ2_XXS 66 B, …: their runs
//! end at the block's end, so a covering word could pass the weight's last byte; 32-bit loads
//! there are undefined on hardware); `aubier_byte(w, l)` takes byte `l` out of them. Every f16
//! scale is one 16-bit load (a `d`, `dmin` pair at a 4-byte offset of a 4-byte block one 32-bit
//! load). Every block size is even and every word sits at an even offset of its block, so this
//! needs `row` to be 2-byte aligned, 4-byte aligned for the types of 4-byte blocks, 8-byte
//! aligned for Q4_K and Q5_K (whole-block rows of a weight that starts 8-byte aligned), and the
//! weight to start 8-byte aligned for the k-quants. Single scale bytes stay byte loads.
//! Words are little-endian, as every GPU and the host harness of `tests/kernels_quant.rs` are.
//!
//! One text, two languages. The helpers and bodies are written once, in the common subset of
//! C++ and GLSL 4.60: functional casts (`float(x)`, `uint(x)`), explicit `!= 0u` conditions,
//! `uint` / `uint64_t` / `int` / `float` only, a byte address `aubier_ptr` advanced by integer
//! addition, every f32 local `precise`.
//! What the two languages spell differently is a short guarded block of definitions,
//! [`Lang::prims`]: the function and table qualifiers (`AUBIER_FN`, `AUBIER_TABLE`), the array
//! parameters (`AUBIER_OUT16(y)`: C++ `float*`, GLSL `out precise float[16]`; `AUBIER_INOUT16`,
//! `AUBIER_OUTU`, `AUBIER_OUT4` / `AUBIER_IN4` for four words), `aubier_ptr`, the loads
//! (`aubier_b8` a byte, `aubier_ld16` an aligned little-endian 16-bit word, `aubier_ld32` an
//! aligned 32-bit word, each returned as a `uint`; `aubier_ld64` an aligned 64-bit word as a
//! `uint64_t`), `aubier_off8` (an address modulo 8) and `aubier_as_f32`; in C++ `precise` is empty (the
//! kernels are compiled without contraction, `#pragma clang fp contract(off)`), in GLSL it makes
//! every f32 operation SPIR-V `NoContraction`.
//!
//! Emitted text. [`device_fn`] writes the definitions of its language and the helpers the type
//! needs (each wrapped in an `#ifndef AUBIER_DQ_…` guard) and then the function;
//! [`device_tables`] writes the grid and sign tables (each wrapped in `#ifndef AUBIER_TABLE_…`).
//! So the outputs for any set of types can be concatenated into one translation unit, tables
//! first. The text uses only builtin C++ or GLSL (no headers); in C++ `__device__` and
//! `__constant__` are macros the dialect's prelude defines, in GLSL `AubierBytes` is the byte
//! buffer reference of [`super::glsl`]'s prelude. Tables come from [`crate::quant_grids`], the
//! runtime's own; GLSL tables are not `const` (glslang copies a dynamically indexed `const`
//! array into a function variable at every use, which lavapipe compiles three to four times
//! slower).

use std::fmt::{self, Display, Formatter};

use super::ir::{Kernel, ParamKind};
use crate::ggml_type::GgmlType;
use crate::quant_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
};

/// The type table: one line per type with a device function, `TYPE => body`. The names are
/// [`GgmlType`] variant names, which are gguf-py's spellings.
macro_rules! device_types {
    ($( $ty:ident => $body:expr; )*) => {
        /// gguf-py names of the types with a device function, in table order.
        const SUPPORTED: &[&str] = &[$( stringify!($ty), )*];

        /// The body of `ty`'s device function, or `None` when it has none.
        fn body(ty: GgmlType) -> Option<Body> {
            match ty {
                $( GgmlType::$ty => Some($body), )*
                _ => None,
            }
        }
    };
}

device_types! {
    F32 => Body::Float(Float::F32);
    F16 => Body::Float(Float::F16);
    BF16 => Body::Float(Float::BF16);
    Q4_0 => Body::Legacy(Legacy::Q4_0);
    Q4_1 => Body::Legacy(Legacy::Q4_1);
    Q5_0 => Body::Legacy(Legacy::Q5_0);
    Q5_1 => Body::Legacy(Legacy::Q5_1);
    Q8_0 => Body::Legacy(Legacy::Q8_0);
    IQ4_NL => Body::Legacy(Legacy::IQ4_NL);
    Q2_K => Body::KQuant(KQuant::Q2_K);
    Q3_K => Body::KQuant(KQuant::Q3_K);
    Q4_K => Body::KQuant(KQuant::Q4_K);
    Q5_K => Body::KQuant(KQuant::Q5_K);
    Q6_K => Body::KQuant(KQuant::Q6_K);
    IQ2_XXS => Body::Iq2(Iq2::IQ2_XXS);
    IQ2_XS => Body::Iq2(Iq2::IQ2_XS);
    IQ2_S => Body::Iq2(Iq2::IQ2_S);
    IQ3_XXS => Body::Iq3(Iq3::IQ3_XXS);
    IQ3_S => Body::Iq3(Iq3::IQ3_S);
    IQ1_S => Body::Iq1(Iq1::IQ1_S);
    IQ1_M => Body::Iq1(Iq1::IQ1_M);
    IQ4_XS => Body::Iq4Xs;
}

/// The ggml types that have a device function, as gguf-py names them (`"Q2_K"`, `"IQ2_XXS"`):
/// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K … Q6_K, IQ2_XXS, IQ2_XS, IQ2_S,
/// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M and IQ4_XS — every type a 2-bit Mistral Small 4 GGUF holds
/// (MODEL.md §6), plus the legacy fallbacks Q4_1/Q5_0/Q5_1.
pub fn supported_types() -> &'static [&'static str] {
    SUPPORTED
}

/// The type named `ggml_type` (gguf-py's spelling, ASCII case ignored) and its body.
fn lookup(ggml_type: &str) -> Option<(GgmlType, Body)> {
    let ty = GgmlType::ALL
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(ggml_type))?;
    Some((ty, body(ty)?))
}

/// The language a dialect's source is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    /// Header-free C++ device code (HIP, CUDA).
    Cpp,
    /// GLSL 4.60 (Vulkan), with the extensions of [`super::glsl`]'s prelude.
    Glsl,
}

impl Lang {
    /// The guarded definitions the shared dequant text needs in this language (the module note).
    pub fn prims(self) -> &'static str {
        match self {
            Lang::Cpp => {
                "#ifndef AUBIER_DQ_PRIMS
#define AUBIER_DQ_PRIMS
#define AUBIER_FN __device__ inline
#define AUBIER_TABLE __constant__ const
#define AUBIER_OUT16(y) float* y
#define AUBIER_INOUT16(y) float* y
#define AUBIER_OUTU(x) uint& x
#define precise
typedef unsigned int uint;
typedef unsigned long uint64_t;
typedef const unsigned char* aubier_ptr;
#define AUBIER_OUT4(w) uint* w
#define AUBIER_IN4(w) const uint* w
typedef unsigned short __attribute__((may_alias)) aubier_h16;
typedef unsigned int __attribute__((may_alias)) aubier_w32;
typedef unsigned long __attribute__((may_alias)) aubier_w64;
__device__ inline uint aubier_b8(aubier_ptr p) { return *p; }
__device__ inline uint aubier_ld16(aubier_ptr p) { return *(const aubier_h16*)p; }
__device__ inline uint aubier_ld32(aubier_ptr p) { return *(const aubier_w32*)p; }
__device__ inline uint64_t aubier_ld64(aubier_ptr p) { return *(const aubier_w64*)p; }
__device__ inline uint aubier_off8(aubier_ptr p) { return uint((unsigned long)p & 7ul); }
/* The f32 whose IEEE bits are u. */
__device__ inline float aubier_as_f32(uint u) {
  union { uint u; float f; } x;
  x.u = u;
  return x.f;
}
#endif
"
            }
            Lang::Glsl => {
                "#ifndef AUBIER_DQ_PRIMS
#define AUBIER_DQ_PRIMS
#define AUBIER_FN
#define AUBIER_TABLE
#define AUBIER_OUT16(y) out precise float y[16]
#define AUBIER_INOUT16(y) inout precise float y[16]
#define AUBIER_OUTU(x) out uint x
#define AUBIER_OUT4(w) out uint w[4]
#define AUBIER_IN4(w) uint w[4]
#define aubier_ptr uint64_t
uint aubier_b8(aubier_ptr p) { return uint(AubierBytes(p).v[0]); }
uint aubier_ld16(aubier_ptr p) { return uint(AubierU16(p).v[0]); }
uint aubier_ld32(aubier_ptr p) { return AubierU32(p).v[0]; }
uint64_t aubier_ld64(aubier_ptr p) { return AubierU64(p).v[0]; }
uint aubier_off8(aubier_ptr p) { return uint(p & 7ul); }
float aubier_as_f32(uint u) { return uintBitsToFloat(u); }
#endif
"
            }
        }
    }
}

/// The device function of `ggml_type` (gguf-py's name, e.g. `"Q2_K"`; ASCII case ignored) in
/// language `lang`, preceded by the definitions and helpers it needs:
///
/// ```text
/// AUBIER_FN void aubier_dq16_<type>(aubier_ptr row, int c, AUBIER_OUT16(y))
/// ```
///
/// (C++: `__device__ inline void …(const unsigned char* row, int c, float* y)`; GLSL:
/// `void …(uint64_t row, int c, out precise float y[16])` with `row` a device address), with
/// `<type>` the name lower-cased (`aubier_dq16_q2_k`). It writes elements `16c .. 16c + 16`
/// of a row (ggml `ne0` order) to `y[0..16]`, bit-exact with llama.cpp `dequantize_row_*`
/// (`ggml/src/ggml-quants.c`) and gguf-py `gguf.quants.dequantize`. `row` is the row's first
/// byte, 2-byte aligned, 4-byte aligned when the type's block size is a multiple of 4, 8-byte
/// aligned for Q4_K and Q5_K (the module note's loads); the caller guarantees `0 ≤ 16c` and
/// `16c + 16 ≤` the row length, which is a whole number of blocks. The tables it reads are [`device_tables`]`(ggml_type)`,
/// which must come earlier in the translation unit.
///
/// Returns `None` for a type without a device function (see [`supported_types`]) or an
/// unknown name.
pub fn device_fn(ggml_type: &str, lang: Lang) -> Option<impl Display> {
    let (ty, body) = lookup(ggml_type)?;
    Some(DeviceFn { ty, body, lang })
}

/// The lookup tables that [`device_fn`]`(ggml_type, lang)` reads (after `lang`'s definitions),
/// each in an `#ifndef AUBIER_TABLE_<NAME>` guard so types sharing a table can be emitted
/// together; empty for a type that reads none. The names are `aubier_` + the llama.cpp
/// `ggml-common.h` name (`aubier_iq2xxs_grid`, `aubier_ksigns_iq2xs`, `aubier_kvalues_iq4nl`,
/// …); the values are [`crate::quant_grids`]'s.
///
/// Returns `None` exactly when [`device_fn`] does.
pub fn device_tables(ggml_type: &str, lang: Lang) -> Option<impl Display> {
    let (_, body) = lookup(ggml_type)?;
    Some(Tables(body.tables(), lang))
}

/// One type's device function with its helpers.
struct DeviceFn {
    ty: GgmlType,
    body: Body,
    lang: Lang,
}

impl Display for DeviceFn {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(self.lang.prims())?;
        let mut done = Vec::new();
        for &h in self.body.helpers() {
            h.write_with_deps(f, &mut done)?;
        }
        let name = Lower(self.ty.name());
        writeln!(f, "/* {}: {} */", self.ty.name(), self.body.layout())?;
        writeln!(
            f,
            "AUBIER_FN void aubier_dq16_{name}(aubier_ptr row, int c, AUBIER_OUT16(y)) {{"
        )?;
        write!(
            f,
            "{}",
            Locate {
                qk: self.ty.block_size(),
                bytes: self.ty.type_size(),
            }
        )?;
        write!(f, "{}", self.body)?;
        writeln!(f, "}}")
    }
}

/// A name written in ASCII lower case.
struct Lower<'a>(&'a str);

impl Display for Lower<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        self.0
            .chars()
            .try_for_each(|ch| write!(f, "{}", ch.to_ascii_lowercase()))
    }
}

/// The opening statements: `b` = the first byte of the block holding chunk `c`, and (for block
/// formats) `s` = the chunk's index inside the block.
struct Locate {
    /// Elements per block (1, or a multiple of 16).
    qk: usize,
    /// Bytes per block.
    bytes: usize,
}

impl Display for Locate {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if self.qk == 1 {
            writeln!(
                f,
                "  aubier_ptr b = row + uint64_t(c) * {}u;",
                16 * self.bytes
            )
        } else {
            let chunks = self.qk / 16;
            writeln!(
                f,
                "  aubier_ptr b = row + uint64_t(c / {chunks}) * {}u;",
                self.bytes
            )?;
            writeln!(f, "  const int s = c % {chunks};")
        }
    }
}

/// A shared helper function, emitted once per translation unit behind its guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Helper {
    /// `aubier_u16`, `aubier_u32`: little-endian loads; `aubier_i8`: a byte as int8.
    Bytes,
    /// `aubier_f16_bits`, `aubier_f16`: exact binary16 → f32 widening.
    F16,
    /// `aubier_put_signed`: grid bytes times a scale, with sign bits (IQ2 and IQ3 families).
    PutSigned,
    /// `aubier_iq_db`: the i-quant sub-block scale `d·(0.5 + s)·k`.
    IqScale,
    /// `aubier_put_iq1`: ternary grid bytes plus the ±1/8 shift, times a scale (IQ1 family).
    PutIq1,
    /// `aubier_scale_min_k4`: 6-bit scale and min of Q4_K/Q5_K (ggml `get_scale_min_k4`).
    ScaleMinK4,
    /// `aubier_q3k_scale`: the signed 6-bit sub-block scale of Q3_K.
    Q3kScale,
}

impl Helper {
    /// Helpers this one calls (emitted before it).
    fn deps(self) -> &'static [Helper] {
        match self {
            Helper::F16 | Helper::PutIq1 => &[Helper::Bytes],
            _ => &[],
        }
    }

    /// The include-guard macro.
    fn guard(self) -> &'static str {
        match self {
            Helper::Bytes => "AUBIER_DQ_BYTES",
            Helper::F16 => "AUBIER_DQ_F16",
            Helper::PutSigned => "AUBIER_DQ_PUT_SIGNED",
            Helper::IqScale => "AUBIER_DQ_IQ_SCALE",
            Helper::PutIq1 => "AUBIER_DQ_PUT_IQ1",
            Helper::ScaleMinK4 => "AUBIER_DQ_SCALE_MIN_K4",
            Helper::Q3kScale => "AUBIER_DQ_Q3K_SCALE",
        }
    }

    /// The shared text (without the guard).
    fn code(self) -> &'static str {
        match self {
            Helper::Bytes => {
                "/* Little-endian u16 / u32 at a 2-byte aligned p (one / two 16-bit loads); a byte value
   0..255 read as int8. */
AUBIER_FN uint aubier_u16(aubier_ptr p) { return aubier_ld16(p); }
AUBIER_FN uint aubier_u32(aubier_ptr p) { return aubier_ld16(p) | (aubier_ld16(p + 2) << 16); }
AUBIER_FN int aubier_i8(uint x) { return int(x ^ 0x80u) - 128; }
/* The 16 bytes at p as four little-endian words: eight 16-bit loads where p is only 2-byte
   aligned (_a2), four 32-bit loads where it is 4-byte aligned (_a4). */
AUBIER_FN void aubier_load16_a2(aubier_ptr p, AUBIER_OUT4(w)) {
  for (int i = 0; i < 4; ++i) w[i] = aubier_ld16(p + 4 * i) | (aubier_ld16(p + (4 * i + 2)) << 16);
}
AUBIER_FN void aubier_load16_a4(aubier_ptr p, AUBIER_OUT4(w)) {
  for (int i = 0; i < 4; ++i) w[i] = aubier_ld32(p + 4 * i);
}
/* The same from two 64-bit loads where p is 8-byte aligned (_a8). */
AUBIER_FN void aubier_load16_a8(aubier_ptr p, AUBIER_OUT4(w)) {
  const uint64_t lo = aubier_ld64(p);
  const uint64_t hi = aubier_ld64(p + 8);
  w[0] = uint(lo);
  w[1] = uint(lo >> 32);
  w[2] = uint(hi);
  w[3] = uint(hi >> 32);
}
/* The same from the 8-byte aligned 64-bit words that cover them (_w8), funnel-shifted by the
   offset of p in its word: two loads where p is 8-byte aligned, three where it is not (the
   third then starts inside the run). Reads up to 6 bytes before p and after p + 16: the
   caller's block must hold them after, and the weight must start 8-byte aligned. */
AUBIER_FN void aubier_load16_w8(aubier_ptr p, AUBIER_OUT4(w)) {
  const uint off = aubier_off8(p);
  const aubier_ptr q = p - off;
  const uint64_t a0 = aubier_ld64(q);
  const uint64_t a1 = aubier_ld64(q + 8);
  uint64_t a2 = 0ul;
  if (off != 0u) a2 = aubier_ld64(q + 16);
  const uint sh = 8u * off;
  const uint64_t lo = off == 0u ? a0 : (a0 >> sh) | (a1 << (64u - sh));
  const uint64_t hi = off == 0u ? a1 : (a1 >> sh) | (a2 << (64u - sh));
  w[0] = uint(lo);
  w[1] = uint(lo >> 32);
  w[2] = uint(hi);
  w[3] = uint(hi >> 32);
}
/* Byte l (0..15) of the 16 bytes held in w, unpacked in registers. */
AUBIER_FN uint aubier_byte(AUBIER_IN4(w), int l) { return (w[l >> 2] >> (8 * (l & 3))) & 255u; }
"
            }
            Helper::F16 => {
                "/* IEEE binary16 bits h (0..0xffff) widened exactly to f32 (ggml GGML_FP16_TO_FP32):
   normals rebias the exponent, subnormals are em * 2^-24 (an exact product with a normal
   result), Inf/NaN keep their payload and NaNs come out quiet. */
AUBIER_FN float aubier_f16_bits(uint h) {
  const uint sign = (h & 0x8000u) << 16;
  const uint em = h & 0x7fffu;
  if (em < 0x0400u) {
    precise float v = float(em) * 5.9604644775390625e-8f;
    return sign != 0u ? -v : v;
  }
  uint mag = (em << 13) + 0x38000000u;
  if (em >= 0x7c00u) {
    mag = 0x7f800000u | ((em & 0x03ffu) << 13) | (em > 0x7c00u ? 0x00400000u : 0u);
  }
  return aubier_as_f32(mag | sign);
}
AUBIER_FN float aubier_f16(aubier_ptr p) { return aubier_f16_bits(aubier_u16(p)); }
"
            }
            Helper::PutSigned => {
                "/* y[at + j] = db * (byte j of grid), negated where bit j of signs is set, for j < n. */
AUBIER_FN void aubier_put_signed(AUBIER_INOUT16(y), int at, int n, float db, uint64_t grid,
                                 uint signs) {
  for (int j = 0; j < n; ++j) {
    precise float v = db * float(uint((grid >> (8 * j)) & 0xfful));
    y[at + j] = ((signs >> j) & 1u) != 0u ? -v : v;
  }
}
"
            }
            Helper::IqScale => {
                "/* The i-quant sub-block scale d * (0.5 + s) * k, in ggml's order. */
AUBIER_FN float aubier_iq_db(float d, uint s, float k) {
  precise float r = d * (0.5f + float(s)) * k;
  return r;
}
"
            }
            Helper::PutIq1 => {
                "/* y[at + j] = dl * ((int8 byte j of grid) + delta), j < 8 (IQ1_S, IQ1_M). */
AUBIER_FN void aubier_put_iq1(AUBIER_INOUT16(y), int at, float dl, uint64_t grid, float delta) {
  for (int j = 0; j < 8; ++j) {
    y[at + j] = dl * (float(aubier_i8(uint((grid >> (8 * j)) & 0xfful))) + delta);
  }
}
"
            }
            Helper::ScaleMinK4 => {
                "/* Scale and min j (0..8) of Q4_K/Q5_K (get_scale_min_k4) from the 12 packed bytes held
   as the words s0, s1, s2 (bytes 0..4, 4..8, 8..12): byte j % 4 of each, in registers. */
AUBIER_FN void aubier_scale_min_k4(int j, uint s0, uint s1, uint s2, AUBIER_OUTU(sc),
                                   AUBIER_OUTU(m)) {
  const uint sh = 8u * uint(j & 3);
  const uint lo = (s0 >> sh) & 255u;
  const uint mid = (s1 >> sh) & 255u;
  const uint top = (s2 >> sh) & 255u;
  sc = j < 4 ? lo & 63u : (top & 15u) | ((lo >> 6) << 4);
  m = j < 4 ? mid & 63u : (top >> 4) | ((mid >> 6) << 4);
}
"
            }
            Helper::Q3kScale => {
                "/* Signed scale j (0..16) of Q3_K from the 12 packed bytes at s: low 4 bits in nibble
   j / 8 of s[j % 8], high 2 bits in pair j / 4 of s[8 + j % 4], offset by 32. */
AUBIER_FN int aubier_q3k_scale(aubier_ptr s, int j) {
  const uint lo = (aubier_b8(s + (j & 7)) >> (4 * (j >> 3))) & 15u;
  const uint hi = (aubier_b8(s + (8 + (j & 3))) >> (2 * (j >> 2))) & 3u;
  return int(lo | (hi << 4)) - 32;
}
"
            }
        }
    }

    /// Writes the helpers this one needs that are not in `done`, then itself, in guards.
    fn write_with_deps(self, f: &mut Formatter<'_>, done: &mut Vec<Helper>) -> fmt::Result {
        if done.contains(&self) {
            return Ok(());
        }
        for &d in self.deps() {
            d.write_with_deps(f, done)?;
        }
        done.push(self);
        let guard = self.guard();
        write!(
            f,
            "#ifndef {guard}\n#define {guard}\n{}#endif\n",
            self.code()
        )
    }
}

/// The decoding statements of a device function, by family.
#[derive(Clone, Copy, Debug)]
enum Body {
    Float(Float),
    Legacy(Legacy),
    KQuant(KQuant),
    Iq2(Iq2),
    Iq3(Iq3),
    Iq1(Iq1),
    Iq4Xs,
}

impl Body {
    /// The helpers the body calls.
    fn helpers(self) -> &'static [Helper] {
        match self {
            Body::Float(Float::F32) => &[Helper::Bytes],
            Body::Float(_) | Body::Legacy(_) | Body::Iq4Xs => &[Helper::F16],
            Body::KQuant(KQuant::Q3_K) => &[Helper::F16, Helper::Q3kScale],
            Body::KQuant(KQuant::Q4_K | KQuant::Q5_K) => &[Helper::F16, Helper::ScaleMinK4],
            Body::KQuant(_) => &[Helper::F16],
            Body::Iq2(_) | Body::Iq3(_) => &[Helper::F16, Helper::IqScale, Helper::PutSigned],
            Body::Iq1(_) => &[Helper::F16, Helper::PutIq1],
        }
    }

    /// The lookup tables the body reads.
    fn tables(self) -> &'static [Table] {
        match self {
            Body::Legacy(Legacy::IQ4_NL) | Body::Iq4Xs => &[Table::KvaluesIq4nl],
            Body::Iq2(Iq2::IQ2_XXS) => &[Table::Iq2xxsGrid, Table::KsignsIq2xs],
            Body::Iq2(Iq2::IQ2_XS) => &[Table::Iq2xsGrid, Table::KsignsIq2xs],
            Body::Iq2(Iq2::IQ2_S) => &[Table::Iq2sGrid],
            Body::Iq3(Iq3::IQ3_XXS) => &[Table::Iq3xxsGrid, Table::KsignsIq2xs],
            Body::Iq3(Iq3::IQ3_S) => &[Table::Iq3sGrid],
            Body::Iq1(_) => &[Table::Iq1sGrid],
            Body::Float(_) | Body::Legacy(_) | Body::KQuant(_) => &[],
        }
    }

    /// The block layout, for the comment above the function (byte offsets in the block).
    fn layout(self) -> &'static str {
        match self {
            Body::Float(Float::F32) => "IEEE binary32, 4 bytes little-endian",
            Body::Float(Float::F16) => "IEEE binary16, 2 bytes little-endian",
            Body::Float(Float::BF16) => "bfloat16 (top half of a binary32), 2 bytes little-endian",
            Body::Legacy(Legacy::Q4_0) => "d f16 @0, qs[16] @2; y = (q - 8) * d",
            Body::Legacy(Legacy::Q4_1) => "d f16 @0, m f16 @2, qs[16] @4; y = q * d + m",
            Body::Legacy(Legacy::Q5_0) => {
                "d f16 @0, qh u32 @2, qs[16] @6; y = (q - 16) * d, fifth bit j from qh"
            }
            Body::Legacy(Legacy::Q5_1) => {
                "d f16 @0, m f16 @2, qh u32 @4, qs[16] @8; y = q * d + m, fifth bit j from qh"
            }
            Body::Legacy(Legacy::Q8_0) => "d f16 @0, qs[32] int8 @2; y = q * d",
            Body::Legacy(Legacy::IQ4_NL) => "d f16 @0, qs[16] @2; y = d * kvalues_iq4nl[q]",
            Body::KQuant(KQuant::Q2_K) => {
                "scales[16] @0 (lo nibble scale, hi nibble min), qs[64] @16, d @80, dmin @82"
            }
            Body::KQuant(KQuant::Q3_K) => "hmask[32] @0, qs[64] @32, scales[12] @96, d @108",
            Body::KQuant(KQuant::Q4_K) => "d @0, dmin @2, scales[12] @4, qs[128] @16",
            Body::KQuant(KQuant::Q5_K) => "d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48",
            Body::KQuant(KQuant::Q6_K) => "ql[128] @0, qh[64] @128, scales[16] int8 @192, d @208",
            Body::Iq2(Iq2::IQ2_XXS) => "d @0, per 32 elements 4 grid bytes + u32 signs/scale @2",
            Body::Iq2(Iq2::IQ2_XS) => {
                "d @0, qs[32] u16 (9-bit grid, 7-bit signs) @2, scales[8] @66"
            }
            Body::Iq2(Iq2::IQ2_S) => "d @0, qs[32] @2, signs[32] @34, qh[8] @66, scales[8] @74",
            Body::Iq3(Iq3::IQ3_XXS) => "d @0, qs[64] @2, per 32 elements u32 signs/scale @66",
            Body::Iq3(Iq3::IQ3_S) => "d @0, qs[64] @2, qh[8] @66, signs[32] @74, scales[4] @106",
            Body::Iq1(Iq1::IQ1_S) => "d @0, qs[32] @2, qh[8] u16 @34",
            Body::Iq1(Iq1::IQ1_M) => "qs[32] @0, qh[16] @32, scales[4] u16 @48 (d in top nibbles)",
            Body::Iq4Xs => "d @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8",
        }
    }
}

impl Display for Body {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Body::Float(t) => Display::fmt(t, f),
            Body::Legacy(t) => Display::fmt(t, f),
            Body::KQuant(t) => Display::fmt(t, f),
            Body::Iq2(t) => Display::fmt(t, f),
            Body::Iq3(t) => Display::fmt(t, f),
            Body::Iq1(t) => Display::fmt(t, f),
            Body::Iq4Xs => f.write_str(IQ4_XS_BODY),
        }
    }
}

/// The element formats: `b` is element `16c`.
#[derive(Clone, Copy, Debug)]
enum Float {
    F32,
    F16,
    BF16,
}

impl Display for Float {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let value = match self {
            // Four 32-bit loads per 16 bytes (an F32 row is 4-byte aligned), not two 16-bit ones
            // per element: on lavapipe each load is a loop over the SIMD lanes.
            Float::F32 => {
                return f.write_str(
                    "  uint w[4];
  for (int q = 0; q < 4; ++q) {
    aubier_load16_a4(b + 16 * q, w);
    for (int j = 0; j < 4; ++j) y[4 * q + j] = aubier_as_f32(w[j]);
  }
",
                );
            }
            Float::F16 => "aubier_f16(b + 2 * j)",
            Float::BF16 => "aubier_as_f32(aubier_u16(b + 2 * j) << 16)",
        };
        writeln!(f, "  for (int j = 0; j < 16; ++j) y[j] = {value};")
    }
}

/// The 32-element formats: chunk `s` = 0 reads the low nibbles (elements 0..16), `s` = 1 the
/// high nibbles (16..32) of the same 16 bytes; Q8_0 reads bytes `16s ..`.
#[allow(non_camel_case_types)] // ggml's names
#[derive(Clone, Copy, Debug)]
enum Legacy {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    IQ4_NL,
}

impl Legacy {
    /// The ggml type.
    fn ty(self) -> GgmlType {
        match self {
            Legacy::Q4_0 => GgmlType::Q4_0,
            Legacy::Q4_1 => GgmlType::Q4_1,
            Legacy::Q5_0 => GgmlType::Q5_0,
            Legacy::Q5_1 => GgmlType::Q5_1,
            Legacy::Q8_0 => GgmlType::Q8_0,
            Legacy::IQ4_NL => GgmlType::IQ4_NL,
        }
    }
}

impl Display for Legacy {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str("  precise float d = aubier_f16(b);\n")?;
        if matches!(self, Legacy::Q4_1 | Legacy::Q5_1) {
            f.write_str("  precise float m = aubier_f16(b + 2);\n")?;
        }
        match self {
            Legacy::Q5_0 => f.write_str("  const uint qh = aubier_u32(b + 2);\n")?,
            Legacy::Q5_1 => f.write_str("  const uint qh = aubier_u32(b + 4);\n")?,
            _ => {}
        }
        // The 16 quant bytes of the chunk (Q8_0: bytes 16s ..) in four words; the nibble of
        // element j, and (Q5) its fifth bit `qh` bit j + 16s.
        let at = match self {
            Legacy::Q4_0 | Legacy::IQ4_NL | Legacy::Q8_0 => 2,
            Legacy::Q4_1 => 4,
            Legacy::Q5_0 => 6,
            Legacy::Q5_1 => 8,
        };
        let load = load16(self.ty().type_size(), at);
        let first = if matches!(self, Legacy::Q8_0) {
            format!("b + {at} + 16 * s")
        } else {
            format!("b + {at}")
        };
        writeln!(f, "  uint w[4];\n  {load}({first}, w);")?;
        let nibble = "((aubier_byte(w, j) >> (4 * s)) & 15u)";
        let fifth = "(((qh >> (j + 16 * s)) & 1u) << 4)";
        let value = match self {
            Legacy::Q4_0 => format!("float(int({nibble}) - 8) * d"),
            Legacy::Q4_1 => format!("float({nibble}) * d + m"),
            Legacy::Q5_0 => format!("float(int({nibble} | {fifth}) - 16) * d"),
            Legacy::Q5_1 => format!("float({nibble} | {fifth}) * d + m"),
            Legacy::Q8_0 => "float(aubier_i8(aubier_byte(w, j))) * d".to_string(),
            Legacy::IQ4_NL => format!("d * float(aubier_kvalues_iq4nl[{nibble}])"),
        };
        writeln!(f, "  for (int j = 0; j < 16; ++j) y[j] = {value};")
    }
}

/// The helper that loads 16 quant bytes starting `at` bytes (plus a multiple of 16) into a block
/// of `block_bytes`: 32-bit loads when both are multiples of 4 (the block, and so every block
/// of a row, starts 4-byte aligned), else 16-bit loads (every block size is even).
fn load16(block_bytes: usize, at: usize) -> &'static str {
    if block_bytes.is_multiple_of(4) && at.is_multiple_of(4) {
        "aubier_load16_a4"
    } else {
        "aubier_load16_a2"
    }
}

/// The k-quants. Chunk `s` (0..16) of the super-block: Q2_K/Q3_K/Q6_K have one scale per
/// chunk; Q4_K/Q5_K one scale and min per two chunks (`get_scale_min_k4`).
#[allow(non_camel_case_types)] // ggml's names
#[derive(Clone, Copy, Debug)]
enum KQuant {
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// The opening of Q4_K's and Q5_K's bodies: their 16-byte head (`d`, `dmin`, the 12 scale
/// bytes) as two 64-bit words, run `r` = s / 4 of 64 elements, its nibble `hi` = (s / 2) % 2,
/// and the chunk's scale `dl` and min `ml` (scale and min `2r + hi`).
const K4_HEAD: &str = "  const uint64_t h0 = aubier_ld64(b);
  const uint64_t h1 = aubier_ld64(b + 8);
  precise float d = aubier_f16_bits(uint(h0) & 0xffffu);
  precise float dmin = aubier_f16_bits(uint(h0 >> 16) & 0xffffu);
  const int r = s >> 2;
  const int hi = (s >> 1) & 1;
  uint sc;
  uint mn;
  aubier_scale_min_k4(2 * r + hi, uint(h0 >> 32), uint(h1), uint(h1 >> 32), sc, mn);
  precise float dl = d * float(sc);
  precise float ml = dmin * float(mn);
";

impl Display for KQuant {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if matches!(self, KQuant::Q4_K | KQuant::Q5_K) {
            f.write_str(K4_HEAD)?;
        }
        f.write_str(match self {
            // Half n = s / 8 of the super-block reads qs[32n ..]; inside it, bit plane
            // j = (s / 2) % 4 (shift 2j) of byte run h = s % 2 (16 bytes).
            // d and dmin are one 32-bit word, the 16 quant bytes four.
            KQuant::Q2_K => {
                "  const uint dd = aubier_ld32(b + 80);
  precise float d = aubier_f16_bits(dd & 0xffffu);
  precise float dmin = aubier_f16_bits(dd >> 16);
  const uint sc = aubier_b8(b + s);
  precise float dl = d * float(sc & 15u);
  precise float ml = dmin * float(sc >> 4);
  uint w[4];
  aubier_load16_w8(b + 16 + 32 * (s >> 3) + 16 * (s & 1), w);
  const int shift = 2 * ((s >> 1) & 3);
  for (int i = 0; i < 4; ++i) w[i] = (w[i] >> shift) & 0x03030303u;
  for (int l = 0; l < 16; ++l) y[l] = dl * float(aubier_byte(w, l)) - ml;
"
            }
            // As Q2_K for the low two bits; the third comes from hmask bit 4n + j (set: +0,
            // clear: −4): q = (low | hbit << 2) − 4, unpacked four bytes to a word.
            KQuant::Q3_K => {
                "  precise float d_all = aubier_f16(b + 108);
  precise float dl = d_all * float(aubier_q3k_scale(b + 96, s));
  uint q[4];
  aubier_load16_w8(b + 32 + 32 * (s >> 3) + 16 * (s & 1), q);
  uint hm[4];
  aubier_load16_w8(b + 16 * (s & 1), hm);
  const int shift = 2 * ((s >> 1) & 3);
  const int hb = 4 * (s >> 3) + ((s >> 1) & 3);
  for (int i = 0; i < 4; ++i) q[i] = ((q[i] >> shift) & 0x03030303u) | (((hm[i] >> hb) & 0x01010101u) << 2);
  for (int l = 0; l < 16; ++l) y[l] = dl * float(int(aubier_byte(q, l)) - 4);
"
            }
            // After K4_HEAD: run r's low nibbles of qs[32r ..], then their high nibbles (hi).
            KQuant::Q4_K => {
                "  uint w[4];
  aubier_load16_a8(b + 16 + 32 * r + 16 * (s & 1), w);
  for (int i = 0; i < 4; ++i) w[i] = (w[i] >> (4 * hi)) & 0x0f0f0f0fu;
  for (int l = 0; l < 16; ++l) y[l] = dl * float(aubier_byte(w, l)) - ml;
"
            }
            // Q4_K plus the fifth bit 2r + hi of qh[l], merged four bytes to a word.
            KQuant::Q5_K => {
                "  uint qh[4];
  aubier_load16_a8(b + 16 + 16 * (s & 1), qh);
  uint ql[4];
  aubier_load16_a8(b + 48 + 32 * r + 16 * (s & 1), ql);
  for (int i = 0; i < 4; ++i) {
    ql[i] = ((ql[i] >> (4 * hi)) & 0x0f0f0f0fu) | (((qh[i] >> (2 * r + hi)) & 0x01010101u) << 4);
  }
  for (int l = 0; l < 16; ++l) y[l] = dl * float(aubier_byte(ql, l)) - ml;
"
            }
            // Half n = s / 8; quarter k = (s % 8) / 2 takes nibble k / 2 of ql[32(k % 2) ..]
            // and bit pair k of qh (merged four bytes to a word); the int8 scale is scales[s];
            // y = (d·sc)·(q − 32).
            KQuant::Q6_K => {
                "  precise float d = aubier_f16(b + 208);
  const int k = (s & 7) >> 1;
  precise float dsc = d * float(aubier_i8(aubier_b8(b + 192 + s)));
  uint ql[4];
  aubier_load16_w8(b + 64 * (s >> 3) + 32 * (k & 1) + 16 * (s & 1), ql);
  uint qh[4];
  aubier_load16_w8(b + 128 + 32 * (s >> 3) + 16 * (s & 1), qh);
  for (int i = 0; i < 4; ++i) {
    ql[i] = ((ql[i] >> (4 * (k >> 1))) & 0x0f0f0f0fu) | (((qh[i] >> (2 * k)) & 0x03030303u) << 4);
  }
  for (int l = 0; l < 16; ++l) y[l] = dsc * float(int(aubier_byte(ql, l)) - 32);
"
            }
        })
    }
}

/// Opening lines shared by the i-quants with an f16 `d` @0 and 32-element sub-blocks: the
/// sub-block `ib` of chunk `s` and its half `h` (groups `2h`, `2h + 1` of 8 elements).
const IQ_SUBBLOCK: &str = "  precise float d = aubier_f16(b);
  const int ib = s >> 1;
  const int h = s & 1;
";

/// The IQ2 family: groups of 8 magnitudes from an 8-wide grid, each with 8 sign bits (a
/// `ksigns_iq2xs` entry, or IQ2_S's explicit byte); scale `d·(0.5 + s)·0.25`.
#[allow(non_camel_case_types)] // ggml's names
#[derive(Clone, Copy, Debug)]
enum Iq2 {
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
}

impl Display for Iq2 {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(IQ_SUBBLOCK)?;
        // The sub-block scale, then per group l the grid row and the sign byte.
        let (scale, grid, signs) = match self {
            Iq2::IQ2_XXS => (
                "  aubier_ptr q = b + 2 + 8 * ib;
  const uint aux = aubier_u32(q + 4);
  precise float db = aubier_iq_db(d, aux >> 28, 0.25f);
  const uint gi = aubier_u16(q + 2 * h);
",
                "aubier_iq2xxs_grid[(gi >> (8 * g)) & 255u]",
                "aubier_ksigns_iq2xs[(aux >> (7 * l)) & 127u]",
            ),
            Iq2::IQ2_XS => (
                "  precise float db = aubier_iq_db(d, (aubier_b8(b + 66 + ib) >> (4 * h)) & 15u, 0.25f);
",
                "aubier_iq2xs_grid[aubier_u16(b + 2 + 2 * (4 * ib + l)) & 511u]",
                "aubier_ksigns_iq2xs[aubier_u16(b + 2 + 2 * (4 * ib + l)) >> 9]",
            ),
            Iq2::IQ2_S => (
                "  precise float db = aubier_iq_db(d, (aubier_b8(b + 74 + ib) >> (4 * h)) & 15u, 0.25f);
  const uint qh = aubier_b8(b + 66 + ib);
  const uint gi = aubier_u16(b + 2 + 4 * ib + 2 * h);
  const uint sg = aubier_u16(b + 34 + 4 * ib + 2 * h);
",
                "aubier_iq2s_grid[((gi >> (8 * g)) & 255u) | ((qh << (8 - 2 * l)) & 0x300u)]",
                "(sg >> (8 * g)) & 255u",
            ),
        };
        f.write_str(scale)?;
        writeln!(f, "  for (int g = 0; g < 2; ++g) {{")?;
        writeln!(f, "    const int l = 2 * h + g;")?;
        writeln!(
            f,
            "    aubier_put_signed(y, 8 * g, 8, db, {grid}, {signs});"
        )?;
        writeln!(f, "  }}")
    }
}

/// The IQ3 family: groups of 8 values from two 4-wide grid rows sharing one sign byte (low
/// nibble for the first row).
#[allow(non_camel_case_types)] // ggml's names
#[derive(Clone, Copy, Debug)]
enum Iq3 {
    IQ3_XXS,
    IQ3_S,
}

impl Display for Iq3 {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(IQ_SUBBLOCK)?;
        let (scale, rows, signs) = match self {
            // db = d·(0.5 + s)·0.5 with s the top 4 bits of the sub-block's u32.
            Iq3::IQ3_XXS => (
                "  const uint aux = aubier_u32(b + 66 + 4 * ib);
  precise float db = aubier_iq_db(d, aux >> 28, 0.5f);
",
                [
                    "aubier_iq3xxs_grid[gi & 255u]",
                    "aubier_iq3xxs_grid[gi >> 8]",
                ],
                "aubier_ksigns_iq2xs[(aux >> (7 * l)) & 127u]",
            ),
            // db = d·(1 + 2s); the ninth index bit of row 2l + t is qh bit 2l + t.
            Iq3::IQ3_S => (
                "  const uint sc = (aubier_b8(b + 106 + (ib >> 1)) >> (4 * (ib & 1))) & 15u;
  precise float db = d * float(1 + 2 * int(sc));
  const uint qh = aubier_b8(b + 66 + ib);
",
                [
                    "aubier_iq3s_grid[(gi & 255u) | ((qh << (8 - 2 * l)) & 256u)]",
                    "aubier_iq3s_grid[(gi >> 8) | ((qh << (7 - 2 * l)) & 256u)]",
                ],
                "aubier_b8(b + 74 + 4 * ib + l)",
            ),
        };
        f.write_str(scale)?;
        writeln!(f, "  for (int g = 0; g < 2; ++g) {{")?;
        writeln!(f, "    const int l = 2 * h + g;")?;
        // The group's two grid-row indices, one 16-bit load.
        writeln!(f, "    const uint gi = aubier_u16(b + 2 + 8 * ib + 2 * l);")?;
        writeln!(f, "    const uint signs = {signs};")?;
        writeln!(
            f,
            "    aubier_put_signed(y, 8 * g, 4, db, {}, signs);",
            rows[0]
        )?;
        writeln!(
            f,
            "    aubier_put_signed(y, 8 * g + 4, 4, db, {}, signs >> 4);",
            rows[1]
        )?;
        writeln!(f, "  }}")
    }
}

/// The IQ1 family: groups of 8 ternary values from `iq1s_grid` (11-bit index), shifted by
/// ±1/8 (IQ1S_DELTA = IQ1M_DELTA) and scaled by `d·(2s + 1)`.
#[allow(non_camel_case_types)] // ggml's names
#[derive(Clone, Copy, Debug)]
enum Iq1 {
    IQ1_S,
    IQ1_M,
}

impl Display for Iq1 {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            // qh u16 per sub-block: 3 high index bits per group, scale bits 12..15, delta sign
            // bit 15.
            Iq1::IQ1_S => {
                "  precise float d = aubier_f16(b);
  const int ib = s >> 1;
  const int h = s & 1;
  const uint qh = aubier_u16(b + 34 + 2 * ib);
  precise float dl = d * float(2 * int((qh >> 12) & 7u) + 1);
  precise float delta = (qh & 0x8000u) != 0u ? -0.125f : 0.125f;
  const uint gi = aubier_u16(b + 2 + 4 * ib + 2 * h);
  for (int g = 0; g < 2; ++g) {
    const int l = 2 * h + g;
    const uint idx = ((gi >> (8 * g)) & 255u) | (((qh >> (3 * l)) & 7u) << 8);
    aubier_put_iq1(y, 8 * g, dl, aubier_iq1s_grid[idx], delta);
  }
"
            }
            // d is the f16 spread over the top nibbles of the four u16 scale words; the 3-bit
            // scale of half h of sub-block ib is bits 6(ib % 2) + 3h of word ib / 2; group l's
            // qh nibble holds 3 high index bits and the delta sign (bit 3).
            Iq1::IQ1_M => {
                "  const uint d_bits = (aubier_u16(b + 48) >> 12) | ((aubier_u16(b + 50) >> 8) & 0x00f0u) |
                      ((aubier_u16(b + 52) >> 4) & 0x0f00u) | (aubier_u16(b + 54) & 0xf000u);
  precise float d = aubier_f16_bits(d_bits);
  const int ib = s >> 1;
  const int h = s & 1;
  const uint sw = aubier_u16(b + 48 + 2 * (ib >> 1)) >> (6 * (ib & 1));
  precise float dl = d * float(2 * int((sw >> (3 * h)) & 7u) + 1);
  const uint gi = aubier_u16(b + 4 * ib + 2 * h);
  for (int g = 0; g < 2; ++g) {
    const uint nib = (aubier_b8(b + 32 + 2 * ib + h) >> (4 * g)) & 15u;
    const uint idx = ((gi >> (8 * g)) & 255u) | ((nib & 7u) << 8);
    precise float delta = (nib & 8u) != 0u ? -0.125f : 0.125f;
    aubier_put_iq1(y, 8 * g, dl, aubier_iq1s_grid[idx], delta);
  }
"
            }
        })
    }
}

/// IQ4_XS: sub-block `ib` scale `(lo | hi << 4) − 32` from `scales_l` nibble `ib % 2` of byte
/// `ib / 2` and `scales_h` bit pair `ib`; half `h` reads nibble `h` of `qs[16ib ..]`.
const IQ4_XS_BODY: &str = "  precise float d = aubier_f16(b);
  const int ib = s >> 1;
  const int h = s & 1;
  const uint lo = (aubier_b8(b + 4 + (ib >> 1)) >> (4 * (ib & 1))) & 15u;
  const uint hi = (aubier_u16(b + 2) >> (2 * ib)) & 3u;
  precise float dl = d * float(int(lo | (hi << 4)) - 32);
  uint w[4];
  aubier_load16_a4(b + 8 + 16 * ib, w);
  for (int j = 0; j < 16; ++j) {
    y[j] = dl * float(aubier_kvalues_iq4nl[(aubier_byte(w, j) >> (4 * h)) & 15u]);
  }
";

/// A lookup table of [`crate::quant_grids`], emitted as an `AUBIER_TABLE` array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Table {
    Iq2xxsGrid,
    Iq2xsGrid,
    Iq2sGrid,
    Iq3xxsGrid,
    Iq3sGrid,
    Iq1sGrid,
    KsignsIq2xs,
    KvaluesIq4nl,
}

impl Display for Table {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Table::Iq2xxsGrid => Display::fmt(&CArray("iq2xxs_grid", &IQ2XXS_GRID), f),
            Table::Iq2xsGrid => Display::fmt(&CArray("iq2xs_grid", &IQ2XS_GRID), f),
            Table::Iq2sGrid => Display::fmt(&CArray("iq2s_grid", &IQ2S_GRID), f),
            Table::Iq3xxsGrid => Display::fmt(&CArray("iq3xxs_grid", &IQ3XXS_GRID), f),
            Table::Iq3sGrid => Display::fmt(&CArray("iq3s_grid", &IQ3S_GRID), f),
            Table::Iq1sGrid => Display::fmt(&CArray("iq1s_grid", &IQ1S_GRID), f),
            Table::KsignsIq2xs => Display::fmt(&CArray("ksigns_iq2xs", &KSIGNS_IQ2XS), f),
            Table::KvaluesIq4nl => Display::fmt(&CArray("kvalues_iq4nl", &KVALUES_IQ4NL), f),
        }
    }
}

/// The tables of one type, in order, after the definitions of the language (none when the type
/// reads no table).
struct Tables(&'static [Table], Lang);

impl Display for Tables {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if !self.0.is_empty() {
            f.write_str(self.1.prims())?;
        }
        self.0.iter().try_for_each(|t| Display::fmt(t, f))
    }
}

/// An integer element type of a table and how its literals are spelled (the same in C++ and
/// GLSL).
trait CElem: Copy {
    /// The element type.
    const C_TYPE: &'static str;
    /// Values per line.
    const PER_LINE: usize;
    /// Writes one literal.
    fn write(self, f: &mut Formatter<'_>) -> fmt::Result;
}

impl CElem for u64 {
    const C_TYPE: &'static str = "uint64_t";
    const PER_LINE: usize = 4;
    fn write(self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "0x{self:016x}ul")
    }
}

impl CElem for u32 {
    const C_TYPE: &'static str = "uint";
    const PER_LINE: usize = 8;
    fn write(self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "0x{self:08x}u")
    }
}

impl CElem for u8 {
    const C_TYPE: &'static str = "uint";
    const PER_LINE: usize = 16;
    fn write(self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl CElem for i8 {
    const C_TYPE: &'static str = "int";
    const PER_LINE: usize = 16;
    fn write(self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// `AUBIER_TABLE T aubier_<name>[N] = {…};` in its `AUBIER_TABLE_<NAME>` guard.
struct CArray<'a, T>(&'a str, &'a [T]);

impl<T: CElem> Display for CArray<'_, T> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let CArray(name, values) = *self;
        let guard = name.to_ascii_uppercase();
        writeln!(f, "#ifndef AUBIER_TABLE_{guard}")?;
        writeln!(f, "#define AUBIER_TABLE_{guard}")?;
        writeln!(
            f,
            "AUBIER_TABLE {} aubier_{name}[{}] = {{",
            T::C_TYPE,
            values.len()
        )?;
        for line in values.chunks(T::PER_LINE) {
            f.write_str("   ")?;
            for v in line {
                f.write_str(" ")?;
                v.write(f)?;
                f.write_str(",")?;
            }
            f.write_str("\n")?;
        }
        writeln!(f, "}};")?;
        writeln!(f, "#endif")
    }
}

/// The quant types `k` reads, sorted, without F32 (read inline).
pub(crate) fn quant_types(k: &Kernel) -> Vec<String> {
    let mut tys: Vec<String> = k
        .params
        .iter()
        .filter_map(|(_, kind)| match kind {
            ParamKind::Weight { ggml_type, .. } | ParamKind::Experts { ggml_type, .. }
                if ggml_type != "F32" =>
            {
                Some(ggml_type.clone())
            }
            _ => None,
        })
        .collect();
    tys.sort();
    tys.dedup();
    tys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_type_has_a_function_and_tables() {
        for &name in supported_types() {
            let ty = GgmlType::from_name(name).expect("a ggml type name");
            for lang in [Lang::Cpp, Lang::Glsl] {
                let text = device_fn(name, lang).expect("supported").to_string();
                let signature = format!(
                    "AUBIER_FN void aubier_dq16_{}(aubier_ptr row, int c, AUBIER_OUT16(y)) {{",
                    name.to_ascii_lowercase()
                );
                assert!(text.starts_with(lang.prims()), "{name}:\n{text}");
                assert!(text.contains(&signature), "{name}:\n{text}");
                assert!(device_tables(name, lang).is_some(), "{name}");
            }
            // Block sizes are 1 or whole multiples of the 16-element chunk.
            assert!(
                ty.block_size() == 1 || ty.block_size().is_multiple_of(16),
                "{name}"
            );
        }
    }

    /// 32-bit loads only in the types whose blocks are a multiple of 4 bytes (elsewhere they
    /// would be misaligned on every other block), and in the 4-byte k-quants.
    #[test]
    fn word_loads_follow_the_block_alignment() {
        for &name in supported_types() {
            let ty = GgmlType::from_name(name).expect("a ggml type name");
            let text = device_fn(name, Lang::Glsl).expect("supported").to_string();
            let body = &text[text
                .find(&format!("aubier_dq16_{}(", name.to_ascii_lowercase()))
                .expect("the function")..];
            let wide = body.contains("aubier_load16_a4") || body.contains("aubier_ld32");
            assert!(!wide || ty.type_size().is_multiple_of(4), "{name}");
            // Aligned 64-bit words without a shift only in the 8-byte blocks.
            let whole_words = body.contains("aubier_load16_a8") || body.contains("aubier_ld64(b");
            assert!(!whole_words || ty.type_size().is_multiple_of(8), "{name}");
            if matches!(name, "Q2_K") {
                assert!(wide, "{name}");
            }
            let k_quant = matches!(name, "Q2_K" | "Q3_K" | "Q4_K" | "Q5_K" | "Q6_K");
            let eight = matches!(name, "Q4_K" | "Q5_K");
            assert_eq!(
                body.contains("aubier_load16_w8"),
                k_quant && !eight,
                "{name}"
            );
            assert_eq!(body.contains("aubier_load16_a8"), eight, "{name}");
            // Their scales come out of the head's words, not byte by byte.
            assert!(!eight || !body.contains("aubier_b8"), "{name}");
            assert!(!k_quant || !body.contains("aubier_load16_a2"), "{name}");
        }
        assert_eq!(load16(84, 16), "aubier_load16_a4");
        assert_eq!(load16(20, 4), "aubier_load16_a4");
        assert_eq!(load16(24, 6), "aubier_load16_a2");
        assert_eq!(load16(34, 2), "aubier_load16_a2");
        assert_eq!(load16(210, 128), "aubier_load16_a2");
    }

    #[test]
    fn names_are_matched_ignoring_ascii_case_and_unknown_ones_are_none() {
        assert_eq!(
            device_fn("iq2_xxs", Lang::Cpp).map(|t| t.to_string()),
            device_fn("IQ2_XXS", Lang::Cpp).map(|t| t.to_string())
        );
        for name in [
            "Q8_K", "Q8_1", "TQ1_0", "MXFP4", "I32", "F64", "", "Q2K", "q2_k ",
        ] {
            assert!(device_fn(name, Lang::Glsl).is_none(), "{name:?}");
            assert!(device_tables(name, Lang::Glsl).is_none(), "{name:?}");
        }
    }

    #[test]
    fn types_without_tables_emit_none_and_shared_tables_are_guarded() {
        assert_eq!(
            device_tables("Q2_K", Lang::Cpp)
                .expect("supported")
                .to_string(),
            ""
        );
        let text = device_tables("IQ2_XXS", Lang::Cpp)
            .expect("supported")
            .to_string();
        assert!(
            text.contains("#ifndef AUBIER_TABLE_KSIGNS_IQ2XS\n"),
            "{text}"
        );
        assert!(text.starts_with(Lang::Cpp.prims()), "{text}");
        assert!(text.contains("AUBIER_TABLE uint64_t aubier_iq2xxs_grid[256] = {"));
    }

    /// The emitted literals read back as the runtime's tables, entry for entry.
    #[test]
    fn emitted_tables_hold_the_quant_grids() {
        fn values(text: &str, name: &str) -> Vec<i64> {
            let start = text
                .find(&format!("aubier_{name}["))
                .unwrap_or_else(|| panic!("{name} missing"));
            let body = &text[start..];
            let body = &body[body.find('{').expect("{") + 1..body.find("};").expect("};")];
            body.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    let s = s.trim_end_matches("ul").trim_end_matches('u');
                    match s.strip_prefix("0x") {
                        Some(hex) => i64::from_str_radix(hex, 16)
                            .or_else(|_| u64::from_str_radix(hex, 16).map(|v| v as i64))
                            .expect("hex"),
                        None => s.parse().expect("decimal"),
                    }
                })
                .collect()
        }
        let as_i64 = |v: &[u64]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
        let iq2 = device_tables("IQ2_XXS", Lang::Glsl)
            .expect("supported")
            .to_string();
        assert_eq!(values(&iq2, "iq2xxs_grid"), as_i64(&IQ2XXS_GRID));
        let ksigns: Vec<i64> = KSIGNS_IQ2XS.iter().map(|&x| i64::from(x)).collect();
        assert_eq!(values(&iq2, "ksigns_iq2xs"), ksigns);
        let xs = device_tables("IQ2_XS", Lang::Glsl)
            .expect("supported")
            .to_string();
        assert_eq!(values(&xs, "iq2xs_grid"), as_i64(&IQ2XS_GRID));
        let s = device_tables("IQ2_S", Lang::Glsl)
            .expect("supported")
            .to_string();
        assert_eq!(values(&s, "iq2s_grid"), as_i64(&IQ2S_GRID));
        let iq3 = device_tables("IQ3_XXS", Lang::Glsl)
            .expect("supported")
            .to_string();
        let want: Vec<i64> = IQ3XXS_GRID.iter().map(|&x| i64::from(x)).collect();
        assert_eq!(values(&iq3, "iq3xxs_grid"), want);
        let iq3s = device_tables("IQ3_S", Lang::Glsl)
            .expect("supported")
            .to_string();
        let want: Vec<i64> = IQ3S_GRID.iter().map(|&x| i64::from(x)).collect();
        assert_eq!(values(&iq3s, "iq3s_grid"), want);
        let iq1 = device_tables("IQ1_M", Lang::Glsl)
            .expect("supported")
            .to_string();
        assert_eq!(values(&iq1, "iq1s_grid"), as_i64(&IQ1S_GRID));
        let nl = device_tables("IQ4_XS", Lang::Glsl)
            .expect("supported")
            .to_string();
        let want: Vec<i64> = KVALUES_IQ4NL.iter().map(|&x| i64::from(x)).collect();
        assert_eq!(values(&nl, "kvalues_iq4nl"), want);
    }

    /// A helper is written once per function even when several callers need it, and after the
    /// helpers it calls.
    #[test]
    fn helpers_come_once_and_after_their_dependencies() {
        let text = device_fn("IQ1_M", Lang::Cpp)
            .expect("supported")
            .to_string();
        for guard in ["AUBIER_DQ_PRIMS", "AUBIER_DQ_BYTES", "AUBIER_DQ_F16"] {
            assert_eq!(
                text.matches(&format!("#ifndef {guard}\n")).count(),
                1,
                "{guard}"
            );
        }
        let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s}"));
        assert!(at("#define AUBIER_DQ_BYTES") < at("#define AUBIER_DQ_F16"));
        assert!(at("#define AUBIER_DQ_BYTES") < at("#define AUBIER_DQ_PUT_IQ1"));
        assert!(at("#define AUBIER_DQ_PUT_IQ1") < at("aubier_dq16_iq1_m("));
    }
}
