//! The response bodies the server writes (OpenAI API reference: the chat completion and chunk
//! objects, the legacy completion object, the model object; `/tokenize` and `/detokenize` are
//! vLLM's; `/health`, `/debug/tokens` and the error body are aubier's own). Their schemas are generated for what serialization writes
//! (schemars' serialize contract): a field is required when it is always written.

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::Serialize;
use serde_json::{Map, Value};

/// Why a generation ended, as the OpenAI API names it (plus `cancelled`, never sent to a client
/// because there is none left to send it to, so not in the schema).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// EOS was produced, or a stop string matched.
    Stop,
    /// EOS was produced after the model called a tool.
    ToolCalls,
    /// `max_tokens` or the KV capacity was reached.
    Length,
    /// The client went away.
    #[schemars(skip)]
    Cancelled,
}

impl Finish {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::ToolCalls => "tool_calls",
            Finish::Length => "length",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// Token counts of one response.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    /// Tokens generated, summed over the choices.
    pub completion_tokens: usize,
    /// prompt_tokens + completion_tokens.
    pub total_tokens: usize,
    /// Where the prompt tokens came from.
    pub prompt_tokens_details: PromptTokensDetails,
    /// What the completion tokens were.
    pub completion_tokens_details: CompletionTokensDetails,
}

/// `usage.completion_tokens_details`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionTokensDetails {
    /// Completion tokens of the reasoning (`[THINK]` … `[/THINK]`, both markers included), summed
    /// over the choices; they are counted in completion_tokens too.
    pub reasoning_tokens: usize,
}

/// `usage.prompt_tokens_details`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptTokensDetails {
    /// Leading prompt tokens whose latent KV rows were reused from the previous request instead
    /// of prefilled (--prompt-cache); at most prompt_tokens - 1.
    pub cached_tokens: usize,
}

/// The function of a returned tool call.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseFunction {
    /// The function called.
    pub name: String,
    /// The JSON text as generated (cut short when finish_reason is length).
    pub arguments: String,
}

/// A tool call of the answer.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseToolCall {
    /// `call_` and 24 hex digits, unique within the response.
    #[schemars(pattern(r"^call_[0-9a-f]{24}$"))]
    pub id: String,
    /// `"function"`.
    #[serde(rename = "type")]
    #[schemars(extend("const" = "function"))]
    pub kind: &'static str,
    /// The call.
    pub function: ResponseFunction,
}

/// The answer of one choice.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AssistantMessage {
    /// `"assistant"`.
    #[schemars(extend("const" = "assistant"))]
    pub role: &'static str,
    /// null when the answer is only tool calls.
    pub content: Option<String>,
    /// The reasoning, with reasoning_effort high.
    pub reasoning_content: Option<String>,
    /// Always null: the model has no separate refusal channel.
    pub refusal: (),
    /// The calls, when the model made some.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1))]
    pub tool_calls: Vec<ResponseToolCall>,
}

/// One token's entry in chat log-probabilities' `top_logprobs`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatTopLogprob {
    /// The token's text, or 'bytes:' and \xHH per byte when it is not valid UTF-8 alone.
    pub token: String,
    /// Natural log of the probability under the raw distribution; -9999 for probability 0.
    #[schemars(range(max = 0.0))]
    pub logprob: f64,
    /// The token's bytes.
    pub bytes: Vec<u8>,
}

/// One generated token's chat log-probabilities.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatTokenLogprob {
    /// The token's text, or 'bytes:' and \xHH per byte when it is not valid UTF-8 alone.
    pub token: String,
    /// Natural log of the probability under the raw distribution; -9999 for probability 0.
    #[schemars(range(max = 0.0))]
    pub logprob: f64,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position, most likely first.
    #[schemars(length(max = 20))]
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// Chat log-probabilities: one entry per generated token (reasoning tokens included), sent with
/// the chunk that releases its text or later.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatLogprobs {
    /// One entry per token.
    pub content: Vec<ChatTokenLogprob>,
    /// Always null.
    pub refusal: (),
}

fn top_logprobs_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "maxProperties": 6,
            "additionalProperties": {"type": "number", "maximum": 0},
        },
    })
}

/// Legacy completion log-probabilities: one entry per generated token, in four parallel lists.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionLogprobs {
    /// Each token's text (as chat's `token`).
    pub tokens: Vec<String>,
    /// Natural log of each token's probability under the raw distribution; -9999 for
    /// probability 0.
    pub token_logprobs: Vec<f64>,
    /// Per token, the most likely tokens and the sampled one: token text → log-probability,
    /// most likely first.
    #[schemars(schema_with = "top_logprobs_schema")]
    pub top_logprobs: Vec<Map<String, Value>>,
    /// Each token's byte offset in the completion's text.
    pub text_offset: Vec<usize>,
}

