//! Chat requests → the Mistral Small 4 (tekken v15) prompt: text and token ids.
//!
//! Algorithm (mistral-common 1.13 `ChatCompletionRequest.from_openai` → `MistralRequestValidatorV15`
//! (serving mode) → `InstructRequestNormalizerV15` → `InstructTokenizerV15.encode_instruct`):
//! 1. **Validate** the OpenAI-shaped request: at least one message; `developer` is `system`; role
//!    order (system→user/assistant/system, user→assistant/system/user,
//!    assistant→assistant/user/tool, tool→assistant/tool/user); the first message is user or system
//!    (the model's Jinja template requires it); the last is user or tool, or assistant with
//!    `continue_final_message`; assistant messages have content or tool calls; tool-call names match
//!    `^[a-zA-Z0-9_-]{1,64}$`; every tool result answers a distinct call of the preceding
//!    assistant turn and every call is answered; `reasoning_effort` is `none` or `high`.
//! 2. **Normalise**: consecutive user (or assistant) messages merge, texts joined with `"\n\n"`
//!    (text chunks of one message join with `""`); `reasoning_content` becomes a leading thinking
//!    chunk; assistant string content loses trailing spaces (`rstrip(" ")`); tool-call arguments
//!    are parsed and re-serialised as Python `json.dumps(..., ensure_ascii=False)` (", " and ": "
//!    separators, key order kept); tool results are sorted into call order; tools become
//!    `{"type": "function", "function": {"name", "description", "parameters"}}`.
//! 3. **Render**, either with the GGUF's `tokenizer.chat_template` (minijinja with HF's
//!    `trim_blocks`/`lstrip_blocks`, `raise_exception`, a Python-style `tojson`, pycompat methods)
//!    or, for a file without one, the built-in v15 renderer. Both give
//!    `<s>[SYSTEM_PROMPT]…[/SYSTEM_PROMPT][AVAILABLE_TOOLS]…[/AVAILABLE_TOOLS][MODEL_SETTINGS]…
//!    [/MODEL_SETTINGS][INST]…[/INST]…</s>…` (MODEL.md §5). With `continue_final_message` the final
//!    assistant turn is left open (its closing `</s>` removed).
//! 4. **Ids**: control-token strings the template writes become control ids; the text between them
//!    is encoded as plain text. Content can never become a control id: before rendering, the first
//!    character of every control-token lookalike in the request is swapped for a private-use
//!    sentinel that occurs nowhere in the request or template, and swapped back after splitting,
//!    so `"[INST]"` typed by a user stays text (as in mistral-common).

use std::collections::HashSet;

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value as Json};

use crate::gguf::{GgufFile, MetaValue};
use crate::tokenizer::{Tokenizer, TokenizerError};

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
    fn name(self) -> &'static str {
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

/// Errors of chat rendering. Each names the message index (0-based) or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// `messages` is empty.
    #[error("the conversation must have at least one message")]
    NoMessages,
    /// `reasoning_effort` is not `none`/`high`.
    #[error("reasoning_effort must be one of \"none\", \"high\"; got {0:?}")]
    ReasoningEffort(String),
    /// The first message is neither user nor system.
    #[error("the conversation must start with a user or system message, got {0}")]
    FirstRole(&'static str),
    /// Two roles that may not follow each other.
    #[error("messages[{index}]: unexpected role '{role}' after role '{previous}'")]
    RoleOrder {
        /// Index of the offending message.
        index: usize,
        /// Its role.
        role: &'static str,
        /// The role before it.
        previous: &'static str,
    },
    /// The last message cannot be answered.
    #[error(
        "the last message must be user or tool (or assistant with continue_final_message), got {0}"
    )]
    LastRole(&'static str),
    /// `continue_final_message` without a final assistant message.
    #[error("continue_final_message needs a final assistant message, got {0}")]
    ContinueNotAssistant(&'static str),
    /// A message lacks the content its role requires.
    #[error("messages[{index}] ({role}): {reason}")]
    Content {
        /// Index of the message.
        index: usize,
        /// Its role.
        role: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A tool call or tool result is malformed or unmatched.
    #[error("messages[{index}]: {reason}")]
    ToolCalls {
        /// Index of the message.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The `tools` field is malformed.
    #[error("tools: {0}")]
    Tools(String),
    /// The GGUF holds `tokenizer.chat_template` but not as a string, or lacks the token list.
    #[error("GGUF metadata key `{key}` must be {expected}")]
    Gguf {
        /// The metadata key.
        key: &'static str,
        /// What it should hold.
        expected: &'static str,
    },
    /// The chat template does not compile.
    #[error("chat template does not compile: {0}")]
    Compile(#[source] minijinja::Error),
    /// Rendering failed, including the template's own `raise_exception`.
    #[error("chat template rendering failed: {0}")]
    Render(#[source] minijinja::Error),
    /// With `continue_final_message`, the rendered prompt did not end with the EOS text.
    #[error("continue_final_message: the rendered prompt does not end with the EOS text {0:?}")]
    OpenTurn(String),
    /// The request uses every supplementary private-use character, so control-token lookalikes
    /// in it cannot be kept apart from the template's control tokens.
    #[error("the request uses every supplementary private-use character; cannot isolate control-token lookalikes")]
    NoSentinel,
    /// The template wrote a control-token string the tokenizer does not know.
    #[error("control token {0:?} is not in the tokenizer's vocabulary")]
    UnknownControl(String),
    /// Encoding a text piece failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

// ---------------------------------------------------------------------------------------------
// Python `json.dumps(x, ensure_ascii=False)` (CPython `Lib/json/encoder.py`).

/// Writes `value` as Python's `json.dumps(value, ensure_ascii=False)` would: `", "` and `": "`
/// separators, keys in stored order, non-ASCII kept, floats as Python `repr`.
pub fn python_json_dumps(value: &Json) -> String {
    let mut out = String::new();
    write_py_json(value, &mut out);
    out
}

fn write_py_json(value: &Json, out: &mut String) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else if let Some(f) = n.as_f64() {
                out.push_str(&python_float_repr(f));
            }
        }
        Json::String(s) => write_py_str(s, out),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_json(item, out);
            }
            out.push(']');
        }
        Json::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_str(key, out);
                out.push_str(": ");
                write_py_json(item, out);
            }
            out.push('}');
        }
    }
}

