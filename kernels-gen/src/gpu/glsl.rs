//! The Vulkan compute dialect ([`Glsl`]): the kernel IR printed by the one printer of
//! [`super::emit`] as a GLSL 4.60 compute shader, which shaderc / glslang turn into SPIR-V
//! (ARCHITECTURE.md § kernels-gen). This module holds only what GLSL spells differently.
//!
//! Algorithm note. A shader is: the extensions, the float-controls execution mode
//! `SignedZeroInfNanPreserve 32` (so NaN, ±∞ and −0 behave as IEEE says, as the IR's
//! NaN-propagating max and NaN tests need), the buffer-reference types, a header (what made
//! it), the push-constant block ([`Dialect::open`]); the helpers (f32 `+ − · /` as functions
//! whose result is a `precise` variable, so every one of them carries SPIR-V `NoContraction` and
//! no driver fuses them into an FMA; the NaN-propagating max; C's truncating `%`; the lane
//! shuffle over `subgroupShuffleXor`), the device math ([`super::math::device_math`] in GLSL),
//! the dequant functions of the quant types read (the one text of [`super::quant`] under its
//! GLSL definitions), the kernel's constant tables, then the shared arrays and `main`
//! ([`Dialect::kernel_open`]): the extents, registers, per-thread arrays, body — all printed by
//! [`super::emit`]. An f32 constant prints as a decimal that parses to exactly its value
//! ([`ExactF32`]) or, for NaN and ±∞ in an expression, `uintBitsToFloat`.
//!
//! ABI (what the Vulkan executor binds):
//! - entry point `main`, `local_size_x = block`; block `(x, y)` of the grid is
//!   `gl_WorkGroupID.xy`, the thread `gl_LocalInvocationID.x`.
//! - one std430 push-constant block: for every parameter in IR order one 8-byte device address,
//!   then the address of the run's extents, two `int`s `T, S` in device memory —
//!   [`push_constant_bytes`] = 8·params + 8 (the extents live in memory, not in the push
//!   constants, so that a command buffer recorded once replays for every `S`). F32 / I32 parameters: the
//!   address of element 0; weights: the tensor's first byte (rows of `row_bytes`); experts: the
//!   address of a table of `uint64_t` device addresses, one per expert (expert `e`'s bytes
//!   start at `table[e]`). No descriptor sets (a tensor may exceed `maxStorageBufferRange`).
//! - [`Stmt::WarpReduce`] is the IR's xor butterfly over `subgroupShuffleXor` with offsets
//!   `warp/2 … 1`: the result is the IR's (and [`super::cpu_exec`]'s) only when the device's
//!   subgroup size equals the kernel's reduction width, which the executor checks.
//! - device features: `bufferDeviceAddress`, `storageBuffer8BitAccess` and
//!   `storageBuffer16BitAccess` (quant blocks are read in bytes, aligned 16-bit and aligned 32-bit
//!   words, never past a tensor's end: a weight's rows start 2-byte aligned, 4-byte aligned for
//!   the types whose block size is a multiple of 4, see [`super::quant`]), `shaderInt64` (addresses),
//!   `shaderFloat64` (`ln`, `sin`, `cos`), subgroup shuffles, and the float-controls property
//!   `shaderSignedZeroInfNanPreserveFloat32`; lavapipe, NVIDIA and AMD (RADV, AMDVLK) have them.
//!
//! Numerics: f32 `+ − ·` are correctly rounded in Vulkan, so the kernels compute the IR's bits
//! wherever only those, conversions, comparisons and the device math run. Vulkan lets `/` be
//! 2.5 ulp and `sqrt` inherit `inversesqrt`'s error, so kernels dividing or taking a root (norms,
//! softmax, renormalisation) are compared with the a-priori bounds of the kernel tests, not bit
//! for bit. Dequantization is exact (see [`super::quant`]).
//!
//! Why GLSL and not WGSL: the kernels need pointers into unbounded device memory (buffer
//! references, 64-bit addresses), byte loads (8-bit storage), `int64`, `f64` and subgroup
//! shuffles; WGSL has none of the first four. GLSL compiles in process through Debian's
//! libshaderc-dev.

