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
//!
//! Files: `validate.rs` does steps 1-2 (the rules, and the normalised conversation both renderers
//! read); `pyjson.rs` writes JSON as Python's `json.dumps`; `builtin.rs` is the built-in v15
//! renderer; `jinja.rs` is the template path of steps 3-4 (the template's functions and
//! `messages`, the control-token table, the lookalike escaping). This file holds the request
//! types, [`ChatError`] and [`ChatTemplate`], which runs the steps in order.

mod builtin;
mod jinja;
mod pyjson;
mod validate;

use minijinja::value::Value;
use minijinja::Environment;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::gguf::{GgufFile, MetaValue};
use crate::text::tokenizer::{Tokenizer, TokenizerError};
use builtin::render_builtin;
use jinja::{
    collect_strings, raise_exception, strftime_now, template_messages, tojson_filter, ControlTable,
    Escaper, JinjaTemplate,
};
pub use pyjson::python_json_dumps;
use validate::validate_and_normalize;

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

/// A rendered prompt piece.
#[derive(Clone, Debug, PartialEq)]
enum Segment {
    /// A control token, by its text (`"[INST]"`).
    Control(String),
    /// Plain text, encoded without special-token parsing.
    Text(String),
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
        // No prompt has more than usize::MAX ids, so the limit never applies.
        Ok(self
            .render_ids_within(req, tok, usize::MAX)?
            .unwrap_or_default())
    }

    /// [`ChatTemplate::render_ids`], unless the prompt has more than `limit` ids: then `None`,
    /// with the text encoded only up to about that point ([`Tokenizer::encode_within`]).
    ///
    /// Errors: those of [`ChatTemplate::render_ids`].
    pub fn render_ids_within(
        &self,
        req: &ChatRequest,
        tok: &Tokenizer,
        limit: usize,
    ) -> Result<Option<Vec<u32>>, ChatError> {
        let mut ids = Vec::new();
        for seg in self.segments(req)? {
            match seg {
                Segment::Control(text) => {
                    let id = tok
                        .special_id(&text)
                        .ok_or(ChatError::UnknownControl(text))?;
                    ids.push(id);
                }
                Segment::Text(text) => {
                    match tok.encode_within(&text, limit.saturating_sub(ids.len()))? {
                        Some(more) => ids.extend(more),
                        None => return Ok(None),
                    }
                }
            }
            if ids.len() > limit {
                return Ok(None);
            }
        }
        Ok(Some(ids))
    }
}
