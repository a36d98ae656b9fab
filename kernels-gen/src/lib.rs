//! `aubier-kernels-gen`: turns plan steps into code and nothing else (ARCHITECTURE.md § kernels-gen).
