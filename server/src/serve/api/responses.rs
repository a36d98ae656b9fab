//! The wire types of `POST /v1/responses` (OpenAI API reference, Responses): the request body,
//! the response object and the typed events of its stream.
//!
//! Request items and content parts are tagged by `type`; they are read as JSON first and then as
//! the type their tag names, so an unknown key is still refused by name (`input[2].foo`), and an
//! item or part type aubier does not implement (`web_search_call`, `input_image`) is kept as
//! [`InputItem::Other`] / [`ContentPart::Other`] for `super::super::responses` to refuse by name.
//! Response-side types have names of their own: a name the request side defines too would be
//! defined twice in `/openapi.json`.

use super::request::{refused_fields, RefusedField};
use super::request::{
    sampling_request, FormatType, FunctionType, ReasoningEffort, SamplingFields, ToolChoiceMode,
    F32_ROUNDS_TO_ZERO, NAME_PATTERN,
};
use super::scalar::{
    Count, DisabledDefault, EmptyDefault, FalseDefault, ModelId, NullDefault, Refused,
    ServiceTierDefault, StrOr, TopK, UInt, VerbosityDefault,
};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// `T` read from a JSON object only: serde's derived structs read arrays too (`[null, 1]` as
/// the fields in order), which the schema does not allow. Fields keep their paths.
#[derive(Clone, Debug, PartialEq)]
pub struct Object<T>(pub T);

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ObjectVisitor(PhantomData)).map(Object)
    }
}

impl<T: JsonSchema> JsonSchema for Object<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }

    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        T::json_schema(g)
    }
}

/// Reads a `type`-tagged object: the tag and the whole object, for a second read as the tagged
/// type (or `None` for the tag when there is none).
fn tagged<'de, D: Deserializer<'de>>(d: D) -> Result<(Option<String>, Value), D::Error> {
    let v = Value::deserialize(d)?;
    let Value::Object(map) = &v else {
        return Err(de::Error::custom("must be an object with a 'type'"));
    };
    let tag = match map.get("type") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(de::Error::custom(format!(
                "must have a string 'type', got {other}"
            )))
        }
    };
    Ok((tag, v))
}

/// `v` read as `T`, its errors passed on as `D`'s (serde's "unknown field `x`" keeps its form,
/// so the request reader names `x` under the object's path).
fn read_as<'de, T: DeserializeOwned, D: Deserializer<'de>>(v: Value) -> Result<T, D::Error> {
    serde_json::from_value(v).map_err(de::Error::custom)
}

/// Declares a one-value enum: the `type` of one tagged object.
macro_rules! type_tag {
    ($($(#[$doc:meta])* $name:ident = $value:literal;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
        pub enum $name {
            /// The only value.
            #[serde(rename = $value)]
            Tag,
        }
    )*};
}

type_tag! {
    /// `"message"`.
    MessageTag = "message";
    /// `"function_call"`.
    FunctionCallTag = "function_call";
    /// `"function_call_output"`.
    FunctionCallOutputTag = "function_call_output";
    /// `"reasoning"`.
    ReasoningTag = "reasoning";
    /// `"item_reference"`.
    ItemReferenceTag = "item_reference";
    /// `"input_text"`.
    InputTextTag = "input_text";
    /// `"output_text"`.
    OutputTextTag = "output_text";
    /// `"reasoning_text"`.
    ReasoningTextTag = "reasoning_text";
    /// `"summary_text"`.
    SummaryTextTag = "summary_text";
}

/// The author of an input message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InputRole {
    /// A user turn.
    User,
    /// Instructions.
    System,
    /// Instructions (OpenAI's newer name of system).
    Developer,
    /// An earlier answer.
    Assistant,
}

/// The status an item sent back as input carries (ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InputItemStatus {
    /// Being generated.
    InProgress,
    /// Finished.
    Completed,
    /// Cut off by max_output_tokens.
    Incomplete,
}

/// The phase OpenAI labels an assistant message with, which clients are asked to send back
/// (ignored: the template has no place for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MessagePhase {
    /// Intermediate commentary.
    Commentary,
    /// The final answer.
    FinalAnswer,
}

/// `{"type": "input_text", "text": …}`.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputText {
    /// `"input_text"`.
    #[serde(rename = "type")]
    pub kind: InputTextTag,
    /// The text.
    pub text: String,
}

