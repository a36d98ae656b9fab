//! The Vulkan compute dialect: the kernel IR printed as a GLSL 4.60 compute shader, which
//! shaderc / glslang turn into SPIR-V (ARCHITECTURE.md § kernels-gen).
//!
//! Algorithm note. A shader is: a header (what made it), the extensions, the float-controls
//! execution mode `SignedZeroInfNanPreserve 32` (so NaN, ±∞ and −0 behave as IEEE says, as the
//! IR's NaN-propagating max and NaN tests need), the buffer-reference types, the push-constant
//! block, the helpers (f32 `+ − · /` as functions whose result is a `precise` variable, so every
//! one of them carries SPIR-V `NoContraction` and no driver fuses them into an FMA; the
//! NaN-propagating max; C's truncating `%`), the device math ([`math::glsl`], the op sequence of
//! [`super::math`]), the dequant functions of the quant types read ([`quant`], translated from
//! the C of [`super::quant`]), the kernel's constant tables, then `main`: shared arrays,
//! registers, per-thread arrays, body. Expressions are fully parenthesised; an f32 constant prints
//! as a decimal that parses to exactly its value (the shortest one when a parse through f64 gives
//! it back, else the f64 value, which is exact) or, for NaN and ±∞, `uintBitsToFloat`.
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
//! - device features: `bufferDeviceAddress`, `storageBuffer8BitAccess` (quant blocks are read a
//!   byte at a time, at any alignment, never past a tensor's end), `shaderInt64` (addresses),
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

mod math;
mod quant;

use super::emit::type_ident;
use super::ir::{BinOp, Builtin, Expr, IrError, Kernel, ParamKind, ReduceOp, Scalar, Stmt, UnOp};
use super::GenError;
use std::fmt::{self, Display, Formatter};

/// Bytes of `k`'s push constants: 8 per parameter (a device address), then 8 for the address of
/// the extents `int T, S`.
pub fn push_constant_bytes(k: &Kernel) -> u32 {
    8 * k.params.len() as u32 + 8
}

/// The push-constant bytes every Vulkan device has (`maxPushConstantsSize` ≥ 128).
const PUSH_CONSTANT_MIN: u32 = 128;

/// The GLSL 4.60 compute shader of kernel `k` (the ABI of the module note), `header` printed
/// first as `//` lines.
///
/// Errors: [`GenError::UnsupportedType`] when `k` reads a type without a device function;
/// [`GenError::Kernel`] when its push constants exceed the 128 bytes every device has (more than
/// 15 parameters).
pub fn render_glsl(k: &Kernel, header: &[String]) -> Result<String, GenError> {
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
    let mut tables = String::new();
    let mut fns = String::new();
    for ty in super::quant_types(k) {
        let unsupported = || GenError::UnsupportedType {
            kernel: k.name.clone(),
            ggml_type: ty.clone(),
        };
        tables.push_str(&quant::device_tables(&ty).ok_or_else(unsupported)?);
        fns.push_str(&quant::device_fn(&ty).ok_or_else(unsupported)?);
    }
    Ok(Shader {
        kernel: k,
        header,
        quant_tables: &tables,
        quant_fns: &fns,
    }
    .to_string())
}

/// Extensions, float controls and the buffer-reference types.
const PRELUDE: &str = r#"#version 460
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference2 : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_shuffle : require
spirv_execution_mode(extensions = ["SPV_KHR_float_controls"], capabilities = [4466], 4461, 32);
layout(buffer_reference, std430, buffer_reference_align = 1) readonly buffer AubierBytes { uint8_t v[]; };
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
int aubier_irem(int a, int b) { return a - (a / b) * b; }
/* The byte at address p, as C's integer promotion of an unsigned char gives it. */
int aubier_b8(uint64_t p) { return int(AubierBytes(p).v[0]); }
void aubier_ld16_f32(uint64_t row, int c, int n, out float o[16]) {
  for (int i = 0; i < 16; ++i) { int j = 16 * c + i; o[i] = j < n ? AubierF32(row).v[j] : 0.0f; }
}
"#;

