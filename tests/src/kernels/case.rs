//! What a case hands both its executor and the bound it is held to: the executor's division and
//! square-root accuracy ([`Ops`]) and the step with its operands ([`StepIn`]). They sit apart
//! from `exec.rs` so that `bounds.rs`, which `exec.rs` uses, does not import it back.

use super::PlanB;

/// The accuracy of an executor's f32 division and square root, in ulps of the exact result.
#[derive(Clone, Copy, Debug)]
pub struct Ops {
    /// Largest error of `a / b`.
    pub div_ulp: f64,
    /// Largest error of `sqrt(a)`.
    pub sqrt_ulp: f64,
}

impl Ops {
    /// IEEE 754: both correctly rounded (half an ulp), as on the CPU.
    pub const CORRECTLY_ROUNDED: Ops = Ops {
        div_ulp: 0.5,
        sqrt_ulp: 0.5,
    };

    /// The relative error of one division beyond a correctly rounded one, in units of
    /// `u = 2⁻²⁴` (an ulp of `x` is at most `2u·|x|`, so `n` ulps are `2n·u` relative; a correctly
    /// rounded one is `u`).
    pub fn div_excess(&self) -> f64 {
        2.0 * self.div_ulp - 1.0
    }

    /// [`Ops::div_excess`] of the square root.
    pub fn sqrt_excess(&self) -> f64 {
        2.0 * self.sqrt_ulp - 1.0
    }

    /// Whether a division gives the CPU's bits (the same correctly rounded operation).
    pub fn exact_div(&self) -> bool {
        self.div_ulp <= 0.5
    }
}

/// Step `i` of `pb`'s plan at `T = t`, `S = s`, with every value's bits (`vals`, by id) and the
/// latent cache as it is before the step.
#[derive(Clone, Copy)]
pub struct StepIn<'a> {
    /// The plan.
    pub pb: &'a PlanB,
    /// The step.
    pub i: usize,
    /// Every value's bits.
    pub vals: &'a [Vec<u32>],
    /// The latent cache before the step.
    pub cache: &'a [f32],
    /// Tokens.
    pub t: usize,
    /// Keys.
    pub s: usize,
}
