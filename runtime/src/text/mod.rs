//! Text in and out of the model: the tekken [`tokenizer`] (text ↔ token ids, from the GGUF's
//! `tokenizer.ggml.*` keys), the [`chat`] template (an OpenAI chat request → the v15 prompt, as
//! text or ids), the [`reasoning`] splitter (generated text → `reasoning_content` and
//! `content`) and the [`grammar`] constraints (JSON content, tool calls → per-step token masks).

pub mod chat;
pub mod grammar;
pub mod reasoning;
pub mod tokenizer;
