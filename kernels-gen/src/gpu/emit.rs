//! The one printer of the kernel IR: every statement and expression is printed here, in small
//! `Display` pieces (STYLE.md §3), for the three dialects — HIP and CUDA (header-free C++ device
//! code) and Vulkan GLSL 4.60 ([`super::glsl::Glsl`]). What a dialect spells differently (how a
//! thread reads its indices, how a parameter is reached, the barrier, f32 arithmetic that must
//! not contract, the file's frame around the body) is the [`Dialect`] trait, whose defaults are
//! the C++ spellings.
//!
//! Algorithm note. A generated source is: the dialect's frame ([`Dialect::open`]: the header
//! lines, the kernel's note and launch shape, the dialect prelude), the helpers (device math of
//! [`super::math`], NaN-propagating max, the F32 chunk load), the dequant device functions of
//! the quant types the kernel reads ([`super::quant`]), the kernel's f32 constant tables, then
//! the kernel ([`Dialect::kernel_open`]: its signature and shared arrays), its registers and
//! per-thread arrays, and the body. Expressions are fully parenthesised. Arrays are named
//! `s_<name>` (shared), `l_<name>` (per thread) and `t_<name>` (constant tables) in every
//! dialect. The C++ dialects keep every f32 operation uncontracted with `#pragma clang fp
//! contract(off)`, the GLSL one with `precise` helpers ([`super::glsl`]). HIP and CUDA print
//! kernels built for warps of [`WARP`] = 32 lanes (CUDA's warp; on AMD the shuffle spans 32-lane
//! groups, wave32 on gfx1201/gfx1100 and half a wave64 on gfx942) and refuse another width; GLSL
//! prints any width, the device's subgroup size.

use super::error::GenError;
use super::ir::{BinOp, Builtin, Expr, Kernel, ParamKind, ReduceOp, Scalar, Shared, Stmt, UnOp};
use super::quant::{self, Lang};
use std::fmt::{self, Display, Formatter};

pub use super::ir::WARP;

