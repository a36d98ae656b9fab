//! `POST /v1/responses`: OpenAI's Responses API on the chat route's engine, template and grammar.
//!
//! Request flow: the body is read and validated as the chat route's is (`super::params`: unknown
//! keys and refused parameters named, sampling checked); `input` (a string, or messages, function
//! calls, function call outputs and reasoning items) becomes [`Item`]s. With
//! `previous_response_id` the stored response's items (its input, the inputs before it, its
//! output) come first, so the rendered prompt starts with the stored response's prompt and the
//! prompt cache reuses it; `instructions` become a leading system message (not carried over, as
//! OpenAI does). The items become chat messages (an answer's reasoning, text and calls one
//! assistant turn, a call's output a tool message), the flat function tools, `tool_choice` and
//! `text.format` the chat shapes that `super::tools::structured` turns into the grammar, and
//! `reasoning.effort` (`none` / `high`, the values the template knows) the template's
//! reasoning effort. Errors the chat shapes name are renamed to the Responses parameters
//! (`tools[0].function.parameters` → `tools[0].parameters`, `response_format` → `text.format`,
//! `messages` → `input`).
//!
//! Output: [`Builder`] turns the engine's events into output items, in the order generated: a
//! `reasoning` item for reasoning text, a `message` item for answer text, a `function_call` item
//! per call (`call_id` the chat route's `call_…` id). Streamed, each step is one typed SSE event
//! (`event: <type>`, data with `type` and `sequence_number`): `response.created`,
//! `response.in_progress`, then per item `response.output_item.added`, its
//! `content_part.added` / text deltas / `content_part.done` or its arguments deltas and done,
//! `response.output_item.done`; the last event is `response.completed`, `response.incomplete`
//! (max_output_tokens or the context reached, `incomplete_details.reason: "max_output_tokens"`)
//! or `response.failed`. Not streamed, the same builder makes the one response object.
//!
//! Store: a finished response (completed or incomplete) with `store` (default true) is kept in
//! memory as its items, for `previous_response_id`: the last [`STORE_RESPONSES`] responses, each
//! for at most [`STORE_TTL`], at most [`STORE_BYTES`] of text together (oldest dropped first; a
//! response past that alone is not kept).
//! An unknown, dropped or unstored id is a 400 `previous_response_not_found`.

use super::api::request::{
    ChosenFunction, FormatType, FunctionDefinition, FunctionType, JsonSchemaFormat,
    NamedToolChoice, ReasoningEffort, ResponseFormat, Tool, ToolChoiceMode,
};
use super::api::responses::{
    ContentPart, EventBody, FunctionTool, IncompleteDetails, InputItem, InputRole,
    InputTokensDetails, Object, OutputFunctionCall, OutputItem, OutputItemStatus, OutputMessage,
    OutputReasoning, OutputText, OutputTokensDetails, Part, ReasoningText, ReasoningUsed,
    ResponseError, ResponseEvent, ResponseInput, ResponseObject, ResponseRequest, ResponseStatus,
    ResponseUsage, TextFormat,
};
use super::api::scalar::StrOr;
use super::app::{
    budget, check_model, generate_params, prompt_ids, read_body, sse_data, unix_now, usage,
    AppState, StreamFailed,
};
use super::engine::{Chunk, Event, Finish, JobSpec, Summary};
use super::error::{missing_parameter, unknown_parameter, ApiError};
use super::params::{self, Sampling};
use super::text::TextMode;
use super::tools::{self, Structured};
use aubier_runtime::text::chat::{
    ChatMessage, ChatRequest, ContentChunk, FunctionCall, MessageContent, Role, ToolCall,
};
use axum::extract::{Request, State};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

/// Most responses the store keeps.
pub const STORE_RESPONSES: usize = 256;

/// How long the store keeps a response.
pub const STORE_TTL: Duration = Duration::from_secs(60 * 60);

/// Most bytes of text the kept responses hold together.
pub const STORE_BYTES: usize = 64 << 20;

/// One turn of a conversation as the Responses API has it.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// A message: user, system, developer or an earlier answer's text.
    Message {
        /// Its author.
        role: Role,
        /// Its text.
        text: String,
    },
    /// An earlier answer's reasoning.
    Reasoning(String),
    /// A function call of an earlier answer.
    Call {
        /// What its output answers.
        call_id: String,
        /// The function.
        name: String,
        /// The JSON text of the arguments.
        arguments: String,
    },
    /// A function call's result.
    Output {
        /// The call it answers.
        call_id: String,
        /// The result.
        output: String,
    },
}