/// `{"type": "output_text", "text": …}`: an earlier answer's text, sent back.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputTextPart {
    /// `"output_text"`.
    #[serde(rename = "type")]
    pub kind: OutputTextTag,
    /// The text.
    pub text: String,
    /// Ignored (aubier writes none).
    pub annotations: Option<Vec<Value>>,
    /// Ignored (aubier writes none).
    pub logprobs: Option<Vec<Value>>,
}

/// One content part of an input message.
#[derive(Clone, Debug, PartialEq)]
pub enum ContentPart {
    /// `input_text`.
    Input(InputText),
    /// `output_text`.
    Output(OutputTextPart),
    /// Another type (images, files, audio, refusals): not implemented, refused by name.
    Other(String),
}

impl ContentPart {
    /// The part's text, `None` for [`ContentPart::Other`].
    pub fn text(&self) -> Option<&str> {
        match self {
            ContentPart::Input(p) => Some(&p.text),
            ContentPart::Output(p) => Some(&p.text),
            ContentPart::Other(_) => None,
        }
    }
}

impl<'de> Deserialize<'de> for ContentPart {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match tagged(d)? {
            (Some(t), v) if t == "input_text" => read_as::<_, D>(v).map(ContentPart::Input),
            (Some(t), v) if t == "output_text" => read_as::<_, D>(v).map(ContentPart::Output),
            (Some(t), _) => Ok(ContentPart::Other(t)),
            (None, _) => Err(de::Error::missing_field("type")),
        }
    }
}

impl JsonSchema for ContentPart {
    fn schema_name() -> Cow<'static, str> {
        "InputContentPart".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({"anyOf": [g.subschema_for::<InputText>(), g.subschema_for::<OutputTextPart>()]})
    }
}

/// A message of the input: a string or a list of text parts.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    /// `"message"` (may be left out).
    #[serde(rename = "type")]
    pub kind: Option<MessageTag>,
    /// Who wrote it.
    pub role: InputRole,
    /// A string, or input_text / output_text parts (joined).
    pub content: StrOr<String, Vec<ContentPart>>,
    /// The item's id, kept (left out or empty: aubier gives one; one already in the
    /// conversation is refused).
    pub id: Option<String>,
    /// An earlier answer's status (ignored).
    pub status: Option<InputItemStatus>,
    /// An earlier answer's phase (ignored).
    pub phase: Option<MessagePhase>,
}

/// A function call of an earlier answer.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallItem {
    /// `"function_call"`.
    #[serde(rename = "type")]
    pub kind: FunctionCallTag,
    /// The id its function_call_output answers.
    #[schemars(length(min = 1))]
    pub call_id: String,
    /// The function called.
    #[schemars(pattern(NAME_PATTERN))]
    pub name: String,
    /// The JSON text of the arguments.
    pub arguments: String,
    /// The item's id, kept (left out or empty: aubier gives one; one already in the
    /// conversation is refused).
    pub id: Option<String>,
    /// The item's status (ignored).
    pub status: Option<InputItemStatus>,
}

/// The result of a function call.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallOutputItem {
    /// `"function_call_output"`.
    #[serde(rename = "type")]
    pub kind: FunctionCallOutputTag,
    /// The call it answers.
    #[schemars(length(min = 1))]
    pub call_id: String,
    /// The result: a string or input_text parts (joined).
    pub output: StrOr<String, Vec<ContentPart>>,
    /// The item's id, kept (left out or empty: aubier gives one; one already in the
    /// conversation is refused).
    pub id: Option<String>,
    /// The item's status (ignored).
    pub status: Option<InputItemStatus>,
}

/// A reasoning or summary text of a reasoning item.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasoningTextPart {
    /// `"reasoning_text"`.
    #[serde(rename = "type")]
    pub kind: ReasoningTextTag,
    /// The text.
    pub text: String,
}

/// A summary text of a reasoning item.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SummaryTextPart {
    /// `"summary_text"`.
    #[serde(rename = "type")]
    pub kind: SummaryTextTag,
    /// The text.
    pub text: String,
}

/// The reasoning of an earlier answer, sent back: rendered as its past reasoning.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasoningItem {
    /// `"reasoning"`.
    #[serde(rename = "type")]
    pub kind: ReasoningTag,
    /// Summaries (used when there is no content).
    pub summary: Vec<Object<SummaryTextPart>>,
    /// The reasoning text.
    pub content: Option<Vec<Object<ReasoningTextPart>>>,
    /// The item's id, kept (left out or empty: aubier gives one; one already in the
    /// conversation is refused).
    pub id: Option<String>,
    /// The item's status (ignored).
    pub status: Option<InputItemStatus>,
    /// The reasoning as aubier wrote it with `include` `reasoning.encrypted_content` (used when
    /// there is no content; one aubier did not write is refused).
    #[schemars(pattern(r"^aubier\.reasoning\.v1\.[A-Za-z0-9+/]*={0,2}$"))]
    pub encrypted_content: Option<String>,
}

