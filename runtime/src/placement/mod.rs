//! Expert placement as pure algorithms (ARCHITECTURE.md § runtime): which MoE experts of each
//! layer live in the fast store. Nothing here touches memory or a model; the split expert store
//! ([`crate::store::expert_store`]) drives these policies and moves bytes to follow them.
//!
//! * [`policy`] — the [`policy::Policy`] trait (one routed expert access at a time; the resident
//!   set it answers; prefetches), and 2Q, LRU, LFU, static and Belady's MIN (with bypass, the exact optimum of
//!   the cache model).
//! * [`arc`], [`lrfu`], [`lecar`] — comparison policies, one paper each: ARC, LRFU and LeCaR.
//! * [`trace`] — routing traces as JSON lines: reader (with line/field errors) and writer.
//! * [`hotset`] — the `--resident-set hotset.json` seed membership.
//! * [`predict`] — the next layer's experts predicted from routing history (cross-layer
//!   co-occurrence), for prefetch.
//! * [`replay`] — a trace through a policy, one instance per layer, token by token, with or
//!   without prefetch: the served fraction and the experts loaded.
//! * [`synthetic`] — generated traces (skew, drift, locality, cross-layer correlation) and the
//!   presets calibrated to real routing.
//! * [`stats`] — the statistics of real routing (ROUTING.md) measured on any trace.

pub mod arc;
pub mod hotset;
pub mod lecar;
pub mod lrfu;
pub mod policy;
pub mod predict;
pub mod replay;
pub mod stats;
pub mod synthetic;
pub mod trace;

#[cfg(test)]
mod calibration_tests;
