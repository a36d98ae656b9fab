//! `aubier-dsl`: the proc-macro language the model is described in (ARCHITECTURE.md § dsl).
