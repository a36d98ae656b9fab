//! The request bodies of `/v1/chat/completions`, `/v1/completions`, `/tokenize`, `/detokenize`
//! and `/debug/tokens` (OpenAI API reference, Chat Completions and legacy Completions; `top_k` /
//! `min_p` / `repetition_penalty` / `ignore_eos` / `min_tokens` / `stop_token_ids` /
//! `continue_final_message` / `add_generation_prompt` and the tokenizer routes from vLLM's
//! OpenAI server,
//! `vllm/entrypoints/openai/protocol.py`).
//!
//! Every object denies unknown fields; `null` is an absent optional field. A field's doc comment
//! is its description in `/openapi.json`. The checks that compare values or narrow them to the
//! engine's f32 are `super::super::params`'s; the schemas below state them too, where JSON Schema
//! can (the `if`/`then` pairs, the ranges).

use super::scalar::{
    Count, DefaultValue, EmptyDefault, FalseDefault, FunctionCallDefault, LogitBias, ModelId,
    NullDefault, OneDefault, Refused, ServiceTierDefault, StrOr, TextModalityDefault, TokenId,
    TokenIds, TopK, UInt, VerbosityDefault,
};
use aubier_runtime::text::chat::Role;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The smallest f64 that stays above 0 once narrowed to f32 is just above this (2^-150).
pub(crate) const F32_ROUNDS_TO_ZERO: f64 = 7.006_492_321_624_085e-46;

/// The pattern of OpenAI function and schema names.
pub const NAME_PATTERN: &str = "^[a-zA-Z0-9_-]{1,64}$";

/// `stop`: one string or up to 4, each non-empty.
pub type Stop = StrOr<String, Vec<String>>;

fn stop_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "anyOf": [
            {"type": "null"},
            {"type": "string", "minLength": 1},
            {"type": "array", "maxItems": 4, "items": {"type": "string", "minLength": 1}},
        ],
    })
}

/// `stream_options` (only with `stream: true`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with the token counts (and `usage: null` on the others).
    pub include_usage: Option<bool>,
    /// Accepted and without effect: aubier never pads its chunks.
    pub include_obfuscation: Option<bool>,
}

/// `reasoning_effort` (the v15 chat format's `[MODEL_SETTINGS]`): `high` opens `[THINK]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    /// No reasoning (the default).
    None,
    /// Reason in `[THINK]…[/THINK]` before answering.
    High,
}

/// The author of a message: the chat template's [`Role`], read by its own deserializer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct MessageRole(pub Role);

impl JsonSchema for MessageRole {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Role".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"enum": Role::ALL.map(Role::name)})
    }
}

/// A content chunk of a message.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ContentChunk {
    /// `{"type": "text", "text": …}`.
    Text {
        /// The text.
        text: String,
    },
    /// `{"type": "thinking", "thinking": …}`: past reasoning of an assistant turn.
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Whether [/THINK] follows; default true.
        closed: Option<bool>,
    },
}

/// Message content: a string or a list of chunks.
pub type Content = StrOr<String, Vec<ContentChunk>>;

/// The function of a tool call in the history.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CalledFunction {
    /// The function called.
    pub name: String,
    /// A JSON string or a JSON object.
    pub arguments: Option<Value>,
}

/// A tool call of an assistant message in the history.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The id the tool message's `tool_call_id` answers.
    pub id: Option<String>,
    /// `"function"`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The call.
    pub function: CalledFunction,
}