/// An item of a stored response, by the id it is listed under (OpenAI's `ItemReferenceParam`).
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemReference {
    /// `"item_reference"` (may be left out or null).
    #[serde(rename = "type")]
    pub kind: Option<ItemReferenceTag>,
    /// The item's id: one of a stored response's input or output items.
    pub id: String,
}

/// One item of `input`.
#[derive(Clone, Debug, PartialEq)]
pub enum InputItem {
    /// A message (`type` `message`, or no `type` with a `role`).
    Message(InputMessage),
    /// An earlier function call.
    FunctionCall(FunctionCallItem),
    /// A function call's result.
    FunctionCallOutput(FunctionCallOutputItem),
    /// Earlier reasoning.
    Reasoning(ReasoningItem),
    /// An item of a stored response (`type` `item_reference`, or no `type` with an `id` and
    /// no `role`).
    Reference(ItemReference),
    /// Another item type (built-in tool calls): not implemented, refused by name.
    Other(String),
}

impl InputItem {
    /// The `id` it was sent with.
    pub fn id(&self) -> Option<&str> {
        match self {
            InputItem::Message(m) => m.id.as_deref(),
            InputItem::FunctionCall(c) => c.id.as_deref(),
            InputItem::FunctionCallOutput(o) => o.id.as_deref(),
            InputItem::Reasoning(r) => r.id.as_deref(),
            InputItem::Reference(r) => Some(&r.id),
            InputItem::Other(_) => None,
        }
    }
}

impl<'de> Deserialize<'de> for InputItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (tag, v) = tagged(d)?;
        // Without a type: a message has a role; an item reference only an id.
        let reference = v.get("id").is_some() && v.get("role").is_none();
        match tag.as_deref() {
            None if reference => read_as::<_, D>(v).map(InputItem::Reference),
            Some("item_reference") => read_as::<_, D>(v).map(InputItem::Reference),
            None | Some("message") => read_as::<_, D>(v).map(InputItem::Message),
            Some("function_call") => read_as::<_, D>(v).map(InputItem::FunctionCall),
            Some("function_call_output") => read_as::<_, D>(v).map(InputItem::FunctionCallOutput),
            Some("reasoning") => read_as::<_, D>(v).map(InputItem::Reasoning),
            Some(other) => Ok(InputItem::Other(other.to_owned())),
        }
    }
}

impl JsonSchema for InputItem {
    fn schema_name() -> Cow<'static, str> {
        "InputItem".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({"anyOf": [
            g.subschema_for::<InputMessage>(),
            g.subschema_for::<FunctionCallItem>(),
            g.subschema_for::<FunctionCallOutputItem>(),
            g.subschema_for::<ReasoningItem>(),
            g.subschema_for::<ItemReference>(),
        ]})
    }
}

/// `input`: one user message as a string, or a list of items.
pub type ResponseInput = StrOr<String, Vec<InputItem>>;

/// A function tool, in the Responses API's flat form.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionTool {
    /// `"function"`.
    #[serde(rename = "type")]
    pub kind: FunctionType,
    /// Distinct among the tools.
    #[schemars(pattern(NAME_PATTERN))]
    pub name: String,
    /// Rendered into the prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema of the arguments; one the grammar engine cannot enforce is a 400 naming
    /// tools[i].parameters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// Default true (the Responses API's default): the arguments are held to the parameters
    /// schema, objects closed to unlisted keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice` naming a function.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionChoice {
    /// `"function"`.
    #[serde(rename = "type")]
    pub kind: FunctionType,
    /// One of the tools' names.
    #[schemars(pattern(NAME_PATTERN))]
    pub name: String,
}

/// `tool_choice`: a mode or a named function.
pub type ResponseToolChoice = StrOr<ToolChoiceMode, Object<FunctionChoice>>;