impl Item {
    /// Bytes of text it holds.
    fn bytes(&self) -> usize {
        match self {
            Item::Message { text, .. } | Item::Reasoning(text) => text.len(),
            Item::Call {
                call_id,
                name,
                arguments,
            } => call_id.len() + name.len() + arguments.len(),
            Item::Output { call_id, output } => call_id.len() + output.len(),
        }
    }
}

/// The assistant turn being gathered from consecutive answer items.
#[derive(Default)]
struct Answer {
    chunks: Vec<ContentChunk>,
    calls: Vec<ToolCall>,
}

impl Answer {
    fn message(self) -> ChatMessage {
        ChatMessage {
            content: Some(MessageContent::Chunks(self.chunks)),
            tool_calls: Some(self.calls),
            ..message(Role::Assistant, None)
        }
    }
}

fn message(role: Role, content: Option<String>) -> ChatMessage {
    ChatMessage {
        role,
        content: content.map(MessageContent::Text),
        reasoning_content: None,
        tool_calls: None,
        tool_call_id: None,
        name: None,
    }
}

/// The chat messages of `instructions` (a system message) and `items`: consecutive reasoning,
/// assistant text and calls form one assistant turn, a call's output a tool message.
pub fn messages(instructions: Option<&str>, items: &[Item]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = instructions
        .map(|i| message(Role::System, Some(i.to_owned())))
        .into_iter()
        .collect();
    let mut answer: Option<Answer> = None;
    for item in items {
        match item {
            Item::Message {
                role: Role::Assistant,
                text,
            } => answer
                .get_or_insert_with(Answer::default)
                .chunks
                .push(ContentChunk::Text { text: text.clone() }),
            Item::Reasoning(text) => {
                answer
                    .get_or_insert_with(Answer::default)
                    .chunks
                    .push(ContentChunk::Thinking {
                        thinking: text.clone(),
                        closed: true,
                    })
            }
            Item::Call {
                call_id,
                name,
                arguments,
            } => answer
                .get_or_insert_with(Answer::default)
                .calls
                .push(ToolCall {
                    id: Some(call_id.clone()),
                    kind: Some("function".to_owned()),
                    function: FunctionCall {
                        name: name.clone(),
                        arguments: Value::String(arguments.clone()),
                    },
                }),
            Item::Message { role, text } => {
                out.extend(answer.take().map(Answer::message));
                out.push(message(*role, Some(text.clone())));
            }
            Item::Output { call_id, output } => {
                out.extend(answer.take().map(Answer::message));
                out.push(ChatMessage {
                    tool_call_id: Some(call_id.clone()),
                    ..message(Role::Tool, Some(output.clone()))
                });
            }
        }
    }
    out.extend(answer.map(Answer::message));
    out
}

/// The recently finished responses, as their items (module note).
#[derive(Debug, Default)]
pub struct ResponseStore {
    kept: Mutex<VecDeque<Kept>>,
}

#[derive(Debug)]
struct Kept {
    id: String,
    at: Instant,
    items: Arc<Vec<Item>>,
    bytes: usize,
}

