//! The kernel IR: one description of a GPU kernel that the emitters print as HIP or CUDA C++ and
//! that [`super::cpu_exec`] runs on the CPU in the GPU's order.
//!
//! Algorithm note. A [`Kernel`] is a SIMT program: a 2-D grid of blocks (`grid`, functions of `T`
//! and `S`), each of `block` threads (one axis, a multiple of the kernel's warp width `warp`, a
//! power of two in [`MIN_WARP`]..=[`MAX_WARP`]: 32 for HIP and CUDA, the device's subgroup size
//! for Vulkan). The body is a tree of [`Stmt`] over typed scalar registers ([`Var`], f32 or i32,
//! private to a thread), per-thread arrays ([`Local`]), block-shared arrays ([`Shared`]) and
//! global buffers ([`Param`]). Expressions ([`Expr`]) are pure; the only side effects are stores,
//! barriers and the two collective operations: [`Stmt::WarpReduce`] (an xor butterfly over
//! `warp`-lane groups with offsets `warp/2, …, 2, 1`) and [`Stmt::Dequant16`] (16 elements of one
//! quantized weight row, through the device function of its ggml type). [`block_reduce`] builds
//! the block-wide reduction from butterflies and shared memory in a fixed tree for any width.
//! Every arithmetic operation is one IEEE f32 or i32 operation, never contracted into an FMA, so
//! the CPU execution and the GPU compute the same bits whenever they run the same operations in
//! the same order. [`Kernel::check`] types the body and checks every reference before any use.

use std::fmt;
use std::ops;

/// Narrowest warp (subgroup) a kernel may be built for.
pub const MIN_WARP: u32 = 4;
/// Widest warp (subgroup) a kernel may be built for.
pub const MAX_WARP: u32 = 64;
/// Lanes per warp of every kernel the HIP and CUDA dialects print.
pub const WARP: u32 = 32;

/// Scalar type of a register, shared array or expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// IEEE f32.
    F32,
    /// Two's-complement i32 (indices, positions, ids; comparisons give 0 or 1).
    I32,
}

/// A launch extent as a function of `T` (tokens in the step) and `S` (keys in the latent cache).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Size {
    /// A constant.
    Const(usize),
    /// `T`.
    Tokens,
    /// `S`.
    Keys,
    /// `a · b`.
    Mul(Box<Size>, Box<Size>),
    /// `a + b`.
    Add(Box<Size>, Box<Size>),
    /// `ceil(a / n)`, `n > 0`.
    CeilDiv(Box<Size>, usize),
    /// `a` when `T = 1`, else 0: the launch of a step's decode form (a grid of no blocks
    /// launches nothing).
    OneToken(Box<Size>),
    /// `a` when `T > 1`, else 0: the launch of a step's prefill form.
    ManyTokens(Box<Size>),
}

impl Size {
    /// `a · b`.
    pub fn prod(a: Size, b: Size) -> Size {
        Size::Mul(Box::new(a), Box::new(b))
    }

    /// `a + b`.
    pub fn sum(a: Size, b: Size) -> Size {
        Size::Add(Box::new(a), Box::new(b))
    }

    /// `ceil(a / n)`.
    pub fn ceil_div(a: Size, n: usize) -> Size {
        Size::CeilDiv(Box::new(a), n.max(1))
    }

    /// `a` at `T = 1`, 0 at `T > 1`.
    pub fn one_token(a: Size) -> Size {
        Size::OneToken(Box::new(a))
    }

    /// `a` at `T > 1`, 0 at `T = 1`.
    pub fn many_tokens(a: Size) -> Size {
        Size::ManyTokens(Box::new(a))
    }

    /// The extent at `T = t`, `S = s`; `None` on overflow.
    pub fn eval(&self, t: usize, s: usize) -> Option<usize> {
        match self {
            Size::Const(n) => Some(*n),
            Size::Tokens => Some(t),
            Size::Keys => Some(s),
            Size::Mul(a, b) => a.eval(t, s)?.checked_mul(b.eval(t, s)?),
            Size::Add(a, b) => a.eval(t, s)?.checked_add(b.eval(t, s)?),
            Size::CeilDiv(a, n) => Some(a.eval(t, s)?.div_ceil(*n)),
            Size::OneToken(a) => Some(if t == 1 { a.eval(t, s)? } else { 0 }),
            Size::ManyTokens(a) => Some(if t > 1 { a.eval(t, s)? } else { 0 }),
        }
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Size::Const(n) => write!(f, "{n}"),
            Size::Tokens => f.write_str("T"),
            Size::Keys => f.write_str("S"),
            Size::Mul(a, b) => write!(f, "{a}·{b}"),
            Size::Add(a, b) => write!(f, "({a} + {b})"),
            Size::CeilDiv(a, n) => write!(f, "ceil({a}/{n})"),
            Size::OneToken(a) => write!(f, "(T = 1 ? {a} : 0)"),
            Size::ManyTokens(a) => write!(f, "(T > 1 ? {a} : 0)"),
        }
    }
}

