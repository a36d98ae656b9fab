//! The kernel builder: small helpers over cranelift's `FunctionBuilder` that every op lowering
//! uses — reading [`StepArgs`](super::StepArgs) fields, counted loops, f32/i32 loads and stores,
//! calls of imported host functions, and the one f32 dot product of the oracle.
//!
//! The f32 dot follows the reduction order of `aubier_runtime::gguf::quant` (eight lanes,
//! element `i` into lane `i % 8`, `w·x` rounded then added, no FMA, lanes folded as
//! `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`), so an inline F32 dot is bit-identical to the runtime's
//! `dot_fn(F32)`. The eight lanes are two `f32x4` registers; the tail (< 8 elements) goes through
//! a 32-byte stack slot holding the lanes.

use super::args::StepArgs;
use super::host::{dequant_symbol, dot_symbol};
use aubier_compiler::types::Dim;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32, F32X4, I32, I64};
use cranelift_codegen::ir::{
    FuncRef, InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Type, Value,
};
use cranelift_frontend::{FunctionBuilder, Variable};
use cranelift_jit::JITModule;
use cranelift_module::{FuncId, Module};
use std::collections::HashMap;
use std::mem::offset_of;

/// Loads and stores of generated code: never trapping (the executor validated every range) and
/// without an alignment promise (vector accesses may be unaligned).
const MEM: MemFlagsData = MemFlagsData::new().with_notrap();

/// A symbolic element count `fixed · T^tokens · S^keys`: the extent of a loop or of the parallel
/// work of a kernel, for a step of `T` tokens over `S` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Compile-time factor.
    pub fixed: usize,
    /// Power of `T`.
    pub tokens: u32,
    /// Power of `S`.
    pub keys: u32,
}

impl Extent {
    /// The constant `n`.
    pub const fn fixed(n: usize) -> Self {
        Self {
            fixed: n,
            tokens: 0,
            keys: 0,
        }
    }

    /// The extent of one axis.
    pub fn of_dim(d: Dim) -> Self {
        match d {
            Dim::Fixed(n) => Self::fixed(n),
            Dim::Tokens => Self {
                fixed: 1,
                tokens: 1,
                keys: 0,
            },
            Dim::Keys => Self {
                fixed: 1,
                tokens: 0,
                keys: 1,
            },
        }
    }

    /// Product of the axes `dims` (the element count of a row-major block of them).
    pub fn of_dims(dims: &[Dim]) -> Option<Self> {
        dims.iter()
            .try_fold(Self::fixed(1), |acc, &d| acc.times(Self::of_dim(d)))
    }

    /// `self · other`, `None` on overflow of the fixed factor.
    pub fn times(self, other: Self) -> Option<Self> {
        Some(Self {
            fixed: self.fixed.checked_mul(other.fixed)?,
            tokens: self.tokens + other.tokens,
            keys: self.keys + other.keys,
        })
    }

    /// `self / n` when the fixed factor is a multiple of `n > 0`.
    pub fn div_fixed(self, n: usize) -> Option<Self> {
        (n > 0 && self.fixed.is_multiple_of(n)).then_some(Self {
            fixed: self.fixed / n,
            ..self
        })
    }

    /// `self / T` when `T` divides it symbolically.
    pub fn div_tokens(self) -> Option<Self> {
        (self.tokens > 0).then_some(Self {
            tokens: self.tokens - 1,
            ..self
        })
    }

    /// `self / S` when `S` divides it symbolically.
    pub fn div_keys(self) -> Option<Self> {
        (self.keys > 0).then_some(Self {
            keys: self.keys - 1,
            ..self
        })
    }

    /// The value for `T = t`, `S = s`; `None` on overflow.
    pub fn eval(self, t: usize, s: usize) -> Option<usize> {
        let mut v = self.fixed;
        for _ in 0..self.tokens {
            v = v.checked_mul(t)?;
        }
        for _ in 0..self.keys {
            v = v.checked_mul(s)?;
        }
        Some(v)
    }
}

/// A kernel under construction: the function builder plus the entry values every kernel reads.
pub(crate) struct Kb<'a, 'f> {
    /// The cranelift function builder.
    pub b: FunctionBuilder<'f>,
    module: &'a mut JITModule,
    imports: &'a HashMap<String, FuncId>,
    refs: HashMap<String, FuncRef>,
    args: Value,
    /// `T` (i64).
    pub t: Value,
    /// `S` (i64).
    pub s: Value,
    /// First work item of this call (i64).
    pub begin: Value,
    /// One past the last work item of this call (i64).
    pub end: Value,
}

