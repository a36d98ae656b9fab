//! Host functions that generated CPU code calls: the per-ggml-type quant kernels the runtime
//! supplies ([`HostSymbols`]), and the f32 transcendental functions cranelift has no instruction
//! for (defined here, so the lowering never depends on the runtime).
//!
//! Every host function follows the platform C calling convention. The generated code passes
//! pointers as 64-bit integers and element counts as `usize`.

/// Dot of one weight row with f32 activations, as `aubier_runtime::gguf::quant::DotFn`:
/// `Σ_i dequant(row)_i · x_i` over `n` elements, in the quant module's fixed reduction order.
///
/// # Safety
/// `n` is a multiple of the type's block size; `row` points to `n / block_elems · block_bytes`
/// readable bytes; `x` points to `n` readable, 4-byte-aligned f32.
pub type HostDotFn = unsafe extern "C" fn(row: *const u8, x: *const f32, n: usize) -> f32;

/// Dequantization of one weight row to `n` f32, as `aubier_runtime::gguf::quant::DequantFn`.
///
/// # Safety
/// As [`HostDotFn`], with `y` pointing to `n` writable, 4-byte-aligned f32 not overlapping `row`.
pub type HostDequantFn = unsafe extern "C" fn(row: *const u8, y: *mut f32, n: usize);

/// The kernels of one ggml type: its block geometry and its dot and dequantize functions
/// (ggml `type_traits`: `blck_size`, `type_size`; llama.cpp `ggml/src/ggml.c`).
#[derive(Clone, Copy, Debug)]
pub struct QuantKernels {
    /// Elements per block (`QK`: 256 for K and IQ types, 32 for Q4_0 …, 1 for F16).
    pub block_elems: usize,
    /// Bytes per block (84 for Q2_K, 66 for IQ2_XXS, …).
    pub block_bytes: usize,
    /// Row dot with f32 activations.
    pub dot: HostDotFn,
    /// Row dequantization to f32.
    pub dequant: HostDequantFn,
}

impl QuantKernels {
    /// Bytes of one row of `n` elements, or `None` when `n` is not a whole number of blocks (or
    /// the size overflows `usize`).
    pub fn row_bytes(&self, n: usize) -> Option<usize> {
        if self.block_elems == 0 || !n.is_multiple_of(self.block_elems) {
            return None;
        }
        (n / self.block_elems).checked_mul(self.block_bytes)
    }
}

/// The host functions a [`crate::cpu::CpuProgram`] may call, keyed by ggml type name as gguf-py
/// spells it (`Q2_K`, `IQ2_XXS`, …; the same string as `WeightRef::ggml_type`). `F32` weights
/// never need an entry: their dots and copies are generated inline.
#[derive(Clone, Debug, Default)]
pub struct HostSymbols {
    quant: Vec<(String, QuantKernels)>,
}

impl HostSymbols {
    /// An empty table: only `F32` weights can be lowered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) the kernels of ggml type `ggml_type`.
    pub fn insert(&mut self, ggml_type: &str, kernels: QuantKernels) {
        match self.quant.iter_mut().find(|(name, _)| name == ggml_type) {
            Some(slot) => slot.1 = kernels,
            None => self.quant.push((ggml_type.to_string(), kernels)),
        }
    }

    /// Builder form of [`Self::insert`].
    pub fn with(mut self, ggml_type: &str, kernels: QuantKernels) -> Self {
        self.insert(ggml_type, kernels);
        self
    }

    /// The kernels of `ggml_type`, if registered.
    pub fn get(&self, ggml_type: &str) -> Option<&QuantKernels> {
        self.quant
            .iter()
            .find(|(name, _)| name == ggml_type)
            .map(|(_, k)| k)
    }

    /// Every registered type with its kernels, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &QuantKernels)> {
        self.quant.iter().map(|(n, k)| (n.as_str(), k))
    }
}

/// Symbol name under which the dot of `ggml_type` is imported by generated code.
pub(crate) fn dot_symbol(ggml_type: &str) -> String {
    format!("aubier_dot_{ggml_type}")
}

/// Symbol name under which the dequantization of `ggml_type` is imported by generated code.
pub(crate) fn dequant_symbol(ggml_type: &str) -> String {
    format!("aubier_dequant_{ggml_type}")
}

/// The unary f32 math functions generated code imports (name, address). `exp` is
/// [`super::expf::expf`] (the same bits on every platform, and a vector version in the runtime's
/// fast path); cos, sin and ln are the Rust standard library's f32 functions (the platform libm),
/// like PyTorch's scalar CPU path.
pub(crate) fn math_symbols() -> [(&'static str, *const u8); 4] {
    [
        (MATH_EXP, aubier_expf as *const u8),
        (MATH_COS, aubier_cosf as *const u8),
        (MATH_SIN, aubier_sinf as *const u8),
        (MATH_LN, aubier_logf as *const u8),
    ]
}

/// Imported name of `e^x`.
pub(crate) const MATH_EXP: &str = "aubier_expf";
/// Imported name of `cos x`.
pub(crate) const MATH_COS: &str = "aubier_cosf";
/// Imported name of `sin x`.
pub(crate) const MATH_SIN: &str = "aubier_sinf";
/// Imported name of `ln x`.
pub(crate) const MATH_LN: &str = "aubier_logf";

extern "C" fn aubier_expf(x: f32) -> f32 {
    super::expf::expf(x)
}

extern "C" fn aubier_cosf(x: f32) -> f32 {
    x.cos()
}

extern "C" fn aubier_sinf(x: f32) -> f32 {
    x.sin()
}

extern "C" fn aubier_logf(x: f32) -> f32 {
    x.ln()
}
