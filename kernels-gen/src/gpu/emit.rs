//! Emitters: the kernel IR printed as header-free C++ device code, in small `Display` pieces
//! (STYLE.md §3). One emitter serves both targets; what differs between HIP and CUDA (how a thread
//! reads its indices, the barrier, the lane shuffle, launch bounds) is the [`Dialect`] trait.
//!
//! Algorithm note. A generated source is: a header (what made it), `#pragma clang fp
//! contract(off)` (no FMA contraction, so the GPU rounds exactly where the IR and the CPU
//! execution round), the dialect prelude (`__global__`/`__device__`/`__shared__` as clang
//! attributes and five `aubier_*` intrinsics), the device math ([`super::math::DEVICE_MATH`]),
//! helpers (NaN-propagating max, the F32 chunk load), the dequant device function of each quant
//! type the kernel reads ([`super::quant::device_fn`]), then the kernel: parameters in IR order
//! then `int T, int S`, shared arrays, registers, per-thread arrays, body. Expressions are fully
//! parenthesised; f32 constants print with Rust's round-tripping `{:?}` plus `f`. Both dialects
//! print kernels built for warps of [`WARP`] = 32 lanes (CUDA's warp; on AMD the shuffle spans
//! 32-lane groups, wave32 on gfx1201/gfx1100 and half a wave64 on gfx942); [`super::render`]
//! refuses a kernel of another width.

use super::ir::{BinOp, Builtin, Expr, Kernel, ParamKind, ReduceOp, Scalar, Stmt, UnOp};
use std::fmt::{self, Display, Formatter};

/// Lanes per warp of every kernel the HIP and CUDA dialects print.
pub const WARP: u32 = 32;

/// What one GPU dialect spells differently.
pub trait Dialect {
    /// Short name (`hip`, `cuda`): the directory of the generated files.
    fn name(&self) -> &'static str;
    /// File extension without the dot.
    fn ext(&self) -> &'static str;
    /// Defines `__global__`, `__device__`, `__shared__`, `__constant__` and the intrinsics `aubier_tid()`,
    /// `aubier_bid_x()`, `aubier_bid_y()`, `aubier_barrier()` (block barrier with a shared-memory
    /// fence) and `aubier_shfl_xor(float v, int mask)` (the value of lane `lane ^ mask`).
    fn prelude(&self) -> &'static str;
    /// The attribute bounding a kernel's block size to `block` threads.
    fn launch_bounds(&self, block: u32) -> String;
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

/// Dialect-neutral helpers every kernel may call.
const HELPERS: &str = r#"__device__ inline float aubier_fmax(float a, float b) { return (a > b || a != a) ? a : b; }
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

/// A complete source file for one kernel in dialect `D`, which must be built for [`WARP`] lanes
/// ([`super::render`] checks it). `header` is printed first as `//` comment lines; `quant_tables`
/// and `quant_fns` are the tables and the device functions of the quant types the kernel reads.
pub struct Source<'a, D: Dialect> {
    /// The dialect.
    pub dialect: &'a D,
    /// The kernel.
    pub kernel: &'a Kernel,
    /// Header lines (without `//`).
    pub header: &'a [String],
    /// Quant lookup tables ([`super::quant::device_tables`]), already rendered.
    pub quant_tables: &'a [String],
    /// Quant device functions ([`super::quant::device_fn`]), already rendered.
    pub quant_fns: &'a [String],
}

impl<D: Dialect> Display for Source<'_, D> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        for line in self.header {
            writeln!(f, "// {line}")?;
        }
        let k = self.kernel;
        for line in k.note.lines() {
            writeln!(f, "// {line}")?;
        }
        writeln!(
            f,
            "// launch: grid ({}, {}), block {}",
            k.grid[0], k.grid[1], k.block
        )?;
        writeln!(f, "#pragma clang fp contract(off)")?;
        f.write_str(self.dialect.prelude())?;
        f.write_str(super::math::DEVICE_MATH)?;
        f.write_str(HELPERS)?;
        for q in self.quant_tables {
            writeln!(f, "{q}")?;
        }
        for q in self.quant_fns {
            writeln!(f, "{q}")?;
        }
        for (name, vals) in &k.tables {
            write!(
                f,
                "__device__ const float {}_{name}[{}] = {{",
                k.name,
                vals.len()
            )?;
            for (i, v) in vals.iter().enumerate() {
                write!(f, "{}{}", if i == 0 { "" } else { ", " }, F(*v))?;
            }
            writeln!(f, "}};")?;
        }
        writeln!(
            f,
            "extern \"C\" __global__ {} void {}(",
            self.dialect.launch_bounds(k.block),
            k.name
        )?;
        for (name, kind) in &k.params {
            writeln!(f, "    {} {name},", ParamDecl(kind))?;
        }
        writeln!(f, "    int T, int S) {{")?;
        for (name, ty, len) in &k.shared {
            writeln!(f, "  __shared__ {} {name}[{len}];", Ty(*ty))?;
        }
        for (i, (name, ty)) in k.vars.iter().enumerate() {
            writeln!(f, "  {} v{i}_{name} = 0;", Ty(*ty))?;
        }
        for (name, len) in &k.locals {
            writeln!(f, "  float {name}[{len}];")?;
        }
        writeln!(f, "  (void)T; (void)S;")?;
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

struct ParamDecl<'a>(&'a ParamKind);

