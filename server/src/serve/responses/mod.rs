//! `POST /v1/responses`: OpenAI's Responses API on the chat route's engine, template and grammar.
//!
//! Request flow: the body is read and validated as the chat route's is (`super::params`: unknown
//! keys and refused parameters named, sampling checked); `input` (a string, or messages, function
//! calls, function call outputs and reasoning items) becomes [`Item`]s, each listed under the
//! `id` it was sent with (or a new one); an `item_reference` is replaced by the stored item it
//! names, with that item's id and status. With `previous_response_id` the stored response's
//! items (its input, the inputs before it, its output) come first, so the rendered prompt
//! starts with the stored response's prompt and the prompt cache reuses it; `instructions`
//! become a leading system message (not carried over, as OpenAI does). The items become chat
//! messages (an answer's reasoning, text and calls one assistant turn, a call's output a tool
//! message), the flat function tools, `tool_choice` and `text.format` the chat shapes that
//! `super::tools::structured` turns into the grammar, and `reasoning.effort` (`none` / `high`,
//! the values the template knows) the template's reasoning effort. Errors the chat shapes name
//! are renamed to the Responses parameters (`tools[0].function.parameters` →
//! `tools[0].parameters`, `response_format` → `text.format`, `messages` → `input`).
//!
//! Output: [`Builder`] turns the engine's events into output items, in the order generated: a
//! `reasoning` item for reasoning text (with `include` `reasoning.encrypted_content`, the text
//! also as [`sealed`] `encrypted_content`, which [`unsealed`] reads back from an input reasoning
//! item), a `message` item for answer text, a `function_call` item per call (`call_id` the chat
//! route's `call_…` id). Streamed, each step is one typed SSE event
//! (`event: <type>`, data with `type` and `sequence_number`): `response.created`,
//! `response.in_progress`, then per item `response.output_item.added`, its
//! `content_part.added` / text deltas / `content_part.done` or its arguments deltas and done,
//! `response.output_item.done`; the last event is `response.completed`, `response.incomplete`
//! (max_output_tokens or the context reached, `incomplete_details.reason: "max_output_tokens"`)
//! or `response.failed`. Not streamed, the same builder makes the one response object.
//!
//! Before the engine sees a request, no input item may be sent with (or refer to) the `id` of an
//! item already in the conversation (OpenAI's "Duplicate item found": with
//! `previous_response_id`, the stored items are there already), its items must pair up (each
//! `function_call_output` after its call, each call answered) and their chat messages pass the
//! template's rules (`ChatRequest::validate`); a refusal names the item (`input[i]`), not the
//! chat message.
//!
//! Store ([`store`]): a finished response (completed, incomplete, or failed mid-stream with its
//! `error` and the items so far) with `store` (default true) is kept in memory as its response
//! object and items, for `previous_response_id`, `item_reference` and the routes of [`stored`]
//! (retrieve, delete, list input items): the last [`STORE_RESPONSES`] responses, each for at most
//! [`STORE_TTL`], at most [`STORE_BYTES`] together (their text and each item's bookkeeping;
//! oldest dropped first; a response past that alone is not kept). A streamed response is kept from its first event on, in progress
//! (its inputs, the object `response.in_progress` carried) until it ends, and forgotten if its
//! client goes away first. An unknown, dropped or unstored id is a 400
//! `previous_response_not_found`; one still in progress a 400 too.

pub mod store;
pub mod stored;

use super::api::request::{
    ChosenFunction, FormatType, FunctionDefinition, FunctionType, JsonSchemaFormat,
    NamedToolChoice, ReasoningEffort, ResponseFormat, Tool, ToolChoiceMode,
};
use super::api::response::ObjectHead;
use super::api::responses::{
    ContentPart, EventBody, FunctionTool, Includable, IncompleteDetails, InputItem, InputRole,
    InputTokensDetails, Object, OutputFunctionCall, OutputItem, OutputItemStatus, OutputMessage,
    OutputReasoning, OutputText, OutputTokensDetails, Part, ReasoningText, ReasoningUsed,
    ResponseError, ResponseEvent, ResponseInput, ResponseObject, ResponseRequest, ResponseStatus,
    ResponseUsage, SummaryMode, TextFormat,
};
use super::api::scalar::StrOr;
use super::engine::{Chunk, Finish, Summary};
use super::error::{missing_parameter, unknown_parameter, ApiError};
use super::generation::{
    request_id, sse_data, usage, Answer as Collected, ChunkFormat, Head, PromptSource, RequestKind,
};
use super::params::{self, Ends, Generation};
use super::state::AppState;
use super::text::{Delta, TextMode, TextModel, ToolCallDelta};
use super::tools::{self, Structured};
use aubier_runtime::text::chat::{
    ChatError, ChatMessage, ChatRequest, ContentChunk, FunctionCall, MessageContent, Role, ToolCall,
};
use aubier_runtime::text::grammar::GrammarSpec;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::sync::Arc;
pub use store::{Item, ResponseStore, Stored, Tag, STORE_BYTES, STORE_RESPONSES, STORE_TTL};

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