/// What one GPU dialect spells differently. The provided methods are the C++ (HIP, CUDA)
/// spellings.
pub trait Dialect {
    /// Short name (`hip`, `cuda`, `vulkan`): the directory of the generated files.
    fn name(&self) -> &'static str;
    /// File extension without the dot.
    fn ext(&self) -> &'static str;
    /// Refuses a kernel this dialect cannot print (C++: a warp other than [`WARP`]).
    fn check(&self, k: &Kernel) -> Result<(), GenError> {
        if k.warp != WARP {
            return Err(GenError::Warp {
                kernel: k.name.clone(),
                warp: k.warp,
            });
        }
        Ok(())
    }
    /// The C++ prelude: defines `__global__`, `__device__`, `__shared__`, `__constant__` and the
    /// intrinsics `aubier_tid()`, `aubier_bid_x()`, `aubier_bid_y()`, `aubier_barrier()` (block
    /// barrier with a shared-memory fence) and `aubier_shfl_xor(float v, int mask)` (the value of
    /// lane `lane ^ mask`). Unused by dialects that override [`Dialect::open`].
    fn prelude(&self) -> &'static str {
        ""
    }
    /// The attribute bounding a kernel's block size to `block` threads (C++).
    fn launch_bounds(&self, _block: u32) -> String {
        String::new()
    }
    /// Everything before the helpers: `header` and the kernel's note as comments, its launch
    /// shape, the prelude.
    fn open(&self, f: &mut Formatter<'_>, k: &Kernel, header: &[String]) -> fmt::Result {
        comments(f, k, header)?;
        writeln!(
            f,
            "// launch: grid ({}, {}), block {}",
            k.grid[0], k.grid[1], k.block
        )?;
        writeln!(f, "#pragma clang fp contract(off)")?;
        f.write_str(self.prelude())
    }
    /// The helpers every kernel may call: the device math, `aubier_fmax`/`fmin`/`imax`/`imin`,
    /// `aubier_ld16_f32`.
    fn helpers(&self) -> String {
        format!("{}{CPP_HELPERS}", super::math::device_math(Lang::Cpp))
    }
    /// The language of the dequant device functions ([`super::quant`]).
    fn lang(&self) -> Lang {
        Lang::Cpp
    }
    /// The constant f32 table `name` holding `vals`, declared and initialised.
    fn const_table(&self, f: &mut Formatter<'_>, name: &str, vals: &[f32]) -> fmt::Result {
        write!(f, "__device__ const float {name}[{}] = {{", vals.len())?;
        for (i, v) in vals.iter().enumerate() {
            f.write_str(if i == 0 { "" } else { ", " })?;
            self.f32_lit(*v, f)?;
        }
        writeln!(f, "}};")
    }
    /// The kernel's opening: its signature (parameters in IR order, then `T`, `S`) and its shared
    /// arrays, ending inside the body.
    fn kernel_open(&self, f: &mut Formatter<'_>, k: &Kernel) -> fmt::Result {
        writeln!(
            f,
            "extern \"C\" __global__ {} void {}(",
            self.launch_bounds(k.block),
            k.name
        )?;
        for (name, kind) in &k.params {
            let ty = match kind {
                ParamKind::F32 { writes: true, .. } => "float* __restrict__",
                ParamKind::F32 { writes: false, .. } => "const float* __restrict__",
                ParamKind::I32 { writes: true, .. } => "int* __restrict__",
                ParamKind::I32 { writes: false, .. } => "const int* __restrict__",
                ParamKind::Weight { .. } => "const unsigned char* __restrict__",
                ParamKind::Experts { .. } => "const unsigned long long* __restrict__",
            };
            writeln!(f, "    {ty} {name},")?;
        }
        writeln!(f, "    int T, int S) {{")?;
        writeln!(f, "  (void)T; (void)S;")?;
        let mut vec4 = false;
        for (i, (name, ty, len)) in k.shared.iter().enumerate() {
            let align = if k.shared_vec4(Shared(i)) {
                vec4 = true;
                " __attribute__((aligned(16)))"
            } else {
                ""
            };
            writeln!(f, "  __shared__{align} {} s_{name}[{len}];", Ty(*ty))?;
        }
        if vec4 {
            writeln!(
                f,
                "  typedef float aubier_f4 __attribute__((ext_vector_type(4)));"
            )?;
        }
        Ok(())
    }
    /// Element `idx` of shared array `name` (`vec4`: the array is read by
    /// [`Stmt::LoadShared4`], [`Kernel::shared_vec4`]).
    fn shared_at(&self, name: &str, idx: String, _vec4: bool) -> String {
        format!("s_{name}[{idx}]")
    }
    /// The statement `dst[c] = s_name[4·idx + c]`, `c < 4`, as one 16-byte load.
    fn shared_load4(&self, name: &str, idx: String, dst: [String; 4]) -> String {
        let [a, b, c, d] = dst;
        format!(
            "{{ const aubier_f4 q = ((const aubier_f4*)s_{name})[{idx}]; {a} = q.x; {b} = q.y; {c} = q.z; {d} = q.w; }}"
        )
    }
    /// An f32 literal of exactly `v`.
    fn f32_lit(&self, v: f32, f: &mut Formatter<'_>) -> fmt::Result {
        if v.is_nan() {
            f.write_str("__builtin_nanf(\"\")")
        } else if v.is_infinite() {
            f.write_str(if v > 0.0 {
                "__builtin_inff()"
            } else {
                "(-__builtin_inff())"
            })
        } else if v.is_sign_negative() {
            write!(f, "(-{:?}f)", -v)
        } else {
            write!(f, "{v:?}f")
        }
    }
    /// A builtin's value, as an `int`.
    fn builtin(&self, b: Builtin) -> &'static str {
        match b {
            Builtin::Thread => "aubier_tid()",
            Builtin::BlockX => "aubier_bid_x()",
            Builtin::BlockY => "aubier_bid_y()",
            Builtin::Tokens => "T",
            Builtin::Keys => "S",
        }
    }
    /// The indexable elements of F32 / I32 parameter `name`.
    fn param(&self, name: &str) -> String {
        name.to_string()
    }
    /// The indexable f32 elements of an F32 weight `name` (raw bytes).
    fn weight_f32(&self, name: &str) -> String {
        format!("((const float*){name})")
    }
    /// The address of row `row` (`row_bytes` bytes each) of weight `name`, or of expert
    /// `expert`'s stacked rows when the parameter is an expert table.
    fn row_address(
        &self,
        name: &str,
        expert: Option<String>,
        row: String,
        row_bytes: usize,
    ) -> String {
        let base = match expert {
            Some(x) => format!("((const unsigned char*){name}[{x}])"),
            None => name.to_string(),
        };
        format!("{base} + (unsigned long long){row} * {row_bytes}ull")
    }
    /// A function computing the f32 or i32 operation `op` where it is not an infix operator
    /// (C++: the NaN-propagating `min`/`max` only).
    fn call(&self, op: BinOp, float: bool) -> Option<&'static str> {
        min_max(op, float)
    }
    /// The truth value "f32 `x` is NaN".
    fn is_nan(&self, x: String) -> String {
        format!("{x} != {x}")
    }
    /// The dialect's words inside expressions and statements.
    const WORDS: Words = Words {
        nonzero: "",
        to_int: "(",
        sqrt: "__builtin_sqrtf",
        barrier: "aubier_barrier()",
        exact_out_arrays: false,
    };
}

