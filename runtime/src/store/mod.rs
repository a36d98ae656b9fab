//! The split expert store of the CPU backend (ARCHITECTURE.md § runtime).
//!
//! * [`expert_store`] — fast-store copies (owned, `mlock`ed) plus the host alias (the mapped file),
//!   driven by a [`crate::placement::policy::Policy`] per layer in the decode loop, with the served
//!   fraction per request and `--reset exact|none`. Which experts are resident is decided by the
//!   pure algorithms of [`crate::placement`]; this folder holds only the memory that follows them.

pub mod expert_store;