/// Chat messages being gathered from items, each with the index of the item it starts at.
#[derive(Default)]
struct Turns {
    messages: Vec<ChatMessage>,
    origins: Vec<Option<usize>>,
    answer: Option<(usize, Answer)>,
}

impl Turns {
    /// The open assistant turn, opened at item `i` if none is.
    fn answer(&mut self, i: usize) -> &mut Answer {
        &mut self.answer.get_or_insert_with(|| (i, Answer::default())).1
    }

    /// Ends the open assistant turn, if any.
    fn close(&mut self) {
        if let Some((i, answer)) = self.answer.take() {
            self.messages.push(answer.message());
            self.origins.push(Some(i));
        }
    }

    /// Adds `m`, from item `origin` (`None`: the instructions), after the open turn.
    fn push(&mut self, origin: Option<usize>, m: ChatMessage) {
        self.close();
        self.messages.push(m);
        self.origins.push(origin);
    }
}

/// The chat messages of `instructions` (a system message) and `items`: consecutive reasoning,
/// assistant text and calls form one assistant turn, a call's output a tool message. With them,
/// for each message, the index in `items` of the item it starts at (`None` for the
/// instructions).
pub fn messages(
    instructions: Option<&str>,
    items: &[Item],
) -> (Vec<ChatMessage>, Vec<Option<usize>>) {
    let mut t = Turns::default();
    if let Some(text) = instructions {
        t.push(None, message(Role::System, Some(text.to_owned())));
    }
    for (i, item) in items.iter().enumerate() {
        match item {
            Item::Message {
                role: Role::Assistant,
                text,
            } => t
                .answer(i)
                .chunks
                .push(ContentChunk::Text { text: text.clone() }),
            Item::Reasoning(text) => t.answer(i).chunks.push(ContentChunk::Thinking {
                thinking: text.clone(),
                closed: true,
            }),
            Item::Call {
                call_id,
                name,
                arguments,
            } => t.answer(i).calls.push(ToolCall {
                id: Some(call_id.clone()),
                kind: Some("function".to_owned()),
                function: FunctionCall {
                    name: name.clone(),
                    arguments: Value::String(arguments.clone()),
                },
            }),
            Item::Message { role, text } => t.push(Some(i), message(*role, Some(text.clone()))),
            Item::Output { call_id, output } => t.push(
                Some(i),
                ChatMessage {
                    tool_call_id: Some(call_id.clone()),
                    ..message(Role::Tool, Some(output.clone()))
                },
            ),
        }
    }
    t.close();
    (t.messages, t.origins)
}

/// What `item` is, for errors: "a user message", "a function_call", ….
fn item_kind(item: &Item) -> String {
    match item {
        Item::Message {
            role: Role::Assistant,
            ..
        } => "an assistant message".to_owned(),
        Item::Message { role, .. } => format!("a {} message", role.name()),
        Item::Reasoning(_) => "a reasoning item".to_owned(),
        Item::Call { .. } => "a function_call".to_owned(),
        Item::Output { .. } => "a function_call_output".to_owned(),
    }
}

/// The parameter of item `i` of a conversation whose first `stored` items are a stored
/// response's: `input[i - stored]`, or `previous_response_id`.
fn item_param(i: usize, stored: usize) -> String {
    match i.checked_sub(stored) {
        Some(j) => format!("input[{j}]"),
        None => "previous_response_id".to_owned(),
    }
}