/// What a dialect spells differently inside expressions and statements ([`Dialect::WORDS`]).
pub struct Words {
    /// Appended to an i32 to make it the dialect's truth value (C++: nothing).
    pub nonzero: &'static str,
    /// Opens a truth value made an i32 0/1, closed by `)` (C++: `(`).
    pub to_int: &'static str,
    /// The correctly rounded f32 square root function.
    pub sqrt: &'static str,
    /// The block barrier statement.
    pub barrier: &'static str,
    /// The dequant functions write `float[16]` arrays only (a per-thread array of another length
    /// goes through a copy).
    pub exact_out_arrays: bool,
}

/// An i32 condition `x` as `D`'s truth value.
fn cond<D: Dialect>(x: impl Display) -> String {
    format!("{x}{}", D::WORDS.nonzero)
}

/// A truth value `x` as `D`'s i32 0/1.
fn to_int<D: Dialect>(x: impl Display) -> String {
    format!("{}{x})", D::WORDS.to_int)
}

/// The NaN-propagating f32 and the i32 `min`/`max` helpers, by name.
pub(super) fn min_max(op: BinOp, float: bool) -> Option<&'static str> {
    match (op, float) {
        (BinOp::Min, true) => Some("aubier_fmin"),
        (BinOp::Max, true) => Some("aubier_fmax"),
        (BinOp::Min, false) => Some("aubier_imin"),
        (BinOp::Max, false) => Some("aubier_imax"),
        _ => None,
    }
}

/// `header` and `k`'s note as `//` lines.
pub(super) fn comments(f: &mut Formatter<'_>, k: &Kernel, header: &[String]) -> fmt::Result {
    for line in header.iter().map(String::as_str).chain(k.note.lines()) {
        writeln!(f, "// {line}")?;
    }
    Ok(())
}

/// HIP for AMD GPUs (gfx1201, gfx1100, gfx942), header-free: clang's amdgcn builtins.
#[derive(Clone, Copy, Debug, Default)]
pub struct Hip;

/// CUDA for NVIDIA GPUs, header-free: clang's nvvm builtins (`shfl.sync.bfly`, the
/// `__shfl_xor_sync(0xffffffff, v, mask)` of the CUDA headers; warp 32).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cuda;