/// One choice of a chat completion.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatChoice {
    /// The choice's index (0..n).
    #[schemars(range(max = 7))]
    pub index: usize,
    /// The answer.
    pub message: AssistantMessage,
    /// With logprobs: the tokens' log-probabilities.
    pub logprobs: Option<ChatLogprobs>,
    /// Why generation ended.
    pub finish_reason: Finish,
}

/// A chat completion (`"stream": false`).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletion {
    /// `chatcmpl-` and 32 hex digits.
    #[schemars(pattern(r"^chatcmpl-[0-9a-f]{32}$"))]
    pub id: String,
    /// `"chat.completion"`.
    #[schemars(extend("const" = "chat.completion"))]
    pub object: &'static str,
    /// Unix time of the answer, in seconds.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// `fp_` and 16 hex digits naming the server's version, the served model and its context:
    /// answers with the same fingerprint come from the same configuration.
    #[schemars(pattern(r"^fp_[0-9a-f]{16}$"))]
    pub system_fingerprint: String,
    /// One per choice, in index order.
    #[schemars(length(min = 1, max = 8))]
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// The function part of a streamed tool-call delta.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionDelta {
    /// In a call's first delta only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next fragment of the arguments (whole characters).
    pub arguments: String,
}

/// A streamed tool-call delta. A call's first delta has id, type and function.name; later ones
/// only function.arguments fragments, under the same index.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCallDelta {
    /// The call's index in the answer.
    pub index: usize,
    /// In a call's first delta only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^call_[0-9a-f]{24}$"))]
    pub id: Option<String>,
    /// `"function"`, in a call's first delta only.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("const" = "function"))]
    pub kind: Option<&'static str>,
    /// The function's name and arguments fragment.
    pub function: FunctionDelta,
}

/// What a chat chunk adds to its choice.
#[derive(Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Delta {
    /// `"assistant"`, in each choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("const" = "assistant"))]
    pub role: Option<&'static str>,
    /// Released answer text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Released reasoning text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool-call pieces.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1))]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// The choice of one chat chunk.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatChunkChoice {
    /// The choice's index (0..n).
    #[schemars(range(max = 7))]
    pub index: usize,
    /// What this chunk adds.
    pub delta: Delta,
    /// With logprobs: the tokens released with this chunk.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<Finish>,
}

/// One event of a chat completion stream.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionChunk {
    /// The same for every chunk of the stream.
    #[schemars(pattern(r"^chatcmpl-[0-9a-f]{32}$"))]
    pub id: String,
    /// `"chat.completion.chunk"`.
    #[schemars(extend("const" = "chat.completion.chunk"))]
    pub object: &'static str,
    /// Unix time of the answer, in seconds.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// `fp_` and 16 hex digits naming the server's version, the served model and its context:
    /// answers with the same fingerprint come from the same configuration.
    #[schemars(pattern(r"^fp_[0-9a-f]{16}$"))]
    pub system_fingerprint: String,
    /// One choice, or none in the closing usage chunk.
    #[schemars(length(max = 1))]
    pub choices: Vec<ChatChunkChoice>,
    /// With stream_options.include_usage: null on every chunk but the last, which has no
    /// choices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One choice of a legacy completion.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionChoice {
    /// The choice's index (0..n).
    #[schemars(range(max = 7))]
    pub index: usize,
    /// The completion.
    pub text: String,
    /// With logprobs: the tokens' log-probabilities.
    pub logprobs: Option<CompletionLogprobs>,
    /// Why generation ended.
    pub finish_reason: Finish,
}

/// A legacy completion (`"stream": false`).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Completion {
    /// `cmpl-` and 32 hex digits.
    #[schemars(pattern(r"^cmpl-[0-9a-f]{32}$"))]
    pub id: String,
    /// `"text_completion"`.
    #[schemars(extend("const" = "text_completion"))]
    pub object: &'static str,
    /// Unix time of the answer, in seconds.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// `fp_` and 16 hex digits naming the server's version, the served model and its context:
    /// answers with the same fingerprint come from the same configuration.
    #[schemars(pattern(r"^fp_[0-9a-f]{16}$"))]
    pub system_fingerprint: String,
    /// One per choice, in index order.
    #[schemars(length(min = 1, max = 8))]
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// The choice of one legacy completion chunk.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionChunkChoice {
    /// The choice's index (0..n).
    #[schemars(range(max = 7))]
    pub index: usize,
    /// Released text.
    pub text: String,
    /// With logprobs: the tokens released with this chunk.
    pub logprobs: Option<CompletionLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<Finish>,
}