/// The chat validator's error `e` about the messages [`messages`] made of `items` (the first
/// `stored` a stored response's), in Responses terms: the message it names becomes the item
/// that message starts at (or `instructions`), chat roles become item types.
fn in_item_terms(
    e: ChatError,
    origins: &[Option<usize>],
    items: &[Item],
    stored: usize,
) -> ApiError {
    let param = |index: usize| match origins.get(index).copied().flatten() {
        Some(i) => item_param(i, stored),
        None => "instructions".to_owned(),
    };
    let kind = |index: usize| match origins.get(index).copied().flatten() {
        Some(i) => item_kind(&items[i]),
        None => "the instructions".to_owned(),
    };
    let at = |index: usize, message: String| {
        let p = param(index);
        ApiError::bad_value(&p, format!("{p}: {message}"))
    };
    match e {
        ChatError::NoMessages => ApiError::bad_value(
            "input",
            "The input has no items: send at least one message.",
        ),
        ChatError::FirstRole(_) => at(
            0,
            format!(
                "the conversation must start with a user, system or developer message (or \
                 instructions), not {}.",
                kind(0)
            ),
        ),
        ChatError::RoleOrder { index, .. } => {
            let before = match origins.get(index).copied().flatten() {
                Some(i) if i > 0 => item_kind(&items[i - 1]),
                _ => kind(index.saturating_sub(1)),
            };
            at(
                index,
                format!(
                    "{} cannot follow {before} in Mistral's chat template (after an answer \
                     comes a user message or a function_call_output; a system or developer \
                     message comes after a user or system message).",
                    kind(index)
                ),
            )
        }
        ChatError::LastRole(_) => {
            let last = origins.len().saturating_sub(1);
            at(
                last,
                format!(
                    "the input ends with {}; end it with what the model should answer: a user \
                     message or a function_call_output.",
                    kind(last)
                ),
            )
        }
        ChatError::Content { index, .. } => at(
            index,
            "an answer (assistant messages, reasoning and function calls in a row) needs \
             non-empty text or a function call."
                .to_owned(),
        ),
        ChatError::ToolCalls { index, reason } => {
            const TERMS: [(&str, &str); 7] = [
                ("tool call needs an id", "function_call needs a call_id"),
                ("tool call id", "call_id"),
                ("tool_call_id", "call_id"),
                ("tool result", "function_call_output"),
                ("tool message", "function_call_output"),
                ("tool call", "function_call"),
                ("assistant turn", "answer"),
            ];
            let reason = TERMS
                .iter()
                .fold(reason, |r, (chat, item)| r.replace(chat, item));
            // The rule is about the answer as a whole (its calls) or one output: name which.
            let answer = origins
                .get(index)
                .copied()
                .flatten()
                .is_some_and(|i| !matches!(items[i], Item::Output { .. }));
            match answer {
                true => at(index, format!("in the answer that starts here: {reason}.")),
                false => at(index, format!("{reason}.")),
            }
        }
        ChatError::Tools(_) => ApiError::bad_value("tools", e.to_string()),
        e => ApiError::bad_value("input", e.to_string()),
    }
}

/// A validated `POST /v1/responses` body.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseParams {
    /// `model`, `max_output_tokens`, sampling and `stream` (one choice, no stops, no
    /// log-probabilities).
    pub generation: Generation,
    /// `input`.
    pub input: Vec<Sent>,
    /// `instructions`.
    pub instructions: Option<String>,
    /// The tools in the chat shape, for the template.
    pub tools: Option<Value>,
    /// `tools`, `tool_choice`, `parallel_tool_calls` and `text.format`: the grammar.
    pub structured: Structured,
    /// `reasoning.effort`.
    pub effort: Option<ReasoningEffort>,
    /// `reasoning.summary`.
    pub summary: Option<SummaryMode>,
    /// Whether `include` asks for reasoning items' `encrypted_content`.
    pub include_reasoning: bool,
    /// `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// `store` (default true).
    pub store: bool,
    /// What the response object repeats of the request: `tools`, `tool_choice`, `text`,
    /// `parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`.
    echo: Echo,
}

/// One item of `input` as sent.
#[derive(Clone, Debug, PartialEq)]
pub enum Sent {
    /// An item, with the `id` it was sent with (kept; none or empty: aubier gives one).
    Item(Item, Option<String>),
    /// An `item_reference`: the id of a stored response's item, which takes its place.
    Reference(String),
}