impl Dialect for Hip {
    fn name(&self) -> &'static str {
        "hip"
    }
    fn ext(&self) -> &'static str {
        "hip"
    }
    fn prelude(&self) -> &'static str {
        concat!(
            "#define __global__ __attribute__((global))\n",
            "#define __device__ __attribute__((device))\n",
            "#define __shared__ __attribute__((shared))\n",
            "#define __constant__ __attribute__((constant))\n",
            "__device__ inline int aubier_tid() { return (int)__builtin_amdgcn_workitem_id_x(); }\n",
            "__device__ inline int aubier_bid_x() { return (int)__builtin_amdgcn_workgroup_id_x(); }\n",
            "__device__ inline int aubier_bid_y() { return (int)__builtin_amdgcn_workgroup_id_y(); }\n",
            "__device__ inline void aubier_barrier() {\n",
            "  __builtin_amdgcn_fence(__ATOMIC_RELEASE, \"workgroup\");\n",
            "  __builtin_amdgcn_s_barrier();\n",
            "  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, \"workgroup\");\n",
            "}\n",
            "__device__ inline float aubier_shfl_xor(float v, int mask) {\n",
            "  int lane = (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));\n",
            "  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute((lane ^ mask) << 2, __builtin_bit_cast(int, v)));\n",
            "}\n",
        )
    }
    fn launch_bounds(&self, block: u32) -> String {
        format!("__attribute__((amdgpu_flat_work_group_size(1, {block})))")
    }
}

impl Dialect for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn ext(&self) -> &'static str {
        "cu"
    }
    fn prelude(&self) -> &'static str {
        concat!(
            "#define __global__ __attribute__((global))\n",
            "#define __device__ __attribute__((device))\n",
            "#define __shared__ __attribute__((shared))\n",
            "#define __constant__ __attribute__((constant))\n",
            "__device__ inline int aubier_tid() { return __nvvm_read_ptx_sreg_tid_x(); }\n",
            "__device__ inline int aubier_bid_x() { return __nvvm_read_ptx_sreg_ctaid_x(); }\n",
            "__device__ inline int aubier_bid_y() { return __nvvm_read_ptx_sreg_ctaid_y(); }\n",
            "__device__ inline void aubier_barrier() { __nvvm_bar_sync(0); }\n",
            "__device__ inline float aubier_shfl_xor(float v, int mask) {\n",
            "  return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, mask, 31);\n",
            "}\n",
        )
    }
    fn launch_bounds(&self, block: u32) -> String {
        format!("__attribute__((launch_bounds({block})))")
    }
}

/// Helpers of the C++ dialects (after the device math).
const CPP_HELPERS: &str = r#"__device__ inline float aubier_fmax(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ inline float aubier_fmin(float a, float b) { return b < a ? b : a; }
__device__ inline int aubier_imax(int a, int b) { return a > b ? a : b; }
__device__ inline int aubier_imin(int a, int b) { return a < b ? a : b; }
__device__ inline void aubier_ld16_f32(const unsigned char* row, int c, int n, float* out) {
  const float* r = (const float*)row;
  for (int i = 0; i < 16; ++i) { int j = 16 * c + i; out[i] = j < n ? r[j] : 0.0f; }
}
"#;

/// The lower-case ggml type name used in device function names (`Q2_K` → `q2_k`).
pub fn type_ident(ggml_type: &str) -> String {
    ggml_type.to_ascii_lowercase()
}

/// The source of kernel `k` in dialect `d`, with `header` lines on top.
///
/// Errors: what [`Dialect::check`] refuses ([`GenError::Warp`] for C++, [`GenError::Kernel`]
/// for GLSL push constants); [`GenError::UnsupportedType`] when `k` reads a type without a
/// device function.
pub fn render<D: Dialect>(d: &D, k: &Kernel, header: &[String]) -> Result<String, GenError> {
    d.check(k)?;
    let mut quant = String::new();
    let mut fns = String::new();
    for ty in quant::quant_types(k) {
        let unsupported = || GenError::UnsupportedType {
            kernel: k.name.clone(),
            ggml_type: ty.clone(),
        };
        let tables = quant::device_tables(&ty, d.lang()).ok_or_else(unsupported)?;
        quant.push_str(&tables.to_string());
        fns.push_str(
            &quant::device_fn(&ty, d.lang())
                .ok_or_else(unsupported)?
                .to_string(),
        );
    }
    quant.push_str(&fns);
    Ok(Source {
        dialect: d,
        kernel: k,
        header,
        quant: &quant,
    }
    .to_string())
}

/// A complete source file for one kernel in dialect `D`.
struct Source<'a, D: Dialect> {
    dialect: &'a D,
    kernel: &'a Kernel,
    header: &'a [String],
    /// The quant tables, then the dequant functions, rendered.
    quant: &'a str,
}

