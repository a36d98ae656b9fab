//! The CPU oracle: cranelift lowering of every unfused [`Plan`] step to native code
//! (ARCHITECTURE.md § kernels-gen, § numerics).
//!
//! Algorithm. [`CpuProgram::compile`] runs once per model load:
//! 1. every plan weight gets a row layout: `F32` rows are read inline; any other ggml type needs
//!    its [`QuantKernels`] in the [`HostSymbols`] (dot + dequantize, imported as host functions);
//! 2. every step is checked (arity, dtypes, symbolic element counts of operands and output,
//!    attributes, no output aliasing an operand) and turned into one or more *kernels*; a fused op
//!    (`phase`, `wkb`, `kqkv`) is a hard error ([`LowerError::FusedOp`]): the oracle never takes
//!    a fused path;
//! 3. each kernel becomes one cranelift function `extern "C" fn(*const StepArgs)` that computes the
//!    work items `begin..end` of a parallel axis (output rows of a mat-vec, tokens, elements …).
//!
//! Calling convention. The executor fills a [`StepArgs`] (operand addresses in the op's operand
//! order, output, scratch, `T`, `S`) and splits `0..work` of each kernel into ranges, one call per
//! range, on any number of threads. Each output element is written by exactly one work item, and
//! the arithmetic of an item never depends on the split, so results are bit-identical for every
//! thread count. The kernels of one step run in order (a barrier between them). Before launching a
//! step the executor validates its [`IndexCheck`]s: generated code indexes memory with token ids,
//! positions and expert ids, and trusts them.
//!
//! Numerics: f32 throughout, fixed reduction orders (module `emit`), `exp` by [`expf::expf`]
//! (deterministic f64 operations), cos, sin and ln from the platform libm (module `host`), YaRN
//! frequencies computed as transformers computes them ([`yarn_inv_freq`]).

mod args;
mod emit;
pub mod expf;
mod host;
mod lower;
mod rope;

#[cfg(test)]
mod tests;

pub use args::{StepArgs, MAX_ARGS};
pub use emit::Extent;
pub use host::{HostDequantFn, HostDotFn, HostSymbols, QuantKernels};
pub use rope::yarn_inv_freq;

use aubier_compiler::plan::Plan;
use cranelift_codegen::ir::types::{F32, I64};
use cranelift_codegen::ir::{AbiParam, UserFuncName};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, FuncId, Linkage, Module};
use std::collections::HashMap;

type KernelFn = unsafe extern "C" fn(*const StepArgs);

/// One compiled kernel of a step.
#[derive(Clone, Debug)]
pub struct Kernel {
    name: &'static str,
    func: KernelFn,
    work: Extent,
    grain: usize,
}

impl Kernel {
    /// What the kernel computes (`mat_mul`, `moe_ffn.gate_up`, …), for traces.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Number of independent work items, as a function of `T` and `S`.
    pub fn work(&self) -> Extent {
        self.work
    }

    /// Suggested minimum work items per call (cheap items such as single elements come in
    /// thousands; a mat-vec row is worth a call on its own).
    pub fn grain(&self) -> usize {
        self.grain
    }

    /// Runs work items `args.begin..args.end`.
    ///
    /// # Safety
    /// `args` describes a valid execution of this kernel's step: every operand and output address
    /// points to an allocation holding the value's elements at `args.t`, `args.s` (weights: the
    /// byte length [`CpuProgram::weight_bytes`] gives), the scratch holds
    /// [`CompiledStep::scratch`] f32, the step's [`IndexCheck`]s hold,
    /// `begin ≤ end ≤ work.eval(t, s)`, and no other thread writes what this call reads or writes
    /// the same output items.
    pub unsafe fn call(&self, args: &StepArgs) {
        // SAFETY: forwarded to the caller (see the doc above); the function was generated for
        // exactly this argument block layout.
        unsafe { (self.func)(args) }
    }
}

/// Which bound an index operand must respect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexBound {
    /// `0 ≤ id < n` (token ids against the vocabulary, expert ids against the expert count).
    Below(usize),
    /// `0 ≤ pos < S` (cache rows written by `cache_write`).
    Keys,
}