impl ResponseStore {
    /// Drops what is past the store's bounds, oldest first.
    fn prune(kept: &mut VecDeque<Kept>) {
        let mut bytes: usize = kept.iter().map(|k| k.bytes).sum();
        while let Some(oldest) = kept.front() {
            if kept.len() <= STORE_RESPONSES
                && bytes <= STORE_BYTES
                && oldest.at.elapsed() < STORE_TTL
            {
                break;
            }
            bytes -= oldest.bytes;
            kept.pop_front();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Kept>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The items of response `id` (its inputs and its output), if kept.
    pub fn get(&self, id: &str) -> Option<Arc<Vec<Item>>> {
        let mut kept = self.lock();
        Self::prune(&mut kept);
        kept.iter().find(|k| k.id == id).map(|k| k.items.clone())
    }

    /// Keeps response `id` as `items`, unless they alone are past [`STORE_BYTES`].
    pub fn put(&self, id: String, items: Vec<Item>) {
        let bytes = items.iter().map(Item::bytes).sum::<usize>() + id.len();
        if bytes > STORE_BYTES {
            return;
        }
        let mut kept = self.lock();
        kept.push_back(Kept {
            id,
            at: Instant::now(),
            items: Arc::new(items),
            bytes,
        });
        Self::prune(&mut kept);
    }
}

/// A validated `POST /v1/responses` body.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseParams {
    /// The `model` field.
    pub model: String,
    /// `input`.
    pub input: Vec<Item>,
    /// `instructions`.
    pub instructions: Option<String>,
    /// The tools in the chat shape, for the template.
    pub tools: Option<Value>,
    /// `tools`, `tool_choice`, `parallel_tool_calls` and `text.format`: the grammar.
    pub structured: Structured,
    /// `reasoning.effort`.
    pub effort: Option<ReasoningEffort>,
    /// `max_output_tokens`; `None` = up to the KV capacity.
    pub max_tokens: Option<usize>,
    /// Sampling settings.
    pub sampling: Sampling,
    /// `stream`.
    pub stream: bool,
    /// `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// `store` (default true).
    pub store: bool,
    /// What the response object repeats of the request: `tools`, `tool_choice`, `text`,
    /// `parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`.
    echo: Echo,
}

#[derive(Clone, Debug, PartialEq)]
struct Echo {
    tools: Vec<Value>,
    tool_choice: Value,
    text: Value,
    parallel_tool_calls: bool,
    max_output_tokens: Option<u64>,
    temperature: f64,
    top_p: f64,
}

/// The template's name of `effort`.
fn effort_name(effort: ReasoningEffort) -> &'static str {
    match effort {
        ReasoningEffort::None => "none",
        ReasoningEffort::High => "high",
    }
}

/// A 400 for a part or item type aubier does not implement.
fn unsupported_type(param: &str, kind: &str, what: &str) -> ApiError {
    ApiError::invalid(
        Some(param),
        "unsupported_parameter",
        format!("Unsupported parameter: '{param}' {kind:?} is not implemented; {what}."),
    )
}

/// The text of a string or of text parts, joined. Errors: 400 naming a part of another type.
fn joined(param: &str, content: StrOr<String, Vec<ContentPart>>) -> Result<String, ApiError> {
    match content {
        StrOr::Str(s) => Ok(s),
        StrOr::Other(parts) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| match part {
                ContentPart::Other(kind) => Err(unsupported_type(
                    &format!("{param}[{j}].type"),
                    kind,
                    "send input_text or output_text parts",
                )),
                text => Ok(text.text().unwrap_or_default()),
            })
            .collect(),
    }
}

/// `input` as items. Errors: 400 naming an item or part aubier does not implement.
fn items(input: ResponseInput) -> Result<Vec<Item>, ApiError> {
    let list = match input {
        StrOr::Str(text) => {
            return Ok(vec![Item::Message {
                role: Role::User,
                text,
            }])
        }
        StrOr::Other(list) => list,
    };
    list.into_iter()
        .enumerate()
        .map(|(i, item)| {
            Ok(match item {
                InputItem::Message(m) => Item::Message {
                    role: match m.role {
                        InputRole::User => Role::User,
                        InputRole::System => Role::System,
                        InputRole::Developer => Role::Developer,
                        InputRole::Assistant => Role::Assistant,
                    },
                    text: joined(&format!("input[{i}].content"), m.content)?,
                },
                InputItem::FunctionCall(c) => Item::Call {
                    call_id: c.call_id,
                    name: c.name,
                    arguments: c.arguments,
                },
                InputItem::FunctionCallOutput(o) => Item::Output {
                    call_id: o.call_id,
                    output: joined(&format!("input[{i}].output"), o.output)?,
                },
                InputItem::Reasoning(r) => {
                    params::refuse(&r.refused(), &format!("input[{i}]."))?;
                    let content: Vec<&str> =
                        r.content.iter().flatten().map(|c| &*c.0.text).collect();
                    let text = if content.is_empty() {
                        r.summary.iter().map(|s| &*s.0.text).collect::<Vec<_>>()
                    } else {
                        content
                    };
                    Item::Reasoning(text.join("\n\n"))
                }
                InputItem::Other(kind) => {
                    return Err(unsupported_type(
                        &format!("input[{i}].type"),
                        &kind,
                        "send messages, function_call, function_call_output and reasoning items",
                    ))
                }
            })
        })
        .collect()
}