use super::emit::{comments, min_max, Dialect, Ty, Words};
use super::error::GenError;
use super::ir::{BinOp, Builtin, IrError, Kernel, ParamKind, Shared};
use super::math::{device_math, ExactF32};
use super::quant::Lang;
use std::fmt::{self, Display, Formatter};

/// Bytes of `k`'s push constants: 8 per parameter (a device address), then 8 for the address of
/// the extents `int T, S`.
pub fn push_constant_bytes(k: &Kernel) -> u32 {
    8 * k.params.len() as u32 + 8
}

/// The push-constant bytes every Vulkan device has (`maxPushConstantsSize` ≥ 128).
const PUSH_CONSTANT_MIN: u32 = 128;

/// The GLSL 4.60 compute shader of kernel `k` (the ABI of the module note), `header` printed
/// first as `//` lines: [`super::emit::render`] in the [`Glsl`] dialect.
///
/// Errors: [`GenError::UnsupportedType`] when `k` reads a type without a device function;
/// [`GenError::Kernel`] when its push constants exceed the 128 bytes every device has (more than
/// 15 parameters).
pub fn render_glsl(k: &Kernel, header: &[String]) -> Result<String, GenError> {
    super::emit::render(&Glsl, k, header)
}

/// Vulkan GLSL 4.60 (the module note).
#[derive(Clone, Copy, Debug, Default)]
pub struct Glsl;

impl Dialect for Glsl {
    fn name(&self) -> &'static str {
        "vulkan"
    }
    fn ext(&self) -> &'static str {
        "comp"
    }
    fn check(&self, k: &Kernel) -> Result<(), GenError> {
        if push_constant_bytes(k) > PUSH_CONSTANT_MIN {
            return Err(GenError::Kernel(IrError {
                kernel: k.name.clone(),
                detail: format!(
                    "{} parameters need {} bytes of push constants; Vulkan guarantees {PUSH_CONSTANT_MIN}",
                    k.params.len(),
                    push_constant_bytes(k)
                ),
            }));
        }
        Ok(())
    }
    fn open(&self, f: &mut Formatter<'_>, k: &Kernel, header: &[String]) -> fmt::Result {
        f.write_str(PRELUDE)?;
        comments(f, k, header)?;
        writeln!(
            f,
            "// launch: grid ({}, {}), block {}; reductions over {}-lane subgroups",
            k.grid[0], k.grid[1], k.block, k.warp
        )?;
        writeln!(f, "layout(local_size_x = {}) in;", k.block)?;
        writeln!(f, "layout(push_constant, std430) uniform AubierArgs {{")?;
        for (name, kind) in &k.params {
            let ty = match kind {
                ParamKind::F32 { .. } => "AubierF32",
                ParamKind::I32 { .. } => "AubierI32",
                ParamKind::Weight { .. } => "uint64_t",
                ParamKind::Experts { .. } => "AubierU64",
            };
            writeln!(f, "  {ty} {name};")?;
        }
        writeln!(f, "  AubierI32 extents;\n}} args;")
    }
    fn helpers(&self) -> String {
        format!("{HELPERS}{}", device_math(Lang::Glsl))
    }
    fn lang(&self) -> Lang {
        Lang::Glsl
    }
    fn const_table(&self, f: &mut Formatter<'_>, name: &str, vals: &[f32]) -> fmt::Result {
        write!(f, "const float {name}[{}] = {{", vals.len())?;
        for (i, v) in vals.iter().enumerate() {
            write!(f, "{}{}", if i == 0 { "" } else { ", " }, ExactF32(*v))?;
        }
        writeln!(f, "}};")
    }
    fn kernel_open(&self, f: &mut Formatter<'_>, k: &Kernel) -> fmt::Result {
        for (i, (name, ty, len)) in k.shared.iter().enumerate() {
            if k.shared_vec4(Shared(i)) {
                writeln!(f, "shared vec4 s_{name}[{}];", len / 4)?;
            } else {
                writeln!(f, "shared {} s_{name}[{len}];", Ty(*ty))?;
            }
        }
        writeln!(f, "void main() {{")?;
        writeln!(
            f,
            "  const int aubier_T = args.extents.v[0];\n  const int aubier_S = args.extents.v[1];"
        )
    }
    fn shared_at(&self, name: &str, idx: String, vec4: bool) -> String {
        if vec4 {
            format!("s_{name}[({idx}) >> 2][({idx}) & 3]")
        } else {
            format!("s_{name}[{idx}]")
        }
    }
    fn shared_load4(&self, name: &str, idx: String, dst: [String; 4]) -> String {
        let [a, b, c, d] = dst;
        format!("{{ const vec4 q = s_{name}[{idx}]; {a} = q.x; {b} = q.y; {c} = q.z; {d} = q.w; }}")
    }
    fn f32_lit(&self, v: f32, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}", F(v))
    }
    fn builtin(&self, b: Builtin) -> &'static str {
        match b {
            Builtin::Thread => "int(gl_LocalInvocationID.x)",
            Builtin::BlockX => "int(gl_WorkGroupID.x)",
            Builtin::BlockY => "int(gl_WorkGroupID.y)",
            Builtin::Tokens => "aubier_T",
            Builtin::Keys => "aubier_S",
        }
    }
    fn param(&self, name: &str) -> String {
        format!("args.{name}.v")
    }
    fn weight_f32(&self, name: &str) -> String {
        format!("AubierF32(args.{name}).v")
    }
    fn row_address(
        &self,
        name: &str,
        expert: Option<String>,
        row: String,
        row_bytes: usize,
    ) -> String {
        let base = match expert {
            Some(x) => format!("args.{name}.v[{x}]"),
            None => format!("args.{name}"),
        };
        format!("{base} + uint64_t({row}) * {row_bytes}ul")
    }
    fn call(&self, op: BinOp, float: bool) -> Option<&'static str> {
        match (op, float) {
            (BinOp::Add, true) => Some("aubier_add"),
            (BinOp::Sub, true) => Some("aubier_sub"),
            (BinOp::Mul, true) => Some("aubier_mul"),
            (BinOp::Div, true) => Some("aubier_div"),
            (BinOp::Rem, _) => Some("aubier_irem"),
            _ => min_max(op, float),
        }
    }
    fn is_nan(&self, x: String) -> String {
        format!("isnan({x})")
    }
    const WORDS: Words = Words {
        nonzero: " != 0",
        to_int: "int(",
        sqrt: "sqrt",
        barrier: "barrier()",
        exact_out_arrays: true,
    };
}