/// An i32 operand the executor must validate before running the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexCheck {
    /// Operand index in the step's args.
    pub arg: usize,
    /// The bound every element must respect.
    pub bound: IndexBound,
    /// What the ids are, for the error message (`token id`, `expert id`, `position`).
    pub what: &'static str,
}

/// A stacked expert weight (`{ne0, ne1, n_expert}`, ggml order) that a step reads through a table
/// of per-expert addresses instead of the tensor's base address, so each expert's bytes may live
/// anywhere (a fast-store copy or the mapped file).
///
/// The operand `arg` of [`StepArgs::args`] then points to `n_expert` `u64` addresses; entry `e`
/// is the first byte of expert `e`'s `expert_bytes` bytes (`row_bytes · ne1`), laid out exactly as
/// bytes `e · expert_bytes .. (e + 1) · expert_bytes` of the stacked tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertTable {
    /// Operand index in the step's args.
    pub arg: usize,
    /// Experts in the tensor (`ne[2]`): entries of the table.
    pub n_expert: usize,
    /// Bytes of one expert's slice (`row_bytes · ne[1]`).
    pub expert_bytes: usize,
}

/// What [`CpuProgram::compile_steps`] makes of one plan step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lowering {
    /// Its cranelift kernels, index checks, expert tables and scratch.
    Code,
    /// Its index checks and expert tables alone: a backend runs the step with a kernel of its
    /// own, so no code is generated for it.
    Checks,
    /// Nothing: a fused step a backend runs with a kernel of its own that checks its operands.
    Skip,
}

/// A lowered plan step.
#[derive(Clone, Debug)]
pub struct CompiledStep {
    /// Kernels, run in order with a barrier between them (empty for a `reshape` in place).
    pub kernels: Vec<Kernel>,
    /// f32 scratch elements the step needs ([`Extent::fixed`]`(0)` when none).
    pub scratch: Extent,
    /// Index operands to validate before the first kernel.
    pub checks: Vec<IndexCheck>,
    /// Weight operands passed as per-expert address tables (`moe_ffn`'s expert tensors).
    pub expert_tables: Vec<ExpertTable>,
}

/// Errors of [`CpuProgram::compile`].
#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    /// A fused node reached the oracle lowering (the FATAL CPU handler of the design).
    #[error("step {step}: `{op}` is a fused op; the CPU oracle lowers only unfused plans (compile with the fusions off)")]
    FusedOp {
        /// Step index in the plan.
        step: usize,
        /// The op's name.
        op: &'static str,
    },
    /// A step's operands, output or attributes do not fit its op.
    #[error("step {step} (`{op}`): {detail}")]
    Invalid {
        /// Step index in the plan.
        step: usize,
        /// The op's name.
        op: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A plan weight cannot be read (unknown type without host kernels, bad shape).
    #[error("weight `{name}`: {detail}")]
    Weight {
        /// GGUF tensor name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The host ISA cannot be targeted by cranelift.
    #[error("cranelift cannot target this host: {0}")]
    Isa(String),
    /// cranelift rejected generated code (a bug of the lowering).
    #[error("cranelift failed on kernel `{kernel}` of step {step}: {detail}")]
    Codegen {
        /// Step index in the plan.
        step: usize,
        /// Kernel name.
        kernel: &'static str,
        /// cranelift's message.
        detail: String,
    },
}

/// The JIT module owning the generated code.
struct Code(Option<JITModule>);

// SAFETY: after `finalize_definitions` the module is never used again except to free its memory
// in `Drop` (which has exclusive access); the code pages it owns are immutable and executable, so
// sharing or sending the owner across threads is sound.
unsafe impl Send for Code {}
// SAFETY: see above; no `&self` method touches the module.
unsafe impl Sync for Code {}

impl Drop for Code {
    fn drop(&mut self) {
        if let Some(module) = self.0.take() {
            // SAFETY: the kernels' function pointers live in `CpuProgram::steps`, which is
            // dropped with this program; nothing else holds them.
            unsafe { module.free_memory() };
        }
    }
}

/// A plan compiled to native code, once per model load.
pub struct CpuProgram {
    steps: Vec<CompiledStep>,
    weight_bytes: Vec<usize>,
    _code: Code,
}

impl std::fmt::Debug for CpuProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuProgram")
            .field("steps", &self.steps.len())
            .field("weights", &self.weight_bytes.len())
            .finish()
    }
}