/// One event of a legacy completion stream.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionChunk {
    /// The same for every chunk of the stream.
    #[schemars(pattern(r"^cmpl-[0-9a-f]{32}$"))]
    pub id: String,
    /// `"text_completion"`.
    #[schemars(extend("const" = "text_completion"))]
    pub object: &'static str,
    /// Unix time of the answer, in seconds.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// `fp_` and 16 hex digits naming the server's version, the served model and its context:
    /// answers with the same fingerprint come from the same configuration.
    #[schemars(pattern(r"^fp_[0-9a-f]{16}$"))]
    pub system_fingerprint: String,
    /// One choice, or none in the closing usage chunk.
    #[schemars(length(max = 1))]
    pub choices: Vec<CompletionChunkChoice>,
    /// With stream_options.include_usage: null on every chunk but the last, which has no
    /// choices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// The served model (OpenAI's model object).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// The model id.
    pub id: String,
    /// `"model"`.
    #[schemars(extend("const" = "model"))]
    pub object: &'static str,
    /// Unix time the server started, in seconds.
    pub created: u64,
    /// `"aubier"`.
    pub owned_by: String,
    /// The context in tokens (the KV capacity, `--kv-max`): prompt and completion together
    /// (vLLM's model card has the same field).
    pub max_model_len: usize,
}

/// `GET /v1/models`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelList {
    /// `"list"`.
    #[schemars(extend("const" = "list"))]
    pub object: &'static str,
    /// The one served model.
    #[schemars(length(min = 1, max = 1))]
    pub data: Vec<Model>,
}

/// Whether the engine is free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// Ready for a request.
    Ok,
    /// Refusing requests for now (with a 503).
    Busy,
}

/// `GET /health`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// ok, or busy with a 503.
    pub status: HealthStatus,
    /// The served model id.
    pub model: String,
    /// Why it is busy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST /debug/tokens`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DebugTokens {
    /// The generated ids (EOS not included).
    pub ids: Vec<u32>,
    /// Why generation ended.
    pub finish_reason: Finish,
    /// Tokens of the prompt.
    #[schemars(range(min = 1))]
    pub prompt_tokens: usize,
    /// Leading prompt tokens reused from the previous request's latent KV (--prompt-cache).
    pub cached_tokens: usize,
    /// Prefill speed, tokens per second.
    pub prefill_tok_s: f64,
    /// Decode speed, tokens per second (0 with fewer than two generated tokens).
    pub decode_tok_s: f64,
}

/// `POST /tokenize` (vLLM's `TokenizeResponse`).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct TokenizeResponse {
    /// How many ids `tokens` holds.
    pub count: usize,
    /// The context: the KV capacity (--kv-max), in tokens, prompt and completion together.
    pub max_model_len: usize,
    /// The ids, in order.
    pub tokens: Vec<u32>,
    /// With return_token_strs: each id's text (as the log-probabilities write a token:
    /// `bytes:` and `\xHH` per byte when not valid UTF-8 alone); else null.
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize` (vLLM's `DetokenizeResponse`).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct DetokenizeResponse {
    /// The ids' text, control tokens written as their text (`<s>`, `[INST]`).
    pub prompt: String,
}

/// OpenAI's error type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    /// The request is at fault (4xx).
    InvalidRequestError,
    /// The server is (5xx).
    ServerError,
}

/// The error object.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorObject {
    /// What was wrong, naming the parameter, model or limit at fault.
    pub message: String,
    /// The error type.
    #[serde(rename = "type")]
    pub kind: ErrorType,
    /// The request parameter at fault, as a path (`messages[1].content`).
    pub param: Option<String>,
    /// A machine-readable code (`unsupported_parameter`, `model_not_found`, …).
    pub code: Option<&'static str>,
}

/// Every error body (OpenAI's `ErrorResponse`).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Error")]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorObject,
}

/// What the objects of one answer share (every chunk of a stream too): its id, time, model and
/// fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectHead {
    /// The answer's id.
    pub id: String,
    /// Unix time of the answer, in seconds.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// The server's `system_fingerprint`.
    pub fingerprint: String,
}

/// `new(head, choices, usage)` for a response object of choices: one place that fills the head
/// fields of the four (which differ in their schema's id pattern and `object` constant).
macro_rules! choices_object {
    ($name:ident, $object:literal, $choice:ty, $usage:ty) => {
        impl $name {
            #[doc = concat!("A `", $object, "` object of `choices` with `usage`.")]
            pub fn new(head: &ObjectHead, choices: Vec<$choice>, usage: $usage) -> $name {
                $name {
                    id: head.id.clone(),
                    object: $object,
                    created: head.created,
                    model: head.model.clone(),
                    system_fingerprint: head.fingerprint.clone(),
                    choices,
                    usage,
                }
            }
        }
    };
}

choices_object!(ChatCompletion, "chat.completion", ChatChoice, Usage);
choices_object!(
    ChatCompletionChunk,
    "chat.completion.chunk",
    ChatChunkChoice,
    Option<Option<Usage>>
);
choices_object!(Completion, "text_completion", CompletionChoice, Usage);
choices_object!(
    CompletionChunk,
    "text_completion",
    CompletionChunkChoice,
    Option<Option<Usage>>
);