impl<D: Dialect> Display for Source<'_, D> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let (d, k) = (self.dialect, self.kernel);
        d.open(f, k, self.header)?;
        f.write_str(&d.helpers())?;
        f.write_str(self.quant)?;
        for (name, vals) in &k.tables {
            d.const_table(f, &format!("t_{name}"), vals)?;
        }
        d.kernel_open(f, k)?;
        for (i, (name, ty)) in k.vars.iter().enumerate() {
            let zero = match ty {
                Scalar::F32 => Expr::F(0.0),
                Scalar::I32 => Expr::I(0),
            };
            writeln!(f, "  {} v{i}_{name} = {};", Ty(*ty), E { d, k, e: &zero })?;
        }
        for (name, len) in &k.locals {
            writeln!(f, "  float l_{name}[{len}];")?;
        }
        for s in &k.body {
            write!(f, "{}", St { d, k, s, depth: 1 })?;
        }
        writeln!(f, "}}")
    }
}

/// A scalar type's name (the same in C++ and GLSL).
pub(super) struct Ty(pub(super) Scalar);

impl Display for Ty {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Scalar::F32 => "float",
            Scalar::I32 => "int",
        })
    }
}

/// `a op b` in dialect `d` (`float`: the operands are f32).
fn bin<D: Dialect>(
    f: &mut Formatter<'_>,
    d: &D,
    op: BinOp,
    float: bool,
    a: &dyn Display,
    b: &dyn Display,
) -> fmt::Result {
    if let Some(name) = d.call(op, float) {
        return write!(f, "{name}({a}, {b})");
    }
    let infix = match op {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::Rem => "%",
        BinOp::Lt => return f.write_str(&to_int::<D>(format!("{a} < {b}"))),
        BinOp::Le => return f.write_str(&to_int::<D>(format!("{a} <= {b}"))),
        BinOp::Eq => return f.write_str(&to_int::<D>(format!("{a} == {b}"))),
        BinOp::And | BinOp::Or => {
            let op = if op == BinOp::And { "&&" } else { "||" };
            let (a, b) = (cond::<D>(a), cond::<D>(b));
            return f.write_str(&to_int::<D>(format!("{a} {op} {b}")));
        }
        BinOp::Min | BinOp::Max => return Err(fmt::Error),
    };
    write!(f, "({a} {infix} {b})")
}

struct E<'a, D: Dialect> {
    d: &'a D,
    k: &'a Kernel,
    e: &'a Expr,
}

impl<D: Dialect> Display for E<'_, D> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let (d, k) = (self.d, self.k);
        let e = |e| E { d, k, e };
        match self.e {
            Expr::F(v) => d.f32_lit(*v, f),
            Expr::I(v) if *v == i32::MIN => f.write_str("(-2147483647 - 1)"),
            Expr::I(v) if *v < 0 => write!(f, "({v})"),
            Expr::I(v) => write!(f, "{v}"),
            Expr::Var(v) => write!(f, "v{}_{}", v.0, k.vars[v.0].0),
            Expr::Builtin(b) => f.write_str(d.builtin(*b)),
            Expr::Load(p, i) => match &k.params[p.0] {
                (name, ParamKind::Weight { .. }) => write!(f, "{}[{}]", d.weight_f32(name), e(i)),
                (name, _) => write!(f, "{}[{}]", d.param(name), e(i)),
            },
            Expr::Table(t, i) => write!(f, "t_{}[{}]", k.tables[*t].0, e(i)),
            Expr::LoadShared(a, i) => {
                f.write_str(&d.shared_at(&k.shared[a.0].0, e(i).to_string(), k.shared_vec4(*a)))
            }
            Expr::LoadLocal(a, i) => write!(f, "l_{}[{}]", k.locals[a.0].0, e(i)),
            Expr::Bin(op, a, b) => {
                let float = matches!(k.ty(a), Ok(Scalar::F32));
                bin(f, d, *op, float, &e(a), &e(b))
            }
            Expr::Un(op, a) => match op {
                UnOp::Neg => write!(f, "(-{})", e(a)),
                UnOp::Sqrt => write!(f, "{}({})", D::WORDS.sqrt, e(a)),
                UnOp::Exp => write!(f, "aubier_exp({})", e(a)),
                UnOp::Ln => write!(f, "aubier_ln({})", e(a)),
                UnOp::Sin => write!(f, "aubier_sin({})", e(a)),
                UnOp::Cos => write!(f, "aubier_cos({})", e(a)),
                UnOp::ToF32 => write!(f, "float({})", e(a)),
                UnOp::Not => f.write_str(&to_int::<D>(format!("{} == 0", e(a)))),
                UnOp::IsNan => f.write_str(&to_int::<D>(d.is_nan(e(a).to_string()))),
            },
            Expr::Select(c, a, b) => {
                write!(f, "({} ? {} : {})", cond::<D>(e(c)), e(a), e(b))
            }
        }
    }
}

