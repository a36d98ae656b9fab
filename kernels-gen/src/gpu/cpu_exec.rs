//! CPU execution of the kernel IR in the GPU's order, so that generated kernels can be tested on
//! a machine without a GPU (ARCHITECTURE.md § kernels-gen).
//!
//! Algorithm note. Blocks run one after the other, `y` outer, `x` inner (blocks of one launch do
//! not communicate). Inside a block all threads run in lockstep, statement by statement, as SIMT
//! hardware does: every register is a vector of `block` lanes and an active mask says which lanes
//! execute. `if` narrows the mask for each branch; a `for` loop runs while any lane is still
//! inside it (lanes leave when their own condition fails). A barrier or a warp reduction
//! is only legal where every lane it needs is active (a barrier: the whole block; a reduction:
//! whole warps of the kernel's width `warp`) — otherwise the kernel is wrong and execution stops
//! with an error. A kernel runs at its own width: the same IR built for 8 and for 32 lanes runs
//! as an 8-lane and as a 32-lane device would.
//! Because every thread runs to the barrier before any thread passes it, shared memory behaves
//! as on the GPU for every race-free kernel. Warp reductions follow the butterfly of
//! [`Stmt::WarpReduce`] exactly (at offset `o`, lane `l` combines its value with lane `l ^ o`'s,
//! `op(mine, theirs)`), and the device math is [`super::math`], so the bits are the GPU's when
//! the GPU runs the same IEEE operations (the emitters disable FMA contraction).
//!
//! Every memory access is bounds-checked against the bound buffers: a kernel that would read or
//! write out of range stops with [`ExecError::OutOfBounds`] instead.

use super::ir::{BinOp, Builtin, Expr, IrError, Kernel, ParamKind, ReduceOp, Stmt, UnOp};
use super::math;

