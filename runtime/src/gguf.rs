//! GGUF v2/v3 reader (in progress).