/// What a kernel parameter is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// f32 elements (an activation, a cache layer, a scratch); `len` elements are bound.
    F32 {
        /// The kernel writes it.
        writes: bool,
        /// Elements bound, as a function of `T`, `S` (the cache: its capacity, `None`).
        len: Option<Size>,
    },
    /// i32 elements (ids, positions).
    I32 {
        /// The kernel writes it.
        writes: bool,
        /// Elements bound.
        len: Option<Size>,
    },
    /// A GGUF weight tensor's raw bytes: rows of `row_bytes` bytes of ggml type `ggml_type`.
    Weight {
        /// gguf-py type name (`F32`, `Q2_K`, …).
        ggml_type: String,
        /// Bytes per `ne[0]` row.
        row_bytes: usize,
        /// Elements per row (`ne[0]`).
        row_len: usize,
    },
    /// A stacked expert tensor read through a table of per-expert addresses (one `u64` per
    /// expert; row `r` of expert `e` is at `table[e] + r · row_bytes`).
    Experts {
        /// gguf-py type name.
        ggml_type: String,
        /// Bytes per `ne[0]` row.
        row_bytes: usize,
        /// Elements per row (`ne[0]`).
        row_len: usize,
    },
}

/// A kernel parameter (global memory), by position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Param(pub usize);
/// A per-thread register, by index into [`Kernel::vars`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Var(pub usize);
/// A block-shared array, by index into [`Kernel::shared`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shared(pub usize);
/// A per-thread f32 array, by index into [`Kernel::locals`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Local(pub usize);

/// Thread-invariant or thread-specific inputs every kernel sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Builtin {
    /// Thread index in the block, `0..block`.
    Thread,
    /// Block index along x.
    BlockX,
    /// Block index along y.
    BlockY,
    /// `T` (kernel argument).
    Tokens,
    /// `S` (kernel argument).
    Keys,
}

/// Binary operations. Arithmetic is IEEE (f32) or wrapping-free i32 (the checker's callers keep
/// indices in range); comparisons return i32 0/1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    /// `a + b`.
    Add,
    /// `a − b`.
    Sub,
    /// `a · b`.
    Mul,
    /// `a / b` (i32: truncating).
    Div,
    /// `a % b` (i32 only, truncating).
    Rem,
    /// Smaller (i32), or f32 `b < a ? b : a`.
    Min,
    /// NaN-propagating maximum: `(a > b || a ≠ a) ? a : b`.
    Max,
    /// `a < b`.
    Lt,
    /// `a ≤ b`.
    Le,
    /// `a == b`.
    Eq,
    /// Logical and of two 0/1 i32.
    And,
    /// Logical or of two 0/1 i32.
    Or,
}

/// Unary operations; the transcendental ones are the device functions of [`super::math`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    /// `−a`.
    Neg,
    /// `sqrt(a)`, correctly rounded.
    Sqrt,
    /// `e^a` ([`super::math::exp`]).
    Exp,
    /// `ln a` ([`super::math::ln`]).
    Ln,
    /// `sin a` ([`super::math::sin`]).
    Sin,
    /// `cos a` ([`super::math::cos`]).
    Cos,
    /// i32 → f32 (round to nearest).
    ToF32,
    /// Logical not of a 0/1 i32.
    Not,
    /// `a ≠ a` (f32 → 0/1): NaN test.
    IsNan,
}

/// A pure expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// f32 constant.
    F(f32),
    /// i32 constant.
    I(i32),
    /// A register.
    Var(Var),
    /// A builtin index or extent.
    Builtin(Builtin),
    /// Element `idx` of an f32 or i32 parameter.
    Load(Param, Box<Expr>),
    /// Element `idx` of a shared array.
    LoadShared(Shared, Box<Expr>),
    /// Element `idx` of a per-thread array.
    LoadLocal(Local, Box<Expr>),
    /// Element `idx` of constant table `t` ([`Kernel::tables`]).
    Table(usize, Box<Expr>),
    /// Binary operation.
    Bin(BinOp, Box<Expr>, Box<Expr>),
    /// Unary operation.
    Un(UnOp, Box<Expr>),
    /// `c ? a : b` (c an i32 0/1).
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
}

impl Expr {
    fn bin(op: BinOp, a: impl Into<Expr>, b: impl Into<Expr>) -> Expr {
        Expr::Bin(op, Box::new(a.into()), Box::new(b.into()))
    }

    fn un(op: UnOp, a: impl Into<Expr>) -> Expr {
        Expr::Un(op, Box::new(a.into()))
    }