impl CpuProgram {
    /// Lowers every step of `plan` with cranelift, importing the quant kernels of `host`.
    ///
    /// Errors: [`LowerError::FusedOp`] for a fused step; [`LowerError::Invalid`] when a step's
    /// operands do not fit its op (arity, dtype, element counts, attributes, aliasing);
    /// [`LowerError::Weight`] for a weight whose type has no kernels or whose `ne` is unusable;
    /// [`LowerError::Isa`] / [`LowerError::Codegen`] from cranelift.
    pub fn compile(plan: &Plan, host: &HostSymbols) -> Result<CpuProgram, LowerError> {
        CpuProgram::compile_steps(plan, host, |_| Lowering::Code)
    }

    /// [`CpuProgram::compile`] lowering each step as `lower` says (by step index): its code, or
    /// only its index checks and expert tables (a step a backend runs with a kernel of its own:
    /// no cranelift code is generated for it), or nothing (a fused step of such a kernel).
    ///
    /// Errors: those of [`CpuProgram::compile`] for the steps lowered.
    pub fn compile_steps(
        plan: &Plan,
        host: &HostSymbols,
        lower: impl Fn(usize) -> Lowering,
    ) -> Result<CpuProgram, LowerError> {
        let weights = plan
            .weights
            .iter()
            .map(|w| lower::WeightInfo::new(w, host))
            .collect::<Result<Vec<_>, _>>()?;
        let cx = lower::Cx {
            plan,
            weights: &weights,
        };
        let nothing = || lower::StepSpec {
            kernels: Vec::new(),
            scratch: Extent::fixed(0),
            checks: Vec::new(),
            expert_tables: Vec::new(),
        };
        let specs = plan
            .steps
            .iter()
            .enumerate()
            .map(|(i, step)| match lower(i) {
                Lowering::Code => lower::lower_step(&cx, i, step),
                Lowering::Checks => lower::lower_step(&cx, i, step).map(|spec| lower::StepSpec {
                    checks: spec.checks,
                    expert_tables: spec.expert_tables,
                    ..nothing()
                }),
                Lowering::Skip => Ok(nothing()),
            })
            .collect::<Result<Vec<_>, _>>()?;

        let mut module = new_module(host)?;
        let imports = declare_imports(&mut module, host)?;
        let mut ctx = module.make_context();
        let mut fctx = FunctionBuilderContext::new();
        let mut sig = module.make_signature();
        sig.params.push(AbiParam::new(I64));

        let mut declared = Vec::with_capacity(specs.len());
        let mut n_funcs = 0u32;
        for (i, spec) in specs.into_iter().enumerate() {
            let lower::StepSpec {
                kernels,
                scratch,
                checks,
                expert_tables,
            } = spec;
            let mut step_funcs = Vec::with_capacity(kernels.len());
            for kernel in kernels {
                let cg = |e: &dyn std::fmt::Display| LowerError::Codegen {
                    step: i,
                    kernel: kernel.meta.name,
                    detail: e.to_string(),
                };
                let id = module
                    .declare_function(&format!("step{i}_k{n_funcs}"), Linkage::Local, &sig)
                    .map_err(|e| cg(&e))?;
                ctx.func.signature = sig.clone();
                ctx.func.name = UserFuncName::user(0, id.as_u32());
                {
                    let b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
                    let mut kb = emit::Kb::new(b, &mut module, &imports);
                    (kernel.emit)(&mut kb);
                    kb.finish();
                }
                module
                    .define_function(id, &mut ctx)
                    .map_err(|e| cg(&format!("{e:?}")))?;
                module.clear_context(&mut ctx);
                step_funcs.push((id, kernel.meta));
                n_funcs += 1;
            }
            declared.push((step_funcs, scratch, checks, expert_tables));
        }
        module
            .finalize_definitions()
            .map_err(|e| LowerError::Isa(e.to_string()))?;

        let steps = declared
            .into_iter()
            .map(|(funcs, scratch, checks, expert_tables)| {
                let kernels = funcs
                    .into_iter()
                    .map(|(id, meta): (FuncId, lower::KernelMeta)| {
                        let ptr = module.get_finalized_function(id);
                        // SAFETY: the function was generated with the signature
                        // `fn(i64 /* *const StepArgs */)` in the platform C calling convention.
                        let func = unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) };
                        Kernel {
                            name: meta.name,
                            func,
                            work: meta.work,
                            grain: meta.grain,
                        }
                    })
                    .collect();
                CompiledStep {
                    kernels,
                    scratch,
                    checks,
                    expert_tables,
                }
            })
            .collect();
        Ok(CpuProgram {
            steps,
            weight_bytes: weights.iter().map(|w| w.total_bytes).collect(),
            _code: Code(Some(module)),
        })
    }

    /// The compiled steps, one per plan step, in plan order.
    pub fn steps(&self) -> &[CompiledStep] {
        &self.steps
    }

    /// Exact byte length each plan weight must have (indexed by `WeightId`): row bytes of its ggml
    /// type times the product of `ne[1..]`.
    pub fn weight_bytes(&self) -> &[usize] {
        &self.weight_bytes
    }
}