/// One message. The conversation rules (first message user or system, role order, the last
/// message, tool results answering calls) are checked by the server: a conversation breaking
/// them is a 400 naming 'messages'.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("not" = {"required": ["reasoning", "reasoning_content"]}))]
pub struct Message {
    /// Who wrote it.
    pub role: MessageRole,
    /// A string or a list of text / thinking chunks; may be null for an assistant tool call.
    pub content: Option<Content>,
    /// Past reasoning of an assistant turn.
    pub reasoning_content: Option<String>,
    /// Another name of reasoning_content.
    pub reasoning: Option<String>,
    /// Tool calls of an assistant turn.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a tool message answers.
    pub tool_call_id: Option<String>,
    /// Author name; not rendered by the v15 format.
    pub name: Option<String>,
    /// OpenAI's assistant refusal. Not implemented: accepted only at its default.
    #[serde(default)]
    pub refusal: Refused<NullDefault>,
    /// Audio output. Not implemented: accepted only at its default.
    #[serde(default)]
    pub audio: Refused<NullDefault>,
    /// The legacy function call of an assistant turn. Not implemented: accepted only at its default.
    #[serde(default)]
    pub function_call: Refused<NullDefault>,
    /// Web-search annotations. Not implemented: accepted only at its default.
    #[serde(default)]
    pub annotations: Refused<EmptyDefault>,
}

/// A function tool's function.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionDefinition {
    /// Distinct among the tools.
    #[schemars(pattern(NAME_PATTERN))]
    pub name: String,
    /// Rendered into the prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema; one the grammar engine cannot enforce is a 400 naming
    /// tools[i].function.parameters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// Constrain the arguments to the parameters schema (otherwise to any JSON object).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// The only tool type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FunctionType {
    /// A function tool.
    Function,
}

/// A function tool. With strict true the arguments are constrained to the parameters schema;
/// otherwise to any JSON object.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// `"function"`.
    #[serde(rename = "type")]
    pub kind: FunctionType,
    /// The function.
    pub function: FunctionDefinition,
}

/// `tool_choice` as a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoiceMode {
    /// No calls.
    None,
    /// The model chooses (the default).
    Auto,
    /// At least one call.
    Required,
}

/// The function a named `tool_choice` forces.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChosenFunction {
    /// One of the tools' names.
    #[schemars(pattern(NAME_PATTERN))]
    pub name: String,
}

/// `tool_choice` naming a function.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedToolChoice {
    /// `"function"`.
    #[serde(rename = "type")]
    pub kind: FunctionType,
    /// The function to call.
    pub function: ChosenFunction,
}

/// `tool_choice`: a mode or a named function.
pub type ToolChoice = StrOr<ToolChoiceMode, NamedToolChoice>;

/// `response_format.json_schema`.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name.
    #[schemars(pattern(NAME_PATTERN))]
    pub name: String,
    /// What the schema is for.
    pub description: Option<String>,
    /// The JSON Schema the content must match.
    pub schema: Map<String, Value>,
    /// Enforced whether or not it is set.
    pub strict: Option<bool>,
}

/// `response_format.type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FormatType {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against `json_schema.schema`.
    JsonSchema,
}

/// `response_format`. One object with the type beside the schema, not an internally tagged enum:
/// serde reads such an enum's fields through its own buffer, out of sight of the path tracking,
/// so an error inside `json_schema` could not be named.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "if" = {"properties": {"type": {"const": "json_schema"}}},
    "then" = {"required": ["json_schema"], "properties": {"json_schema": {"type": "object"}}},
    "else" = {"properties": {"json_schema": {"type": "null"}}},
))]
pub struct ResponseFormat {
    /// text, json_object, or json_schema (with json_schema).
    #[serde(rename = "type")]
    pub kind: FormatType,
    /// The schema, with type json_schema only.
    pub json_schema: Option<JsonSchemaFormat>,
}