    /// `min(self, b)`.
    pub fn min(self, b: impl Into<Expr>) -> Expr {
        Expr::bin(BinOp::Min, self, b)
    }
    /// NaN-propagating `max(self, b)`.
    pub fn max(self, b: impl Into<Expr>) -> Expr {
        Expr::bin(BinOp::Max, self, b)
    }
    /// `self < b`.
    pub fn lt(self, b: impl Into<Expr>) -> Expr {
        Expr::bin(BinOp::Lt, self, b)
    }
    /// `self ≤ b`.
    pub fn le(self, b: impl Into<Expr>) -> Expr {
        Expr::bin(BinOp::Le, self, b)
    }
    /// `self == b`.
    pub fn eq(self, b: impl Into<Expr>) -> Expr {
        Expr::bin(BinOp::Eq, self, b)
    }
    /// Logical and.
    pub fn and(self, b: impl Into<Expr>) -> Expr {
        Expr::bin(BinOp::And, self, b)
    }
    /// Logical or.
    pub fn or(self, b: impl Into<Expr>) -> Expr {
        Expr::bin(BinOp::Or, self, b)
    }
    /// `sqrt`.
    pub fn sqrt(self) -> Expr {
        Expr::un(UnOp::Sqrt, self)
    }
    /// `e^self`.
    pub fn exp(self) -> Expr {
        Expr::un(UnOp::Exp, self)
    }
    /// `ln self`.
    pub fn ln(self) -> Expr {
        Expr::un(UnOp::Ln, self)
    }
    /// `sin self`.
    pub fn sin(self) -> Expr {
        Expr::un(UnOp::Sin, self)
    }
    /// `cos self`.
    pub fn cos(self) -> Expr {
        Expr::un(UnOp::Cos, self)
    }
    /// i32 → f32.
    pub fn to_f32(self) -> Expr {
        Expr::un(UnOp::ToF32, self)
    }
    /// NaN test.
    pub fn is_nan(self) -> Expr {
        Expr::un(UnOp::IsNan, self)
    }
    /// `c ? a : b` with `self` as `c`.
    pub fn select(self, a: impl Into<Expr>, b: impl Into<Expr>) -> Expr {
        Expr::Select(Box::new(self), Box::new(a.into()), Box::new(b.into()))
    }
}

macro_rules! arith {
    ($tr:ident, $f:ident, $op:ident) => {
        impl<R: Into<Expr>> ops::$tr<R> for Expr {
            type Output = Expr;
            fn $f(self, rhs: R) -> Expr {
                Expr::bin(BinOp::$op, self, rhs)
            }
        }
    };
}
arith!(Add, add, Add);
arith!(Sub, sub, Sub);
arith!(Mul, mul, Mul);
arith!(Div, div, Div);
arith!(Rem, rem, Rem);

impl ops::Not for Expr {
    type Output = Expr;
    /// Logical not of a 0/1 i32.
    fn not(self) -> Expr {
        Expr::un(UnOp::Not, self)
    }
}

impl ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        Expr::un(UnOp::Neg, self)
    }
}

impl From<f32> for Expr {
    fn from(v: f32) -> Expr {
        Expr::F(v)
    }
}

impl From<i32> for Expr {
    fn from(v: i32) -> Expr {
        Expr::I(v)
    }
}

impl From<Var> for Expr {
    fn from(v: Var) -> Expr {
        Expr::Var(v)
    }
}

impl From<Builtin> for Expr {
    fn from(b: Builtin) -> Expr {
        Expr::Builtin(b)
    }
}

impl From<&Expr> for Expr {
    fn from(e: &Expr) -> Expr {
        e.clone()
    }
}

/// A usize extent as an i32 constant (the builders bound every extent by
/// `kernels::MAX_EXTENT` before building, far below `i32::MAX`).
pub fn ci(n: usize) -> Expr {
    Expr::I(i32::try_from(n).unwrap_or(i32::MAX))
}

/// Reduction of a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// f32 sum.
    Sum,
    /// f32 NaN-propagating maximum.
    Max,
}