/// A JIT module for the host ISA with the math and quant host functions registered.
fn new_module(host: &HostSymbols) -> Result<JITModule, LowerError> {
    let isa_err = |e: &dyn std::fmt::Display| LowerError::Isa(e.to_string());
    let mut flags = settings::builder();
    for (k, v) in [
        ("opt_level", "speed"),
        ("is_pic", "false"),
        ("use_colocated_libcalls", "false"),
        // Row buffers of mat-vec kernels live on the stack (up to `lower::ROW_BUF_MAX` f32).
        ("enable_probestack", "true"),
        ("probestack_strategy", "inline"),
    ] {
        flags.set(k, v).map_err(|e| isa_err(&e))?;
    }
    let isa = cranelift_native::builder()
        .map_err(|e| isa_err(&e))?
        .finish(settings::Flags::new(flags))
        .map_err(|e| isa_err(&e))?;
    if isa.pointer_bits() != 64 {
        return Err(LowerError::Isa(format!(
            "{}-bit pointers; the oracle's argument block assumes 64",
            isa.pointer_bits()
        )));
    }
    let mut jb = JITBuilder::with_isa(isa, default_libcall_names());
    for (name, addr) in host::math_symbols() {
        jb.symbol(name, addr);
    }
    for (ty, k) in host.iter() {
        jb.symbol(host::dot_symbol(ty), k.dot as *const u8);
        jb.symbol(host::dequant_symbol(ty), k.dequant as *const u8);
    }
    Ok(JITModule::new(jb))
}

/// Declares every host function generated code may call.
fn declare_imports(
    module: &mut JITModule,
    host: &HostSymbols,
) -> Result<HashMap<String, FuncId>, LowerError> {
    let mut imports = HashMap::new();
    let mut unary = module.make_signature();
    unary.params.push(AbiParam::new(F32));
    unary.returns.push(AbiParam::new(F32));
    let mut dot = module.make_signature();
    dot.params.extend([AbiParam::new(I64); 3]);
    dot.returns.push(AbiParam::new(F32));
    let mut dequant = module.make_signature();
    dequant.params.extend([AbiParam::new(I64); 3]);

    let mut decls: Vec<(String, &cranelift_codegen::ir::Signature)> = host::math_symbols()
        .iter()
        .map(|(n, _)| (n.to_string(), &unary))
        .collect();
    for (ty, _) in host.iter() {
        decls.push((host::dot_symbol(ty), &dot));
        decls.push((host::dequant_symbol(ty), &dequant));
    }
    for (name, sig) in decls {
        let id = module
            .declare_function(&name, Linkage::Import, sig)
            .map_err(|e| LowerError::Isa(format!("declaring host function {name}: {e}")))?;
        imports.insert(name, id);
    }
    Ok(imports)
}
