//! [`Segment`], the piece of a rendered prompt both renderers produce, in a file of its own so
//! that they name it without importing the parent module.

/// A rendered prompt piece.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Segment {
    /// A control token, by its text (`"[INST]"`).
    Control(String),
    /// Plain text, encoded without special-token parsing.
    Text(String),
}