/// A statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `var = e`.
    Set(Var, Expr),
    /// `param[idx] = val`.
    Store(Param, Expr, Expr),
    /// `shared[idx] = val`.
    StoreShared(Shared, Expr, Expr),
    /// `local[idx] = val`.
    StoreLocal(Local, Expr, Expr),
    /// `dst[c] = shared[4·idx + c]` for `c` in `0..4`: one vector load of four consecutive f32
    /// elements (the array must be f32 with a length that is a multiple of 4; the emitters
    /// declare an array read this way as 16-byte aligned four-element vectors, see
    /// [`Kernel::shared_vec4`]).
    LoadShared4(Shared, Expr, [Var; 4]),
    /// `for (var = start; var < end; var += step) body` (i32; `step > 0`). Lanes may leave the loop
    /// at different iterations (a divergent loop) unless the body holds a barrier or a collective.
    For {
        /// The induction register.
        var: Var,
        /// First value.
        start: Expr,
        /// Exclusive bound.
        end: Expr,
        /// Increment.
        step: i32,
        /// Body.
        body: Vec<Stmt>,
    },
    /// `if (cond) then else els`.
    If(Expr, Vec<Stmt>, Vec<Stmt>),
    /// Block-wide barrier with shared-memory fence (`__syncthreads`): every thread of the block
    /// must reach it.
    Barrier,
    /// `var = reduce over the thread's warp` (lanes `warp·g .. warp·g + warp − 1`, `warp` the
    /// kernel's) by an xor butterfly (offsets `warp/2, …, 2, 1`; at each step
    /// `v = op(v, shuffle_xor(v, off))`); every lane of a participating warp must be active.
    WarpReduce(ReduceOp, Var),
    /// `dst[0..16] = elements 16·chunk .. 16·chunk + 15 of row `row` of weight `w`` (elements past
    /// the row's end read as 0 for F32 rows whose length is not a multiple of 16); for
    /// [`ParamKind::Experts`], `expert` selects the table entry.
    Dequant16 {
        /// The weight parameter.
        w: Param,
        /// Expert id (only for [`ParamKind::Experts`]).
        expert: Option<Expr>,
        /// Row index.
        row: Expr,
        /// Chunk index within the row.
        chunk: Expr,
        /// Destination per-thread array (≥ 16 elements).
        dst: Local,
    },
}

/// A kernel: signature, launch shape and body.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// C identifier of the kernel (unique within a generated set).
    pub name: String,
    /// What it computes and how (printed above the kernel).
    pub note: String,
    /// Parameters in signature order (then `int T, int S`).
    pub params: Vec<(String, ParamKind)>,
    /// Registers: name and type.
    pub vars: Vec<(String, Scalar)>,
    /// Shared arrays: name, type, length.
    pub shared: Vec<(String, Scalar, usize)>,
    /// Per-thread f32 arrays: name, length.
    pub locals: Vec<(String, usize)>,
    /// Constant f32 tables baked into the source (RoPE frequencies): name, values.
    pub tables: Vec<(String, Vec<f32>)>,
    /// Grid (blocks along x, y).
    pub grid: [Size; 2],
    /// Threads per block (a multiple of `warp`, at most 1024).
    pub block: u32,
    /// Lanes per warp of [`Stmt::WarpReduce`] (a power of two in [`MIN_WARP`]..=[`MAX_WARP`]).
    pub warp: u32,
    /// Body.
    pub body: Vec<Stmt>,
}

/// A structural error of a kernel (a bug of its builder).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel `{kernel}`: {detail}")]
pub struct IrError {
    /// Kernel name.
    pub kernel: String,
    /// What is wrong.
    pub detail: String,
}

impl Kernel {
    /// Types the body and checks every reference (registers, params, arrays), the warp width,
    /// the block size and the loop steps.
    ///
    /// Errors: [`IrError`] naming the first problem.
    pub fn check(&self) -> Result<(), IrError> {
        let err = |detail: String| IrError {
            kernel: self.name.clone(),
            detail,
        };
        let w = self.warp;
        if !w.is_power_of_two() || !(MIN_WARP..=MAX_WARP).contains(&w) {
            return Err(err(format!(
                "warp {w} is not a power of two in {MIN_WARP}..={MAX_WARP}"
            )));
        }
        if self.block == 0 || !self.block.is_multiple_of(w) || self.block > 1024 {
            return Err(err(format!(
                "block {} is not a multiple of the warp {w} in 1..=1024",
                self.block
            )));
        }
        self.check_stmts(&self.body).map_err(err)
    }