fn write_py_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest round-trip digits, positional for decimal exponents in
/// `-4..16`, otherwise `d.ddde+XX` (at least two exponent digits); `NaN`/`Infinity` as `json`
/// writes them.
fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{x:e}");
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return sci;
    };
    let Ok(exp) = exp.parse::<i32>() else {
        return sci;
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i32;
    let body = if (-4..16).contains(&exp) {
        if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else if exp + 1 >= n {
            format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
        } else {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            format!("{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let mantissa = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{exp_sign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

/// mistral-common's tool-call argument normalisation: empty → `{}`; valid JSON → re-serialised
/// Python-style; anything else → that text as a JSON string literal (`json.dumps(text)`).
fn normalize_arguments(arguments: &Json) -> String {
    match arguments {
        Json::Null => "{}".into(),
        Json::String(s) if s.is_empty() => "{}".into(),
        Json::String(s) => match serde_json::from_str::<Json>(s) {
            Ok(parsed) => python_json_dumps(&parsed),
            Err(_) => python_json_dumps(arguments),
        },
        other => python_json_dumps(other),
    }
}

// ---------------------------------------------------------------------------------------------
// Validation and normalisation.

/// A piece of assistant content after normalisation.
#[derive(Clone, Debug, PartialEq)]
enum Chunk {
    Text(String),
    Thinking { text: String, closed: bool },
}

/// A normalised turn.
#[derive(Clone, Debug, PartialEq)]
enum Turn {
    System(String),
    User(String),
    Assistant {
        /// The aggregated content: `Str` when only text was given (then trailing spaces are
        /// stripped), chunks otherwise.
        content: AssistantContent,
        /// `(id, name, normalised arguments)`.
        tool_calls: Vec<(String, String, String)>,
    },
    Tool {
        call_id: String,
        content: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
enum AssistantContent {
    Str(String),
    Chunks(Vec<Chunk>),
}

/// A validated, normalised request.
#[derive(Clone, Debug)]
struct Conversation {
    turns: Vec<Turn>,
    /// Canonical tools list, `None` when there are none.
    tools: Option<Json>,
    reasoning_effort: &'static str,
    /// The final assistant turn stays open.
    prefix: bool,
}

fn effective_role(role: Role) -> Role {
    match role {
        Role::Developer => Role::System,
        other => other,
    }
}

fn valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The message's content as chunks, with mistral-common's chunk rules for its role.
fn content_chunks(index: usize, message: &ChatMessage) -> Result<Vec<Chunk>, ChatError> {
    let role = effective_role(message.role);
    let err = |reason| ChatError::Content {
        index,
        role: role.name(),
        reason,
    };
    let mut chunks = match &message.content {
        None => Vec::new(),
        Some(MessageContent::Text(text)) => vec![Chunk::Text(text.clone())],
        Some(MessageContent::Chunks(list)) => list
            .iter()
            .map(|chunk| match chunk {
                ContentChunk::Text { text } => Ok(Chunk::Text(text.clone())),
                ContentChunk::Thinking { thinking, closed } if role == Role::Assistant => {
                    Ok(Chunk::Thinking {
                        text: thinking.clone(),
                        closed: *closed,
                    })
                }
                ContentChunk::Thinking { .. } => Err(err(
                    "thinking chunks are only allowed in assistant messages",
                )),
                ContentChunk::Unsupported => Err(err(
                    "only text (and, for assistant, thinking) chunks are supported",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    if let Some(reasoning) = &message.reasoning_content {
        if role != Role::Assistant {
            return Err(err(
                "reasoning_content is only allowed in assistant messages",
            ));
        }
        if chunks.iter().any(|c| matches!(c, Chunk::Thinking { .. })) {
            return Err(err(
                "a message cannot have both thinking chunks and reasoning_content",
            ));
        }
        chunks.insert(
            0,
            Chunk::Thinking {
                text: reasoning.clone(),
                closed: true,
            },
        );
    }
    Ok(chunks)
}

/// mistral-common `_aggregate_content_chunks_impl`: texts of one message join with `""`, texts
/// of different messages with `"\n\n"`, empty texts are skipped; a string when only text remains.
fn aggregate(contents: &[Vec<Chunk>]) -> (bool, Vec<Chunk>) {
    let mut out: Vec<Chunk> = Vec::new();
    let mut text: Option<String> = None;
    let mut only_text = true;
    for chunks in contents {
        let mut new_message = text.is_some();
        for chunk in chunks {
            match chunk {
                Chunk::Text(t) if t.is_empty() => {}
                Chunk::Text(t) => {
                    let buf = text.get_or_insert_with(String::new);
                    if new_message && !buf.is_empty() {
                        buf.push_str("\n\n");
                    }
                    buf.push_str(t);
                    new_message = false;
                }
                thinking => {
                    only_text = false;
                    if let Some(t) = text.take() {
                        out.push(Chunk::Text(t));
                    }
                    out.push(thinking.clone());
                }
            }
        }
    }
    if let Some(t) = text {
        out.push(Chunk::Text(t));
    }
    (only_text, out)
}

fn validate_and_normalize(req: &ChatRequest) -> Result<Conversation, ChatError> {
    let messages = &req.messages;
    let reasoning_effort = match req.reasoning_effort.as_deref() {
        None => REASONING_EFFORTS[0],
        Some(value) => REASONING_EFFORTS
            .iter()
            .find(|e| **e == value)
            .copied()
            .ok_or_else(|| ChatError::ReasoningEffort(value.to_owned()))?,
    };
    let Some(first) = messages.first() else {
        return Err(ChatError::NoMessages);
    };
    let roles: Vec<Role> = messages.iter().map(|m| effective_role(m.role)).collect();
    if !matches!(roles[0], Role::User | Role::System) {
        return Err(ChatError::FirstRole(first.role.name()));
    }
    for (index, pair) in roles.windows(2).enumerate() {
        let (previous, role) = (pair[0], pair[1]);
        let allowed = match previous {
            Role::System | Role::Developer => {
                matches!(role, Role::User | Role::Assistant | Role::System)
            }
            Role::User => matches!(role, Role::Assistant | Role::System | Role::User),
            Role::Assistant => matches!(role, Role::Assistant | Role::User | Role::Tool),
            Role::Tool => matches!(role, Role::Assistant | Role::Tool | Role::User),
        };
        if !allowed {
            return Err(ChatError::RoleOrder {
                index: index + 1,
                role: role.name(),
                previous: previous.name(),
            });
        }
    }
    // A lone system message is accepted (mistral-common checks the last role only when there
    // are two or more messages).
    let last = roles[roles.len() - 1];
    let answerable = match last {
        Role::User | Role::Tool => true,
        Role::System | Role::Developer => roles.len() == 1,
        Role::Assistant => false,
    };
    if req.continue_final_message {
        if last != Role::Assistant {
            return Err(ChatError::ContinueNotAssistant(last.name()));
        }
    } else if !answerable {
        return Err(ChatError::LastRole(last.name()));
    }

    // Per-message content, tool calls and ids.
    let mut chunks = Vec::with_capacity(messages.len());
    let mut calls: Vec<Vec<(String, String, String)>> = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let role = roles[index];
        let content = content_chunks(index, message)?;
        let content_err = |reason| ChatError::Content {
            index,
            role: role.name(),
            reason,
        };
        match role {
            Role::User | Role::System | Role::Developer if message.content.is_none() => {
                return Err(content_err("content is required"));
            }
            Role::Tool if message.content.is_none() => {
                return Err(content_err("content is required"))
            }
            _ => {}
        }
        if role != Role::Assistant && message.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(content_err("only assistant messages may have tool_calls"));
        }
        let mut message_calls = Vec::new();
        for call in message.tool_calls.iter().flatten() {
            let tool_err = |reason: String| ChatError::ToolCalls { index, reason };
            if call.kind.as_deref().is_some_and(|k| k != "function") {
                return Err(tool_err(format!(
                    "tool call type {:?} is not \"function\"",
                    call.kind
                )));
            }
            if !valid_function_name(&call.function.name) {
                return Err(tool_err(format!(
                    "function name {:?} must match ^[a-zA-Z0-9_-]{{1,64}}$",
                    call.function.name
                )));
            }
            let id = match call.id.as_deref() {
                Some(id) if !id.is_empty() && id != "null" => id.to_owned(),
                _ => return Err(tool_err("every tool call needs an id".into())),
            };
            message_calls.push((
                id,
                call.function.name.clone(),
                normalize_arguments(&call.function.arguments),
            ));
        }
        if role == Role::Assistant {
            let has_content = chunks_nonempty(&content);
            if !has_content && message_calls.is_empty() {
                return Err(content_err(
                    "an assistant message needs non-empty content or tool_calls",
                ));
            }
        }
        if role == Role::Tool && message.tool_call_id.as_deref().is_none_or(str::is_empty) {
            return Err(ChatError::ToolCalls {
                index,
                reason: "a tool message needs tool_call_id".into(),
            });
        }
        chunks.push(content);
        calls.push(message_calls);
    }

    // mistral-common `MistralRequestValidatorV13._validate_tool_calls_followed_by_tool_messages`.
    let mut expected: HashSet<&str> = HashSet::new();
    let mut observed: HashSet<&str> = HashSet::new();
    for (index, message) in messages.iter().enumerate().skip(1) {
        match roles[index] {
            Role::Tool => {
                let id = message.tool_call_id.as_deref().unwrap_or_default();
                if !expected.contains(id) {
                    return Err(ChatError::ToolCalls {
                        index,
                        reason: format!("tool result for unknown tool call id {id:?}"),
                    });
                }
                if !observed.insert(id) {
                    return Err(ChatError::ToolCalls {
                        index,
                        reason: format!("duplicate tool result for tool call id {id:?}"),
                    });
                }
            }
            Role::Assistant => {
                if expected.len() != observed.len() {
                    return Err(ChatError::ToolCalls {
                        index,
                        reason: "not every tool call of the previous assistant turn has a result"
                            .into(),
                    });
                }
                expected.clear();
                observed.clear();
                for (id, _, _) in &calls[index] {
                    if !expected.insert(id) {
                        return Err(ChatError::ToolCalls {
                            index,
                            reason: format!("duplicate tool call id {id:?}"),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    if expected.len() != observed.len() {
        return Err(ChatError::ToolCalls {
            index: messages.len() - 1,
            reason: "not every tool call of the last assistant turn has a result".into(),
        });
    }

    // Aggregate runs of same-role messages (user, assistant); system and tool stay separate.
    let mut turns = Vec::new();
    let mut latest_call_ids: Vec<String> = Vec::new();
    let mut i = 0;
    while i < messages.len() {
        let role = roles[i];
        let mut j = i + 1;
        while j < messages.len() && roles[j] == role {
            j += 1;
        }
        match role {
            Role::System | Role::Developer => {
                for content in &chunks[i..j] {
                    let merged = aggregate(std::slice::from_ref(content)).1;
                    turns.push(Turn::System(text_of(&merged)));
                }
            }
            Role::User => {
                turns.push(Turn::User(text_of(&aggregate(&chunks[i..j]).1)));
            }
            Role::Assistant => {
                let (only_text, merged) = aggregate(&chunks[i..j]);
                let content = if only_text {
                    AssistantContent::Str(text_of(&merged))
                } else {
                    AssistantContent::Chunks(merged)
                };
                let tool_calls: Vec<_> = (i..j).flat_map(|k| calls[k].clone()).collect();
                latest_call_ids = tool_calls.iter().map(|(id, _, _)| id.clone()).collect();
                turns.push(Turn::Assistant {
                    content,
                    tool_calls,
                });
            }
            Role::Tool => {
                // mistral-common `InstructRequestNormalizerV13._inplace_sort_tool_messages`.
                let mut results: Vec<(usize, usize, Turn)> = (i..j)
                    .map(|k| {
                        let call_id = messages[k].tool_call_id.clone().unwrap_or_default();
                        let order = latest_call_ids
                            .iter()
                            .position(|id| *id == call_id)
                            .unwrap_or(usize::MAX);
                        let content = text_of(&aggregate(std::slice::from_ref(&chunks[k])).1);
                        (order, k, Turn::Tool { call_id, content })
                    })
                    .collect();
                results.sort_by_key(|(order, k, _)| (*order, *k));
                turns.extend(results.into_iter().map(|(_, _, turn)| turn));
            }
        }
        i = j;
    }

    Ok(Conversation {
        turns,
        tools: canonical_tools(req.tools.as_ref())?,
        reasoning_effort,
        prefix: req.continue_final_message,
    })
}

fn chunks_nonempty(chunks: &[Chunk]) -> bool {
    chunks.iter().any(|c| match c {
        Chunk::Text(t) => !t.is_empty(),
        Chunk::Thinking { .. } => true,
    })
}

/// The text of an all-text aggregate.
fn text_of(chunks: &[Chunk]) -> String {
    chunks
        .iter()
        .map(|c| match c {
            Chunk::Text(t) => t.as_str(),
            Chunk::Thinking { text, .. } => text.as_str(),
        })
        .collect()
}

/// mistral-common `Tool.from_openai`: keep `type`, `function.{name, description, parameters}`
/// (defaults `""` and `{}`), in that order; drop other fields (`strict` …).
fn canonical_tools(tools: Option<&Json>) -> Result<Option<Json>, ChatError> {
    let list = match tools {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::Array(list)) => list,
        Some(_) => return Err(ChatError::Tools("must be an array of tools".into())),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let err = |what: &str| ChatError::Tools(format!("tools[{i}]: {what}"));
        let obj = tool.as_object().ok_or_else(|| err("must be an object"))?;
        if obj.get("type").is_some_and(|t| t != "function") {
            return Err(err("type must be \"function\""));
        }
        let function = obj
            .get("function")
            .and_then(Json::as_object)
            .ok_or_else(|| err("function must be an object"))?;
        let name = function
            .get("name")
            .and_then(Json::as_str)
            .ok_or_else(|| err("function.name must be a string"))?;
        if !valid_function_name(name) {
            return Err(err("function.name must match ^[a-zA-Z0-9_-]{1,64}$"));
        }
        let description = match function.get("description") {
            None | Some(Json::Null) => Json::String(String::new()),
            Some(Json::String(s)) => Json::String(s.clone()),
            Some(_) => return Err(err("function.description must be a string")),
        };
        let parameters = match function.get("parameters") {
            None | Some(Json::Null) => Json::Object(Map::new()),
            Some(Json::Object(p)) => Json::Object(p.clone()),
            Some(_) => return Err(err("function.parameters must be an object")),
        };
        out.push(json!({
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }));
    }
    Ok((!out.is_empty()).then_some(Json::Array(out)))
}

// ---------------------------------------------------------------------------------------------
// Rendering.

/// A rendered prompt piece.
#[derive(Clone, Debug, PartialEq)]
enum Segment {
    /// A control token, by its text (`"[INST]"`).
    Control(String),
    /// Plain text, encoded without special-token parsing.
    Text(String),
}

/// The built-in v15 renderer (mistral-common `InstructTokenizerV15`), as segments.
fn render_builtin(conv: &Conversation) -> Vec<Segment> {
    use Segment::{Control, Text};
    let ctl = |s: &str| Control(s.to_owned());
    let mut out = vec![ctl("<s>")];
    let mut first_user = true;
    let n = conv.turns.len();
    for (i, turn) in conv.turns.iter().enumerate() {
        match turn {
            Turn::System(text) => {
                out.extend([
                    ctl("[SYSTEM_PROMPT]"),
                    Text(text.clone()),
                    ctl("[/SYSTEM_PROMPT]"),
                ]);
            }
            Turn::User(text) => {
                if first_user {
                    first_user = false;
                    if let Some(tools) = &conv.tools {
                        out.extend([
                            ctl("[AVAILABLE_TOOLS]"),
                            Text(python_json_dumps(tools)),
                            ctl("[/AVAILABLE_TOOLS]"),
                        ]);
                    }
                    let settings = json!({ "reasoning_effort": conv.reasoning_effort });
                    out.extend([
                        ctl("[MODEL_SETTINGS]"),
                        Text(python_json_dumps(&settings)),
                        ctl("[/MODEL_SETTINGS]"),
                    ]);
                }
                out.extend([ctl("[INST]"), Text(text.clone()), ctl("[/INST]")]);
            }
            Turn::Assistant {
                content,
                tool_calls,
            } => {
                match content {
                    AssistantContent::Str(text) => {
                        out.push(Text(text.trim_end_matches(' ').to_owned()))
                    }
                    AssistantContent::Chunks(chunks) => {
                        for chunk in chunks {
                            match chunk {
                                Chunk::Text(text) => out.push(Text(text.clone())),
                                Chunk::Thinking { text, closed } => {
                                    out.extend([ctl("[THINK]"), Text(text.clone())]);
                                    if *closed {
                                        out.push(ctl("[/THINK]"));
                                    }
                                }
                            }
                        }
                    }
                }
                for (_, name, arguments) in tool_calls {
                    out.extend([
                        ctl("[TOOL_CALLS]"),
                        Text(name.clone()),
                        ctl("[ARGS]"),
                        Text(arguments.clone()),
                    ]);
                }
                if !(conv.prefix && i + 1 == n) {
                    out.push(ctl("</s>"));
                }
            }
            Turn::Tool { content, .. } => {
                out.extend([
                    ctl("[TOOL_RESULTS]"),
                    Text(content.clone()),
                    ctl("[/TOOL_RESULTS]"),
                ]);
            }
        }
    }
    out
}

/// Control-token texts, matched longest-first.
#[derive(Clone, Debug)]
struct ControlTable {
    texts: HashSet<String>,
    /// Distinct lengths in bytes, longest first.
    lengths: Vec<usize>,
    /// First characters of the texts (`<` and `[` for tekken), sorted.
    firsts: Vec<char>,
}

impl ControlTable {
    fn new(texts: impl IntoIterator<Item = String>) -> ControlTable {
        let texts: HashSet<String> = texts.into_iter().filter(|t| !t.is_empty()).collect();
        let mut lengths: Vec<usize> = texts
            .iter()
            .map(String::len)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        lengths.sort_unstable_by(|a, b| b.cmp(a));
        let mut firsts: Vec<char> = texts
            .iter()
            .filter_map(|t| t.chars().next())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        firsts.sort_unstable();
        ControlTable {
            texts,
            lengths,
            firsts,
        }
    }

    /// Length of the longest control text starting at byte `at` (a char boundary) of `s`.
    fn match_at(&self, s: &str, at: usize) -> Option<usize> {
        let rest = &s[at..];
        let first = rest.chars().next()?;
        if self.firsts.binary_search(&first).is_err() {
            return None;
        }
        self.lengths.iter().copied().find(|&len| {
            rest.len() >= len && rest.is_char_boundary(len) && self.texts.contains(&rest[..len])
        })
    }

    /// Splits `s` into control tokens and text runs.
    fn split(&self, s: &str) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut text_start = 0;
        let mut at = 0;
        while at < s.len() {
            if let Some(len) = self.match_at(s, at) {
                if text_start < at {
                    out.push(Segment::Text(s[text_start..at].to_owned()));
                }
                out.push(Segment::Control(s[at..at + len].to_owned()));
                at += len;
                text_start = at;
            } else {
                at += s[at..].chars().next().map_or(1, char::len_utf8);
            }
        }
        if text_start < s.len() {
            out.push(Segment::Text(s[text_start..].to_owned()));
        }
        out
    }
}

/// Swaps the first character of every control-token lookalike for a private-use sentinel.
struct Escaper<'a> {
    table: &'a ControlTable,
    /// `(original, sentinel)` pairs, one per first character of a control text.
    pairs: Vec<(char, char)>,
}

impl<'a> Escaper<'a> {
    /// Picks sentinels from the supplementary private-use planes (U+F0000.., U+100000..) that
    /// occur nowhere in `haystack` (the template source and every request string).
    ///
    /// Errors: [`ChatError::NoSentinel`] if the request uses every such character.
    fn new(table: &'a ControlTable, haystack: &str) -> Result<Escaper<'a>, ChatError> {
        let used: HashSet<char> = haystack.chars().collect();
        let mut free = (0xF0000u32..=0xFFFFD)
            .chain(0x100000..=0x10FFFD)
            .filter_map(char::from_u32)
            .filter(|c| !used.contains(c));
        let pairs = table
            .firsts
            .iter()
            .map(|&c| free.next().map(|s| (c, s)).ok_or(ChatError::NoSentinel))
            .collect::<Result<_, _>>()?;
        Ok(Escaper { table, pairs })
    }

    fn escape(&self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        for (at, c) in s.char_indices() {
            let sentinel = self
                .table
                .match_at(s, at)
                .and_then(|_| self.pairs.iter().find(|(o, _)| *o == c).map(|(_, s)| *s));
            out.push(sentinel.unwrap_or(c));
        }
        out
    }

    fn unescape(&self, s: &str) -> String {
        s.chars()
            .map(|c| {
                self.pairs
                    .iter()
                    .find(|(_, s)| *s == c)
                    .map_or(c, |(o, _)| *o)
            })
            .collect()
    }

    fn escape_json(&self, value: &Json) -> Json {
        match value {
            Json::String(s) => Json::String(self.escape(s)),
            Json::Array(items) => Json::Array(items.iter().map(|v| self.escape_json(v)).collect()),
            Json::Object(map) => Json::Object(
                map.iter()
                    .map(|(k, v)| (self.escape(k), self.escape_json(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

fn collect_strings(value: &Json, out: &mut String) {
    match value {
        Json::String(s) => out.push_str(s),
        Json::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        Json::Object(map) => map.iter().for_each(|(k, v)| {
            out.push_str(k);
            collect_strings(v, out);
        }),
        _ => {}
    }
}

/// The normalised conversation as the HF-style `messages` list a Jinja template expects.
fn template_messages(conv: &Conversation) -> Json {
    let chunk_json = |c: &Chunk| match c {
        Chunk::Text(t) => json!({"type": "text", "text": t}),
        Chunk::Thinking { text, closed } => {
            json!({"type": "thinking", "thinking": text, "closed": closed})
        }
    };
    let list = conv
        .turns
        .iter()
        .map(|turn| match turn {
            Turn::System(text) => json!({"role": "system", "content": text}),
            Turn::User(text) => json!({"role": "user", "content": text}),
            Turn::Tool { call_id, content } => json!({"role": "tool", "tool_call_id": call_id, "content": content}),
            Turn::Assistant { content, tool_calls } => {
                let content = match content {
                    AssistantContent::Str(s) if s.trim_end_matches(' ').is_empty() => Json::Null,
                    AssistantContent::Str(s) => Json::String(s.trim_end_matches(' ').to_owned()),
                    AssistantContent::Chunks(chunks) => Json::Array(chunks.iter().map(chunk_json).collect()),
                };
                let mut message = json!({"role": "assistant", "content": content});
                if !tool_calls.is_empty() {
                    let calls: Vec<Json> = tool_calls
                        .iter()
                        .map(|(id, name, arguments)| {
                            json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
                        })
                        .collect();
                    message["tool_calls"] = Json::Array(calls);
                }
                message
            }
        })
        .collect();
    Json::Array(list)
}

/// minijinja filter `tojson`: Python `json.dumps(x, ensure_ascii=False)`, as HF's chat-template
/// environment defines it (minijinja's own `tojson` is compact and HTML-escapes).
fn tojson_filter(value: Value) -> Result<Value, minijinja::Error> {
    let json = serde_json::to_value(&value).map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: value is not JSON")
            .with_source(e)
    })?;
    Ok(Value::from_safe_string(python_json_dumps(&json)))
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time formatted with C `strftime` specifiers, as
/// transformers' chat-template environment provides it (Mistral templates use it for the date).
fn strftime_now(format: String) -> Result<Value, minijinja::Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Utc::now().format(&format)).map_err(|_| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(Value::from(out))
}

/// A compiled Jinja chat template and what rendering it needs.
struct JinjaTemplate {
    env: Environment<'static>,
    controls: ControlTable,
    source: String,
    bos: String,
    eos: String,
}

enum Renderer {
    Builtin,
    Jinja(Box<JinjaTemplate>),
}

/// A chat template: the GGUF's Jinja `tokenizer.chat_template`, or the built-in v15 renderer.
pub struct ChatTemplate {
    renderer: Renderer,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.renderer {
            Renderer::Builtin => "builtin v15",
            Renderer::Jinja(_) => "jinja",
        };
        f.debug_struct("ChatTemplate").field("kind", &kind).finish()
    }
}

const TEMPLATE_NAME: &str = "chat_template";

impl ChatTemplate {
    /// The GGUF's `tokenizer.chat_template` if it has one, else [`ChatTemplate::builtin_v15`].
    /// Control-token texts (token types 2 and 3) and the BOS/EOS texts come from the file's
    /// `tokenizer.ggml.*` keys.
    ///
    /// Errors: [`ChatError::Gguf`] for a mistyped key, [`ChatError::Compile`] for a template
    /// minijinja cannot parse.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate, ChatError> {
        let source = match file.get("tokenizer.chat_template") {
            None => return Ok(ChatTemplate::builtin_v15()),
            Some(value) => value.as_str().ok_or(ChatError::Gguf {
                key: "tokenizer.chat_template",
                expected: "a string",
            })?,
        };
        let tokens_err = ChatError::Gguf {
            key: "tokenizer.ggml.tokens",
            expected: "an array of strings",
        };
        let tokens = file
            .get("tokenizer.ggml.tokens")
            .and_then(MetaValue::as_strings)
            .ok_or(tokens_err)?;
        let types_err = || ChatError::Gguf {
            key: "tokenizer.ggml.token_type",
            expected: "an array of integers as long as tokenizer.ggml.tokens",
        };
        let types = file
            .get("tokenizer.ggml.token_type")
            .and_then(MetaValue::as_array)
            .ok_or_else(types_err)?;
        if types.len() != tokens.len() {
            return Err(types_err());
        }
        let mut controls = Vec::new();
        for (text, token_type) in tokens.iter().zip(types.iter()) {
            match token_type.as_i64() {
                Some(2 | 3) => controls.push(text.to_string()),
                Some(_) => {}
                None => return Err(types_err()),
            }
        }
        let token_text = |key: &'static str| -> Result<String, ChatError> {
            let err = ChatError::Gguf {
                key,
                expected: "a token id inside tokenizer.ggml.tokens",
            };
            let id = file.get(key).and_then(MetaValue::as_u64).ok_or(err)?;
            usize::try_from(id)
                .ok()
                .and_then(|i| tokens.get(i))
                .map(|t| t.to_string())
                .ok_or(ChatError::Gguf {
                    key,
                    expected: "a token id inside tokenizer.ggml.tokens",
                })
        };
        let bos = token_text("tokenizer.ggml.bos_token_id")?;
        let eos = token_text("tokenizer.ggml.eos_token_id")?;
        ChatTemplate::from_jinja(source, controls, bos, eos)
    }

    /// A Jinja chat template (HF conventions) with the given control-token texts and BOS/EOS
    /// texts (`"<s>"`, `"</s>"`; passed to the template as `bos_token`/`eos_token`).
    ///
    /// Errors: [`ChatError::Compile`].
    pub fn from_jinja(
        source: &str,
        control_tokens: impl IntoIterator<Item = String>,
        bos: String,
        eos: String,
    ) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(ChatError::Compile)?;
        Ok(ChatTemplate {
            renderer: Renderer::Jinja(Box::new(JinjaTemplate {
                env,
                controls: ControlTable::new(control_tokens),
                source: source.to_owned(),
                bos,
                eos,
            })),
        })
    }

    /// The built-in renderer of the tekken v15 format (MODEL.md §5; mistral-common
    /// `InstructTokenizerV15`), for files without a chat template.
    pub fn builtin_v15() -> ChatTemplate {
        ChatTemplate {
            renderer: Renderer::Builtin,
        }
    }

    /// Whether this is the built-in renderer rather than a Jinja template.
    pub fn is_builtin(&self) -> bool {
        matches!(self.renderer, Renderer::Builtin)
    }

    fn segments(&self, req: &ChatRequest) -> Result<Vec<Segment>, ChatError> {
        let conv = validate_and_normalize(req)?;
        let JinjaTemplate {
            env,
            controls,
            source,
            bos,
            eos,
        } = match &self.renderer {
            Renderer::Builtin => return Ok(render_builtin(&conv)),
            Renderer::Jinja(jinja) => jinja.as_ref(),
        };
        let messages = template_messages(&conv);
        let mut haystack = source.clone();
        collect_strings(&messages, &mut haystack);
        if let Some(tools) = &conv.tools {
            collect_strings(tools, &mut haystack);
        }
        let escaper = Escaper::new(controls, &haystack)?;
        let ctx = minijinja::context! {
            messages => Value::from_serialize(escaper.escape_json(&messages)),
            tools => conv.tools.as_ref().map(|t| Value::from_serialize(escaper.escape_json(t))),
            reasoning_effort => conv.reasoning_effort,
            bos_token => bos,
            eos_token => eos,
            add_generation_prompt => !conv.prefix,
        };
        let template = env.get_template(TEMPLATE_NAME).map_err(ChatError::Render)?;
        let mut rendered = template.render(ctx).map_err(ChatError::Render)?;
        if conv.prefix {
            let trimmed = rendered.trim_end_matches(char::is_whitespace);
            match trimmed.strip_suffix(eos.as_str()) {
                Some(open) => rendered = open.to_owned(),
                None => return Err(ChatError::OpenTurn(eos.clone())),
            }
        }
        Ok(controls
            .split(&rendered)
            .into_iter()
            .map(|seg| match seg {
                Segment::Text(t) => Segment::Text(escaper.unescape(&t)),
                control => control,
            })
            .collect())
    }

    /// Renders the prompt text: control tokens appear as their strings (`<s>[INST]…[/INST]`),
    /// exactly as mistral-common's `Tokenized.text`.
    ///
    /// Errors: every validation rule in the module note (as the matching [`ChatError`]),
    /// [`ChatError::Render`] when the template raises.
    pub fn render(&self, req: &ChatRequest) -> Result<String, ChatError> {
        Ok(self
            .segments(req)?
            .into_iter()
            .map(|seg| match seg {
                Segment::Control(t) | Segment::Text(t) => t,
            })
            .collect())
    }

    /// Renders the prompt as token ids, starting with BOS: control strings become control ids,
    /// text between them is encoded as plain text (content lookalikes stay text).
    ///
    /// Errors: those of [`ChatTemplate::render`], [`ChatError::UnknownControl`] for a control
    /// string `tok` lacks, [`ChatError::Tokenizer`] if encoding fails.
    pub fn render_ids(&self, req: &ChatRequest, tok: &Tokenizer) -> Result<Vec<u32>, ChatError> {
        let mut ids = Vec::new();
        for seg in self.segments(req)? {
            match seg {
                Segment::Control(text) => {
                    let id = tok
                        .special_id(&text)
                        .ok_or(ChatError::UnknownControl(text))?;
                    ids.push(id);
                }
                Segment::Text(text) => ids.extend(tok.encode(&text)?),
            }
        }
        Ok(ids)
    }
}

// ---------------------------------------------------------------------------------------------
// Reasoning split.

const THINK_OPEN: &str = "[THINK]";
const THINK_CLOSE: &str = "[/THINK]";

/// Splits generated text (decoded with control tokens kept as text) into reasoning and answer:
/// the text inside `[THINK]…[/THINK]` is the reasoning (`reasoning_content`), the rest the
/// content. A `[THINK]` that is never closed (generation stopped) makes the remainder reasoning.
/// Returns `(None, text)` when there is no `[THINK]`.
pub fn split_reasoning(text: &str) -> (Option<String>, String) {
    let mut splitter = ReasoningSplitter::new();
    let first = splitter.push(text);
    let last = splitter.finish();
    let reasoning = first.reasoning + &last.reasoning;
    let content = first.content + &last.content;
    (splitter.saw_think.then_some(reasoning), content)
}

/// Text routed by a [`ReasoningSplitter`] step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReasoningDelta {
    /// New `reasoning_content` text.
    pub reasoning: String,
    /// New `content` text.
    pub content: String,
}

/// Streaming version of [`split_reasoning`] for SSE: feed decoded pieces (from
/// [`crate::tokenizer::StreamDecoder::push_keep_special`]) and get the reasoning and content
/// deltas. A piece ending in a possible prefix of `[THINK]`/`[/THINK]` is held back until the
/// next piece decides it, so a marker split across pieces is never leaked as text.
#[derive(Clone, Debug, Default)]
pub struct ReasoningSplitter {
    in_reasoning: bool,
    saw_think: bool,
    held: String,
}

impl ReasoningSplitter {
    /// A splitter in content mode.
    pub fn new() -> ReasoningSplitter {
        ReasoningSplitter::default()
    }

    /// Whether the text so far is inside `[THINK]…`.
    pub fn in_reasoning(&self) -> bool {
        self.in_reasoning
    }

    /// Feeds one decoded piece.
    pub fn push(&mut self, piece: &str) -> ReasoningDelta {
        let mut text = std::mem::take(&mut self.held);
        text.push_str(piece);
        let mut delta = ReasoningDelta::default();
        let mut rest = text.as_str();
        loop {
            let marker = if self.in_reasoning {
                THINK_CLOSE
            } else {
                THINK_OPEN
            };
            if let Some(pos) = rest.find(marker) {
                self.emit(&mut delta, &rest[..pos]);
                self.in_reasoning = !self.in_reasoning;
                self.saw_think |= self.in_reasoning;
                rest = &rest[pos + marker.len()..];
                continue;
            }
            // Hold back the longest suffix that is a proper prefix of the marker.
            let hold = (1..marker.len())
                .rev()
                .find(|&k| {
                    rest.len() >= k
                        && rest.is_char_boundary(rest.len() - k)
                        && marker.starts_with(&rest[rest.len() - k..])
                })
                .unwrap_or(0);
            let (now, later) = rest.split_at(rest.len() - hold);
            self.emit(&mut delta, now);
            self.held = later.to_owned();
            break;
        }
        delta
    }

    /// Flushes held-back text.
    pub fn finish(&mut self) -> ReasoningDelta {
        let mut delta = ReasoningDelta::default();
        let held = std::mem::take(&mut self.held);
        self.emit(&mut delta, &held);
        delta
    }

    fn emit(&self, delta: &mut ReasoningDelta, text: &str) {
        if self.in_reasoning {
            delta.reasoning.push_str(text);
        } else {
            delta.content.push_str(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr_matches_cpython() {
        // Expected strings are CPython 3.11 `repr(float)` outputs.
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789012345680.0, "1.2345678901234568e+17"),
            (1e100, "1e+100"),
            (9999999999999998.0, "9999999999999998.0"),
            (100.0, "100.0"),
            (-0.0, "-0.0"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float_repr(x), want, "{x:e}");
        }
    }

    #[test]
    fn python_json_dumps_escapes_like_cpython() {
        // CPython: json.dumps({"a": "é\n\"\x01\x7f", "b": [1, 2.5, None, True]}, ensure_ascii=False)
        let v: Json =
            serde_json::from_str(r#"{"a": "é\n\"\u0001\u007f", "b": [1, 2.5, null, true]}"#)
                .unwrap();
        assert_eq!(
            python_json_dumps(&v),
            "{\"a\": \"é\\n\\\"\\u0001\u{7f}\", \"b\": [1, 2.5, null, true]}"
        );
    }

    #[test]
    fn reasoning_splitter_handles_split_markers() {
        let text = "[THINK]plan it[/THINK]answer";
        let whole = split_reasoning(text);
        assert_eq!(whole, (Some("plan it".into()), "answer".into()));
        for cut in 1..text.len() {
            let mut s = ReasoningSplitter::new();
            let a = s.push(&text[..cut]);
            let b = s.push(&text[cut..]);
            let c = s.finish();
            assert_eq!(
                a.reasoning + &b.reasoning + &c.reasoning,
                "plan it",
                "cut {cut}"
            );
            assert_eq!(a.content + &b.content + &c.content, "answer", "cut {cut}");
        }
        assert_eq!(
            split_reasoning("no think [here"),
            (None, "no think [here".into())
        );
        assert_eq!(
            split_reasoning("[THINK]unfinished"),
            (Some("unfinished".into()), String::new())
        );
    }
}