/// `text.format` as the chat route's `response_format`, and as the response repeats it.
///
/// Errors: 400 for json_schema without name or schema, or those with another type.
fn text_format(format: Option<TextFormat>) -> Result<(Option<ResponseFormat>, Value), ApiError> {
    let Some(f) = format else {
        return Ok((None, json!({"format": {"type": "text"}})));
    };
    if f.kind != FormatType::JsonSchema {
        let sent = [
            ("name", f.name.is_some()),
            ("schema", f.schema.is_some()),
            ("description", f.description.is_some()),
            ("strict", f.strict.is_some()),
        ];
        if let Some((key, _)) = sent.iter().find(|(_, s)| *s) {
            return Err(unknown_parameter(&format!("text.format.{key}")));
        }
        let kind = if f.kind == FormatType::Text {
            "text"
        } else {
            "json_object"
        };
        let format = ResponseFormat {
            kind: f.kind,
            json_schema: None,
        };
        return Ok((Some(format), json!({"format": {"type": kind}})));
    }
    let name = f
        .name
        .ok_or_else(|| missing_parameter("text.format.name"))?;
    let schema = f
        .schema
        .ok_or_else(|| missing_parameter("text.format.schema"))?;
    let echo = json!({"format": {"type": "json_schema", "name": name, "schema": schema,
        "description": f.description, "strict": f.strict}});
    let format = ResponseFormat {
        kind: FormatType::JsonSchema,
        json_schema: Some(JsonSchemaFormat {
            name,
            description: f.description,
            schema,
            strict: f.strict,
        }),
    };
    Ok((Some(format), echo))
}

/// An error the chat shapes name, renamed to the Responses parameter (module note).
fn renamed(mut e: ApiError) -> ApiError {
    const PREFIXES: [(&str, &str); 4] = [
        ("response_format.json_schema.", "text.format."),
        ("response_format", "text.format"),
        ("tool_choice.function.", "tool_choice."),
        ("reasoning_effort", "reasoning.effort"),
    ];
    let Some(from) = e.param.take() else {
        return e;
    };
    let to = if from == "messages" {
        "input".to_owned()
    } else if from.starts_with("tools[") {
        from.replacen("].function.", "].", 1)
    } else {
        PREFIXES
            .iter()
            .find_map(|(a, b)| from.strip_prefix(a).map(|rest| format!("{b}{rest}")))
            .unwrap_or_else(|| from.clone())
    };
    if from != "messages" {
        e.message = e.message.replace(&from, &to);
    }
    e.param = Some(to);
    e
}