impl Display for ParamDecl<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            ParamKind::F32 { writes: true, .. } => "float* __restrict__",
            ParamKind::F32 { writes: false, .. } => "const float* __restrict__",
            ParamKind::I32 { writes: true, .. } => "int* __restrict__",
            ParamKind::I32 { writes: false, .. } => "const int* __restrict__",
            ParamKind::Weight { .. } => "const unsigned char* __restrict__",
            ParamKind::Experts { .. } => "const unsigned long long* __restrict__",
        })
    }
}

/// An f32 constant that round-trips.
struct F(f32);

impl Display for F {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let v = self.0;
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
}

struct E<'a> {
    k: &'a Kernel,
    e: &'a Expr,
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
                Builtin::Thread => "aubier_tid()",
                Builtin::BlockX => "aubier_bid_x()",
                Builtin::BlockY => "aubier_bid_y()",
                Builtin::Tokens => "T",
                Builtin::Keys => "S",
            }),
            Expr::Load(p, i) => match &k.params[p.0] {
                (name, ParamKind::Weight { .. }) => {
                    write!(f, "((const float*){name})[{}]", e(i))
                }
                (name, _) => write!(f, "{name}[{}]", e(i)),
            },
            Expr::Table(t, i) => write!(f, "{}_{}[{}]", k.name, k.tables[*t].0, e(i)),
            Expr::LoadShared(a, i) => write!(f, "{}[{}]", k.shared[a.0].0, e(i)),
            Expr::LoadLocal(a, i) => write!(f, "{}[{}]", k.locals[a.0].0, e(i)),
            Expr::Bin(op, a, b) => {
                let float = matches!(k.ty(a), Ok(Scalar::F32));
                let infix = match op {
                    BinOp::Add => "+",
                    BinOp::Sub => "-",
                    BinOp::Mul => "*",
                    BinOp::Div => "/",
                    BinOp::Rem => "%",
                    BinOp::Lt => "<",
                    BinOp::Le => "<=",
                    BinOp::Eq => "==",
                    BinOp::And => "&&",
                    BinOp::Or => "||",
                    BinOp::Min | BinOp::Max => {
                        let name = match (op, float) {
                            (BinOp::Min, true) => "aubier_fmin",
                            (BinOp::Min, false) => "aubier_imin",
                            (_, true) => "aubier_fmax",
                            _ => "aubier_imax",
                        };
                        return write!(f, "{name}({}, {})", e(a), e(b));
                    }
                };
                write!(f, "({} {infix} {})", e(a), e(b))
            }
            Expr::Un(op, a) => match op {
                UnOp::Neg => write!(f, "(-{})", e(a)),
                UnOp::Sqrt => write!(f, "__builtin_sqrtf({})", e(a)),
                UnOp::Exp => write!(f, "aubier_exp({})", e(a)),
                UnOp::Ln => write!(f, "aubier_ln({})", e(a)),
                UnOp::Sin => write!(f, "aubier_sin({})", e(a)),
                UnOp::Cos => write!(f, "aubier_cos({})", e(a)),
                UnOp::ToF32 => write!(f, "((float){})", e(a)),
                UnOp::Not => write!(f, "((int)!{})", e(a)),
                UnOp::IsNan => write!(f, "((int)({0} != {0}))", e(a)),
            },
            Expr::Select(c, a, b) => write!(f, "({} ? {} : {})", e(c), e(a), e(b)),
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
            Stmt::Store(p, i, x) => writeln!(f, "{pad}{}[{}] = {};", k.params[p.0].0, e(i), e(x)),
            Stmt::StoreShared(a, i, x) => {
                writeln!(f, "{pad}{}[{}] = {};", k.shared[a.0].0, e(i), e(x))
            }
            Stmt::StoreLocal(a, i, x) => {
                writeln!(f, "{pad}{}[{}] = {};", k.locals[a.0].0, e(i), e(x))
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
                writeln!(f, "{pad}if ({}) {{", e(c))?;
                self.block(f, a)?;
                if !b.is_empty() {
                    writeln!(f, "{pad}}} else {{")?;
                    self.block(f, b)?;
                }
                writeln!(f, "{pad}}}")
            }
            Stmt::Barrier => writeln!(f, "{pad}aubier_barrier();"),
            Stmt::WarpReduce(op, v) => {
                let v = var(v);
                let step = match op {
                    ReduceOp::Sum => format!("{v} = {v} + aubier_shfl_xor({v}, o)"),
                    ReduceOp::Max => format!("{v} = aubier_fmax({v}, aubier_shfl_xor({v}, o))"),
                };
                writeln!(
                    f,
                    "{pad}for (int o = {}; o > 0; o >>= 1) {step};",
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
                    Some(x) => format!("((const unsigned char*){name}[{}])", e(x)),
                    None => name.clone(),
                };
                let row = format!("{base} + (unsigned long long){} * {rb}ull", e(row));
                let dst = &k.locals[dst.0].0;
                if ty == "F32" {
                    writeln!(
                        f,
                        "{pad}aubier_ld16_f32({row}, {}, {len}, {dst});",
                        e(chunk)
                    )
                } else {
                    writeln!(
                        f,
                        "{pad}aubier_dq16_{}({row}, {}, {dst});",
                        type_ident(ty),
                        e(chunk)
                    )
                }
            }
        }
    }
}
