//! Expert placement for the split expert store (ARCHITECTURE.md § runtime): the policies that
//! decide which MoE experts of each layer live in the fast store, the routing-trace format, and the
//! offline replay that scores policies by their served fraction.
//!
//! * [`expert_store`] — the split expert store of the CPU backend: fast-store copies (owned,
//!   `mlock`ed) plus the host alias (the mapped file), driven by a policy per layer in the decode
//!   loop, with the served fraction per request and `--reset exact|none`.
//! * [`policy`] — the [`policy::Policy`] trait a store drives per routed expert, and 2Q, LRU, LFU,
//!   static and Belady's MIN (with bypass, the exact optimum of the cache model).
//! * [`trace`] — routing traces as JSON lines: reader (with line/field errors) and writer.
//! * [`hotset`] — the `--resident-set hotset.json` seed membership.
//! * [`replay`] — a trace through a policy, one instance per layer: the served fraction.
//! * [`synthetic`] — traces with a Zipf-like skew and a drifting hot set, for benchmarks.

pub mod expert_store;
pub mod hotset;
pub mod policy;
pub mod replay;
pub mod synthetic;
pub mod trace;