/// The sampling fields every request body has, copied out of it.
#[derive(Clone, Copy, Debug)]
pub struct SamplingFields {
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k`.
    pub top_k: Option<TopK>,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// `presence_penalty`.
    pub presence_penalty: Option<f64>,
    /// `frequency_penalty`.
    pub frequency_penalty: Option<f64>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f64>,
    /// `seed`.
    pub seed: Option<UInt>,
}

/// Declares a request body with the sampling fields after its own, and its
/// `sampling_fields()`. (serde's `flatten` would share them, but it cannot deny unknown fields.)
macro_rules! sampling_request {
    ($(#[$meta:meta])* pub struct $name:ident { $($fields:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            $($fields)*
            /// Softmax temperature; 0 is greedy. Default 1 (0 on /debug/tokens).
            #[schemars(range(min = 0.0, max = 2.0))]
            pub temperature: Option<f64>,
            /// Nucleus mass in (0, 1]; default 1. The engine samples in 32-bit floats, so the
            /// value must stay above 0 once narrowed: above 2^-150.
            #[schemars(range(max = 1.0), extend("exclusiveMinimum" = F32_ROUNDS_TO_ZERO))]
            pub top_p: Option<f64>,
            /// Keep the k most likely tokens; 0 (default) is off, and so is -1 (vLLM's and
            /// llama.cpp's "off").
            pub top_k: Option<TopK>,
            /// vLLM extension: after temperature, drop the tokens whose probability is below
            /// min_p times the top probability; 0 (default) is off.
            #[schemars(range(min = 0.0, max = 1.0))]
            pub min_p: Option<f64>,
            /// OpenAI: subtracted from the logit of every token generated at least once in this
            /// choice; default 0.
            #[schemars(range(min = -2.0, max = 2.0))]
            pub presence_penalty: Option<f64>,
            /// OpenAI: subtracted from the logit of every generated token once per time it was
            /// generated in this choice; default 0.
            #[schemars(range(min = -2.0, max = 2.0))]
            pub frequency_penalty: Option<f64>,
            /// vLLM / llama.cpp extension: for each distinct token of the prompt and of this
            /// choice, a positive logit is divided by it, another multiplied; default 1 (off).
            /// The engine computes in 32-bit floats, so it must stay above 0 once narrowed
            /// (above 2^-150) and at most the largest 32-bit float.
            #[schemars(
                range(max = f32::MAX as f64),
                extend("exclusiveMinimum" = F32_ROUNDS_TO_ZERO)
            )]
            pub repetition_penalty: Option<f64>,
            /// Sampler seed; absent means a fresh random seed (0 on /debug/tokens).
            pub seed: Option<UInt>,
        }

        impl $name {
            /// Its sampling fields.
            pub fn sampling_fields(&self) -> SamplingFields {
                SamplingFields {
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    min_p: self.min_p,
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    repetition_penalty: self.repetition_penalty,
                    seed: self.seed,
                }
            }
        }
    };
}

pub(crate) use sampling_request;

sampling_request! {
/// A `POST /v1/chat/completions` body.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    description = "stream_options only with 'stream': true; top_logprobs above 0 only with \
        'logprobs': true.",
    extend(
        "if" = {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
        "then" = {"required": ["stream"], "properties": {"stream": {"const": true}}},
        "allOf" = [{
            "if": {
                "required": ["top_logprobs"],
                "properties": {"top_logprobs": {"type": "integer", "minimum": 1}},
            },
            "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": true}}},
        }],
    )
)]
pub struct ChatCompletionRequest {
    /// The served model id.
    pub model: ModelId,
    /// The conversation, oldest first.
    #[schemars(length(min = 1))]
    pub messages: Vec<Message>,
    /// Most tokens to generate; default: up to the KV capacity, to which it is clamped
    /// (finish_reason 'length').
    pub max_completion_tokens: Option<Count>,
    /// The older name of max_completion_tokens; if both are sent they must agree.
    pub max_tokens: Option<Count>,
    /// Up to 4 non-empty stop strings; never part of the answer.
    #[serde(default)]
    #[schemars(schema_with = "stop_schema")]
    pub stop: Option<Stop>,
    /// Answer with server-sent events.
    pub stream: Option<bool>,
    /// Only with 'stream': true.
    pub stream_options: Option<StreamOptions>,
    /// `high` reasons in [THINK]…[/THINK] first (returned as reasoning_content).
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Continue the final assistant message instead of answering it (vLLM).
    pub continue_final_message: Option<bool>,
    /// vLLM's switch, default true, false with 'continue_final_message' (true with it is an
    /// error, as in vLLM). Either value renders the same prompt: the model's template ends each
    /// user and tool turn where the answer begins, with no generation prompt of its own.
    pub add_generation_prompt: Option<bool>,
    /// Choices to generate, one after the other (choice i samples with seed + i); default 1.
    #[schemars(range(max = 8))]
    pub n: Option<Count>,
    /// Function tools, distinct names. Rendered into the prompt; calls in the output are
    /// returned as tool_calls.
    pub tools: Option<Vec<Tool>>,
    /// none forbids calls; auto (default) lets the model choose; required or a named function
    /// forces a call (needs tools).
    pub tool_choice: Option<ToolChoice>,
    /// Allow several calls in one answer (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Return each generated token's log-probability under the model's raw distribution (before
    /// logit_bias, temperature, penalties and truncation).
    pub logprobs: Option<bool>,
    /// With logprobs: also the most likely tokens at each position (0..20); above 0 it needs
    /// logprobs true.
    #[schemars(range(max = 20))]
    pub top_logprobs: Option<UInt>,
    /// Constrain the content: text (default), any JSON object, or JSON valid against a schema
    /// (enforced whether or not strict is set; a schema the grammar engine cannot enforce is a
    /// 400 naming response_format).
    pub response_format: Option<ResponseFormat>,
    /// The legacy functions (use tools). Not implemented: accepted only at its default.
    #[serde(default)]
    pub functions: Refused<EmptyDefault>,
    /// The legacy function choice (use tool_choice). Not implemented: accepted only at its default.
    #[serde(default)]
    pub function_call: Refused<FunctionCallDefault>,
    /// OpenAI: a map from token id (a decimal string below the vocabulary size) to a bias in
    /// [-100, 100] added to that token's logit before sampling (before the penalties and
    /// temperature, as vLLM applies it; greedy honours it). -100 effectively bans the token,
    /// 100 effectively forces it. At most 300 entries. Log-probabilities stay the model's raw
    /// distribution.
    pub logit_bias: Option<LogitBias>,
    /// vLLM: keep generating past EOS, up to max_tokens or the context; default false. A
    /// grammar's end (response_format, tool calls) still ends the choice.
    pub ignore_eos: Option<bool>,
    /// vLLM: before this many tokens EOS and stop_token_ids cannot be sampled (their logits are
    /// -inf) and a stop string must end in the text of a later token; default 0, at most
    /// max_tokens.
    pub min_tokens: Option<UInt>,
    /// vLLM: token ids (each below the vocabulary size) that end the choice as EOS does
    /// (finish_reason stop), not part of the answer.
    #[serde(default)]
    pub stop_token_ids: Option<TokenList>,
    /// Audio output. Not implemented: accepted only at its default.
    #[serde(default)]
    pub audio: Refused<NullDefault>,
    /// Output modalities. Not implemented: accepted only at its default.
    #[serde(default)]
    pub modalities: Refused<TextModalityDefault>,
    /// Predicted output. Not implemented: accepted only at its default.
    #[serde(default)]
    pub prediction: Refused<NullDefault>,
    /// Web search. Not implemented: accepted only at its default.
    #[serde(default)]
    pub web_search_options: Refused<NullDefault>,
    /// Storing the completion. Not implemented: accepted only at its default.
    #[serde(default)]
    pub store: Refused<FalseDefault>,
    /// Stored-completion tags. Not implemented: accepted only at its default.
    #[serde(default)]
    pub metadata: Refused<EmptyDefault>,
    /// Processing tier. Not implemented: accepted only at its default.
    #[serde(default)]
    pub service_tier: Refused<ServiceTierDefault>,
    /// Answer length hint. Not implemented: accepted only at its default.
    #[serde(default)]
    pub verbosity: Refused<VerbosityDefault>,
    /// Identifies the caller; does not change the answer.
    pub user: Option<String>,
    /// Identifies the caller; does not change the answer.
    pub safety_identifier: Option<String>,
    /// Identifies the caller; does not change the answer.
    pub prompt_cache_key: Option<String>,
}
}

/// The `prompt` of a legacy completion: one string, or one array of token ids. Read as JSON and
/// sorted out by `super::super::params`, so that a batch of prompts is refused as unsupported
/// rather than as malformed.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct PromptValue(pub Value);

impl JsonSchema for PromptValue {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PromptValue".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({"anyOf": [{"type": "string"}, g.subschema_for::<TokenIds>()]})
    }
}

sampling_request! {
/// A `POST /v1/completions` body.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    description = "stream_options only with 'stream': true.",
    extend(
        "if" = {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
        "then" = {"required": ["stream"], "properties": {"stream": {"const": true}}},
    )
)]
pub struct CompletionRequest {
    /// The served model id.
    pub model: ModelId,
    /// One string (BOS is added), or one array of token ids used as given (each below the
    /// vocabulary size; at most the KV capacity). A batch of prompts is not implemented.
    pub prompt: PromptValue,
    /// Most tokens to generate; default 16, clamped to the KV capacity.
    pub max_tokens: Option<Count>,
    /// Up to 4 non-empty stop strings; never part of the answer.
    #[serde(default)]
    #[schemars(schema_with = "stop_schema")]
    pub stop: Option<Stop>,
    /// Answer with server-sent events.
    pub stream: Option<bool>,
    /// Only with 'stream': true.
    pub stream_options: Option<StreamOptions>,
    /// Choices to generate, one after the other (choice i samples with seed + i); default 1.
    #[schemars(range(max = 8))]
    pub n: Option<Count>,
    /// Return each generated token's log-probability under the model's raw distribution, and the
    /// logprobs most likely tokens at each position (0..5).
    #[schemars(range(max = 5))]
    pub logprobs: Option<UInt>,
    /// Candidates per choice. Not implemented: accepted only at its default.
    #[serde(default)]
    pub best_of: Refused<OneDefault>,
    /// Echo the prompt. Not implemented: accepted only at its default.
    #[serde(default)]
    pub echo: Refused<FalseDefault>,
    /// Text after the completion. Not implemented: accepted only at its default.
    #[serde(default)]
    pub suffix: Refused<EmptyDefault>,
    /// OpenAI: a map from token id (a decimal string below the vocabulary size) to a bias in
    /// [-100, 100] added to that token's logit before sampling (before the penalties and
    /// temperature, as vLLM applies it; greedy honours it). -100 effectively bans the token,
    /// 100 effectively forces it. At most 300 entries. Log-probabilities stay the model's raw
    /// distribution.
    pub logit_bias: Option<LogitBias>,
    /// vLLM: keep generating past EOS, up to max_tokens or the context; default false. A
    /// grammar's end (response_format, tool calls) still ends the choice.
    pub ignore_eos: Option<bool>,
    /// vLLM: before this many tokens EOS and stop_token_ids cannot be sampled (their logits are
    /// -inf) and a stop string must end in the text of a later token; default 0, at most
    /// max_tokens.
    pub min_tokens: Option<UInt>,
    /// vLLM: token ids (each below the vocabulary size) that end the choice as EOS does
    /// (finish_reason stop), not part of the answer.
    #[serde(default)]
    pub stop_token_ids: Option<TokenList>,
    /// Identifies the caller; does not change the answer.
    pub user: Option<String>,
    /// Identifies the caller; does not change the answer.
    pub safety_identifier: Option<String>,
    /// Identifies the caller; does not change the answer.
    pub prompt_cache_key: Option<String>,
}
}

sampling_request! {
/// A `POST /debug/tokens` body: token ids in, token ids out, no tokenizer involved.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DebugTokensRequest {
    /// When present, the served model id.
    pub model: Option<ModelId>,
    /// Prompt ids, used as given (no BOS added); at most the KV capacity.
    pub ids: TokenIds,
    /// Tokens to generate, clamped to the KV capacity.
    pub max_tokens: UInt,
    /// Keep generating past EOS (as `aubier run --ignore-eos`).
    pub ignore_eos: Option<bool>,
}
}

/// A `POST /tokenize` body of the text form (vLLM's `TokenizeCompletionRequest`): the ids of
/// `prompt` as `/v1/completions` reads a string prompt.
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeCompletionRequest {
    /// When present, the served model id.
    pub model: Option<ModelId>,
    /// The text, tokenized as /v1/completions tokenizes a string prompt.
    pub prompt: String,
    /// Start with BOS, as /v1/completions does (default true); false gives the text's ids alone.
    pub add_special_tokens: Option<bool>,
    /// Also answer each token's text in token_strs (default false).
    pub return_token_strs: Option<bool>,
}

/// A `POST /tokenize` body of the chat form (vLLM's `TokenizeChatRequest`): the ids of the
/// prompt `/v1/chat/completions` renders from the same messages, tools and settings.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "if" = {
        "required": ["continue_final_message"],
        "properties": {"continue_final_message": {"const": true}},
    },
    "then" = {"properties": {"add_generation_prompt": {"not": {"const": true}}}},
))]
pub struct TokenizeChatRequest {
    /// When present, the served model id.
    pub model: Option<ModelId>,
    /// The conversation, oldest first, as /v1/chat/completions takes it.
    #[schemars(length(min = 1))]
    pub messages: Vec<Message>,
    /// Function tools, rendered into the prompt as /v1/chat/completions renders them.
    pub tools: Option<Vec<Tool>>,
    /// As /v1/chat/completions' reasoning_effort (an aubier addition: it changes the prompt).
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Continue the final assistant message instead of answering it.
    pub continue_final_message: Option<bool>,
    /// Default true; not true with continue_final_message. Either value renders the same prompt,
    /// as on /v1/chat/completions.
    pub add_generation_prompt: Option<bool>,
    /// Also answer each token's text in token_strs (default false).
    pub return_token_strs: Option<bool>,
    /// Special tokens on top of the template's, which has BOS.
    /// Not implemented: accepted only at its default.
    #[serde(default)]
    pub add_special_tokens: Refused<FalseDefault>,
    /// Another chat template. Not implemented: accepted only at its default.
    #[serde(default)]
    pub chat_template: Refused<NullDefault>,
    /// Keyword arguments of the chat template. Not implemented: accepted only at its default.
    #[serde(default)]
    pub chat_template_kwargs: Refused<EmptyDefault>,
    /// Arguments of a multimodal processor. Not implemented: accepted only at its default.
    #[serde(default)]
    pub mm_processor_kwargs: Refused<EmptyDefault>,
    /// Arguments of the media loaders. Not implemented: accepted only at its default.
    #[serde(default)]
    pub media_io_kwargs: Refused<EmptyDefault>,
}

/// An array of token ids read as JSON and checked by `super::super::params`, which names a bad
/// element by its parameter (`tokens[i]` of `/detokenize`, `stop_token_ids[i]`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct TokenList(pub Vec<Value>);

impl JsonSchema for TokenList {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TokenList".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "array", "items": g.subschema_for::<TokenId>()})
    }
}

/// A `POST /detokenize` body (vLLM's `DetokenizeRequest`).
#[derive(Clone, Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// When present, the served model id.
    pub model: Option<ModelId>,
    /// Token ids, each below the vocabulary size; none gives the empty text.
    pub tokens: TokenList,
}

/// The refused parameters of a request type: name, value sent (`null` when absent) and default.
pub type RefusedField<'a> = (&'static str, &'a Value, DefaultValue);

/// `refused()` of each type: its [`Refused`] fields, each with its name, the value sent and
/// the default.
macro_rules! refused_fields {
    ($($ty:ty { $($field:ident),* })*) => {$(
        impl $ty {
            /// Its parameters recognised but not implemented.
            pub fn refused(&self) -> Vec<RefusedField<'_>> {
                vec![$((stringify!($field), &self.$field.0, self.$field.default_value())),*]
            }
        }
    )*};
}

pub(crate) use refused_fields;

refused_fields! {
    ChatCompletionRequest {
        functions, function_call, audio, modalities, prediction,
        web_search_options, store, metadata, service_tier, verbosity
    }
    CompletionRequest { best_of, echo, suffix }
    TokenizeChatRequest {
        add_special_tokens, chat_template, chat_template_kwargs, mm_processor_kwargs,
        media_io_kwargs
    }
    Message { refusal, audio, function_call, annotations }
}
