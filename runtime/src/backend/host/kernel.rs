//! The contract between the host executor and a host backend's kernels: how a step is bound
//! ([`HostKernel`], [`HostBinding`]), what a kernel of the backend's own implements
//! ([`StepKernel`]) and what it is given ([`StepIo`], [`WeightRows`]).

use super::memory::DenseCopies;
use crate::backend::ExecError;
use aubier_compiler::plan::{Operand, Plan, Step};
use aubier_kernels_gen::cpu::StepArgs;

/// A host backend's kernel of its own for one step, run by the executor in place of the step's
/// cranelift kernels.
pub(crate) trait StepKernel: std::fmt::Debug + Clone + Send + Sync + 'static {
    /// Buffers the kernels keep between steps (one set per run).
    type Buffers: std::fmt::Debug + Default + Send;

    /// Runs the step of `io`.
    ///
    /// Errors: [`ExecError`] when an operand is not what the kernel was bound for, or an index
    /// operand is out of range.
    fn run(&self, io: &StepIo<'_, '_>, buf: &mut Self::Buffers) -> Result<(), ExecError>;

    /// Whether it reads the step's experts as rows ([`StepIo::expert_slices`]).
    fn reads_expert_slices(&self) -> bool;

    /// The kernel's name, for times and reports (`q8_mat_mul`, …).
    fn name(&self) -> &'static str;
}

/// No kernel: the oracle's binding, every step on cranelift.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NoKernel {}

impl StepKernel for NoKernel {
    type Buffers = ();

    fn run(&self, _: &StepIo<'_, '_>, _: &mut ()) -> Result<(), ExecError> {
        match *self {}
    }

    fn reads_expert_slices(&self) -> bool {
        match *self {}
    }

    fn name(&self) -> &'static str {
        match *self {}
    }
}

/// How the executor runs one step.
#[derive(Clone, Debug)]
pub(crate) enum HostKernel<K> {
    /// The step's cranelift kernels.
    Cranelift,
    /// A kernel of the backend's own.
    Own(K),
}

/// What a host backend's [`super::Backend::bind`] gives its load: the kernel of every step.
#[derive(Clone, Debug)]
pub(crate) struct HostBinding<K> {
    /// Per plan step, in order.
    pub kernels: Vec<HostKernel<K>>,
}

/// A weight's bytes as a kernel reads them: the file's view or a copy, in the file's layout or
/// in the backend's own (the `cpu` backend's interleaved rows).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WeightRows<'a> {
    pub bytes: &'a [u8],
    /// In the backend's own layout ([`CopyLayout`]); else the file's.
    pub interleaved: bool,
}

/// What a kernel of one step reads and writes: the step's bound operand and output addresses
/// (`args`, sized by the executor for `(T, S)`), the plan, the weights, the backend's copies of
/// dense weights and the expert rows the executor resolved.
pub(crate) struct StepIo<'a, 'w> {
    pub plan: &'a Plan,
    pub index: usize,
    pub step: &'a Step,
    pub args: &'a StepArgs,
    /// Tokens this step runs for (1 for the output head of a last-position-only run).
    pub t: usize,
    /// Keys.
    pub s: usize,
    pub weights: &'a [&'w [u8]],
    /// The backend's copies of dense weights.
    pub copies: &'a DenseCopies,
    /// Per stacked expert tensor of the step, each expert's rows (slot copy or file slice).
    pub expert_slices: &'a [Vec<WeightRows<'w>>],
}

impl StepIo<'_, '_> {
    /// Elements of the step's output at these extents.
    pub fn out_numel(&self) -> usize {
        self.plan.values[self.step.out].shape.numel(self.t, self.s)
    }

    /// Elements of value operand `i`.
    ///
    /// Errors: [`ExecError::Value`] when operand `i` is not a value.
    pub fn arg_numel(&self, i: usize) -> Result<usize, ExecError> {
        match self.step.args.get(i) {
            Some(&Operand::Value(v)) => Ok(self.plan.values[v].shape.numel(self.t, self.s)),
            _ => Err(ExecError::Value {
                value: usize::MAX,
                name: format!("operand {i} of step {}", self.index),
                detail: "expected a value".into(),
            }),
        }
    }

    /// The weight of operand `i`.
    ///
    /// Errors: [`ExecError::Value`] when operand `i` is not a weight.
    pub fn weight(&self, i: usize) -> Result<usize, ExecError> {
        match self.step.args.get(i) {
            Some(&Operand::Weight(w)) => Ok(w),
            _ => Err(ExecError::Value {
                value: usize::MAX,
                name: format!("operand {i} of step {}", self.index),
                detail: "expected a weight".into(),
            }),
        }
    }
}
