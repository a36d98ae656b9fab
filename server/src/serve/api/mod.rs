//! The HTTP API's wire types: every request body the server reads ([`request`]) and every
//! response body it writes ([`response`]); the Responses API's both ways ([`responses`]), as Rust types that serde reads and writes with and
//! that schemars turns into JSON Schema (draft 2020-12, OpenAPI 3.1's dialect). `/openapi.json`
//! (`super::openapi`) is generated from them, so the document describes what the code parses
//! and writes.
//!
//! Contract: request objects deny unknown fields (a 400 naming the field); `null` is an absent
//! optional field; integers follow JSON Schema (`2.0` is 2); parameters recognised but not
//! implemented are [`scalar::Refused`] fields, accepted only at their default. Checks between
//! values, and those that depend on the engine's f32 or the served model, are
//! `super::params`'s; the schemas state them where JSON Schema can.

pub mod request;
pub mod response;
pub mod responses;
pub mod scalar;
