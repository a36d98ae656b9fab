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
//! `messages`, the control-token table, the lookalike escaping); `request.rs` holds the request
//! types, `error.rs` [`ChatError`] and `segment.rs` the rendered pieces. This file holds
//! [`ChatTemplate`], which runs the steps in order.

mod builtin;
mod error;
mod jinja;
mod pyjson;
mod request;
mod segment;
mod validate;

use minijinja::value::Value;
use minijinja::Environment;

use crate::gguf::{GgufFile, MetaValue};
use crate::text::tokenizer::Tokenizer;
use builtin::render_builtin;
pub use error::ChatError;
use jinja::{
    collect_strings, raise_exception, strftime_now, template_messages, tojson_filter, ControlTable,
    Escaper, JinjaTemplate,
};
pub use pyjson::python_json_dumps;
pub use request::{
    ChatMessage, ChatRequest, ContentChunk, FunctionCall, MessageContent, Role, ToolCall,
    REASONING_EFFORTS,
};
use segment::Segment;
use validate::{validate_and_normalize, Conversation};

impl ChatRequest {
    /// Step 1 of the module note alone: `Ok` when the request is one both renderers accept.
    ///
    /// Errors: the rule broken, naming the message index (0-based) or field at fault.
    pub fn validate(&self) -> Result<(), ChatError> {
        validate_and_normalize(self).map(|_| ())
    }
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

    fn segments(&self, conv: &Conversation) -> Result<Vec<Segment>, ChatError> {
        let JinjaTemplate {
            env,
            controls,
            source,
            bos,
            eos,
        } = match &self.renderer {
            Renderer::Builtin => return Ok(render_builtin(conv)),
            Renderer::Jinja(jinja) => jinja.as_ref(),
        };
        let messages = template_messages(conv);
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
            .segments(&validate_and_normalize(req)?)?
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
    /// with the text encoded only up to about that point ([`Tokenizer::encode_within`]), and
    /// without rendering at all when the conversation has more turns than `limit` (the prompt
    /// has at least as many ids as turns: BOS, two control tokens per system, user or tool turn,
    /// an answer's `</s>` or `[TOOL_CALLS]`, and only a continued final answer may write none),
    /// as a Jinja template's time can grow with the square of the turns.
    ///
    /// Errors: those of [`ChatTemplate::render_ids`].
    pub fn render_ids_within(
        &self,
        req: &ChatRequest,
        tok: &Tokenizer,
        limit: usize,
    ) -> Result<Option<Vec<u32>>, ChatError> {
        let conv = validate_and_normalize(req)?;
        if conv.turns.len() > limit {
            return Ok(None);
        }
        let mut ids = Vec::new();
        for seg in self.segments(&conv)? {
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