/// `text.format`: text, any JSON object, or JSON valid against a schema (flat: name and schema
/// beside the type).
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "if" = {"properties": {"type": {"const": "json_schema"}}},
    "then" = {"required": ["name", "schema"], "properties": {"schema": {"type": "object"}}},
    "else" = {"properties": {"name": {"type": "null"}, "schema": {"type": "null"},
        "description": {"type": "null"}, "strict": {"type": "null"}}},
))]
pub struct TextFormat {
    /// text (default), json_object, or json_schema (with name and schema).
    #[serde(rename = "type")]
    pub kind: FormatType,
    /// The schema's name (json_schema only).
    #[schemars(pattern(NAME_PATTERN))]
    pub name: Option<String>,
    /// The JSON Schema the text must match (json_schema only; enforced whether or not strict
    /// is set).
    pub schema: Option<Map<String, Value>>,
    /// What the schema is for (json_schema only).
    pub description: Option<String>,
    /// json_schema only; enforced either way.
    pub strict: Option<bool>,
}

/// `text`.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    /// The output's format.
    pub format: Option<Object<TextFormat>>,
    /// Answer length hint. Not implemented: accepted only at its default.
    #[serde(default)]
    pub verbosity: Refused<VerbosityDefault>,
}

/// `reasoning.summary`: the one value aubier can honour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SummaryMode {
    /// The model chooses (and writes no summary).
    Auto,
}

/// What `include` may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum Includable {
    /// Reasoning items carry `encrypted_content`, to send back with `store: false`.
    #[serde(rename = "reasoning.encrypted_content")]
    ReasoningEncryptedContent,
}

/// `reasoning`.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasoningConfig {
    /// `high` reasons in [THINK]…[/THINK] first (returned as a reasoning item); `none` (the
    /// default) does not. The model knows no other effort.
    pub effort: Option<ReasoningEffort>,
    /// Reasoning summaries: `auto` lets the model choose, and it writes none (a reasoning
    /// item's summary stays empty); `concise` and `detailed` are refused.
    pub summary: Option<SummaryMode>,
    /// The older name of summary, read the same way (summary wins when both are sent).
    pub generate_summary: Option<SummaryMode>,
}

/// `stream_options`.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseStreamOptions {
    /// Accepted and without effect: aubier never pads its events.
    pub include_obfuscation: Option<bool>,
}

sampling_request! {
/// A `POST /v1/responses` body.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    description = "stream_options only with 'stream': true.",
    extend(
        "if" = {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
        "then" = {"required": ["stream"], "properties": {"stream": {"const": true}}},
    )
)]
pub struct ResponseRequest {
    /// The served model id.
    pub model: ModelId,
    /// One user message as a string, or a list of messages, function calls, function call
    /// outputs and reasoning items, oldest first.
    pub input: ResponseInput,
    /// A system message before the input (not carried over by previous_response_id).
    pub instructions: Option<String>,
    /// Function tools, distinct names, in the flat form.
    pub tools: Option<Vec<Object<FunctionTool>>>,
    /// none forbids calls; auto (default) lets the model choose; required or a named function
    /// forces a call (needs tools).
    pub tool_choice: Option<ResponseToolChoice>,
    /// Allow several calls in one answer (default true).
    pub parallel_tool_calls: Option<bool>,
    /// The output's format.
    pub text: Option<Object<TextConfig>>,
    /// The reasoning effort.
    pub reasoning: Option<Object<ReasoningConfig>>,
    /// Most tokens to generate (reasoning included); default: up to the KV capacity, to which
    /// it is clamped (status 'incomplete').
    pub max_output_tokens: Option<Count>,
    /// Answer with typed server-sent events.
    pub stream: Option<bool>,
    /// Only with 'stream': true.
    pub stream_options: Option<Object<ResponseStreamOptions>>,
    /// Continue a stored response: its input and output items come before this input.
    pub previous_response_id: Option<String>,
    /// Keep the response for previous_response_id (default true; the last 256, for an hour).
    pub store: Option<bool>,
    /// Extra output data: `reasoning.encrypted_content` alone.
    pub include: Option<Vec<Includable>>,
    /// Stored-response tags. Not implemented: accepted only at its default.
    #[serde(default)]
    pub metadata: Refused<EmptyDefault>,
    /// Context truncation. Not implemented: accepted only at its default.
    #[serde(default)]
    pub truncation: Refused<DisabledDefault>,
    /// Background mode. Not implemented: accepted only at its default.
    #[serde(default)]
    pub background: Refused<FalseDefault>,
    /// Server-side conversations. Not implemented: accepted only at its default.
    #[serde(default)]
    pub conversation: Refused<NullDefault>,
    /// Stored prompts. Not implemented: accepted only at its default.
    #[serde(default)]
    pub prompt: Refused<NullDefault>,
    /// A limit on built-in tool calls. Not implemented: accepted only at its default.
    #[serde(default)]
    pub max_tool_calls: Refused<NullDefault>,
    /// Log-probabilities. Not implemented: accepted only at its default.
    #[serde(default)]
    pub top_logprobs: Refused<NullDefault>,
    /// Processing tier. Not implemented: accepted only at its default.
    #[serde(default)]
    pub service_tier: Refused<ServiceTierDefault>,
    /// Prompt cache retention. Not implemented: accepted only at its default.
    #[serde(default)]
    pub prompt_cache_retention: Refused<NullDefault>,
    /// Prompt cache options. Not implemented: accepted only at its default.
    #[serde(default)]
    pub prompt_cache_options: Refused<NullDefault>,
    /// Context management. Not implemented: accepted only at its default.
    #[serde(default)]
    pub context_management: Refused<NullDefault>,
    /// Moderation. Not implemented: accepted only at its default.
    #[serde(default)]
    pub moderation: Refused<NullDefault>,
    /// Identifies the caller; does not change the answer.
    pub user: Option<String>,
    /// Identifies the caller; does not change the answer.
    pub safety_identifier: Option<String>,
    /// Identifies the caller; does not change the answer.
    pub prompt_cache_key: Option<String>,
}
}