struct St<'a, D: Dialect> {
    d: &'a D,
    k: &'a Kernel,
    s: &'a Stmt,
    depth: usize,
}

impl<D: Dialect> St<'_, D> {
    fn block(&self, f: &mut Formatter<'_>, body: &[Stmt]) -> fmt::Result {
        for s in body {
            let depth = self.depth + 1;
            write!(f, "{}", St { s, depth, ..*self })?;
        }
        Ok(())
    }
}

impl<D: Dialect> Display for St<'_, D> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let (d, k) = (self.d, self.k);
        let e = |e| E { d, k, e };
        let pad = "  ".repeat(self.depth);
        let var = |v: &super::ir::Var| format!("v{}_{}", v.0, k.vars[v.0].0);
        match self.s {
            Stmt::Set(v, x) => writeln!(f, "{pad}{} = {};", var(v), e(x)),
            Stmt::Store(p, i, x) => {
                writeln!(
                    f,
                    "{pad}{}[{}] = {};",
                    d.param(&k.params[p.0].0),
                    e(i),
                    e(x)
                )
            }
            Stmt::StoreShared(a, i, x) => {
                let at = d.shared_at(&k.shared[a.0].0, e(i).to_string(), k.shared_vec4(*a));
                writeln!(f, "{pad}{at} = {};", e(x))
            }
            Stmt::LoadShared4(a, i, dst) => {
                let load = d.shared_load4(&k.shared[a.0].0, e(i).to_string(), dst.map(|v| var(&v)));
                writeln!(f, "{pad}{load}")
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
                writeln!(f, "{pad}if ({}) {{", cond::<D>(e(c)))?;
                self.block(f, a)?;
                if !b.is_empty() {
                    writeln!(f, "{pad}}} else {{")?;
                    self.block(f, b)?;
                }
                writeln!(f, "{pad}}}")
            }
            Stmt::Barrier => writeln!(f, "{pad}{};", D::WORDS.barrier),
            Stmt::WarpReduce(op, v) => {
                let v = var(v);
                let other = format!("aubier_shfl_xor({v}, o)");
                let op = match op {
                    ReduceOp::Sum => BinOp::Add,
                    ReduceOp::Max => BinOp::Max,
                };
                write!(
                    f,
                    "{pad}for (int o = {}; o > 0; o >>= 1) {v} = ",
                    k.warp / 2
                )?;
                bin(f, d, op, true, &v, &other)?;
                writeln!(f, ";")
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
                    } => (ggml_type, *row_bytes, row_len),
                    _ => return Err(fmt::Error),
                };
                let expert = expert.as_ref().map(|x| e(x).to_string());
                let row = d.row_address(name, expert, e(row).to_string(), rb);
                let (dst, dst_len) = &k.locals[dst.0];
                let copy = D::WORDS.exact_out_arrays && *dst_len != 16;
                let target = if copy {
                    "dq".to_string()
                } else {
                    format!("l_{dst}")
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
                if copy {
                    writeln!(
                        f,
                        "{pad}{{ float dq[16]; {call}; for (int j = 0; j < 16; ++j) l_{dst}[j] = dq[j]; }}"
                    )
                } else {
                    writeln!(f, "{pad}{call};")
                }
            }
        }
    }
}