impl Sent {
    /// The id it was sent with.
    fn id(&self) -> Option<&str> {
        match self {
            Sent::Item(_, id) => id.as_deref(),
            Sent::Reference(id) => Some(id),
        }
    }
}

/// A `/v1/responses` request as the generation route runs it: the body, and the items of the
/// conversation so far (the stored response's, then `input`) whose chat messages are the
/// prompt.
pub(super) struct ResponsesKind {
    params: ResponseParams,
    items: Vec<Item>,
    tags: Vec<Tag>,
    store: Arc<ResponseStore>,
    chat: ChatRequest,
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

/// `input` as items, each with the id it was sent with, and references. Errors: 400 naming an
/// item or part aubier does not implement.
fn items(input: ResponseInput) -> Result<Vec<Sent>, ApiError> {
    let list = match input {
        StrOr::Str(text) => {
            let said = Item::Message {
                role: Role::User,
                text,
            };
            return Ok(vec![Sent::Item(said, None)]);
        }
        StrOr::Other(list) => list,
    };
    list.into_iter()
        .enumerate()
        .map(|(i, item)| {
            let id = item.id().map(str::to_owned);
            let item = match item {
                InputItem::Reference(r) => return Ok(Sent::Reference(r.id)),
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
                    let content: Vec<&str> =
                        r.content.iter().flatten().map(|c| &*c.0.text).collect();
                    let blob = match &r.encrypted_content {
                        None => None,
                        Some(blob) => Some(unsealed(blob).ok_or_else(|| {
                            ApiError::bad_value(
                                &format!("input[{i}].encrypted_content"),
                                format!(
                                    "'input[{i}].encrypted_content' was not written by aubier \
                                     (it starts with '{SEALED_PREFIX}' and base64 text): send \
                                     the reasoning as 'content', or leave it out."
                                ),
                            )
                        })?),
                    };
                    let text = match (content.is_empty(), blob) {
                        (false, _) => content.join("\n\n"),
                        (true, Some(text)) => text,
                        (true, None) => {
                            let summary: Vec<&str> = r.summary.iter().map(|s| &*s.0.text).collect();
                            summary.join("\n\n")
                        }
                    };
                    Item::Reasoning(text)
                }
                InputItem::Other(kind) => {
                    return Err(unsupported_type(
                        &format!("input[{i}].type"),
                        &kind,
                        "send messages, function_call, function_call_output, reasoning and \
                         item_reference items",
                    ))
                }
            };
            Ok(Sent::Item(item, id))
        })
        .collect()
}

/// What [`sealed`] writes before the base64 of the reasoning text.
const SEALED_PREFIX: &str = "aubier.reasoning.v1.";

/// A reasoning item's `encrypted_content` (`include` `reasoning.encrypted_content`): the text,
/// readable by whoever has it (aubier keeps no secret; the field is opaque to clients, who send
/// it back so that a `store: false` conversation keeps its past reasoning).
fn sealed(text: &str) -> String {
    format!("{SEALED_PREFIX}{}", BASE64.encode(text))
}

/// The text [`sealed`] wrote into `blob`; `None` for a blob it did not write.
fn unsealed(blob: &str) -> Option<String> {
    let bytes = BASE64.decode(blob.strip_prefix(SEALED_PREFIX)?).ok()?;
    String::from_utf8(bytes).ok()
}