/// Extensions, float controls and the buffer-reference types.
const PRELUDE: &str = r#"#version 460
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference2 : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_shuffle : require
spirv_execution_mode(extensions = ["SPV_KHR_float_controls"], capabilities = [4466], 4461, 32);
layout(buffer_reference, std430, buffer_reference_align = 1) readonly buffer AubierBytes { uint8_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) readonly buffer AubierU16 { uint16_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer AubierU32 { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer AubierF32 { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer AubierI32 { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer AubierU64 { uint64_t v[]; };
"#;

/// Helpers every kernel may call (after the push constants).
const HELPERS: &str = r#"float aubier_add(float a, float b) { precise float r = a + b; return r; }
float aubier_sub(float a, float b) { precise float r = a - b; return r; }
float aubier_mul(float a, float b) { precise float r = a * b; return r; }
float aubier_div(float a, float b) { precise float r = a / b; return r; }
float aubier_fmax(float a, float b) { return (a > b || isnan(a)) ? a : b; }
float aubier_fmin(float a, float b) { return b < a ? b : a; }
int aubier_imax(int a, int b) { return max(a, b); }
int aubier_imin(int a, int b) { return min(a, b); }
int aubier_irem(int a, int b) { return a - (a / b) * b; }
float aubier_shfl_xor(float v, int mask) { return subgroupShuffleXor(v, uint(mask)); }
void aubier_ld16_f32(uint64_t row, int c, int n, out float o[16]) {
  for (int i = 0; i < 16; ++i) { int j = 16 * c + i; o[i] = j < n ? AubierF32(row).v[j] : 0.0f; }
}
"#;

/// An f32 constant in an expression: exact, NaN and ±∞ by their bits.
struct F(f32);

impl Display for F {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v.is_finite() {
            write!(f, "{}", ExactF32(v))
        } else {
            write!(f, "uintBitsToFloat(0x{:08x}u)", v.to_bits())
        }
    }
}