/// A complete shader for one kernel.
struct Shader<'a> {
    kernel: &'a Kernel,
    header: &'a [String],
    quant_tables: &'a str,
    quant_fns: &'a str,
}

impl Display for Shader<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let k = self.kernel;
        f.write_str(PRELUDE)?;
        for line in self.header {
            writeln!(f, "// {line}")?;
        }
        for line in k.note.lines() {
            writeln!(f, "// {line}")?;
        }
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
        writeln!(f, "  AubierI32 extents;\n}} args;")?;
        f.write_str(HELPERS)?;
        f.write_str(&math::glsl())?;
        f.write_str(self.quant_tables)?;
        f.write_str(self.quant_fns)?;
        for (name, vals) in &k.tables {
            write!(f, "const float t_{name}[{}] = {{", vals.len())?;
            for (i, v) in vals.iter().enumerate() {
                write!(f, "{}{}", if i == 0 { "" } else { ", " }, ConstF(*v))?;
            }
            writeln!(f, "}};")?;
        }
        for (name, ty, len) in &k.shared {
            writeln!(f, "shared {} s_{name}[{len}];", Ty(*ty))?;
        }
        writeln!(f, "void main() {{")?;
        writeln!(
            f,
            "  const int aubier_T = args.extents.v[0];\n  const int aubier_S = args.extents.v[1];"
        )?;
        for (i, (name, ty)) in k.vars.iter().enumerate() {
            let zero = match ty {
                Scalar::F32 => "0.0f",
                Scalar::I32 => "0",
            };
            writeln!(f, "  {} v{i}_{name} = {zero};", Ty(*ty))?;
        }
        for (name, len) in &k.locals {
            writeln!(f, "  float l_{name}[{len}];")?;
        }
        for s in &k.body {
            write!(f, "{}", St { k, s, depth: 1 })?;
        }
        writeln!(f, "}}")
    }
}

struct Ty(Scalar);

impl Display for Ty {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Scalar::F32 => "float",
            Scalar::I32 => "int",
        })
    }
}

/// An f32 constant in an expression: exact, NaN and ±∞ by their bits.
struct F(f32);

impl Display for F {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v.is_finite() {
            write!(f, "{}", ConstF(v))
        } else {
            write!(f, "uintBitsToFloat(0x{:08x}u)", v.to_bits())
        }
    }
}

/// An f32 constant in a constant initializer (where `uintBitsToFloat` is not a constant
/// expression): NaN and ±∞ as the folded quotients `0/0`, `±1/0`.
pub(super) struct ConstF(pub(super) f32);

impl Display for ConstF {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v.is_nan() {
            return f.write_str("(0.0f / 0.0f)");
        }
        if v.is_infinite() {
            return f.write_str(if v > 0.0 {
                "(1.0f / 0.0f)"
            } else {
                "(-1.0f / 0.0f)"
            });
        }
        let (sign, m) = if v.is_sign_negative() {
            ("-", -v)
        } else {
            ("", v)
        };
        // glslang may parse a literal to f64 and round that to f32; the shortest digits survive
        // the double rounding almost always, the f64 digits (exactly `m`) always.
        let short = format!("{m:?}");
        let text = if short.parse::<f64>().map(|d| d as f32) == Ok(m) {
            short
        } else {
            format!("{:?}", f64::from(m))
        };
        if sign.is_empty() {
            write!(f, "{text}f")
        } else {
            write!(f, "(-{text}f)")
        }
    }
}

struct E<'a> {
    k: &'a Kernel,
    e: &'a Expr,
}

impl E<'_> {
    /// `e` as a GLSL `bool` (the IR's conditions are 0/1 i32).
    fn cond(&self) -> String {
        format!("({} != 0)", self)
    }
}