refused_fields! {
    ResponseRequest {
        metadata, truncation, background, conversation, prompt, max_tool_calls,
        top_logprobs, service_tier, prompt_cache_retention, prompt_cache_options,
        context_management, moderation
    }
    TextConfig { verbosity }
}

// ---------------------------------------------------------------------------------------------
// The response object.

/// A response's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResponseStatus {
    /// Being generated (the stream's first events).
    InProgress,
    /// Finished.
    Completed,
    /// Cut off by max_output_tokens or the context.
    Incomplete,
    /// The engine failed (the stream's response.failed).
    Failed,
}

/// An output item's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputItemStatus {
    /// Being generated.
    InProgress,
    /// Finished.
    Completed,
    /// Cut off by max_output_tokens or the context.
    Incomplete,
}

/// The text of an answer.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputText {
    /// `"output_text"`.
    #[serde(rename = "type")]
    #[schemars(extend("const" = "output_text"))]
    pub kind: &'static str,
    /// The text.
    pub text: String,
    /// Always empty.
    #[schemars(length(max = 0))]
    pub annotations: Vec<Value>,
    /// Always empty.
    #[schemars(length(max = 0))]
    pub logprobs: Vec<Value>,
}

/// The reasoning text of a reasoning item.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasoningText {
    /// `"reasoning_text"`.
    #[serde(rename = "type")]
    #[schemars(extend("const" = "reasoning_text"))]
    pub kind: &'static str,
    /// The text.
    pub text: String,
}

/// An answer's text, as a message item.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputMessage {
    /// `msg_` and 32 hex digits.
    #[schemars(pattern(r"^msg_[0-9a-f]{32}$"))]
    pub id: String,
    /// `"message"`.
    #[serde(rename = "type")]
    #[schemars(extend("const" = "message"))]
    pub kind: &'static str,
    /// `"assistant"`.
    #[schemars(extend("const" = "assistant"))]
    pub role: &'static str,
    /// Its status.
    pub status: OutputItemStatus,
    /// One output_text (none in response.output_item.added).
    #[schemars(length(max = 1))]
    pub content: Vec<OutputText>,
}

/// A function call of the answer.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputFunctionCall {
    /// `fc_` and 32 hex digits.
    #[schemars(pattern(r"^fc_[0-9a-f]{32}$"))]
    pub id: String,
    /// `"function_call"`.
    #[serde(rename = "type")]
    #[schemars(extend("const" = "function_call"))]
    pub kind: &'static str,
    /// `call_` and 24 hex digits: what the function_call_output answers.
    #[schemars(pattern(r"^call_[0-9a-f]{24}$"))]
    pub call_id: String,
    /// The function called.
    pub name: String,
    /// The JSON text as generated (cut short when the status is incomplete).
    pub arguments: String,
    /// Its status.
    pub status: OutputItemStatus,
}

