//! What long work reports as it goes (a model's load: [`crate::engine::Model::load_observed`]),
//! for a display the caller renders (the server's bar on a terminal, a line per step with its
//! time otherwise): named steps in order, each counted in bytes, in items, or not at all.

/// What a step of long work counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// Nothing: the step's time alone.
    Time,
    /// Bytes, this many in all.
    Bytes(u64),
    /// Items, this many in all, named in the plural (`shaders`).
    Items(u64, &'static str),
}

/// A display of long work.
pub trait Progress {
    /// A step starts, ending the one before: `what` it does and what it counts.
    fn step(&mut self, what: &str, count: Count);

    /// `n` more of the current step's count are done.
    fn advance(&mut self, n: u64);
}

/// No display.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl Progress for Quiet {
    fn step(&mut self, _: &str, _: Count) {}

    fn advance(&mut self, _: u64) {}
}