/// A byte offset as a cranelift immediate. Offsets are `StepArgs` fields or positions inside one
/// row of a fixed width (a few KiB at most), far below `i32::MAX`.
fn field(off: usize) -> i32 {
    off as i32
}

impl<'a, 'f> Kb<'a, 'f> {
    /// Opens the entry block of a kernel `fn(args: *const StepArgs)` and reads `T`, `S`, `begin`,
    /// `end`.
    pub fn new(
        mut b: FunctionBuilder<'f>,
        module: &'a mut JITModule,
        imports: &'a HashMap<String, FuncId>,
    ) -> Self {
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        b.seal_block(entry);
        let args = b.block_params(entry)[0];
        let ld = |b: &mut FunctionBuilder<'f>, off: usize| b.ins().load(I64, MEM, args, field(off));
        let t = ld(&mut b, offset_of!(StepArgs, t));
        let s = ld(&mut b, offset_of!(StepArgs, s));
        let begin = ld(&mut b, offset_of!(StepArgs, begin));
        let end = ld(&mut b, offset_of!(StepArgs, end));
        Self {
            b,
            module,
            imports,
            refs: HashMap::new(),
            args,
            t,
            s,
            begin,
            end,
        }
    }

    /// Closes the kernel: returns and finalizes the function.
    pub fn finish(mut self) {
        self.b.ins().return_(&[]);
        self.b.seal_all_blocks();
        let config = self.module.target_config();
        self.b.finalize(config);
    }

    /// Address of operand `i` (`StepArgs::args[i]`).
    pub fn arg(&mut self, i: usize) -> Value {
        let off = offset_of!(StepArgs, args) + 8 * i;
        self.b.ins().load(I64, MEM, self.args, field(off))
    }

    /// Address of the output (`StepArgs::out`).
    pub fn out(&mut self) -> Value {
        self.b
            .ins()
            .load(I64, MEM, self.args, field(offset_of!(StepArgs, out)))
    }

    /// Address of the step's f32 scratch (`StepArgs::scratch`).
    pub fn scratch(&mut self) -> Value {
        self.b
            .ins()
            .load(I64, MEM, self.args, field(offset_of!(StepArgs, scratch)))
    }

    /// An i64 constant.
    pub fn ic(&mut self, n: usize) -> Value {
        self.b.ins().iconst(I64, n as i64)
    }

    /// An f32 constant.
    pub fn fc(&mut self, v: f32) -> Value {
        self.b.ins().f32const(v)
    }

    /// The value of a symbolic extent at this call's `T`, `S`.
    pub fn extent(&mut self, e: Extent) -> Value {
        let mut v = self.ic(e.fixed);
        for _ in 0..e.tokens {
            v = self.b.ins().imul(v, self.t);
        }
        for _ in 0..e.keys {
            v = self.b.ins().imul(v, self.s);
        }
        v
    }