impl Display for E<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let k = self.k;
        let e = |e| E { k, e };
        match self.e {
            Expr::F(v) => write!(f, "{}", F(*v)),
            Expr::I(v) if *v == i32::MIN => f.write_str("(-2147483647 - 1)"),
            Expr::I(v) if *v < 0 => write!(f, "({v})"),
            Expr::I(v) => write!(f, "{v}"),
            Expr::Var(v) => write!(f, "v{}_{}", v.0, k.vars[v.0].0),
            Expr::Builtin(b) => f.write_str(match b {
                Builtin::Thread => "int(gl_LocalInvocationID.x)",
                Builtin::BlockX => "int(gl_WorkGroupID.x)",
                Builtin::BlockY => "int(gl_WorkGroupID.y)",
                Builtin::Tokens => "aubier_T",
                Builtin::Keys => "aubier_S",
            }),
            Expr::Load(p, i) => match &k.params[p.0] {
                (name, ParamKind::Weight { .. }) => {
                    write!(f, "AubierF32(args.{name}).v[{}]", e(i))
                }
                (name, _) => write!(f, "args.{name}.v[{}]", e(i)),
            },
            Expr::Table(t, i) => write!(f, "t_{}[{}]", k.tables[*t].0, e(i)),
            Expr::LoadShared(a, i) => write!(f, "s_{}[{}]", k.shared[a.0].0, e(i)),
            Expr::LoadLocal(a, i) => write!(f, "l_{}[{}]", k.locals[a.0].0, e(i)),
            Expr::Bin(op, a, b) => {
                let float = matches!(k.ty(a), Ok(Scalar::F32));
                let call = match (op, float) {
                    (BinOp::Add, true) => Some("aubier_add"),
                    (BinOp::Sub, true) => Some("aubier_sub"),
                    (BinOp::Mul, true) => Some("aubier_mul"),
                    (BinOp::Div, true) => Some("aubier_div"),
                    (BinOp::Min, true) => Some("aubier_fmin"),
                    (BinOp::Max, true) => Some("aubier_fmax"),
                    (BinOp::Min, false) => Some("min"),
                    (BinOp::Max, false) => Some("max"),
                    (BinOp::Rem, _) => Some("aubier_irem"),
                    _ => None,
                };
                if let Some(name) = call {
                    return write!(f, "{name}({}, {})", e(a), e(b));
                }
                let infix = match op {
                    BinOp::Add => "+",
                    BinOp::Sub => "-",
                    BinOp::Mul => "*",
                    BinOp::Div => "/",
                    BinOp::Lt => "<",
                    BinOp::Le => "<=",
                    BinOp::Eq => "==",
                    BinOp::And => {
                        return write!(f, "int({} && {})", e(a).cond(), e(b).cond());
                    }
                    BinOp::Or => {
                        return write!(f, "int({} || {})", e(a).cond(), e(b).cond());
                    }
                    BinOp::Rem | BinOp::Min | BinOp::Max => return Err(fmt::Error),
                };
                if matches!(op, BinOp::Lt | BinOp::Le | BinOp::Eq) {
                    write!(f, "int({} {infix} {})", e(a), e(b))
                } else {
                    write!(f, "({} {infix} {})", e(a), e(b))
                }
            }
            Expr::Un(op, a) => match op {
                UnOp::Neg => write!(f, "(-{})", e(a)),
                UnOp::Sqrt => write!(f, "sqrt({})", e(a)),
                UnOp::Exp => write!(f, "aubier_exp({})", e(a)),
                UnOp::Ln => write!(f, "aubier_ln({})", e(a)),
                UnOp::Sin => write!(f, "aubier_sin({})", e(a)),
                UnOp::Cos => write!(f, "aubier_cos({})", e(a)),
                UnOp::ToF32 => write!(f, "float({})", e(a)),
                UnOp::Not => write!(f, "int({} == 0)", e(a)),
                UnOp::IsNan => write!(f, "int(isnan({}))", e(a)),
            },
            Expr::Select(c, a, b) => write!(f, "({} ? {} : {})", e(c).cond(), e(a), e(b)),
        }
    }
}

struct St<'a> {
    k: &'a Kernel,
    s: &'a Stmt,
    depth: usize,
}