/// The reasoning of the answer (`reasoning.effort` high).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputReasoning {
    /// `rs_` and 32 hex digits (listed by `input_items`: an input item's is the `id` it was
    /// sent with, if any).
    pub id: String,
    /// `"reasoning"`.
    #[serde(rename = "type")]
    #[schemars(extend("const" = "reasoning"))]
    pub kind: &'static str,
    /// Always empty: the model writes no summaries.
    #[schemars(length(max = 0))]
    pub summary: Vec<Value>,
    /// The reasoning text (none in response.output_item.added).
    #[schemars(length(max = 1))]
    pub content: Vec<ReasoningText>,
    /// With `include` `reasoning.encrypted_content`, once the item is done: the reasoning to
    /// send back as input with `store: false` (not encrypted: `aubier.reasoning.v1.` and the
    /// text in base64).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encrypted_content: Option<String>,
    /// Its status.
    pub status: OutputItemStatus,
}

/// One output item.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum OutputItem {
    /// Reasoning.
    Reasoning(OutputReasoning),
    /// Text.
    Message(OutputMessage),
    /// A function call.
    FunctionCall(OutputFunctionCall),
}

/// `usage.input_tokens_details`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputTokensDetails {
    /// Leading prompt tokens reused from the previous request (--prompt-cache).
    pub cached_tokens: usize,
    /// Always 0: filling aubier's cache costs nothing apart.
    pub cache_write_tokens: usize,
}

/// `usage.output_tokens_details`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputTokensDetails {
    /// Output tokens of the reasoning ([THINK] … [/THINK], markers included).
    pub reasoning_tokens: usize,
}

/// Token counts of a response.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseUsage {
    /// Tokens of the rendered prompt.
    pub input_tokens: usize,
    /// Where they came from.
    pub input_tokens_details: InputTokensDetails,
    /// Tokens generated.
    pub output_tokens: usize,
    /// What they were.
    pub output_tokens_details: OutputTokensDetails,
    /// input_tokens + output_tokens.
    pub total_tokens: usize,
}

/// Why a response is incomplete.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IncompleteDetails {
    /// `"max_output_tokens"` (max_output_tokens or the context reached).
    #[schemars(extend("const" = "max_output_tokens"))]
    pub reason: &'static str,
}

/// Why a response failed.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseError {
    /// `server_error` (a code of OpenAI's closed list; the message says what failed).
    pub code: String,
    /// What failed.
    pub message: String,
}

/// The reasoning settings the response ran with.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasoningUsed {
    /// `none` or `high`; null when not sent.
    #[schemars(extend("enum" = ["none", "high", null]))]
    pub effort: Option<&'static str>,
    /// `auto` when sent; else null.
    #[schemars(extend("enum" = ["auto", null]))]
    pub summary: Option<&'static str>,
}

fn object_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "object"})
}

fn objects_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "array", "items": {"type": "object"}})
}

fn tool_choice_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]})
}

/// A response (`"stream": false`, and in the stream's response.* events).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseObject {
    /// `resp_` and 32 hex digits.
    #[schemars(pattern(r"^resp_[0-9a-f]{32}$"))]
    pub id: String,
    /// `"response"`.
    #[schemars(extend("const" = "response"))]
    pub object: &'static str,
    /// Unix time of the request, in seconds.
    pub created_at: u64,
    /// Its status.
    pub status: ResponseStatus,
    /// With status failed: why.
    pub error: Option<ResponseError>,
    /// With status incomplete: why.
    pub incomplete_details: Option<IncompleteDetails>,
    /// The request's instructions.
    pub instructions: Option<String>,
    /// The request's max_output_tokens.
    pub max_output_tokens: Option<u64>,
    /// The served model id.
    pub model: String,
    /// Reasoning, text and function calls, in the order generated.
    pub output: Vec<OutputItem>,
    /// The request's parallel_tool_calls (default true).
    pub parallel_tool_calls: bool,
    /// The request's previous_response_id.
    pub previous_response_id: Option<String>,
    /// The reasoning settings.
    pub reasoning: ReasoningUsed,
    /// Whether the response is kept for previous_response_id.
    pub store: bool,
    /// The sampling temperature.
    pub temperature: f64,
    /// The nucleus mass.
    pub top_p: f64,
    /// `{"format": …}`: the request's text.format (default text).
    #[schemars(schema_with = "object_schema")]
    pub text: Value,
    /// The request's tool_choice (default auto).
    #[schemars(schema_with = "tool_choice_schema")]
    pub tool_choice: Value,
    /// The request's tools.
    #[schemars(schema_with = "objects_schema")]
    pub tools: Vec<Value>,
    /// `"disabled"`.
    #[schemars(extend("const" = "disabled"))]
    pub truncation: &'static str,
    /// Token counts (null until the response ends).
    pub usage: Option<ResponseUsage>,
    /// Always empty.
    #[schemars(extend("maxProperties" = 0))]
    pub metadata: Map<String, Value>,
}