/// Checks that no input item is sent with, or refers to, the `id` of an item already in the
/// conversation: one of the stored response's (`stored`, as `previous_response_id` carries them
/// over) or an earlier input item's. Such an item would be rendered twice.
///
/// Errors: 400 naming `input[i].id`, with OpenAI's message "Duplicate item found with id …".
fn no_duplicates(stored: &[Tag], sent: &[Sent]) -> Result<(), ApiError> {
    let mut seen: HashSet<&str> = stored.iter().map(|t| t.id.as_str()).collect();
    for (i, id) in sent.iter().map(Sent::id).enumerate() {
        match id {
            Some(id) if !id.is_empty() && !seen.insert(id) => {
                return Err(ApiError::bad_value(
                    &format!("input[{i}].id"),
                    format!(
                        "Duplicate item found with id {id}. Remove duplicate items from your \
                         input and try again."
                    ),
                ))
            }
            _ => {}
        }
    }
    Ok(())
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

/// Checks, in `items` (the stored response's `stored` items, then `input`), that every
/// `function_call_output` answers a `function_call` before it, every `function_call` has an
/// output after it (as OpenAI does) and the last item is one the model can answer (not an
/// assistant message or reasoning), before the chat validator (whose errors count chat
/// messages, not items, and speak of chat roles) sees them.
///
/// Errors: 400 naming the item, `input[i]` (or `previous_response_id` for a stored one), with
/// OpenAI's messages "No tool call found for function call output with call_id …" and "No tool
/// output found for function call …", or saying the input ends with an answer.
fn answerable(items: &[Item], stored: usize) -> Result<(), ApiError> {
    let param = |i: usize| item_param(i, stored);
    // Whether each function_call has an output after it, in one backward pass, so that a body
    // of many items costs time linear in their count.
    let mut outputs_after = HashSet::new();
    let mut answered = vec![true; items.len()];
    for (i, item) in items.iter().enumerate().rev() {
        match item {
            Item::Output { call_id, .. } => {
                outputs_after.insert(call_id.as_str());
            }
            Item::Call { call_id, .. } => answered[i] = outputs_after.contains(call_id.as_str()),
            _ => {}
        }
    }
    let mut calls_before = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        match item {
            Item::Output { call_id, .. } if !calls_before.contains(call_id.as_str()) => {
                return Err(ApiError::bad_value(
                    &param(i),
                    format!("No tool call found for function call output with call_id {call_id}."),
                ))
            }
            Item::Call { call_id, .. } if !answered[i] => {
                return Err(ApiError::bad_value(
                    &param(i),
                    format!("No tool output found for function call {call_id}."),
                ))
            }
            Item::Call { call_id, .. } => {
                calls_before.insert(call_id.as_str());
            }
            Item::Message {
                role: Role::Assistant,
                ..
            }
            | Item::Reasoning(_)
                if i + 1 == items.len() =>
            {
                return Err(ApiError::bad_value(
                    &param(i),
                    "The input ends with an answer (an assistant message or a reasoning item); \
                     end it with what the model should answer: a user message or a \
                     function_call_output.",
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Parses and validates a `POST /v1/responses` body.
///
/// Errors: 400 for malformed JSON, a missing `model` or `input`, a value of the wrong type or out
/// of range, a refused parameter at a non-default value or an unimplemented item type (named in
/// `param`), or an unrecognised parameter.
pub fn parse(bytes: &[u8]) -> Result<ResponseParams, ApiError> {
    let r: ResponseRequest = params::read(bytes)?;
    params::refuse(&r.refused(), "")?;
    let sampling = params::sampling(r.sampling_fields(), 1.0, params::random_seed())?;
    let text = r.text.map(|t| t.0);
    let reasoning = r.reasoning.map(|x| x.0);
    if let Some(t) = &text {
        params::refuse(&t.refused(), "text.")?;
    }
    let stream = r.stream.unwrap_or(false);
    if r.stream_options.is_some() && !stream {
        return Err(ApiError::bad_value(
            "stream_options",
            "'stream_options' is only allowed when 'stream' is true.",
        ));
    }
    let max_tokens = params::count("max_output_tokens", r.max_output_tokens)?;
    let effort = reasoning.as_ref().and_then(|x| x.effort);
    let summary = reasoning.and_then(|x| x.summary.or(x.generate_summary));
    let include_reasoning = r
        .include
        .is_some_and(|i| i.contains(&Includable::ReasoningEncryptedContent));
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
        generation: Generation {
            model: r.model.0,
            max_tokens,
            sampling,
            stop: Vec::new(),
            stream,
            include_usage: false,
            n: 1,
            logprobs: None,
            ends: Ends::default(),
        },
        input: items(r.input)?,
        instructions: r.instructions,
        tools,
        structured,
        effort,
        summary,
        include_reasoning,
        previous_response_id: r.previous_response_id,
        store: r.store.unwrap_or(true),
        echo,
    })
}

impl ResponseParams {
    /// The response object before anything is generated.
    fn head(&self, head: &ObjectHead) -> ResponseObject {
        let e = &self.echo;
        ResponseObject {
            id: head.id.clone(),
            object: "response",
            created_at: head.created,
            status: ResponseStatus::InProgress,
            error: None,
            incomplete_details: None,
            instructions: self.instructions.clone(),
            max_output_tokens: e.max_output_tokens,
            model: head.model.clone(),
            output: Vec::new(),
            parallel_tool_calls: e.parallel_tool_calls,
            previous_response_id: self.previous_response_id.clone(),
            reasoning: ReasoningUsed {
                effort: self.effort.map(effort_name),
                summary: self.summary.map(|SummaryMode::Auto| "auto"),
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
    /// The wire item, with its text when `whole` (else as response.output_item.added has it),
    /// a whole reasoning item with its `encrypted_content` when `seal`.
    fn item(&self, status: OutputItemStatus, whole: bool, seal: bool) -> OutputItem {
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
                encrypted_content: (whole && seal).then(|| sealed(text)),
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

/// Where a finished response is kept: the store's owner, and the items before its output with
/// their tags.
struct Keep {
    store: Arc<ResponseStore>,
    items: Vec<Item>,
    tags: Vec<Tag>,
}

/// The state machine from the engine's events to the response object and its stream events
/// (module note).
struct Builder {
    response: ResponseObject,
    open: Option<Open>,
    said: Vec<(Tag, Item)>,
    streaming: bool,
    include_reasoning: bool,
    seq: u64,
    events: Vec<ResponseEvent>,
    keep: Option<Keep>,
}

impl Builder {
    /// The builder of `response`, streamed or not, with reasoning items' `encrypted_content`
    /// when `include_reasoning`, kept by `keep` when done.
    fn new(
        response: ResponseObject,
        streaming: bool,
        include_reasoning: bool,
        keep: Option<Keep>,
    ) -> Builder {
        let mut b = Builder {
            response,
            open: None,
            said: Vec::new(),
            streaming,
            include_reasoning,
            seq: 0,
            events: Vec::new(),
            keep,
        };
        let r = b.response.clone();
        b.emit(|| EventBody::Created {
            response: r.clone(),
        });
        b.emit(|| EventBody::InProgress { response: r });
        if streaming {
            b.place();
        }
        b
    }

    /// Keeps the response in progress, with its inputs, when asked to keep it: a stream's
    /// client knows its id from `response.created` on.
    fn place(&mut self) {
        let Some(k) = &self.keep else {
            return;
        };
        let (items, tags) = (k.items.clone(), k.tags.clone());
        if let Some(stored) = self.stored(items, tags, k.items.len(), false) {
            k.store.put(self.response.id.clone(), stored);
        }
    }

    /// The response as it is now with `items` (the first `inputs` its inputs) and their
    /// `tags`, for the store; `None` if it did not serialize, which a response object always
    /// does (its maps have string keys).
    fn stored(
        &self,
        items: Vec<Item>,
        tags: Vec<Tag>,
        inputs: usize,
        finished: bool,
    ) -> Option<Stored> {
        let response = serde_json::to_string(&self.response).ok()?;
        Some(Stored {
            response,
            items,
            tags,
            inputs,
            finished,
        })
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
        let item = open.item(OutputItemStatus::InProgress, false, false);
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
        let whole = open.item(status, true, self.include_reasoning);
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
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    part: part(reasoning, &text),
                });
                let item = match reasoning {
                    true => Item::Reasoning(text),
                    false => Item::Message {
                        role: Role::Assistant,
                        text,
                    },
                };
                self.said.push((Tag { id, status }, item));
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => {
                self.emit(|| EventBody::FunctionCallArgumentsDone {
                    item_id: id.clone(),
                    output_index,
                    name: name.clone(),
                    arguments: arguments.clone(),
                });
                let item = Item::Call {
                    call_id,
                    name,
                    arguments,
                };
                self.said.push((Tag { id, status }, item));
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
                id: request_id(if reasoning { "rs_" } else { "msg_" }),
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
                    id: request_id("fc_"),
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
        self.keep();
        let response = self.response.clone();
        self.emit(|| match complete {
            true => EventBody::Completed { response },
            false => EventBody::Incomplete { response },
        });
    }

    /// Keeps the response as it is now, with its items, when asked to; streamed, in place of
    /// the response in progress, unless that was deleted since.
    fn keep(&mut self) {
        let Some(Keep {
            store,
            mut items,
            mut tags,
        }) = self.keep.take()
        else {
            return;
        };
        let inputs = items.len();
        for (tag, item) in self.said.drain(..) {
            tags.push(tag);
            items.push(item);
        }
        let id = self.response.id.clone();
        match (self.stored(items, tags, inputs, true), self.streaming) {
            (Some(stored), true) => store.update(id, stored),
            (Some(stored), false) => store.put(id, stored),
            (None, _) => {}
        }
    }

    /// Ends the stream of a failed response; keeps it (status `failed`, its `error`, the items
    /// so far) when asked to.
    fn failed(&mut self, e: &ApiError) {
        self.close(OutputItemStatus::Incomplete);
        self.response.status = ResponseStatus::Failed;
        // OpenAI's `error.code` is one of a closed list (strict clients refuse others), with no
        // code of aubier's failures (engine_error, grammar_limit): `server_error`, the message
        // saying what failed.
        self.response.error = Some(ResponseError {
            code: "server_error".to_owned(),
            message: e.message.clone(),
        });
        self.keep();
        let response = self.response.clone();
        self.emit(|| EventBody::Failed { response });
    }
}

/// A new id for an input item: `msg_`, `rs_`, `fc_` or `fco_` (by its type) and 32 hex digits.
fn new_item_id(item: &Item) -> String {
    request_id(match item {
        Item::Message { .. } => "msg_",
        Item::Reasoning(_) => "rs_",
        Item::Call { .. } => "fc_",
        Item::Output { .. } => "fco_",
    })
}

/// 400 for `input[i]`, an item_reference to an item no kept response holds, with OpenAI's
/// message (and its null `code`).
fn item_not_found(i: usize, id: &str) -> ApiError {
    ApiError {
        code: None,
        ..ApiError::bad_value(
            &format!("input[{i}].id"),
            format!(
                "Item with id '{id}' not found. Items are not persisted when `store` is set to \
                 false; aubier keeps those of the last {STORE_RESPONSES} responses stored with \
                 'store' for {} minutes. Try again with `store` set to true, or remove this \
                 item from your input.",
                STORE_TTL.as_secs() / 60
            ),
        )
    }
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

impl RequestKind for ResponsesKind {
    const PROMPT_PARAM: &'static str = "input";
    const ID_PREFIX: &'static str = "resp_";
    type Chunks = ResponseEvents;

    /// Errors: as [`parse`]'s, a 400 `previous_response_not_found` for an id the store does
    /// not hold, a 400 naming `previous_response_id` for a response still in progress, and
    /// 400s naming `input[i].id` for an item sent with (or referring to) an id already in the
    /// conversation and for an `item_reference` to an item no kept response holds.
    fn parse(app: &AppState, bytes: &[u8]) -> Result<ResponsesKind, ApiError> {
        let mut params = parse(bytes)?;
        // Another model is its 404 before the conversation is checked, as on the other routes.
        app.check_model(&params.generation.model)?;
        let (mut items, mut tags) = match &params.previous_response_id {
            None => (Vec::new(), Vec::new()),
            Some(id) => {
                let s = app.responses.get(id).ok_or_else(|| not_found(id))?;
                if !s.finished {
                    return Err(ApiError::bad_value(
                        "previous_response_id",
                        format!(
                            "Previous response with id '{id}' is still in progress: continue \
                             it once it has finished."
                        ),
                    ));
                }
                (s.items.clone(), s.tags.clone())
            }
        };
        let stored = items.len();
        no_duplicates(&tags, &params.input)?;
        for (i, sent) in std::mem::take(&mut params.input).into_iter().enumerate() {
            let (tag, item) = match sent {
                Sent::Item(item, id) => {
                    let id = id.filter(|id| !id.is_empty());
                    let tag = Tag {
                        id: id.unwrap_or_else(|| new_item_id(&item)),
                        status: OutputItemStatus::Completed,
                    };
                    (tag, item)
                }
                Sent::Reference(id) => app
                    .responses
                    .item(&id)
                    .ok_or_else(|| item_not_found(i, &id))?,
            };
            tags.push(tag);
            items.push(item);
        }
        answerable(&items, stored)?;
        let (messages, origins) = messages(params.instructions.as_deref(), &items);
        let chat = ChatRequest {
            messages,
            tools: params.tools.take(),
            reasoning_effort: params.effort.map(|e| effort_name(e).to_owned()),
            continue_final_message: false,
        };
        chat.validate()
            .map_err(|e| in_item_terms(e, &origins, &items, stored))?;
        Ok(ResponsesKind {
            params,
            items,
            tags,
            store: app.responses.clone(),
            chat,
        })
    }

    fn generation(&self) -> &Generation {
        &self.params.generation
    }

    fn take_prompt(&mut self) -> PromptSource {
        let chat = std::mem::take(&mut self.chat);
        PromptSource::Build(Box::new(move |t: &TextModel, limit| {
            t.chat_prompt_within(&chat, limit).map_err(renamed)
        }))
    }

    fn mode(&self) -> TextMode {
        TextMode::Chat {
            stops: Vec::new(),
            tool_calls: self.params.structured.tool_calls,
        }
    }

    fn take_grammar(&mut self) -> Option<GrammarSpec> {
        self.params.structured.grammar.take()
    }

    fn rename(e: ApiError) -> ApiError {
        renamed(e)
    }

    fn answer(self, _app: &AppState, head: Head, answers: Vec<Collected>) -> Response {
        let mut b = self.builder(&head, false);
        for a in answers {
            b.chunk(&Chunk {
                choice: a.summary.choice,
                delta: Delta {
                    reasoning: a.reasoning,
                    content: a.content,
                    tool_calls: a
                        .tool_calls
                        .into_iter()
                        .enumerate()
                        .map(|(index, c)| ToolCallDelta {
                            index,
                            head: Some((c.id, c.name)),
                            arguments: c.arguments,
                        })
                        .collect(),
                },
                logprobs: Vec::new(),
            });
            b.done(&a.summary);
        }
        Json(b.response).into_response()
    }

    fn chunks(self, _app: &AppState, head: Head) -> ResponseEvents {
        ResponseEvents(self.builder(&head, true))
    }
}

impl ResponsesKind {
    /// The builder of this request's response, keeping it in the store when `store` is set.
    fn builder(self, head: &Head, streaming: bool) -> Builder {
        let keep = self.params.store.then_some(Keep {
            store: self.store,
            items: self.items,
            tags: self.tags,
        });
        let include = self.params.include_reasoning;
        Builder::new(self.params.head(&head.object), streaming, include, keep)
    }
}

/// The typed SSE events of a streamed response (module note): `event: <type>` and the event's
/// data; no `[DONE]` (the last event is `response.completed`, `.incomplete` or `.failed`).
pub(super) struct ResponseEvents(Builder);

/// A stream dropped before its end (the client went away) forgets its response in progress.
impl Drop for ResponseEvents {
    fn drop(&mut self) {
        if let Some(k) = self.0.keep.take() {
            k.store.forget(&self.0.response.id);
        }
    }
}

impl ChunkFormat for ResponseEvents {
    type Chunk = ResponseEvent;
    const DONE_MARKER: bool = false;

    fn opening(&mut self, _choice: usize) -> Vec<ResponseEvent> {
        self.0.take()
    }

    fn text(&mut self, chunk: &Chunk) -> Vec<ResponseEvent> {
        self.0.chunk(chunk);
        self.0.take()
    }

    fn finish(&mut self, summary: &Summary) -> Vec<ResponseEvent> {
        self.0.done(summary);
        self.0.take()
    }

    fn usage(&mut self, _done: &[Summary]) -> Vec<ResponseEvent> {
        Vec::new()
    }

    fn event(&self, ev: &ResponseEvent) -> SseEvent {
        sse_data(ev).event(ev.body.name())
    }

    fn failure(&mut self, error: &ApiError) -> Vec<SseEvent> {
        self.0.failed(error);
        let events = self.0.take();
        events.iter().map(|ev| self.event(ev)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_reasoning_unseals_and_other_blobs_do_not() {
        for text in ["", "plan", "déjà vu\n[THINK] ✓"] {
            assert_eq!(unsealed(&sealed(text)).as_deref(), Some(text));
        }
        let plan = sealed("plan");
        let body = plan.strip_prefix(SEALED_PREFIX).expect("prefixed");
        for blob in [
            body,
            "gAAAAABo",
            "aubier.reasoning.v1.!!",
            "aubier.reasoning.v1./w==",
        ] {
            assert_eq!(unsealed(blob), None, "{blob}");
        }
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
        let (m, origins) = messages(Some("be brief"), &items);
        assert_eq!(origins, [None, Some(0), Some(1), Some(4)]);
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::System, Role::User, Role::Assistant, Role::Tool]
        );
        assert_eq!(m[2].tool_calls.as_ref().map(Vec::len), Some(1));
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_1"));
    }
}
