//! The OpenAI-shaped request types ([`ChatRequest`] and its parts) and the accepted
//! `reasoning_effort` values, in a file of their own: the validator reads them without importing
//! the parent module.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// The accepted `reasoning_effort` values (the v15 `model_settings_builder`); absent means
/// `"none"`.
pub const REASONING_EFFORTS: [&str; 2] = ["none", "high"];

/// An OpenAI Chat Completions request, reduced to the fields that shape the prompt.
///
/// Other request fields (`model`, `stream`, sampling …) are ignored by this type, so the server
/// can deserialise the same body into it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ChatRequest {
    /// The conversation, oldest first.
    pub messages: Vec<ChatMessage>,
    /// OpenAI function tools (`[{"type": "function", "function": {...}}]`), or `None`.
    #[serde(default)]
    pub tools: Option<Json>,
    /// `"none"` or `"high"`; `None` means `"none"`. Rendered as `[MODEL_SETTINGS]`.
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// Continue the final assistant message instead of closing it (vLLM/HF name; mistral-common's
    /// `prefix`). The prompt then ends with that message's text.
    #[serde(default)]
    pub continue_final_message: bool,
}

/// The author of a message.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions; rendered `[SYSTEM_PROMPT]…[/SYSTEM_PROMPT]` where it occurs.
    System,
    /// OpenAI's newer name for `system`; treated as `system`.
    Developer,
    /// A user turn: `[INST]…[/INST]`.
    User,
    /// A model turn: text, past reasoning and tool calls, closed by `</s>`.
    Assistant,
    /// A tool result: `[TOOL_RESULTS]…[/TOOL_RESULTS]`.
    Tool,
}

impl Role {
    /// Every role, in declaration order.
    pub const ALL: [Role; 5] = [
        Role::System,
        Role::Developer,
        Role::User,
        Role::Assistant,
        Role::Tool,
    ];

    /// The role's name in a request (`"user"`).
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message of [`ChatRequest::messages`].
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// A string or a list of content chunks; may be `None` for an assistant tool call.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Past reasoning of an assistant turn (vLLM/OpenRouter field; `reasoning` is accepted too),
    /// rendered as `[THINK]…[/THINK]` before the text.
    #[serde(default, alias = "reasoning")]
    pub reasoning_content: Option<String>,
    /// Tool calls of an assistant turn.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// Optional author name (ignored by the v15 format).
    #[serde(default)]
    pub name: Option<String>,
}

/// Message content: a plain string or a list of chunks.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed chunks, concatenated in order.
    Chunks(Vec<ContentChunk>),
}

/// One content chunk (`{"type": "text", "text": …}` or `{"type": "thinking", "thinking": …}`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentChunk {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// Reasoning of an assistant turn (mistral-common `ThinkChunk`).
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Whether `[/THINK]` follows (default true).
        #[serde(default = "default_true")]
        closed: bool,
    },
    /// Any other chunk type (images, audio …): rejected when rendering, since this engine is
    /// text-only.
    #[serde(other)]
    Unsupported,
}

fn default_true() -> bool {
    true
}

/// An OpenAI tool call of an assistant message.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct ToolCall {
    /// The call id that the `tool` message's `tool_call_id` refers to (required).
    #[serde(default)]
    pub id: Option<String>,
    /// `"function"`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The called function.
    pub function: FunctionCall,
}

/// The function part of a [`ToolCall`].
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct FunctionCall {
    /// Function name, `^[a-zA-Z0-9_-]{1,64}$`.
    pub name: String,
    /// The arguments: a JSON string (OpenAI) or a JSON object; absent/empty means `{}`.
    #[serde(default)]
    pub arguments: Json,
}