// ---------------------------------------------------------------------------------------------
// Stream events.

/// A content part in response.content_part.added / .done.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Part {
    /// Of a message.
    Text(OutputText),
    /// Of a reasoning item.
    Reasoning(ReasoningText),
}

/// What one stream event says, tagged by its `type` (also the SSE `event:` field).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(tag = "type")]
pub enum EventBody {
    /// The first event.
    #[serde(rename = "response.created")]
    Created {
        /// status in_progress, no output.
        response: ResponseObject,
    },
    /// The second event.
    #[serde(rename = "response.in_progress")]
    InProgress {
        /// status in_progress, no output.
        response: ResponseObject,
    },
    /// An output item begins.
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        /// Its place in output.
        output_index: usize,
        /// The item, empty.
        item: OutputItem,
    },
    /// An item's content part begins.
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        /// The item.
        item_id: String,
        /// Its place in output.
        output_index: usize,
        /// The part's place in the item's content.
        content_index: usize,
        /// The part, empty.
        part: Part,
    },
    /// More answer text.
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        /// The message item.
        item_id: String,
        /// Its place in output.
        output_index: usize,
        /// The part's place in the item's content.
        content_index: usize,
        /// The text (whole characters).
        delta: String,
        /// Always empty.
        #[schemars(length(max = 0))]
        logprobs: Vec<Value>,
    },
    /// The answer text, whole.
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        /// The message item.
        item_id: String,
        /// Its place in output.
        output_index: usize,
        /// The part's place in the item's content.
        content_index: usize,
        /// The whole text.
        text: String,
        /// Always empty.
        #[schemars(length(max = 0))]
        logprobs: Vec<Value>,
    },
    /// More reasoning text.
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        /// The reasoning item.
        item_id: String,
        /// Its place in output.
        output_index: usize,
        /// The part's place in the item's content.
        content_index: usize,
        /// The text (whole characters).
        delta: String,
    },
    /// The reasoning text, whole.
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        /// The reasoning item.
        item_id: String,
        /// Its place in output.
        output_index: usize,
        /// The part's place in the item's content.
        content_index: usize,
        /// The whole text.
        text: String,
    },
    /// An item's content part, whole.
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        /// The item.
        item_id: String,
        /// Its place in output.
        output_index: usize,
        /// The part's place in the item's content.
        content_index: usize,
        /// The whole part.
        part: Part,
    },
    /// More of a call's arguments.
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        /// The function_call item.
        item_id: String,
        /// Its place in output.
        output_index: usize,
        /// The next fragment (whole characters).
        delta: String,
    },
    /// A call's arguments, whole.
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        /// The function_call item.
        item_id: String,
        /// Its place in output.
        output_index: usize,
        /// The function called.
        name: String,
        /// The whole JSON text.
        arguments: String,
    },
    /// An output item ends.
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        /// Its place in output.
        output_index: usize,
        /// The whole item.
        item: OutputItem,
    },
    /// The last event of a finished response.
    #[serde(rename = "response.completed")]
    Completed {
        /// The whole response.
        response: ResponseObject,
    },
    /// The last event of a response cut off by max_output_tokens or the context.
    #[serde(rename = "response.incomplete")]
    Incomplete {
        /// The whole response, with incomplete_details.
        response: ResponseObject,
    },
    /// The last event when the engine failed.
    #[serde(rename = "response.failed")]
    Failed {
        /// The response so far, with error.
        response: ResponseObject,
    },
}

impl EventBody {
    /// The event's `type`.
    pub fn name(&self) -> &'static str {
        match self {
            EventBody::Created { .. } => "response.created",
            EventBody::InProgress { .. } => "response.in_progress",
            EventBody::OutputItemAdded { .. } => "response.output_item.added",
            EventBody::ContentPartAdded { .. } => "response.content_part.added",
            EventBody::OutputTextDelta { .. } => "response.output_text.delta",
            EventBody::OutputTextDone { .. } => "response.output_text.done",
            EventBody::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            EventBody::ReasoningTextDone { .. } => "response.reasoning_text.done",
            EventBody::ContentPartDone { .. } => "response.content_part.done",
            EventBody::FunctionCallArgumentsDelta { .. } => {
                "response.function_call_arguments.delta"
            }
            EventBody::FunctionCallArgumentsDone { .. } => "response.function_call_arguments.done",
            EventBody::OutputItemDone { .. } => "response.output_item.done",
            EventBody::Completed { .. } => "response.completed",
            EventBody::Incomplete { .. } => "response.incomplete",
            EventBody::Failed { .. } => "response.failed",
        }
    }
}

