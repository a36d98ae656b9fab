//! ggml quant blocks (in progress).