    fn check_stmts(&self, stmts: &[Stmt]) -> Result<(), String> {
        for s in stmts {
            match s {
                Stmt::Set(v, e) => {
                    let vt = self.var_ty(*v)?;
                    self.expect(e, vt)?;
                }
                Stmt::Store(p, i, v) => {
                    self.expect(i, Scalar::I32)?;
                    let t = self.param_elem(*p, true)?;
                    self.expect(v, t)?;
                }
                Stmt::StoreShared(a, i, v) => {
                    self.expect(i, Scalar::I32)?;
                    let t = self.shared_ty(*a)?;
                    self.expect(v, t)?;
                }
                Stmt::StoreLocal(a, i, v) => {
                    self.expect(i, Scalar::I32)?;
                    self.local_len(*a)?;
                    self.expect(v, Scalar::F32)?;
                }
                Stmt::LoadShared4(a, i, dst) => {
                    self.expect(i, Scalar::I32)?;
                    let len = self.shared.get(a.0).map_or(0, |x| x.2);
                    if self.shared_ty(*a)? != Scalar::F32 || !len.is_multiple_of(4) {
                        return Err(format!(
                            "shared array {} is read as vectors of 4 but is not f32 of a length that is a multiple of 4",
                            a.0
                        ));
                    }
                    for v in dst {
                        if self.var_ty(*v)? != Scalar::F32 {
                            return Err("a vector shared load writes f32 registers".into());
                        }
                    }
                }
                Stmt::For {
                    var,
                    start,
                    end,
                    step,
                    body,
                } => {
                    if self.var_ty(*var)? != Scalar::I32 || *step <= 0 {
                        return Err("a loop needs an i32 register and a positive step".into());
                    }
                    self.expect(start, Scalar::I32)?;
                    self.expect(end, Scalar::I32)?;
                    self.check_stmts(body)?;
                }
                Stmt::If(c, a, b) => {
                    self.expect(c, Scalar::I32)?;
                    self.check_stmts(a)?;
                    self.check_stmts(b)?;
                }
                Stmt::Barrier => {}
                Stmt::WarpReduce(_, v) => {
                    if self.var_ty(*v)? != Scalar::F32 {
                        return Err("warp reductions are over f32 registers".into());
                    }
                }
                Stmt::Dequant16 {
                    w,
                    expert,
                    row,
                    chunk,
                    dst,
                } => {
                    let kind = self
                        .params
                        .get(w.0)
                        .map(|p| &p.1)
                        .ok_or_else(|| format!("no parameter {}", w.0))?;
                    match (kind, expert) {
                        (ParamKind::Weight { .. }, None) => {}
                        (ParamKind::Experts { .. }, Some(e)) => self.expect(e, Scalar::I32)?,
                        _ => {
                            return Err(format!("parameter {} read as the wrong weight kind", w.0))
                        }
                    }
                    self.expect(row, Scalar::I32)?;
                    self.expect(chunk, Scalar::I32)?;
                    if self.local_len(*dst)? < 16 {
                        return Err("a dequant destination needs 16 elements".into());
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether shared array `a` is read as vectors of 4 ([`Stmt::LoadShared4`]) anywhere in the
    /// body: the emitters then declare it as 16-byte aligned four-element vectors.
    pub fn shared_vec4(&self, a: Shared) -> bool {
        fn reads(body: &[Stmt], a: Shared) -> bool {
            body.iter().any(|s| match s {
                Stmt::LoadShared4(b, ..) => *b == a,
                Stmt::For { body, .. } => reads(body, a),
                Stmt::If(_, x, y) => reads(x, a) || reads(y, a),
                _ => false,
            })
        }
        reads(&self.body, a)
    }

    fn var_ty(&self, v: Var) -> Result<Scalar, String> {
        self.vars
            .get(v.0)
            .map(|x| x.1)
            .ok_or_else(|| format!("no register {}", v.0))
    }

    fn shared_ty(&self, a: Shared) -> Result<Scalar, String> {
        self.shared
            .get(a.0)
            .map(|x| x.1)
            .ok_or_else(|| format!("no shared array {}", a.0))
    }

    fn local_len(&self, a: Local) -> Result<usize, String> {
        self.locals
            .get(a.0)
            .map(|x| x.1)
            .ok_or_else(|| format!("no local array {}", a.0))
    }

    /// Element type of an f32/i32 parameter (`store`: it must be writable).
    fn param_elem(&self, p: Param, store: bool) -> Result<Scalar, String> {
        match self.params.get(p.0).map(|x| &x.1) {
            Some(ParamKind::F32 { writes, .. }) if *writes || !store => Ok(Scalar::F32),
            Some(ParamKind::I32 { writes, .. }) if *writes || !store => Ok(Scalar::I32),
            Some(ParamKind::Weight { ggml_type, .. }) if ggml_type == "F32" && !store => {
                Ok(Scalar::F32)
            }
            Some(_) => Err(format!(
                "parameter `{}` cannot be {}",
                self.params[p.0].0,
                if store { "stored to" } else { "loaded" }
            )),
            None => Err(format!("no parameter {}", p.0)),
        }
    }

    fn expect(&self, e: &Expr, t: Scalar) -> Result<(), String> {
        let got = self.ty(e)?;
        if got != t {
            return Err(format!("expected {t:?}, got {got:?} in {e:?}"));
        }
        Ok(())
    }

    /// The type of `e`.
    ///
    /// Errors: a reference to a missing register, parameter or array, or mixed operand types.
    pub fn ty(&self, e: &Expr) -> Result<Scalar, String> {
        Ok(match e {
            Expr::F(_) => Scalar::F32,
            Expr::I(_) | Expr::Builtin(_) => Scalar::I32,
            Expr::Var(v) => self.var_ty(*v)?,
            Expr::Load(p, i) => {
                self.expect(i, Scalar::I32)?;
                self.param_elem(*p, false)?
            }
            Expr::LoadShared(a, i) => {
                self.expect(i, Scalar::I32)?;
                self.shared_ty(*a)?
            }
            Expr::LoadLocal(a, i) => {
                self.expect(i, Scalar::I32)?;
                self.local_len(*a)?;
                Scalar::F32
            }
            Expr::Table(t, i) => {
                self.expect(i, Scalar::I32)?;
                if *t >= self.tables.len() {
                    return Err(format!("no table {t}"));
                }
                Scalar::F32
            }
            Expr::Bin(op, a, b) => {
                let ta = self.ty(a)?;
                self.expect(b, ta)?;
                match op {
                    BinOp::Rem | BinOp::And | BinOp::Or if ta != Scalar::I32 => {
                        return Err(format!("{op:?} takes i32"))
                    }
                    BinOp::Lt | BinOp::Le | BinOp::Eq | BinOp::And | BinOp::Or => Scalar::I32,
                    _ => ta,
                }
            }
            Expr::Un(op, a) => {
                let ta = self.ty(a)?;
                let (want, out) = match op {
                    UnOp::Neg => (ta, ta),
                    UnOp::ToF32 | UnOp::Not => (Scalar::I32, Scalar::F32),
                    UnOp::IsNan => (Scalar::F32, Scalar::I32),
                    _ => (Scalar::F32, Scalar::F32),
                };
                if ta != want {
                    return Err(format!("{op:?} takes {want:?}"));
                }
                if *op == UnOp::Not {
                    Scalar::I32
                } else {
                    out
                }
            }
            Expr::Select(c, a, b) => {
                self.expect(c, Scalar::I32)?;
                let ta = self.ty(a)?;
                self.expect(b, ta)?;
                ta
            }
        })
    }
}

/// Builds a [`Kernel`] statement by statement; nested bodies are closures.
#[derive(Debug)]
pub struct Kb {
    k: Kernel,
    stack: Vec<Vec<Stmt>>,
}

impl Kb {
    /// A kernel named `name` over `grid` blocks of `block` threads in warps of `warp` lanes,
    /// described by `note` ([`Kernel::check`] refuses a bad `warp` or `block` at
    /// [`Kb::finish`]).
    pub fn new(
        name: impl Into<String>,
        note: impl Into<String>,
        grid: [Size; 2],
        block: u32,
        warp: u32,
    ) -> Kb {
        Kb {
            k: Kernel {
                name: name.into(),
                note: note.into(),
                params: Vec::new(),
                vars: Vec::new(),
                shared: Vec::new(),
                locals: Vec::new(),
                tables: Vec::new(),
                grid,
                block,
                warp,
                body: Vec::new(),
            },
            stack: vec![Vec::new()],
        }
    }

    /// Adds a parameter.
    pub fn param(&mut self, name: &str, kind: ParamKind) -> Param {
        self.k.params.push((name.to_string(), kind));
        Param(self.k.params.len() - 1)
    }

    /// A read-only f32 input of `len` elements.
    pub fn input_f32(&mut self, name: &str, len: Size) -> Param {
        self.param(
            name,
            ParamKind::F32 {
                writes: false,
                len: Some(len),
            },
        )
    }

    /// A read-only i32 input of `len` elements.
    pub fn input_i32(&mut self, name: &str, len: Size) -> Param {
        self.param(
            name,
            ParamKind::I32 {
                writes: false,
                len: Some(len),
            },
        )
    }

    /// A written f32 buffer of `len` elements (`None`: the latent cache layer, bound by capacity).
    pub fn output_f32(&mut self, name: &str, len: Option<Size>) -> Param {
        self.param(name, ParamKind::F32 { writes: true, len })
    }

    /// A written i32 buffer of `len` elements.
    pub fn output_i32(&mut self, name: &str, len: Size) -> Param {
        self.param(
            name,
            ParamKind::I32 {
                writes: true,
                len: Some(len),
            },
        )
    }

    /// A fresh register initialised to `init` (its type is `init`'s).
    ///
    /// The type of `init` must be derivable; an ill-typed `init` is reported by [`Kernel::check`]
    /// (the register is then typed f32).
    pub fn let_(&mut self, name: &str, init: impl Into<Expr>) -> Var {
        let init = init.into();
        let ty = self.k.ty(&init).unwrap_or(Scalar::F32);
        self.k.vars.push((name.to_string(), ty));
        let v = Var(self.k.vars.len() - 1);
        self.push(Stmt::Set(v, init));
        v
    }

    /// `v = e`.
    pub fn set(&mut self, v: Var, e: impl Into<Expr>) {
        self.push(Stmt::Set(v, e.into()));
    }

    /// `p[idx] = val`.
    pub fn store(&mut self, p: Param, idx: impl Into<Expr>, val: impl Into<Expr>) {
        self.push(Stmt::Store(p, idx.into(), val.into()));
    }

    /// `p[idx]`.
    pub fn load(&self, p: Param, idx: impl Into<Expr>) -> Expr {
        Expr::Load(p, Box::new(idx.into()))
    }

    /// A shared array.
    pub fn shared(&mut self, name: &str, ty: Scalar, len: usize) -> Shared {
        self.k.shared.push((name.to_string(), ty, len));
        Shared(self.k.shared.len() - 1)
    }

    /// `a[idx]` of a shared array.
    pub fn lds(&self, a: Shared, idx: impl Into<Expr>) -> Expr {
        Expr::LoadShared(a, Box::new(idx.into()))
    }

    /// Four fresh f32 registers `name0..name3` loaded with `a[4·idx .. 4·idx + 4]` by one vector
    /// load ([`Stmt::LoadShared4`]).
    pub fn lds4(&mut self, name: &str, a: Shared, idx: impl Into<Expr>) -> [Var; 4] {
        let dst = std::array::from_fn(|c| {
            self.k.vars.push((format!("{name}{c}"), Scalar::F32));
            Var(self.k.vars.len() - 1)
        });
        self.push(Stmt::LoadShared4(a, idx.into(), dst));
        dst
    }

    /// `a[idx] = val` of a shared array.
    pub fn sts(&mut self, a: Shared, idx: impl Into<Expr>, val: impl Into<Expr>) {
        self.push(Stmt::StoreShared(a, idx.into(), val.into()));
    }

    /// A constant table; element `i` is `table(t, i)`.
    pub fn table(&mut self, name: &str, vals: Vec<f32>) -> usize {
        self.k.tables.push((name.to_string(), vals));
        self.k.tables.len() - 1
    }

    /// Element `idx` of constant table `t`.
    pub fn tab(&self, t: usize, idx: impl Into<Expr>) -> Expr {
        Expr::Table(t, Box::new(idx.into()))
    }

    /// A per-thread f32 array.
    pub fn local(&mut self, name: &str, len: usize) -> Local {
        self.k.locals.push((name.to_string(), len));
        Local(self.k.locals.len() - 1)
    }

    /// `a[idx]` of a per-thread array.
    pub fn ldl(&self, a: Local, idx: impl Into<Expr>) -> Expr {
        Expr::LoadLocal(a, Box::new(idx.into()))
    }

    /// `a[idx] = val` of a per-thread array.
    pub fn stl(&mut self, a: Local, idx: impl Into<Expr>, val: impl Into<Expr>) {
        self.push(Stmt::StoreLocal(a, idx.into(), val.into()));
    }

    /// `for (i = start; i < end; i += step) body(i)`.
    pub fn for_(
        &mut self,
        name: &str,
        start: impl Into<Expr>,
        end: impl Into<Expr>,
        step: i32,
        body: impl FnOnce(&mut Kb, Expr),
    ) {
        self.k.vars.push((name.to_string(), Scalar::I32));
        let var = Var(self.k.vars.len() - 1);
        self.stack.push(Vec::new());
        body(self, Expr::Var(var));
        let body = self.stack.pop().unwrap_or_default();
        self.push(Stmt::For {
            var,
            start: start.into(),
            end: end.into(),
            step,
            body,
        });
    }

    /// `if (cond) then`.
    pub fn if_(&mut self, cond: impl Into<Expr>, then: impl FnOnce(&mut Kb)) {
        self.if_else(cond, then, |_| {});
    }

    /// `if (cond) then else els`.
    pub fn if_else(
        &mut self,
        cond: impl Into<Expr>,
        then: impl FnOnce(&mut Kb),
        els: impl FnOnce(&mut Kb),
    ) {
        self.stack.push(Vec::new());
        then(self);
        let a = self.stack.pop().unwrap_or_default();
        self.stack.push(Vec::new());
        els(self);
        let b = self.stack.pop().unwrap_or_default();
        self.push(Stmt::If(cond.into(), a, b));
    }

    /// `__syncthreads()`.
    pub fn barrier(&mut self) {
        self.push(Stmt::Barrier);
    }

    /// Warp butterfly reduction of `v` in place.
    pub fn warp_reduce(&mut self, op: ReduceOp, v: Var) {
        self.push(Stmt::WarpReduce(op, v));
    }

    /// `dst[0..16] = chunk` of a weight row.
    pub fn dequant16(
        &mut self,
        w: Param,
        expert: Option<Expr>,
        row: impl Into<Expr>,
        chunk: impl Into<Expr>,
        dst: Local,
    ) {
        self.push(Stmt::Dequant16 {
            w,
            expert,
            row: row.into(),
            chunk: chunk.into(),
            dst,
        });
    }

    /// Threads per block.
    pub fn block(&self) -> u32 {
        self.k.block
    }

    /// Lanes per warp.
    pub fn warp(&self) -> u32 {
        self.k.warp
    }

    /// The shared scratch [`block_reduce`] needs (f32, named `red`):
    /// [`reduce_scratch_len`] elements.
    pub fn reduce_scratch(&mut self) -> Shared {
        self.reduce_scratch_rows(1)
    }

    /// The shared scratch [`block_reduce_rows`] needs for `rows` registers (f32, named `red`):
    /// `rows ·` [`reduce_scratch_len`] elements.
    pub fn reduce_scratch_rows(&mut self, rows: usize) -> Shared {
        let len = reduce_scratch_len(self.k.block, self.k.warp);
        self.shared("red", Scalar::F32, len * rows.max(1))
    }

    fn push(&mut self, s: Stmt) {
        if let Some(top) = self.stack.last_mut() {
            top.push(s);
        }
    }

    /// The finished kernel, type-checked.
    ///
    /// Errors: [`IrError`] from [`Kernel::check`].
    pub fn finish(mut self) -> Result<Kernel, IrError> {
        self.k.body = self.stack.pop().unwrap_or_default();
        self.k.check()?;
        Ok(self.k)
    }
}

/// `threadIdx.x` as an expression.
pub fn tid() -> Expr {
    Expr::Builtin(Builtin::Thread)
}

/// `blockIdx.x`.
pub fn bx() -> Expr {
    Expr::Builtin(Builtin::BlockX)
}

/// `blockIdx.y`.
pub fn by() -> Expr {
    Expr::Builtin(Builtin::BlockY)
}

/// `T`.
pub fn tokens() -> Expr {
    Expr::Builtin(Builtin::Tokens)
}

/// `S`.
pub fn keys() -> Expr {
    Expr::Builtin(Builtin::Keys)
}

/// Elements of the shared scratch of [`block_reduce`] for `block` threads in warps of `warp`
/// lanes: `max(warp, round_up(block / warp, warp))` (a whole warp of partials is read at each
/// round).
pub fn reduce_scratch_len(block: u32, warp: u32) -> usize {
    let w = warp.max(1) as usize;
    w.max((block as usize / w).div_ceil(w) * w)
}

/// Block-wide reduction of register `v` (every thread of the block must be active), in a fixed
/// tree for warps of `W` lanes and `P = block / W` partials:
/// 1. a butterfly in every warp; lane 0 of warp `g` writes `scratch[g]`; barrier;
/// 2. while more than `W` partials remain (`n` of them): thread `i` of the first `ceil(n / W)`
///    warps reads `scratch[i]` (the identity for `i ≥ n`); barrier; butterfly; lane 0 of warp `g`
///    writes `scratch[g]`; barrier; `n ← ceil(n / W)`;
/// 3. warp 0 reduces the last `n ≤ W` partials by a butterfly (the identity past `n`), lane 0
///    writes `scratch[0]`; barrier; every thread reads the total; barrier.
///
/// `scratch` must hold [`reduce_scratch_len`] f32 ([`Kb::reduce_scratch`]).
pub fn block_reduce(kb: &mut Kb, op: ReduceOp, v: Var, scratch: Shared) {
    block_reduce_rows(kb, op, &[v], scratch);
}

/// [`block_reduce`] of several registers at once: each by the same tree, so each gets the bits
/// a [`block_reduce`] of it alone gives, with the barriers shared. Register `r` uses its own
/// [`reduce_scratch_len`] elements of `scratch`, from `r · reduce_scratch_len`
/// ([`Kb::reduce_scratch_rows`]).
pub fn block_reduce_rows(kb: &mut Kb, op: ReduceOp, vs: &[Var], scratch: Shared) {
    let w = kb.warp() as i32;
    let mut n = kb.block() as i32 / w;
    let len = reduce_scratch_len(kb.block(), kb.warp());
    let at = |r: usize, i: Expr| if r == 0 { i } else { i + ci(r * len) };
    for &v in vs {
        kb.warp_reduce(op, v);
    }
    if n == 1 {
        return;
    }
    let lane = tid() % w;
    let warp = tid() / w;
    let store_partials = |kb: &mut Kb| {
        kb.if_(lane.clone().eq(0), |kb| {
            for (r, &v) in vs.iter().enumerate() {
                kb.sts(scratch, at(r, warp.clone()), v);
            }
        });
    };
    store_partials(kb);
    kb.barrier();
    let ident = match op {
        ReduceOp::Sum => 0.0,
        ReduceOp::Max => f32::NEG_INFINITY,
    };
    let read_partials = |kb: &mut Kb, n: i32| {
        for (r, &v) in vs.iter().enumerate() {
            let part = kb.lds(scratch, at(r, tid()));
            kb.set(v, tid().lt(n).select(part, ident));
        }
    };
    while n > w {
        let active = tid().lt((n + w - 1) / w * w);
        kb.if_(active.clone(), |kb| read_partials(kb, n));
        kb.barrier();
        kb.if_(active, |kb| {
            for &v in vs {
                kb.warp_reduce(op, v);
            }
            store_partials(kb);
        });
        kb.barrier();
        n = (n + w - 1) / w;
    }
    kb.if_(tid().lt(w), |kb| {
        read_partials(kb, n);
        for &v in vs {
            kb.warp_reduce(op, v);
        }
        kb.if_(tid().eq(0), |kb| {
            for (r, &v) in vs.iter().enumerate() {
                kb.sts(scratch, at(r, Expr::from(0)), v);
            }
        });
    });
    kb.barrier();
    for (r, &v) in vs.iter().enumerate() {
        let total = kb.lds(scratch, at(r, Expr::from(0)));
        kb.set(v, total);
    }
    kb.barrier();
}