/// Parses and validates a `POST /v1/responses` body.
///
/// Errors: 400 for malformed JSON, a missing `model` or `input`, a value of the wrong type or out
/// of range, a refused parameter at a non-default value or an unimplemented item type (named in
/// `param`), or an unrecognised parameter.
pub fn parse(bytes: &[u8]) -> Result<ResponseParams, ApiError> {
    let r: ResponseRequest = params::read(bytes)?;
    params::refuse(&r.refused(), "")?;
    let sampling = params::sampling(r.sampling_fields(), 1.0)?;
    let text = r.text.map(|t| t.0);
    let reasoning = r.reasoning.map(|x| x.0);
    if let Some(t) = &text {
        params::refuse(&t.refused(), "text.")?;
    }
    if let Some(x) = &reasoning {
        params::refuse(&x.refused(), "reasoning.")?;
    }
    let stream = r.stream.unwrap_or(false);
    if r.stream_options.is_some() && !stream {
        return Err(ApiError::bad_value(
            "stream_options",
            "'stream_options' is only allowed when 'stream' is true.",
        ));
    }
    let max_tokens = params::count("max_output_tokens", r.max_output_tokens)?;
    let effort = reasoning.and_then(|x| x.effort);
    let flat: Vec<FunctionTool> = r
        .tools
        .unwrap_or_default()
        .into_iter()
        .map(|Object(t)| FunctionTool {
            strict: Some(t.strict.unwrap_or(true)),
            ..t
        })
        .collect();
    let chat_tools: Vec<Tool> = flat
        .iter()
        .map(|t| Tool {
            kind: FunctionType::Function,
            function: FunctionDefinition {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
                strict: t.strict,
            },
        })
        .collect();
    let (choice, choice_echo) = match r.tool_choice {
        None => (None, json!("auto")),
        Some(StrOr::Str(mode)) => {
            let name = match mode {
                ToolChoiceMode::None => "none",
                ToolChoiceMode::Auto => "auto",
                ToolChoiceMode::Required => "required",
            };
            (Some(StrOr::Str(mode)), json!(name))
        }
        Some(StrOr::Other(Object(f))) => {
            let echo = json!({"type": "function", "name": f.name});
            let named = NamedToolChoice {
                kind: FunctionType::Function,
                function: ChosenFunction { name: f.name },
            };
            (Some(StrOr::Other(named)), echo)
        }
    };
    let (format, text_echo) = text_format(text.and_then(|t| t.format).map(|f| f.0))?;
    let structured = tools::structured(
        &chat_tools,
        choice,
        r.parallel_tool_calls,
        format,
        effort == Some(ReasoningEffort::High),
    )
    .map_err(renamed)?;
    let to_json = |v: Result<Value, serde_json::Error>| {
        v.map_err(|e| ApiError::internal(format!("The tools do not serialize again: {e}.")))
    };
    let tools = match chat_tools.is_empty() {
        true => None,
        false => Some(to_json(serde_json::to_value(&chat_tools))?),
    };
    let echo = Echo {
        tools: flat
            .iter()
            .map(|t| to_json(serde_json::to_value(t)))
            .collect::<Result<_, _>>()?,
        tool_choice: choice_echo,
        text: text_echo,
        parallel_tool_calls: r.parallel_tool_calls.unwrap_or(true),
        max_output_tokens: r.max_output_tokens.map(|c| c.0),
        temperature: f64::from(sampling.temperature),
        top_p: f64::from(sampling.top_p),
    };
    Ok(ResponseParams {
        model: r.model.0,
        input: items(r.input)?,
        instructions: r.instructions,
        tools,
        structured,
        effort,
        max_tokens,
        sampling,
        stream,
        previous_response_id: r.previous_response_id,
        store: r.store.unwrap_or(true),
        echo,
    })
}

impl ResponseParams {
    /// The response object before anything is generated.
    fn head(&self, id: String, model: String) -> ResponseObject {
        let e = &self.echo;
        ResponseObject {
            id,
            object: "response",
            created_at: unix_now(),
            status: ResponseStatus::InProgress,
            error: None,
            incomplete_details: None,
            instructions: self.instructions.clone(),
            max_output_tokens: e.max_output_tokens,
            model,
            output: Vec::new(),
            parallel_tool_calls: e.parallel_tool_calls,
            previous_response_id: self.previous_response_id.clone(),
            reasoning: ReasoningUsed {
                effort: self.effort.map(effort_name),
                summary: (),
            },
            store: self.store,
            temperature: e.temperature,
            top_p: e.top_p,
            text: e.text.clone(),
            tool_choice: e.tool_choice.clone(),
            tools: e.tools.clone(),
            truncation: "disabled",
            usage: None,
            metadata: Map::new(),
        }
    }
}

/// `prefix`, `_` and 128 random bits in hex.
fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:032x}", rand::random::<u128>())
}