impl St<'_> {
    fn block(&self, f: &mut Formatter<'_>, body: &[Stmt]) -> fmt::Result {
        for s in body {
            write!(
                f,
                "{}",
                St {
                    k: self.k,
                    s,
                    depth: self.depth + 1
                }
            )?;
        }
        Ok(())
    }
}

impl Display for St<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let k = self.k;
        let e = |e| E { k, e };
        let pad = "  ".repeat(self.depth);
        let var = |v: &super::ir::Var| format!("v{}_{}", v.0, k.vars[v.0].0);
        match self.s {
            Stmt::Set(v, x) => writeln!(f, "{pad}{} = {};", var(v), e(x)),
            Stmt::Store(p, i, x) => {
                writeln!(f, "{pad}args.{}.v[{}] = {};", k.params[p.0].0, e(i), e(x))
            }
            Stmt::StoreShared(a, i, x) => {
                writeln!(f, "{pad}s_{}[{}] = {};", k.shared[a.0].0, e(i), e(x))
            }
            Stmt::StoreLocal(a, i, x) => {
                writeln!(f, "{pad}l_{}[{}] = {};", k.locals[a.0].0, e(i), e(x))
            }
            Stmt::For {
                var: v,
                start,
                end,
                step,
                body,
            } => {
                let v = var(v);
                writeln!(
                    f,
                    "{pad}for ({v} = {}; {v} < {}; {v} += {step}) {{",
                    e(start),
                    e(end)
                )?;
                self.block(f, body)?;
                writeln!(f, "{pad}}}")
            }
            Stmt::If(c, a, b) => {
                writeln!(f, "{pad}if {} {{", e(c).cond())?;
                self.block(f, a)?;
                if !b.is_empty() {
                    writeln!(f, "{pad}}} else {{")?;
                    self.block(f, b)?;
                }
                writeln!(f, "{pad}}}")
            }
            Stmt::Barrier => writeln!(f, "{pad}barrier();"),
            Stmt::WarpReduce(op, v) => {
                let v = var(v);
                let step = match op {
                    ReduceOp::Sum => format!("{v} = aubier_add({v}, subgroupShuffleXor({v}, o))"),
                    ReduceOp::Max => format!("{v} = aubier_fmax({v}, subgroupShuffleXor({v}, o))"),
                };
                writeln!(
                    f,
                    "{pad}for (uint o = {}u; o > 0u; o >>= 1) {step};",
                    k.warp / 2
                )
            }
            Stmt::Dequant16 {
                w,
                expert,
                row,
                chunk,
                dst,
            } => {
                let (name, kind) = &k.params[w.0];
                let (ty, rb, len) = match kind {
                    ParamKind::Weight {
                        ggml_type,
                        row_bytes,
                        row_len,
                    }
                    | ParamKind::Experts {
                        ggml_type,
                        row_bytes,
                        row_len,
                    } => (ggml_type, row_bytes, row_len),
                    _ => return Err(fmt::Error),
                };
                let base = match expert {
                    Some(x) => format!("args.{name}.v[{}]", e(x)),
                    None => format!("args.{name}"),
                };
                let row = format!("{base} + uint64_t({}) * {rb}ul", e(row));
                let (dst, dst_len) = &k.locals[dst.0];
                // A function's `out float[16]` takes an array of exactly 16.
                let target = if *dst_len == 16 {
                    format!("l_{dst}")
                } else {
                    "dq".to_string()
                };
                let call = if ty == "F32" {
                    format!("aubier_ld16_f32({row}, {}, {len}, {target})", e(chunk))
                } else {
                    format!(
                        "aubier_dq16_{}({row}, {}, {target})",
                        type_ident(ty),
                        e(chunk)
                    )
                };
                if *dst_len == 16 {
                    writeln!(f, "{pad}{call};")
                } else {
                    writeln!(
                        f,
                        "{pad}{{ float dq[16]; {call}; for (int j = 0; j < 16; ++j) l_{dst}[j] = dq[j]; }}"
                    )
                }
            }
        }
    }
}
