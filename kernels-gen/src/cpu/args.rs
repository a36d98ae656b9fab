//! The argument block of a generated kernel ([`StepArgs`]) and its operand capacity, in a file of
//! their own so that the emitter reads the block's field offsets without importing the parent.

/// Most operands any op takes (`moe_ffn` with split gate/up: h, ids, weights, gate, up, down).
pub const MAX_ARGS: usize = 6;

/// The argument block of one kernel call (`#[repr(C)]`, read by generated code at fixed offsets).
///
/// Operand `i` of the step is at `args[i]`: a value's first element (f32 or i32, row-major, as laid
/// out by its shape at this `T`, `S`), or a weight's first byte (raw GGUF tensor data, ggml `ne`
/// order) — except the operands listed in [`CompiledStep::expert_tables`], which are the address
/// of a per-expert address table (see [`ExpertTable`]). Unused entries are null.
///
/// [`CompiledStep::expert_tables`]: super::CompiledStep::expert_tables
/// [`ExpertTable`]: super::ExpertTable
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StepArgs {
    /// Operand addresses, in the op's operand order.
    pub args: [*const u8; MAX_ARGS],
    /// The output value's first element (for `cache_write`: row 0 of the layer's latent cache).
    pub out: *mut u8,
    /// The step's f32 scratch ([`CompiledStep::scratch`] elements), or null when it needs none.
    ///
    /// [`CompiledStep::scratch`]: super::CompiledStep::scratch
    pub scratch: *mut f32,
    /// `T`: tokens in this step.
    pub t: usize,
    /// `S`: keys in the latent cache after this step's write.
    pub s: usize,
    /// First work item of this call.
    pub begin: usize,
    /// One past the last work item of this call.
    pub end: usize,
}

impl StepArgs {
    /// A block with every pointer null, for `T = t`, `S = s` and the work range `begin..end`.
    pub fn new(t: usize, s: usize, begin: usize, end: usize) -> Self {
        Self {
            args: [std::ptr::null(); MAX_ARGS],
            out: std::ptr::null_mut(),
            scratch: std::ptr::null_mut(),
            t,
            s,
            begin,
            end,
        }
    }
}