/// The output item being generated: reasoning or answer text, or a call.
enum Open {
    Text {
        reasoning: bool,
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

impl Open {
    /// The wire item, with its text when `whole` (else as response.output_item.added has it).
    fn item(&self, status: OutputItemStatus, whole: bool) -> OutputItem {
        match self {
            Open::Text {
                reasoning: true,
                id,
                text,
            } => OutputItem::Reasoning(OutputReasoning {
                id: id.clone(),
                kind: "reasoning",
                summary: Vec::new(),
                content: whole.then(|| reasoning_part(text)).into_iter().collect(),
                status,
            }),
            Open::Text { id, text, .. } => OutputItem::Message(OutputMessage {
                id: id.clone(),
                kind: "message",
                role: "assistant",
                status,
                content: whole.then(|| text_part(text)).into_iter().collect(),
            }),
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => OutputItem::FunctionCall(OutputFunctionCall {
                id: id.clone(),
                kind: "function_call",
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
                status,
            }),
        }
    }
}

fn text_part(text: &str) -> OutputText {
    OutputText {
        kind: "output_text",
        text: text.to_owned(),
        annotations: Vec::new(),
        logprobs: Vec::new(),
    }
}

fn reasoning_part(text: &str) -> ReasoningText {
    ReasoningText {
        kind: "reasoning_text",
        text: text.to_owned(),
    }
}

/// The content part of a text item.
fn part(reasoning: bool, text: &str) -> Part {
    match reasoning {
        true => Part::Reasoning(reasoning_part(text)),
        false => Part::Text(text_part(text)),
    }
}

/// Where a finished response is kept: the store's owner and the items before its output.
struct Keep {
    app: Arc<AppState>,
    items: Vec<Item>,
}

/// The state machine from the engine's events to the response object and its stream events
/// (module note).
struct Builder {
    response: ResponseObject,
    open: Option<Open>,
    said: Vec<Item>,
    streaming: bool,
    seq: u64,
    events: Vec<ResponseEvent>,
    keep: Option<Keep>,
}

impl Builder {
    fn new(response: ResponseObject, streaming: bool, keep: Option<Keep>) -> Builder {
        let mut b = Builder {
            response,
            open: None,
            said: Vec::new(),
            streaming,
            seq: 0,
            events: Vec::new(),
            keep,
        };
        let r = b.response.clone();
        b.emit(|| EventBody::Created {
            response: r.clone(),
        });
        b.emit(|| EventBody::InProgress { response: r });
        b
    }

    /// Records an event when streaming.
    fn emit(&mut self, body: impl FnOnce() -> EventBody) {
        if self.streaming {
            self.events.push(ResponseEvent {
                body: body(),
                sequence_number: self.seq,
            });
            self.seq += 1;
        }
    }

    /// The events recorded since the last call.
    fn take(&mut self) -> Vec<ResponseEvent> {
        std::mem::take(&mut self.events)
    }

    fn output_index(&self) -> usize {
        self.response.output.len()
    }

    fn begin(&mut self, open: Open) {
        let output_index = self.output_index();
        let item = open.item(OutputItemStatus::InProgress, false);
        self.emit(|| EventBody::OutputItemAdded { output_index, item });
        if let Open::Text { reasoning, id, .. } = &open {
            self.emit(|| EventBody::ContentPartAdded {
                item_id: id.clone(),
                output_index,
                content_index: 0,
                part: part(*reasoning, ""),
            });
        }
        self.open = Some(open);
    }

    /// Ends the open item, if any.
    fn close(&mut self, status: OutputItemStatus) {
        let Some(open) = self.open.take() else {
            return;
        };
        let output_index = self.output_index();
        let whole = open.item(status, true);
        match open {
            Open::Text {
                reasoning,
                id,
                text,
            } => {
                self.emit(|| match reasoning {
                    true => EventBody::ReasoningTextDone {
                        item_id: id.clone(),
                        output_index,
                        content_index: 0,
                        text: text.clone(),
                    },
                    false => EventBody::OutputTextDone {
                        item_id: id.clone(),
                        output_index,
                        content_index: 0,
                        text: text.clone(),
                        logprobs: Vec::new(),
                    },
                });
                self.emit(|| EventBody::ContentPartDone {
                    item_id: id,
                    output_index,
                    content_index: 0,
                    part: part(reasoning, &text),
                });
                self.said.push(match reasoning {
                    true => Item::Reasoning(text),
                    false => Item::Message {
                        role: Role::Assistant,
                        text,
                    },
                });
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => {
                self.emit(|| EventBody::FunctionCallArgumentsDone {
                    item_id: id,
                    output_index,
                    name: name.clone(),
                    arguments: arguments.clone(),
                });
                self.said.push(Item::Call {
                    call_id,
                    name,
                    arguments,
                });
            }
        }
        let item = whole.clone();
        self.emit(|| EventBody::OutputItemDone { output_index, item });
        self.response.output.push(whole);
    }

    /// Adds reasoning (`reasoning`) or answer text, opening its item when another is open.
    fn text(&mut self, reasoning: bool, delta: &str) {
        if !matches!(&self.open, Some(Open::Text { reasoning: r, .. }) if *r == reasoning) {
            self.close(OutputItemStatus::Completed);
            self.begin(Open::Text {
                reasoning,
                id: new_id(if reasoning { "rs" } else { "msg" }),
                text: String::new(),
            });
        }
        let output_index = self.output_index();
        let Some(Open::Text { id, text, .. }) = &mut self.open else {
            return;
        };
        text.push_str(delta);
        let (item_id, delta) = (id.clone(), delta.to_owned());
        self.emit(|| match reasoning {
            true => EventBody::ReasoningTextDelta {
                item_id,
                output_index,
                content_index: 0,
                delta,
            },
            false => EventBody::OutputTextDelta {
                item_id,
                output_index,
                content_index: 0,
                delta,
                logprobs: Vec::new(),
            },
        });
    }

    /// Takes in one engine chunk.
    fn chunk(&mut self, c: &Chunk) {
        if !c.delta.reasoning.is_empty() {
            self.text(true, &c.delta.reasoning);
        }
        if !c.delta.content.is_empty() {
            self.text(false, &c.delta.content);
        }
        for piece in &c.delta.tool_calls {
            if let Some((call_id, name)) = &piece.head {
                self.close(OutputItemStatus::Completed);
                self.begin(Open::Call {
                    id: new_id("fc"),
                    call_id: call_id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                });
            }
            let output_index = self.output_index();
            if let Some(Open::Call { id, arguments, .. }) = &mut self.open {
                arguments.push_str(&piece.arguments);
                let (item_id, delta) = (id.clone(), piece.arguments.clone());
                if !delta.is_empty() {
                    self.emit(|| EventBody::FunctionCallArgumentsDelta {
                        item_id,
                        output_index,
                        delta,
                    });
                }
            }
        }
    }

    /// Ends the response; keeps it when asked to.
    fn done(&mut self, s: &Summary) {
        let complete = matches!(s.finish, Finish::Stop | Finish::ToolCalls);
        self.close(match complete {
            true => OutputItemStatus::Completed,
            false => OutputItemStatus::Incomplete,
        });
        let u = usage(std::slice::from_ref(s));
        let r = &mut self.response;
        r.usage = Some(ResponseUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: u.prompt_tokens_details.cached_tokens,
                cache_write_tokens: 0,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: u.completion_tokens_details.reasoning_tokens,
            },
            total_tokens: u.total_tokens,
        });
        if complete {
            r.status = ResponseStatus::Completed;
        } else {
            r.status = ResponseStatus::Incomplete;
            r.incomplete_details = Some(IncompleteDetails {
                reason: "max_output_tokens",
            });
        }
        if let Some(Keep { app, mut items }) = self.keep.take() {
            items.append(&mut self.said);
            app.responses.put(r.id.clone(), items);
        }
        let response = r.clone();
        self.emit(|| match complete {
            true => EventBody::Completed { response },
            false => EventBody::Incomplete { response },
        });
    }

    /// Ends the stream of a failed response.
    fn failed(&mut self, e: &ApiError) {
        self.close(OutputItemStatus::Incomplete);
        self.response.status = ResponseStatus::Failed;
        self.response.error = Some(ResponseError {
            code: e.code.unwrap_or("server_error").to_owned(),
            message: e.message.clone(),
        });
        let response = self.response.clone();
        self.emit(|| EventBody::Failed { response });
    }
}

/// The SSE events of a response (module note); a failure sets `failed`.
fn sse_stream(
    rx: UnboundedReceiver<Event>,
    mut builder: Builder,
    failed: StreamFailed,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
    let head = builder.take();
    let body = stream::unfold(Some((rx, builder)), move |state| {
        let failed = failed.clone();
        async move {
            let (mut rx, mut b) = state?;
            let more = match rx.recv().await {
                Some(Event::Chunk(c)) => {
                    b.chunk(&c);
                    true
                }
                Some(Event::Done(s)) => {
                    b.done(&s);
                    false
                }
                Some(Event::Failed(e)) => {
                    failed.0.store(true, Ordering::SeqCst);
                    b.failed(&e);
                    false
                }
                None => {
                    failed.0.store(true, Ordering::SeqCst);
                    b.failed(&stopped());
                    false
                }
            };
            let events = b.take();
            Some((events, more.then_some((rx, b))))
        }
    });
    stream::iter(head)
        .chain(body.flat_map(stream::iter))
        .map(|ev| Ok(sse_data(&ev).event(ev.body.name())))
}

fn stopped() -> ApiError {
    ApiError::internal("The engine stopped without finishing the request.")
}

/// 400 `previous_response_not_found`.
fn not_found(id: &str) -> ApiError {
    ApiError::invalid(
        Some("previous_response_id"),
        "previous_response_not_found",
        format!(
            "Previous response with id '{id}' not found: aubier keeps the last \
             {STORE_RESPONSES} responses stored with 'store' for {} minutes.",
            STORE_TTL.as_secs() / 60
        ),
    )
}

/// `POST /v1/responses` (module note).
pub async fn create(State(app): State<Arc<AppState>>, req: Request) -> Result<Response, ApiError> {
    let received = Instant::now();
    let bytes = read_body(&app, req).await?;
    let body_len = bytes.len();
    let mut p = parse(&bytes)?;
    drop(bytes);
    check_model(&app, &p.model)?;
    let mut items = match &p.previous_response_id {
        None => Vec::new(),
        Some(id) => app.responses.get(id).ok_or_else(|| not_found(id))?.to_vec(),
    };
    items.append(&mut p.input);
    let chat = ChatRequest {
        messages: messages(p.instructions.as_deref(), &items),
        tools: p.tools.take(),
        reasoning_effort: p.effort.map(|e| effort_name(e).to_owned()),
        continue_final_message: false,
    };
    let prompt = prompt_ids(&app, "input", body_len, move |t, limit| {
        t.chat_prompt_within(&chat, limit).map_err(renamed)
    })
    .await?;
    let max_tokens = budget(&app, prompt.len(), p.max_tokens, "input")?;
    let constraints = match p.structured.grammar.take() {
        None => Vec::new(),
        Some(spec) => {
            let text = app.text.clone();
            let compiled =
                tokio::task::spawn_blocking(move || tools::compile(text.grammar(), &spec))
                    .await
                    .map_err(|e| {
                        ApiError::internal(format!("The grammar compiler task failed: {e}."))
                    })?;
            vec![compiled.map_err(renamed)?]
        }
    };
    let spec = JobSpec {
        prompt,
        params: generate_params(&app, &p.sampling, max_tokens, None),
        mode: TextMode::Chat {
            stops: Vec::new(),
            tool_calls: p.structured.tool_calls,
        },
        constraints,
        received,
        choices: 1,
    };
    let mut rx = app.engine.submit(spec, app.limits.queue_wait).await?;
    let head = p.head(new_id("resp"), app.limits.model_id.clone());
    let keep = p.store.then(|| Keep {
        app: app.clone(),
        items,
    });
    let mut builder = Builder::new(head, p.stream, keep);
    if p.stream {
        let failed = StreamFailed::default();
        let mut resp = Sse::new(sse_stream(rx, builder, failed.clone())).into_response();
        resp.extensions_mut().insert(failed);
        return Ok(resp);
    }
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Chunk(c) => builder.chunk(&c),
            Event::Done(s) => {
                builder.done(&s);
                return Ok(Json(builder.response).into_response());
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(stopped())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(text: &str) -> Vec<Item> {
        vec![Item::Message {
            role: Role::User,
            text: text.to_owned(),
        }]
    }

    #[test]
    fn the_store_keeps_the_last_responses_within_its_bytes() {
        let store = ResponseStore::default();
        for i in 0..STORE_RESPONSES + 10 {
            store.put(format!("resp_{i}"), said("x"));
        }
        assert!(store.get("resp_9").is_none());
        assert_eq!(store.get("resp_10").as_deref(), Some(&said("x")));
        let last = format!("resp_{}", STORE_RESPONSES + 9);
        assert!(store.get(&last).is_some());
        store.put("big".to_owned(), said(&"y".repeat(STORE_BYTES)));
        assert!(store.get("big").is_none(), "past the byte bound alone");
        assert!(store.get(&last).is_some(), "the newer ones stay");
    }

    #[test]
    fn answer_items_in_a_row_are_one_assistant_turn() {
        let items = [
            Item::Message {
                role: Role::User,
                text: "q".to_owned(),
            },
            Item::Reasoning("r".to_owned()),
            Item::Message {
                role: Role::Assistant,
                text: "a".to_owned(),
            },
            Item::Call {
                call_id: "call_1".to_owned(),
                name: "f".to_owned(),
                arguments: "{}".to_owned(),
            },
            Item::Output {
                call_id: "call_1".to_owned(),
                output: "o".to_owned(),
            },
        ];
        let m = messages(Some("be brief"), &items);
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::System, Role::User, Role::Assistant, Role::Tool]
        );
        assert_eq!(m[2].tool_calls.as_ref().map(Vec::len), Some(1));
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_1"));
    }
}