/// A buffer bound to one kernel parameter, in parameter order.
#[derive(Debug)]
pub enum Arg<'a> {
    /// An f32 parameter.
    F32(&'a mut [f32]),
    /// An i32 parameter.
    I32(&'a mut [i32]),
    /// A [`ParamKind::Weight`]: the tensor's raw bytes (rows of `row_bytes`).
    Weight(&'a [u8]),
    /// A [`ParamKind::Experts`]: each expert's bytes, by expert id (the address table).
    Experts(&'a [&'a [u8]]),
}

/// Decodes 16 elements of a quantized row: `(ggml_type, row bytes, chunk, out)` writes elements
/// `16·chunk .. 16·chunk + 15` of the row into `out`. F32 rows never reach it.
pub type Dequant16<'a> = &'a dyn Fn(&str, &[u8], usize, &mut [f32; 16]) -> Result<(), String>;

/// Errors of [`run`]: a kernel that misbehaves, or buffers that do not fit it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    /// The kernel does not pass [`Kernel::check`].
    #[error(transparent)]
    Invalid(#[from] IrError),
    /// The bound arguments do not match the kernel's parameters.
    #[error("kernel `{kernel}`: {detail}")]
    Binding {
        /// Kernel name.
        kernel: String,
        /// What does not fit.
        detail: String,
    },
    /// A load or store outside its buffer.
    #[error("kernel `{kernel}`: {what} index {index} outside 0..{len} (block {block:?}, thread {thread})")]
    OutOfBounds {
        /// Kernel name.
        kernel: String,
        /// The buffer.
        what: String,
        /// The index.
        index: i64,
        /// The buffer's length.
        len: usize,
        /// Block (x, y).
        block: (usize, usize),
        /// Thread.
        thread: usize,
    },
    /// A barrier or a warp reduction reached by only part of the lanes it needs, an integer
    /// division by zero, or a failed dequantization.
    #[error("kernel `{kernel}`: {detail} (block {block:?})")]
    Fault {
        /// Kernel name.
        kernel: String,
        /// What happened.
        detail: String,
        /// Block (x, y).
        block: (usize, usize),
    },
}

/// Runs `kernel` over its whole grid for `T = t`, `S = s`, with `args` bound to its parameters
/// (in order) and `dequant` decoding quantized weight chunks.
///
/// Errors: [`ExecError::Invalid`] for a kernel that [`Kernel::check`] refuses;
/// [`ExecError::Binding`] when an argument's kind or length does not fit its parameter;
/// [`ExecError::OutOfBounds`] / [`ExecError::Fault`] when the kernel misbehaves.
pub fn run(
    kernel: &Kernel,
    args: &mut [Arg<'_>],
    t: usize,
    s: usize,
    dequant: Dequant16<'_>,
) -> Result<(), ExecError> {
    kernel.check()?;
    let bind = |detail: String| ExecError::Binding {
        kernel: kernel.name.clone(),
        detail,
    };
    if args.len() != kernel.params.len() {
        return Err(bind(format!(
            "{} arguments for {} parameters",
            args.len(),
            kernel.params.len()
        )));
    }
    for ((name, kind), a) in kernel.params.iter().zip(args.iter()) {
        let (have, need) = match (kind, a) {
            (ParamKind::F32 { len, .. }, Arg::F32(b)) => (b.len(), len.as_ref()),
            (ParamKind::I32 { len, .. }, Arg::I32(b)) => (b.len(), len.as_ref()),
            (ParamKind::Weight { row_bytes, .. }, Arg::Weight(b)) => {
                if b.len() % row_bytes.max(&1) != 0 {
                    return Err(bind(format!("weight `{name}`: not whole rows")));
                }
                continue;
            }
            (ParamKind::Experts { .. }, Arg::Experts(_)) => continue,
            _ => return Err(bind(format!("parameter `{name}` bound to the wrong kind"))),
        };
        if let Some(need) = need {
            let n = need
                .eval(t, s)
                .ok_or_else(|| bind(format!("`{name}`: size overflows")))?;
            if have < n {
                return Err(bind(format!("`{name}` holds {have} elements, needs {n}")));
            }
        }
    }
    let gx = kernel.grid[0]
        .eval(t, s)
        .ok_or_else(|| bind("grid overflows".into()))?;
    let gy = kernel.grid[1]
        .eval(t, s)
        .ok_or_else(|| bind("grid overflows".into()))?;
    let (ti, si) = match (i32::try_from(t), i32::try_from(s)) {
        (Ok(a), Ok(b)) => (a, b),
        _ => return Err(bind("T or S exceeds i32".into())),
    };
    let n = kernel.block as usize;
    let mut blk = Block {
        k: kernel,
        args,
        dequant,
        n,
        t: ti,
        s: si,
        at: (0, 0),
        vars: kernel.vars.iter().map(|_| vec![0u32; n]).collect(),
        shared: kernel.shared.iter().map(|a| vec![0u32; a.2]).collect(),
        locals: kernel.locals.iter().map(|a| vec![0f32; a.1 * n]).collect(),
    };
    for y in 0..gy {
        for x in 0..gx {
            blk.at = (x, y);
            for v in blk.shared.iter_mut() {
                v.fill(0);
            }
            let mask = vec![true; n];
            blk.stmts(&kernel.body, &mask)?;
        }
    }
    Ok(())
}

/// Lane values of an expression.
enum Lanes {
    F(Vec<f32>),
    I(Vec<i32>),
}

impl Lanes {
    fn f(self) -> Vec<f32> {
        match self {
            Lanes::F(v) => v,
            Lanes::I(v) => v.into_iter().map(|x| f32::from_bits(x as u32)).collect(),
        }
    }

    fn i(self) -> Vec<i32> {
        match self {
            Lanes::I(v) => v,
            Lanes::F(v) => v.into_iter().map(|x| x.to_bits() as i32).collect(),
        }
    }

    fn bits(&self, l: usize) -> u32 {
        match self {
            Lanes::F(v) => v[l].to_bits(),
            Lanes::I(v) => v[l] as u32,
        }
    }
}

/// The state of one block.
struct Block<'k, 'a, 'b, 'd> {
    k: &'k Kernel,
    args: &'b mut [Arg<'a>],
    dequant: Dequant16<'d>,
    n: usize,
    t: i32,
    s: i32,
    at: (usize, usize),
    /// Registers, as bits, lane-major.
    vars: Vec<Vec<u32>>,
    /// Shared arrays, as bits.
    shared: Vec<Vec<u32>>,
    /// Per-thread arrays, `len` elements per lane.
    locals: Vec<Vec<f32>>,
}

type R<T> = Result<T, ExecError>;

impl Block<'_, '_, '_, '_> {
    fn oob(&self, what: &str, index: i64, len: usize, thread: usize) -> ExecError {
        ExecError::OutOfBounds {
            kernel: self.k.name.clone(),
            what: what.to_string(),
            index,
            len,
            block: self.at,
            thread,
        }
    }

    fn fault(&self, detail: impl Into<String>) -> ExecError {
        ExecError::Fault {
            kernel: self.k.name.clone(),
            detail: detail.into(),
            block: self.at,
        }
    }

    fn eval(&mut self, e: &Expr, m: &[bool]) -> R<Lanes> {
        let n = self.n;
        Ok(match e {
            Expr::F(v) => Lanes::F(vec![*v; n]),
            Expr::I(v) => Lanes::I(vec![*v; n]),
            Expr::Var(v) => {
                let bits = &self.vars[v.0];
                if self.k.vars[v.0].1 == super::ir::Scalar::F32 {
                    Lanes::F(bits.iter().map(|&b| f32::from_bits(b)).collect())
                } else {
                    Lanes::I(bits.iter().map(|&b| b as i32).collect())
                }
            }
            Expr::Builtin(b) => Lanes::I(match b {
                Builtin::Thread => (0..n as i32).collect(),
                Builtin::BlockX => vec![self.at.0 as i32; n],
                Builtin::BlockY => vec![self.at.1 as i32; n],
                Builtin::Tokens => vec![self.t; n],
                Builtin::Keys => vec![self.s; n],
            }),
            Expr::Load(p, i) => {
                let idx = self.eval(i, m)?.i();
                let name = &self.k.params[p.0].0;
                match &self.args[p.0] {
                    Arg::F32(b) => {
                        let mut out = vec![0f32; n];
                        for l in 0..n {
                            if m[l] {
                                let j = idx[l];
                                out[l] = *usize::try_from(j)
                                    .ok()
                                    .and_then(|j| b.get(j))
                                    .ok_or_else(|| self.oob(name, j as i64, b.len(), l))?;
                            }
                        }
                        Lanes::F(out)
                    }
                    Arg::I32(b) => {
                        let mut out = vec![0i32; n];
                        for l in 0..n {
                            if m[l] {
                                let j = idx[l];
                                out[l] = *usize::try_from(j)
                                    .ok()
                                    .and_then(|j| b.get(j))
                                    .ok_or_else(|| self.oob(name, j as i64, b.len(), l))?;
                            }
                        }
                        Lanes::I(out)
                    }
                    Arg::Weight(b) => {
                        let mut out = vec![0f32; n];
                        for l in 0..n {
                            if m[l] {
                                let j = idx[l];
                                let bytes = usize::try_from(j)
                                    .ok()
                                    .and_then(|j| b.get(4 * j..4 * j + 4))
                                    .ok_or_else(|| self.oob(name, j as i64, b.len() / 4, l))?;
                                out[l] =
                                    f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                            }
                        }
                        Lanes::F(out)
                    }
                    _ => return Err(self.fault(format!("`{name}` is not an element buffer"))),
                }
            }
            Expr::LoadShared(a, i) => {
                let idx = self.eval(i, m)?.i();
                let arr = &self.shared[a.0];
                let mut out = vec![0u32; n];
                for l in 0..n {
                    if m[l] {
                        let j = idx[l];
                        out[l] = *usize::try_from(j)
                            .ok()
                            .and_then(|j| arr.get(j))
                            .ok_or_else(|| {
                                self.oob(&self.k.shared[a.0].0, j as i64, arr.len(), l)
                            })?;
                    }
                }
                if self.k.shared[a.0].1 == super::ir::Scalar::F32 {
                    Lanes::F(out.into_iter().map(f32::from_bits).collect())
                } else {
                    Lanes::I(out.into_iter().map(|b| b as i32).collect())
                }
            }
            Expr::Table(t, i) => {
                let idx = self.eval(i, m)?.i();
                let (name, vals) = &self.k.tables[*t];
                let mut out = vec![0f32; n];
                for l in 0..n {
                    if m[l] {
                        let j = idx[l];
                        out[l] = *usize::try_from(j)
                            .ok()
                            .and_then(|j| vals.get(j))
                            .ok_or_else(|| self.oob(name, j as i64, vals.len(), l))?;
                    }
                }
                Lanes::F(out)
            }
            Expr::LoadLocal(a, i) => {
                let idx = self.eval(i, m)?.i();
                let len = self.k.locals[a.0].1;
                let mut out = vec![0f32; n];
                for l in 0..n {
                    if m[l] {
                        let j = idx[l];
                        let j = usize::try_from(j)
                            .ok()
                            .filter(|&j| j < len)
                            .ok_or_else(|| self.oob(&self.k.locals[a.0].0, j as i64, len, l))?;
                        out[l] = self.locals[a.0][l * len + j];
                    }
                }
                Lanes::F(out)
            }
            Expr::Bin(op, a, b) => {
                let (x, y) = (self.eval(a, m)?, self.eval(b, m)?);
                if matches!(x, Lanes::F(_)) {
                    let (x, y) = (x.f(), y.f());
                    match op {
                        BinOp::Lt | BinOp::Le | BinOp::Eq => Lanes::I(
                            x.iter()
                                .zip(&y)
                                .map(|(&p, &q)| {
                                    i32::from(match op {
                                        BinOp::Lt => p < q,
                                        BinOp::Le => p <= q,
                                        _ => p == q,
                                    })
                                })
                                .collect(),
                        ),
                        _ => Lanes::F(
                            x.iter()
                                .zip(&y)
                                .map(|(&p, &q)| match op {
                                    BinOp::Add => p + q,
                                    BinOp::Sub => p - q,
                                    BinOp::Mul => p * q,
                                    BinOp::Div => p / q,
                                    BinOp::Min => {
                                        if q < p {
                                            q
                                        } else {
                                            p
                                        }
                                    }
                                    _ => max_f(p, q),
                                })
                                .collect(),
                        ),
                    }
                } else {
                    let (x, y) = (x.i(), y.i());
                    let mut out = vec![0i32; n];
                    for l in 0..n {
                        if !m[l] {
                            continue;
                        }
                        let (p, q) = (x[l], y[l]);
                        out[l] = match op {
                            BinOp::Add => p.wrapping_add(q),
                            BinOp::Sub => p.wrapping_sub(q),
                            BinOp::Mul => p.wrapping_mul(q),
                            BinOp::Div | BinOp::Rem => {
                                if q == 0 {
                                    return Err(self.fault("integer division by zero"));
                                }
                                if *op == BinOp::Div {
                                    p.wrapping_div(q)
                                } else {
                                    p.wrapping_rem(q)
                                }
                            }
                            BinOp::Min => p.min(q),
                            BinOp::Max => p.max(q),
                            BinOp::Lt => i32::from(p < q),
                            BinOp::Le => i32::from(p <= q),
                            BinOp::Eq => i32::from(p == q),
                            BinOp::And => i32::from(p != 0 && q != 0),
                            BinOp::Or => i32::from(p != 0 || q != 0),
                        };
                    }
                    Lanes::I(out)
                }
            }
            Expr::Un(op, a) => {
                let x = self.eval(a, m)?;
                match (op, x) {
                    (UnOp::Neg, Lanes::F(v)) => Lanes::F(v.into_iter().map(|p| -p).collect()),
                    (UnOp::Neg, Lanes::I(v)) => {
                        Lanes::I(v.into_iter().map(|p| p.wrapping_neg()).collect())
                    }
                    (UnOp::ToF32, x) => Lanes::F(x.i().into_iter().map(|p| p as f32).collect()),
                    (UnOp::Not, x) => {
                        Lanes::I(x.i().into_iter().map(|p| i32::from(p == 0)).collect())
                    }
                    (UnOp::IsNan, x) => {
                        Lanes::I(x.f().into_iter().map(|p| i32::from(p.is_nan())).collect())
                    }
                    (op, x) => {
                        let f: fn(f32) -> f32 = match op {
                            UnOp::Sqrt => f32::sqrt,
                            UnOp::Exp => math::exp,
                            UnOp::Ln => math::ln,
                            UnOp::Sin => math::sin,
                            _ => math::cos,
                        };
                        Lanes::F(x.f().into_iter().map(f).collect())
                    }
                }
            }
            Expr::Select(c, a, b) => {
                let c = self.eval(c, m)?.i();
                let (x, y) = (self.eval(a, m)?, self.eval(b, m)?);
                if matches!(x, Lanes::F(_)) {
                    let (x, y) = (x.f(), y.f());
                    Lanes::F(
                        (0..n)
                            .map(|l| if c[l] != 0 { x[l] } else { y[l] })
                            .collect(),
                    )
                } else {
                    let (x, y) = (x.i(), y.i());
                    Lanes::I(
                        (0..n)
                            .map(|l| if c[l] != 0 { x[l] } else { y[l] })
                            .collect(),
                    )
                }
            }
        })
    }

    fn stmts(&mut self, body: &[Stmt], m: &[bool]) -> R<()> {
        for s in body {
            self.stmt(s, m)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt, m: &[bool]) -> R<()> {
        let n = self.n;
        match s {
            Stmt::Set(v, e) => {
                let x = self.eval(e, m)?;
                for (l, slot) in self.vars[v.0].iter_mut().enumerate() {
                    if m[l] {
                        *slot = x.bits(l);
                    }
                }
            }
            Stmt::Store(p, i, e) => {
                let idx = self.eval(i, m)?.i();
                let x = self.eval(e, m)?;
                let name = self.k.params[p.0].0.clone();
                for l in 0..n {
                    if !m[l] {
                        continue;
                    }
                    let j = idx[l];
                    let ok = match &mut self.args[p.0] {
                        Arg::F32(b) => usize::try_from(j)
                            .ok()
                            .and_then(|j| b.get_mut(j))
                            .map(|slot| *slot = f32::from_bits(x.bits(l)))
                            .ok_or(b.len()),
                        Arg::I32(b) => usize::try_from(j)
                            .ok()
                            .and_then(|j| b.get_mut(j))
                            .map(|slot| *slot = x.bits(l) as i32)
                            .ok_or(b.len()),
                        _ => Err(0),
                    };
                    if let Err(len) = ok {
                        return Err(self.oob(&name, j as i64, len, l));
                    }
                }
            }
            Stmt::StoreShared(a, i, e) => {
                let idx = self.eval(i, m)?.i();
                let x = self.eval(e, m)?;
                for l in 0..n {
                    if !m[l] {
                        continue;
                    }
                    let j = idx[l];
                    let len = self.shared[a.0].len();
                    match usize::try_from(j).ok().filter(|&j| j < len) {
                        Some(j) => self.shared[a.0][j] = x.bits(l),
                        None => return Err(self.oob(&self.k.shared[a.0].0, j as i64, len, l)),
                    }
                }
            }
            Stmt::LoadShared4(a, i, dst) => {
                let idx = self.eval(i, m)?.i();
                for l in 0..n {
                    if !m[l] {
                        continue;
                    }
                    let j = i64::from(idx[l]) * 4;
                    let arr = &self.shared[a.0];
                    let four = usize::try_from(j)
                        .ok()
                        .and_then(|j| arr.get(j..j + 4))
                        .ok_or_else(|| self.oob(&self.k.shared[a.0].0, j, arr.len(), l))?;
                    let four: [u32; 4] = std::array::from_fn(|c| four[c]);
                    for (v, bits) in dst.iter().zip(four) {
                        self.vars[v.0][l] = bits;
                    }
                }
            }
            Stmt::StoreLocal(a, i, e) => {
                let idx = self.eval(i, m)?.i();
                let x = self.eval(e, m)?.f();
                let len = self.k.locals[a.0].1;
                for l in 0..n {
                    if !m[l] {
                        continue;
                    }
                    let j = idx[l];
                    match usize::try_from(j).ok().filter(|&j| j < len) {
                        Some(j) => self.locals[a.0][l * len + j] = x[l],
                        None => return Err(self.oob(&self.k.locals[a.0].0, j as i64, len, l)),
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
                let x = self.eval(start, m)?;
                for (l, slot) in self.vars[var.0].iter_mut().enumerate() {
                    if m[l] {
                        *slot = x.bits(l);
                    }
                }
                loop {
                    let end = self.eval(end, m)?.i();
                    let inner: Vec<bool> = (0..n)
                        .map(|l| m[l] && (self.vars[var.0][l] as i32) < end[l])
                        .collect();
                    if !inner.iter().any(|&b| b) {
                        break;
                    }
                    self.stmts(body, &inner)?;
                    for (slot, &on) in self.vars[var.0].iter_mut().zip(&inner) {
                        if on {
                            *slot = (*slot as i32).wrapping_add(*step) as u32;
                        }
                    }
                }
            }
            Stmt::If(c, a, b) => {
                let c = self.eval(c, m)?.i();
                let ma: Vec<bool> = (0..n).map(|l| m[l] && c[l] != 0).collect();
                let mb: Vec<bool> = (0..n).map(|l| m[l] && c[l] == 0).collect();
                if ma.iter().any(|&x| x) {
                    self.stmts(a, &ma)?;
                }
                if mb.iter().any(|&x| x) {
                    self.stmts(b, &mb)?;
                }
            }
            Stmt::Barrier => {
                if !m.iter().all(|&x| x) {
                    return Err(self.fault("barrier reached by part of the block"));
                }
            }
            Stmt::WarpReduce(op, v) => {
                let w = self.k.warp as usize;
                for g in (0..n).step_by(w) {
                    let grp = &m[g..g + w];
                    if grp.iter().any(|&x| x) && !grp.iter().all(|&x| x) {
                        return Err(self.fault("warp reduction reached by part of a warp"));
                    }
                }
                let mut off = w / 2;
                while off > 0 {
                    let cur: Vec<f32> = self.vars[v.0].iter().map(|&b| f32::from_bits(b)).collect();
                    for l in 0..n {
                        if m[l] {
                            let (a, b) = (cur[l], cur[l ^ off]);
                            let r = match op {
                                ReduceOp::Sum => a + b,
                                ReduceOp::Max => max_f(a, b),
                            };
                            self.vars[v.0][l] = r.to_bits();
                        }
                    }
                    off /= 2;
                }
            }
            Stmt::Dequant16 {
                w,
                expert,
                row,
                chunk,
                dst,
            } => {
                let rows = self.eval(row, m)?.i();
                let chunks = self.eval(chunk, m)?.i();
                let experts = match expert {
                    Some(e) => Some(self.eval(e, m)?.i()),
                    None => None,
                };
                let (ty, rb, row_len) = match &self.k.params[w.0].1 {
                    ParamKind::Weight {
                        ggml_type,
                        row_bytes,
                        row_len,
                    }
                    | ParamKind::Experts {
                        ggml_type,
                        row_bytes,
                        row_len,
                    } => (ggml_type.clone(), *row_bytes, *row_len),
                    _ => return Err(self.fault("dequant of a non-weight")),
                };
                let name = self.k.params[w.0].0.clone();
                let llen = self.k.locals[dst.0].1;
                for l in 0..n {
                    if !m[l] {
                        continue;
                    }
                    let bytes: &[u8] = match (&self.args[w.0], &experts) {
                        (Arg::Weight(b), None) => b,
                        (Arg::Experts(t), Some(e)) => {
                            let e = e[l];
                            match usize::try_from(e).ok().and_then(|e| t.get(e)) {
                                Some(b) => b,
                                None => return Err(self.oob(&name, e as i64, t.len(), l)),
                            }
                        }
                        _ => return Err(self.fault(format!("`{name}` bound to the wrong kind"))),
                    };
                    let (r, c) = (rows[l], chunks[l]);
                    let n_rows = bytes.len() / rb.max(1);
                    let r = match usize::try_from(r).ok().filter(|&r| r < n_rows) {
                        Some(r) => r,
                        None => return Err(self.oob(&name, r as i64, n_rows, l)),
                    };
                    let n_chunks = row_len.div_ceil(16);
                    let c = match usize::try_from(c).ok().filter(|&c| c < n_chunks) {
                        Some(c) => c,
                        None => {
                            return Err(self.oob(&format!("{name} chunk"), c as i64, n_chunks, l))
                        }
                    };
                    let rowb = &bytes[r * rb..(r + 1) * rb];
                    let mut out = [0f32; 16];
                    if ty == "F32" {
                        for (i, o) in out.iter_mut().enumerate() {
                            let j = 16 * c + i;
                            if j < row_len {
                                let b = &rowb[4 * j..4 * j + 4];
                                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                            }
                        }
                    } else {
                        (self.dequant)(&ty, rowb, c, &mut out)
                            .map_err(|e| self.fault(format!("dequantizing `{name}`: {e}")))?;
                    }
                    self.locals[dst.0][l * llen..l * llen + 16].copy_from_slice(&out);
                }
            }
        }
        Ok(())
    }
}

/// The IR's NaN-propagating maximum.
fn max_f(a: f32, b: f32) -> f32 {
    if a > b || a.is_nan() {
        a
    } else {
        b
    }
}