/// One event of a response stream: its body and its place in the stream.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct ResponseEvent {
    /// The event.
    #[serde(flatten)]
    pub body: EventBody,
    /// 0, 1, 2, … in stream order.
    pub sequence_number: u64,
}

/// `DELETE /v1/responses/{id}`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseDeleted {
    /// The deleted response's id.
    pub id: String,
    /// `"response"`.
    #[schemars(extend("const" = "response"))]
    pub object: &'static str,
    /// Always true (an id not stored is a 404).
    #[schemars(extend("const" = true))]
    pub deleted: bool,
}

/// A text part of an input message listed by `input_items`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListedInputText {
    /// `"input_text"`.
    #[serde(rename = "type")]
    #[schemars(extend("const" = "input_text"))]
    pub kind: &'static str,
    /// The text.
    pub text: String,
}

/// The one text part of a listed message: input_text, or output_text for an earlier answer.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ListedText {
    /// A user, system or developer message's text.
    Input(ListedInputText),
    /// An earlier answer's text.
    Output(OutputText),
}

/// A message listed by `input_items`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListedMessage {
    /// The `id` it was sent with, else `msg_` and 32 hex digits.
    pub id: String,
    /// `"message"`.
    #[serde(rename = "type")]
    #[schemars(extend("const" = "message"))]
    pub kind: &'static str,
    /// Who wrote it.
    #[schemars(extend("enum" = ["user", "system", "developer", "assistant"]))]
    pub role: &'static str,
    /// `completed`, or `incomplete` for an answer cut off by its max_output_tokens or the context.
    pub status: OutputItemStatus,
    /// Its text, one part.
    #[schemars(length(min = 1, max = 1))]
    pub content: Vec<ListedText>,
}

/// A function call listed by `input_items` (an earlier answer's, or one sent as input).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListedFunctionCall {
    /// The `id` it was sent with, else `fc_` and 32 hex digits.
    pub id: String,
    /// `"function_call"`.
    #[serde(rename = "type")]
    #[schemars(extend("const" = "function_call"))]
    pub kind: &'static str,
    /// What its function_call_output answers.
    pub call_id: String,
    /// The function called.
    pub name: String,
    /// The JSON text of the arguments.
    pub arguments: String,
    /// `completed`, or `incomplete` for an answer cut off by its max_output_tokens or the context.
    pub status: OutputItemStatus,
}

/// A function call's output listed by `input_items`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListedFunctionCallOutput {
    /// The `id` it was sent with, else `fco_` and 32 hex digits.
    pub id: String,
    /// `"function_call_output"`.
    #[serde(rename = "type")]
    #[schemars(extend("const" = "function_call_output"))]
    pub kind: &'static str,
    /// The call it answers.
    pub call_id: String,
    /// The result.
    pub output: String,
    /// `completed`.
    pub status: OutputItemStatus,
}

/// One item of a response's input, as `GET /v1/responses/{id}/input_items` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ListedItem {
    /// A message.
    Message(ListedMessage),
    /// Reasoning of an earlier answer.
    Reasoning(OutputReasoning),
    /// A function call.
    FunctionCall(ListedFunctionCall),
    /// A function call's output.
    FunctionCallOutput(ListedFunctionCallOutput),
}

/// `GET /v1/responses/{id}/input_items`'s answer: one page of the response's input items.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputItemList {
    /// `"list"`.
    #[schemars(extend("const" = "list"))]
    pub object: &'static str,
    /// The page's items, in the order asked (`order`, default `desc`: the newest first).
    pub data: Vec<ListedItem>,
    /// The first item's id (null when the page is empty).
    pub first_id: Option<String>,
    /// The last item's id (null when the page is empty); `after` for the next page.
    pub last_id: Option<String>,
    /// Whether items remain past this page.
    pub has_more: bool,
}

/// `POST /v1/responses/input_tokens`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputTokenCount {
    /// `"response.input_tokens"`.
    #[schemars(extend("const" = "response.input_tokens"))]
    pub object: &'static str,
    /// Tokens of the prompt `POST /v1/responses` would render from the same body.
    pub input_tokens: usize,
}