    /// `a · b` (i64).
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().imul(a, b)
    }

    /// `a · n` (i64).
    pub fn mul_c(&mut self, a: Value, n: usize) -> Value {
        self.b.ins().imul_imm_s(a, n as i64)
    }

    /// `a + b` (i64).
    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().iadd(a, b)
    }

    /// `a + n` (i64).
    pub fn add_c(&mut self, a: Value, n: usize) -> Value {
        self.b.ins().iadd_imm_s(a, n as i64)
    }

    /// `a / n` (unsigned i64, `n > 0`).
    pub fn div_c(&mut self, a: Value, n: usize) -> Value {
        let d = self.ic(n);
        self.b.ins().udiv(a, d)
    }

    /// `base + idx · elem_bytes`.
    pub fn at(&mut self, base: Value, idx: Value, elem_bytes: usize) -> Value {
        let off = self.mul_c(idx, elem_bytes);
        self.b.ins().iadd(base, off)
    }

    /// Loads an f32.
    pub fn ld(&mut self, ptr: Value) -> Value {
        self.b.ins().load(F32, MEM, ptr, 0)
    }

    /// Stores an f32.
    pub fn st(&mut self, ptr: Value, v: Value) {
        self.b.ins().store(MEM, v, ptr, 0);
    }

    /// Loads the f32 at `ptr + off` bytes.
    pub fn ld_off(&mut self, ptr: Value, off: usize) -> Value {
        self.b.ins().load(F32, MEM, ptr, field(off))
    }

    /// Stores `v` (any type) at `ptr + off` bytes.
    pub fn st_off(&mut self, ptr: Value, v: Value, off: usize) {
        self.b.ins().store(MEM, v, ptr, field(off));
    }

    /// Loads `f32x4`.
    pub fn ld4(&mut self, ptr: Value) -> Value {
        self.b.ins().load(F32X4, MEM, ptr, 0)
    }

    /// Stores `f32x4`.
    pub fn st4(&mut self, ptr: Value, v: Value) {
        self.b.ins().store(MEM, v, ptr, 0);
    }

    /// Loads an i32 and sign-extends it to i64.
    pub fn ld_i32(&mut self, ptr: Value) -> Value {
        let v = self.b.ins().load(I32, MEM, ptr, 0);
        self.b.ins().sextend(I64, v)
    }

    /// Stores the low 32 bits of an i64.
    pub fn st_i32(&mut self, ptr: Value, v: Value) {
        let v = self.b.ins().ireduce(I32, v);
        self.b.ins().store(MEM, v, ptr, 0);
    }

    /// A mutable local of type `ty` starting at `init`.
    pub fn var(&mut self, ty: Type, init: Value) -> Variable {
        let v = self.b.declare_var(ty);
        self.b.def_var(v, init);
        v
    }

    /// Reads a local.
    pub fn get(&mut self, v: Variable) -> Value {
        self.b.use_var(v)
    }

    /// Writes a local.
    pub fn set(&mut self, v: Variable, x: Value) {
        self.b.def_var(v, x);
    }

    /// `for i in (start..end).step_by(step) { body(i) }`; the caller guarantees that `end − start`
    /// is a multiple of `step` (or `step == 1`).
    pub fn for_step(
        &mut self,
        start: Value,
        end: Value,
        step: usize,
        body: impl FnOnce(&mut Self, Value),
    ) {
        let header = self.b.create_block();
        let body_blk = self.b.create_block();
        let exit = self.b.create_block();
        self.b.append_block_param(header, I64);
        self.b.ins().jump(header, &[start.into()]);
        self.b.switch_to_block(header);
        let i = self.b.block_params(header)[0];
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, i, end);
        self.b.ins().brif(more, body_blk, &[], exit, &[]);
        self.b.switch_to_block(body_blk);
        self.b.seal_block(body_blk);
        body(self, i);
        let next = self.add_c(i, step);
        self.b.ins().jump(header, &[next.into()]);
        self.b.seal_block(header);
        self.b.switch_to_block(exit);
        self.b.seal_block(exit);
    }

    /// `for i in start..end { body(i) }`.
    pub fn for_range(&mut self, start: Value, end: Value, body: impl FnOnce(&mut Self, Value)) {
        self.for_step(start, end, 1, body);
    }

    /// `for i in 0..n { body(i) }`.
    pub fn for_n(&mut self, n: Value, body: impl FnOnce(&mut Self, Value)) {
        let zero = self.ic(0);
        self.for_step(zero, n, 1, body);
    }

    /// Calls an imported host function by symbol name; returns its results.
    pub fn call(&mut self, name: &str, args: &[Value]) -> Vec<Value> {
        let fref = match self.refs.get(name) {
            Some(&f) => f,
            None => {
                // Every name the lowerings call is declared before emission (see `CpuProgram::compile`).
                let id = self.imports[name];
                let f = self.module.declare_func_in_func(id, self.b.func);
                self.refs.insert(name.to_string(), f);
                f
            }
        };
        let inst = self.b.ins().call(fref, args);
        self.b.inst_results(inst).to_vec()
    }

    /// Calls a unary f32 host function.
    pub fn math(&mut self, name: &str, x: Value) -> Value {
        self.call(name, &[x])[0]
    }

    /// `x / (1 + e^(−x))`: SiLU as PyTorch's CPU kernel writes it.
    pub fn silu(&mut self, x: Value) -> Value {
        let neg = self.b.ins().fneg(x);
        let e = self.math(super::host::MATH_EXP, neg);
        let one = self.fc(1.0);
        let den = self.b.ins().fadd(one, e);
        self.b.ins().fdiv(x, den)
    }

    /// The oracle's f32 dot of `n` elements at `w` and `x` (reduction order in the module note).
    pub fn dot_f32(&mut self, w: Value, x: Value, n: Value) -> Value {
        let zero = self.fc(0.0);
        let zv = self.b.ins().splat(F32X4, zero);
        let lo = self.var(F32X4, zv);
        let hi = self.var(F32X4, zv);
        let mask = self.b.ins().iconst(I64, !7i64);
        let n8 = self.b.ins().band(n, mask);
        let start = self.ic(0);
        self.for_step(start, n8, 8, |k, i| {
            let wp = k.at(w, i, 4);
            let xp = k.at(x, i, 4);
            for (half, var) in [(0i32, lo), (16, hi)] {
                let a = k.b.ins().load(F32X4, MEM, wp, half);
                let c = k.b.ins().load(F32X4, MEM, xp, half);
                let p = k.b.ins().fmul(a, c);
                let acc = k.get(var);
                let sum = k.b.ins().fadd(acc, p);
                k.set(var, sum);
            }
        });
        // Tail: lanes to a stack slot, element n8 + j into lane j, lanes back.
        let slot =
            self.b
                .create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 32, 4));
        let lanes = self.b.ins().stack_addr(I64, slot, 0);
        let (l, h) = (self.get(lo), self.get(hi));
        self.b.ins().store(MEM, l, lanes, 0);
        self.b.ins().store(MEM, h, lanes, 16);
        self.for_range(n8, n, |k, i| {
            let j = k.b.ins().isub(i, n8);
            let lp = k.at(lanes, j, 4);
            let wv = {
                let p = k.at(w, i, 4);
                k.ld(p)
            };
            let xv = {
                let p = k.at(x, i, 4);
                k.ld(p)
            };
            let prod = k.b.ins().fmul(wv, xv);
            let acc = k.ld(lp);
            let sum = k.b.ins().fadd(acc, prod);
            k.st(lp, sum);
        });
        let l = self.b.ins().load(F32X4, MEM, lanes, 0);
        let h = self.b.ins().load(F32X4, MEM, lanes, 16);
        let lane = |k: &mut Self, v: Value, i: u8| k.b.ins().extractlane(v, i);
        let (a0, a1, a2, a3) = (
            lane(self, l, 0),
            lane(self, l, 1),
            lane(self, l, 2),
            lane(self, l, 3),
        );
        let (a4, a5, a6, a7) = (
            lane(self, h, 0),
            lane(self, h, 1),
            lane(self, h, 2),
            lane(self, h, 3),
        );
        let s01 = self.b.ins().fadd(a0, a1);
        let s23 = self.b.ins().fadd(a2, a3);
        let s45 = self.b.ins().fadd(a4, a5);
        let s67 = self.b.ins().fadd(a6, a7);
        let s03 = self.b.ins().fadd(s01, s23);
        let s47 = self.b.ins().fadd(s45, s67);
        self.b.ins().fadd(s03, s47)
    }

    /// Address of a new stack buffer of `n` f32 (16-byte aligned), live for the whole kernel.
    pub fn stack_f32(&mut self, n: usize) -> Value {
        let bytes = u32::try_from(n * 4).unwrap_or(u32::MAX);
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            bytes,
            4,
        ));
        self.b.ins().stack_addr(I64, slot, 0)
    }

    /// Dot of one weight row with `n` f32 activations: inline for `F32`, else the type's host dot.
    pub fn dot_row(&mut self, ty: &WeightType, row: Value, x: Value, n: Value) -> Value {
        match ty {
            WeightType::F32 => self.dot_f32(row, x, n),
            WeightType::Quant(name) => self.call(&dot_symbol(name), &[row, x, n])[0],
        }
    }

    /// Writes the `n` f32 values of one weight row to `y`: a copy for `F32`, else the type's host
    /// dequantization.
    pub fn dequant_row(&mut self, ty: &WeightType, row: Value, y: Value, n: Value) {
        match ty {
            WeightType::F32 => self.copy_f32(y, row, n),
            WeightType::Quant(name) => {
                self.call(&dequant_symbol(name), &[row, y, n]);
            }
        }
    }

    /// Copies `n` f32 (4-byte units: f32 or i32) from `src` to `dst` (non-overlapping).
    pub fn copy_f32(&mut self, dst: Value, src: Value, n: Value) {
        let mask = self.b.ins().iconst(I64, !3i64);
        let n4 = self.b.ins().band(n, mask);
        let zero = self.ic(0);
        self.for_step(zero, n4, 4, |k, i| {
            let s = k.at(src, i, 4);
            let d = k.at(dst, i, 4);
            let v = k.ld4(s);
            k.st4(d, v);
        });
        self.for_range(n4, n, |k, i| {
            let s = k.at(src, i, 4);
            let d = k.at(dst, i, 4);
            let v = k.b.ins().load(I32, MEM, s, 0);
            k.b.ins().store(MEM, v, d, 0);
        });
    }
}

/// How generated code reads a weight's rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WeightType {
    /// Plain f32: dots and copies inline.
    F32,
    /// A block type whose kernels are imported host functions (the ggml type name).
    Quant(String),
}
