//! Request parameters: read the JSON bodies of `/v1/chat/completions`, `/v1/completions`,
//! `/tokenize`, `/detokenize` and `/debug/tokens` into their wire types (`super::api::request`)
//! and validate them into what the routes run.
//!
//! Algorithm: the body is parsed as JSON (a 400 `invalid_json` with serde's position) and must be
//! an object. It is then deserialized into its wire type with the path of a failing field tracked
//! (serde_path_to_error): an unknown key is a 400 `unknown_parameter` naming its path
//! (`messages[1].foo`), a missing one `missing_required_parameter`, a value of the wrong kind
//! `invalid_value` naming it. Then each value is checked: ranges; floats the engine computes in
//! f32 (`temperature`, `top_p`, the penalties) after narrowing, with the sampler's own rule, so no
//! value a client sends can reach the engine invalid; values that depend on each other
//! (`max_tokens` / `max_completion_tokens`, `top_logprobs` / `logprobs`, `stream_options` /
//! `stream`); and each recognised but unimplemented parameter is refused **by name** unless it
//! carries its default value (a silently ignored parameter would give an answer that looks like
//! the one the client asked for), inside messages too. The parameter names and defaults follow
//! the OpenAI API reference (Chat Completions and legacy Completions) and, for `top_k` /
//! `repetition_penalty` / `min_p` / `ignore_eos` / `min_tokens` / `stop_token_ids` /
//! `continue_final_message` / `add_generation_prompt`, vLLM's OpenAI server.

use super::api::request::{
    ChatCompletionRequest, CompletionRequest, ContentChunk as WireChunk, DebugTokensRequest,
    DetokenizeRequest, Message, ReasoningEffort, RefusedField, SamplingFields, Stop, StreamOptions,
    TokenList, TokenizeChatRequest, TokenizeCompletionRequest, ToolCall as WireToolCall,
};
use super::api::scalar::{
    json_uint, token_ids, Count, DefaultValue, LogitBias, ModelId, StrOr, UInt, LOGIT_BIAS_RANGE,
    MAX_LOGIT_BIAS,
};
use super::error::{missing_parameter, unknown_parameter, ApiError};
use super::tools::{structured, Structured};
use aubier_runtime::sampler::SamplingParams;
use aubier_runtime::text::chat::{
    ChatMessage, ChatRequest, ContentChunk, FunctionCall, MessageContent, ToolCall,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Most stop strings one request may carry (the OpenAI limit).
pub const MAX_STOPS: usize = 4;

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 8;

/// Most `top_logprobs` of a chat request (the OpenAI limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// Most `logprobs` of a legacy completion request (the OpenAI limit).
pub const MAX_COMPLETION_LOGPROBS: u64 = 5;

/// What every generation request carries beside its prompt (chat and legacy completions; the
/// Responses API maps its own names onto it).
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The `model` field.
    pub model: String,
    /// Most tokens to generate; `None` = up to the context's end. The route clamps it to the
    /// room the prompt leaves (`aubier_runtime::generate::completion_room`).
    pub max_tokens: Option<usize>,
    /// The sampler's parameters, checked by [`SamplingParams::validate`]; the seed is the
    /// request's `seed`, else a fresh random one (OpenAI semantics).
    pub sampling: SamplingParams,
    /// Stop strings (≤ [`MAX_STOPS`], each non-empty).
    pub stop: Vec<String>,
    /// `stream`: answer with server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: send a last chunk with the token counts.
    pub include_usage: bool,
    /// `n`: choices to generate, in [1, [`MAX_CHOICES`]].
    pub n: usize,
    /// `Some(k)`: each token's log-probability and the `k` most likely (chat `logprobs: true` +
    /// `top_logprobs` ≤ [`MAX_TOP_LOGPROBS`]; completions `logprobs` ≤
    /// [`MAX_COMPLETION_LOGPROBS`]).
    pub logprobs: Option<usize>,
    /// vLLM's `ignore_eos`, `min_tokens` and `stop_token_ids`.
    pub ends: Ends,
}

/// What may end a choice besides `max_tokens` and stop strings (vLLM's `SamplingParams`,
/// `vllm/sampling_params.py`); the default is OpenAI's behaviour.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ends {
    /// `ignore_eos`: EOS does not end the choice.
    pub ignore_eos: bool,
    /// `min_tokens`: tokens generated before EOS, a stop id or a stop string may end the
    /// choice (≤ `max_tokens` when that is given).
    pub min_tokens: usize,
    /// `stop_token_ids`: ids that end the choice as EOS does (checked against the vocabulary
    /// by the route).
    pub stop_token_ids: Vec<u32>,
}

/// A validated `POST /v1/chat/completions` body.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatParams {
    /// `messages`, `tools`, `reasoning_effort` and `continue_final_message`: what the chat
    /// template renders.
    pub chat: ChatRequest,
    /// `tools`, `tool_choice`, `parallel_tool_calls` and `response_format`: the grammar to
    /// enforce and whether tool calls are read.
    pub structured: Structured,
    /// Model, `max_completion_tokens` (or its older name `max_tokens`), sampling, stops, `n`,
    /// `stream`, `logprobs`.
    pub generation: Generation,
}

/// The `prompt` of a legacy completion.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// One string, tokenized with BOS.
    Text(String),
    /// Token ids, used as given (each must be below the vocabulary size, checked by the route).
    Ids(Vec<u32>),
}

/// A validated `POST /v1/completions` body.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionParams {
    /// The prompt: one string or one array of token ids.
    pub prompt: Prompt,
    /// Model, `max_tokens` (default 16, the OpenAI default of this endpoint), sampling, stops,
    /// `n`, `stream`, `logprobs`.
    pub generation: Generation,
}

/// A validated `POST /debug/tokens` body: token ids in, token ids out, no tokenizer involved.
#[derive(Clone, Debug, PartialEq)]
pub struct DebugTokensParams {
    /// Optional `model`; when present it must be the served id.
    pub model: Option<String>,
    /// Prompt token ids, used as given (no BOS added).
    pub ids: Vec<u32>,
    /// Tokens to generate (required).
    pub max_tokens: usize,
    /// Sampling settings; greedy unless `temperature` is given and seed 0 unless `seed` is (as
    /// `aubier run`).
    pub sampling: SamplingParams,
    /// Keep generating past EOS (as `aubier run --ignore-eos`).
    pub ignore_eos: bool,
}

/// The names refused on `/v1/chat/completions` when not at their default.
pub fn refused_chat_parameters() -> impl Iterator<Item = &'static str> {
    let names: Vec<&'static str> = ChatCompletionRequest::default()
        .refused()
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    names.into_iter()
}

/// The names refused on `/v1/completions` when not at their default.
pub fn refused_completion_parameters() -> impl Iterator<Item = &'static str> {
    let names: Vec<&'static str> = CompletionRequest::default()
        .refused()
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    names.into_iter()
}

/// `key` under `path` (serde_path_to_error's `.` is the body itself).
fn join(path: &str, key: &str) -> String {
    if path == "." {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// The name between the first pair of backticks of serde's `message`, when it starts with
/// `prefix` (serde's "unknown field `x`, …" and "missing field `x`").
fn quoted<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = message.strip_prefix(prefix)?.strip_prefix('`')?;
    rest.split('`').next()
}

/// The 400 of a body that does not deserialize into its wire type, naming the field's path.
fn field_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let message = e.inner().to_string();
    if let Some(key) = quoted(&message, "unknown field ") {
        // Inside an internally tagged object (a content chunk) the path stops at the object.
        let param = if path == key || path.ends_with(&format!(".{key}")) {
            path
        } else {
            join(&path, key)
        };
        return unknown_parameter(&param);
    }
    if let Some(key) = quoted(&message, "missing field ") {
        return missing_parameter(&join(&path, key));
    }
    let text = match message.strip_prefix("must ") {
        Some(rule) => format!("'{path}' must {rule}."),
        None => format!("Invalid value for '{path}': {message}."),
    };
    ApiError::bad_value(&path, text)
}

/// Reads `bytes` as the wire type `T`: [`object`], then [`typed`].
///
/// Errors: those of [`object`] and [`typed`].
pub(super) fn read<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    typed(object(bytes)?)
}

/// Reads `bytes` as a JSON object. A leading UTF-8 byte order mark is skipped: RFC 8259 § 8.1
/// lets a parser ignore it, and the parsers behind vLLM (Python's `json`) and llama.cpp
/// (nlohmann) do, so a body saved by an editor that writes one is read as sent.
///
/// Errors: 400 `invalid_json` for malformed JSON or a body that is not an object.
fn object(bytes: &[u8]) -> Result<Value, ApiError> {
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::invalid(
            None,
            "invalid_json",
            format!("The request body is not valid JSON: {e}."),
        )
    })?;
    if !value.is_object() {
        return Err(ApiError::invalid(
            None,
            "invalid_json",
            format!(
                "The request body must be a JSON object, got {}.",
                json_kind(&value)
            ),
        ));
    }
    Ok(value)
}

/// Reads the JSON object `value` as the wire type `T`. Errors: [`field_error`]'s.
fn typed<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(field_error)
}

/// Refuses each of `fields` sent with a non-default value, named under `prefix`
/// (`messages[0].`). A [`DefaultValue::One`] parameter that is not a count at all is invalid
/// rather than unsupported.
pub(super) fn refuse(fields: &[RefusedField<'_>], prefix: &str) -> Result<(), ApiError> {
    for (name, v, default) in fields {
        let full = format!("{prefix}{name}");
        let counted = json_uint(v).is_some_and(|n| n >= 1);
        if matches!(default, DefaultValue::One) && !v.is_null() && !counted {
            return Err(ApiError::bad_value(
                &full,
                format!("'{full}' must be an integer >= 1, got {v}."),
            ));
        }
        if !default.holds(v) {
            return Err(ApiError::unsupported(
                &full,
                &format!("is not implemented (default {})", default.describe()),
            ));
        }
    }
    Ok(())
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A count as `usize`. Errors: 400 naming `name` when it does not fit.
pub(super) fn count(name: &str, c: Option<Count>) -> Result<Option<usize>, ApiError> {
    c.map(|Count(n)| {
        usize::try_from(n)
            .map_err(|_| ApiError::bad_value(name, format!("'{name}' {n} is too large.")))
    })
    .transpose()
}

/// `sent` as an f32 in `[lo, hi]`, or `default` when absent.
///
/// Errors: 400 naming `name` outside the range.
fn bounded(
    name: &str,
    sent: Option<f64>,
    default: f32,
    (lo, hi): (f64, f64),
) -> Result<f32, ApiError> {
    match sent {
        None => Ok(default),
        Some(x) if (lo..=hi).contains(&x) => Ok(x as f32),
        Some(x) => Err(ApiError::bad_value(
            name,
            format!("'{name}' must be in [{lo}, {hi}], got {x}."),
        )),
    }
}

/// `sent` as an f32 in `(0, hi]`, or `default` when absent.
///
/// Errors: 400 naming `name` outside the range.
fn above_zero(name: &str, sent: Option<f64>, default: f32, hi: f64) -> Result<f32, ApiError> {
    match sent {
        None => Ok(default),
        Some(x) if x > 0.0 && x <= hi => Ok(x as f32),
        Some(x) => {
            let hi = if hi >= 1e6 {
                format!("{hi:e}")
            } else {
                hi.to_string()
            };
            Err(ApiError::bad_value(
                name,
                format!("'{name}' must be in (0, {hi}], got {x}."),
            ))
        }
    }
}

/// The sampler's parameters of a request, with the given defaults of `temperature` and `seed`.
///
/// Errors: 400 naming the field for a value outside its documented (OpenAI / vLLM) range, and
/// for one the engine's f32 makes invalid (`top_p` 1e-46 is 0 in f32): the narrowed values are
/// checked with the sampler's own rule ([`SamplingParams::validate`]), so a request that passes
/// here never fails in the sampler.
pub fn sampling(
    f: SamplingFields,
    default_temperature: f32,
    default_seed: u64,
) -> Result<SamplingParams, ApiError> {
    let top_k = match f.top_k {
        None => 0,
        Some(k) => usize::try_from(k.0)
            .map_err(|_| ApiError::bad_value("top_k", format!("'top_k' {} is too large.", k.0)))?,
    };
    let params = SamplingParams {
        temperature: bounded(
            "temperature",
            f.temperature,
            default_temperature,
            (0.0, 2.0),
        )?,
        top_p: above_zero("top_p", f.top_p, 1.0, 1.0)?,
        top_k,
        min_p: bounded("min_p", f.min_p, 0.0, (0.0, 1.0))?,
        presence_penalty: bounded("presence_penalty", f.presence_penalty, 0.0, (-2.0, 2.0))?,
        frequency_penalty: bounded("frequency_penalty", f.frequency_penalty, 0.0, (-2.0, 2.0))?,
        repetition_penalty: above_zero(
            "repetition_penalty",
            f.repetition_penalty,
            1.0,
            f64::from(f32::MAX),
        )?,
        seed: f.seed.map_or(default_seed, |s| s.0),
        logit_bias: Vec::new(),
    };
    params.validate().map_err(|e| {
        let name = e.field().unwrap_or("sampling");
        let sent = match name {
            "temperature" => f.temperature,
            "top_p" => f.top_p,
            "min_p" => f.min_p,
            "presence_penalty" => f.presence_penalty,
            "frequency_penalty" => f.frequency_penalty,
            _ => f.repetition_penalty,
        };
        ApiError::bad_value(
            name,
            format!(
                "'{name}' {} is out of range once narrowed to the engine's 32-bit float ({e}).",
                sent.map_or_else(|| "(default)".to_owned(), |x| x.to_string())
            ),
        )
    })?;
    Ok(params)
}

/// `logit_bias` as `(id, bias)` pairs by ascending id (OpenAI's API reference): at most
/// [`MAX_LOGIT_BIAS`] entries, each key a token id written in decimal (no sign, no leading
/// zero, below 2^32; the route checks it against the vocabulary), each value a number in
/// [-[`LOGIT_BIAS_RANGE`], [`LOGIT_BIAS_RANGE`]].
///
/// Errors: 400 naming `logit_bias`, and in its message the key at fault.
fn logit_bias(map: Option<LogitBias>) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = map.map(|m| m.0).unwrap_or_default();
    let bad = |text: String| ApiError::bad_value("logit_bias", text);
    if map.len() > MAX_LOGIT_BIAS {
        return Err(bad(format!(
            "'logit_bias' holds {} entries; at most {MAX_LOGIT_BIAS} are allowed.",
            map.len()
        )));
    }
    let mut pairs = map
        .iter()
        .map(|(key, v)| {
            // Canonical decimals only (no sign, no leading zero): those that print back as sent.
            let id = key
                .parse::<u32>()
                .ok()
                .filter(|id| id.to_string() == *key)
                .ok_or_else(|| {
                    bad(format!(
                        "'logit_bias' key {key:?} is not a token id (a decimal integer in [0, 2^32))."
                    ))
                })?;
            match v.as_f64() {
                Some(b) if (-LOGIT_BIAS_RANGE..=LOGIT_BIAS_RANGE).contains(&b) => Ok((id, b as f32)),
                _ => Err(bad(format!(
                    "'logit_bias' value of key {key:?} must be a number in [-{LOGIT_BIAS_RANGE}, {LOGIT_BIAS_RANGE}], got {v}."
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    pairs.sort_unstable_by_key(|&(id, _)| id);
    Ok(pairs)
}

/// The sampler's parameters of a chat or legacy completion request: [`sampling`] with OpenAI's
/// defaults (temperature 1, a fresh random seed) and the request's [`logit_bias`].
///
/// Errors: those of [`logit_bias`], then of [`sampling`].
fn openai_sampling(f: SamplingFields, bias: Option<LogitBias>) -> Result<SamplingParams, ApiError> {
    Ok(SamplingParams {
        logit_bias: logit_bias(bias)?,
        ..sampling(f, 1.0, random_seed())?
    })
}

/// [`Ends`] of a request: `min_tokens` above `max_tokens` (when given) is refused, as vLLM
/// refuses it; `stop_token_ids` are kept sorted, each once.
///
/// Errors: 400 naming `min_tokens`, or `stop_token_ids` for an element that is not a u32
/// (named `stop_token_ids[i]` in the message).
fn ends(
    ignore_eos: Option<bool>,
    min_tokens: Option<UInt>,
    stop_token_ids: Option<TokenList>,
    max_tokens: Option<usize>,
) -> Result<Ends, ApiError> {
    let mut stop_token_ids = match stop_token_ids {
        None => Vec::new(),
        Some(list) => token_ids("stop_token_ids", &list.0)
            .map_err(|e| ApiError::bad_value("stop_token_ids", format!("{e}.")))?,
    };
    stop_token_ids.sort_unstable();
    stop_token_ids.dedup();
    let min_tokens = match min_tokens.map(|m| usize::try_from(m.0)) {
        None => 0,
        Some(Ok(m)) if max_tokens.is_none_or(|max| m <= max) => m,
        Some(_) => {
            return Err(ApiError::bad_value(
                "min_tokens",
                format!(
                    "'min_tokens' ({}) must be at most 'max_tokens' ({}).",
                    min_tokens.map_or(0, |m| m.0),
                    max_tokens.map_or_else(|| "unbounded".to_owned(), |m| m.to_string())
                ),
            ))
        }
    };
    Ok(Ends {
        ignore_eos: ignore_eos.unwrap_or(false),
        min_tokens,
        stop_token_ids,
    })
}

/// A fresh seed for a request that did not send one (OpenAI sampling is unseeded by default).
pub fn random_seed() -> u64 {
    rand::random()
}

/// `n`: a count in [1, [`MAX_CHOICES`]], default 1.
///
/// Errors: 400 naming `n` for anything else.
fn choices(n: Option<Count>) -> Result<usize, ApiError> {
    match n {
        None => Ok(1),
        Some(Count(n)) if n <= MAX_CHOICES as u64 => Ok(n as usize),
        Some(Count(n)) => Err(ApiError::bad_value(
            "n",
            format!("'n' must be at most {MAX_CHOICES}, got {n}."),
        )),
    }
}

/// Chat `logprobs` (a boolean) and `top_logprobs` (0..=[`MAX_TOP_LOGPROBS`]): `Some(top)` when
/// `logprobs` is true. A `top_logprobs` above 0 needs `logprobs: true` (OpenAI; vLLM lets 0 pass
/// alone, as it changes nothing).
///
/// Errors: 400 naming the parameter at fault.
fn chat_logprobs(on: Option<bool>, top: Option<u64>) -> Result<Option<usize>, ApiError> {
    let on = on.unwrap_or(false);
    match top {
        Some(k) if k > MAX_TOP_LOGPROBS => Err(ApiError::bad_value(
            "top_logprobs",
            format!("'top_logprobs' must be in [0, {MAX_TOP_LOGPROBS}], got {k}."),
        )),
        Some(k) if k > 0 && !on => Err(ApiError::bad_value(
            "top_logprobs",
            "'top_logprobs' needs 'logprobs' to be true.",
        )),
        _ => Ok(on.then(|| top.unwrap_or(0) as usize)),
    }
}

/// Legacy completions `logprobs`: an integer in 0..=[`MAX_COMPLETION_LOGPROBS`], or absent.
///
/// Errors: 400 naming `logprobs` for anything else.
fn completion_logprobs(k: Option<u64>) -> Result<Option<usize>, ApiError> {
    match k {
        Some(k) if k > MAX_COMPLETION_LOGPROBS => Err(ApiError::bad_value(
            "logprobs",
            format!("'logprobs' must be in [0, {MAX_COMPLETION_LOGPROBS}], got {k}."),
        )),
        k => Ok(k.map(|k| k as usize)),
    }
}

/// `stop`: a string or an array of up to [`MAX_STOPS`] non-empty strings.
fn stop(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None => Vec::new(),
        Some(StrOr::Str(s)) => vec![s],
        Some(StrOr::Other(list)) => list,
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::bad_value(
            "stop",
            format!(
                "'stop' holds {} strings; at most {MAX_STOPS} are allowed.",
                stops.len()
            ),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::bad_value(
            "stop",
            "'stop' strings must not be empty.",
        ));
    }
    Ok(stops)
}

/// `stream` and `stream_options.include_usage` (`include_obfuscation` is accepted and has no
/// effect, since aubier never pads its chunks). `stream_options` without `stream` is refused, as
/// the OpenAI API does.
fn stream(stream: Option<bool>, options: Option<StreamOptions>) -> Result<(bool, bool), ApiError> {
    let stream = stream.unwrap_or(false);
    match options {
        Some(_) if !stream => Err(ApiError::bad_value(
            "stream_options",
            "'stream_options' is only allowed when 'stream' is true.",
        )),
        options => Ok((
            stream,
            options.and_then(|o| o.include_usage).unwrap_or(false),
        )),
    }
}

fn chunk(c: WireChunk) -> ContentChunk {
    match c {
        WireChunk::Text { text } => ContentChunk::Text { text },
        WireChunk::Thinking { thinking, closed } => ContentChunk::Thinking {
            thinking,
            closed: closed.unwrap_or(true),
        },
    }
}

fn tool_call(c: WireToolCall) -> ToolCall {
    ToolCall {
        id: c.id,
        kind: c.kind,
        function: FunctionCall {
            name: c.function.name,
            arguments: c.function.arguments.unwrap_or(Value::Null),
        },
    }
}

/// Message `i` as the chat template reads it.
///
/// Errors: 400 naming a refused key sent with a non-default value, or `reasoning` sent beside
/// `reasoning_content` (two names of one field).
fn message(i: usize, m: Message) -> Result<ChatMessage, ApiError> {
    let prefix = format!("messages[{i}].");
    refuse(&m.refused(), &prefix)?;
    if m.reasoning.is_some() && m.reasoning_content.is_some() {
        let name = format!("{prefix}reasoning");
        return Err(ApiError::bad_value(
            &name,
            format!("'{name}' is another name of 'reasoning_content'; send one of them."),
        ));
    }
    Ok(ChatMessage {
        role: m.role.0,
        content: m.content.map(|c| match c {
            StrOr::Str(s) => MessageContent::Text(s),
            StrOr::Other(chunks) => MessageContent::Chunks(chunks.into_iter().map(chunk).collect()),
        }),
        reasoning_content: m.reasoning_content.or(m.reasoning),
        tool_calls: m.tool_calls.map(|c| c.into_iter().map(tool_call).collect()),
        tool_call_id: m.tool_call_id,
        name: m.name,
    })
}

/// Parses and validates a chat completion request body.
///
/// Errors: 400 for malformed JSON, a missing `model` or `messages`, a value of the wrong type or out
/// of range, more than [`MAX_STOPS`] stops, a refused parameter at a non-default value (named in
/// `param`), or an unrecognised parameter.
pub fn parse_chat(bytes: &[u8]) -> Result<ChatParams, ApiError> {
    validate_chat(read(bytes)?)
}

/// Validates a chat completion request (the checks of [`parse_chat`] after reading).
///
/// Errors: as [`parse_chat`], but for malformed JSON and field types.
fn validate_chat(r: ChatCompletionRequest) -> Result<ChatParams, ApiError> {
    refuse(&r.refused(), "")?;
    let structured = structured(
        r.tools.as_deref().unwrap_or_default(),
        r.tool_choice.clone(),
        r.parallel_tool_calls,
        r.response_format.clone(),
        r.reasoning_effort == Some(ReasoningEffort::High),
    )?;
    let max_new = count("max_completion_tokens", r.max_completion_tokens)?;
    let max_old = count("max_tokens", r.max_tokens)?;
    let max_tokens = match (max_new, max_old) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::bad_value(
                "max_tokens",
                format!("'max_tokens' ({b}) and 'max_completion_tokens' ({a}) disagree; send one."),
            ))
        }
        (a, b) => a.or(b),
    };
    let sampling = openai_sampling(r.sampling_fields(), r.logit_bias)?;
    let (stream, include_usage) = stream(r.stream, r.stream_options)?;
    let generation = Generation {
        model: r.model.0,
        max_tokens,
        sampling,
        stream,
        include_usage,
        n: choices(r.n)?,
        logprobs: chat_logprobs(r.logprobs, r.top_logprobs.map(|k| k.0))?,
        stop: stop(r.stop)?,
        ends: ends(r.ignore_eos, r.min_tokens, r.stop_token_ids, max_tokens)?,
    };
    let tools =
        match &r.tools {
            Some(tools) => Some(serde_json::to_value(tools).map_err(|e| {
                ApiError::internal(format!("The tools do not serialize again: {e}."))
            })?),
            None => None,
        };
    let continue_final_message = r.continue_final_message.unwrap_or(false);
    if continue_final_message && r.add_generation_prompt == Some(true) {
        return Err(ApiError::bad_value(
            "add_generation_prompt",
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true.",
        ));
    }
    let messages = r
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let chat = ChatRequest {
        messages,
        tools,
        reasoning_effort: r.reasoning_effort.map(|e| {
            match e {
                ReasoningEffort::None => "none",
                ReasoningEffort::High => "high",
            }
            .to_owned()
        }),
        continue_final_message,
    };
    Ok(ChatParams {
        chat,
        structured,
        generation,
    })
}

/// The prompt of a legacy completion: one string, or one array of token ids (OpenAI's API takes
/// both).
///
/// Errors: 400 `unsupported_parameter` for a batch (an array of strings or of token-id arrays),
/// `invalid_value` for anything else that is neither.
fn prompt(v: Value) -> Result<Prompt, ApiError> {
    match v {
        Value::String(s) => Ok(Prompt::Text(s)),
        Value::Array(items) if items.iter().all(Value::is_number) => token_ids("prompt", &items)
            .map(Prompt::Ids)
            .map_err(|e| ApiError::bad_value("prompt", format!("{e}."))),
        Value::Array(items) if items.iter().all(|v| v.is_string() || v.is_array()) => {
            Err(ApiError::unsupported(
                "prompt",
                "as a batch (an array of strings or of token-id arrays) is not implemented; send one string or one array of token ids",
            ))
        }
        other => Err(ApiError::bad_value(
            "prompt",
            format!(
                "'prompt' must be a string or an array of token ids, got {}.",
                json_kind(&other)
            ),
        )),
    }
}

/// Parses and validates a (legacy) completion request body. `prompt` is one string or one array
/// of token ids (OpenAI's API takes both); a batch of prompts is refused.
///
/// Errors: as [`parse_chat`], with `prompt` in place of `messages`.
pub fn parse_completion(bytes: &[u8]) -> Result<CompletionParams, ApiError> {
    let r: CompletionRequest = read(bytes)?;
    refuse(&r.refused(), "")?;
    let prompt = prompt(r.prompt.0.clone())?;
    let sampling = openai_sampling(r.sampling_fields(), r.logit_bias)?;
    let (stream, include_usage) = stream(r.stream, r.stream_options)?;
    let max_tokens = count("max_tokens", r.max_tokens)?.unwrap_or(16);
    Ok(CompletionParams {
        prompt,
        generation: Generation {
            ends: ends(
                r.ignore_eos,
                r.min_tokens,
                r.stop_token_ids,
                Some(max_tokens),
            )?,
            model: r.model.0,
            max_tokens: Some(max_tokens),
            sampling,
            stream,
            include_usage,
            n: choices(r.n)?,
            logprobs: completion_logprobs(r.logprobs.map(|k| k.0))?,
            stop: stop(r.stop)?,
        },
    })
}

/// Parses and validates a `/debug/tokens` body: `{"ids": [u32], "max_tokens": n}` plus optional
/// `model`, `temperature` (default 0), the other sampling parameters of the chat route, `seed`
/// (default 0) and `ignore_eos`.
///
/// Errors: 400 for malformed JSON, missing `ids` / `max_tokens`, an id that is not a u32, bad
/// sampling values, or an unrecognised parameter.
pub fn parse_debug_tokens(bytes: &[u8]) -> Result<DebugTokensParams, ApiError> {
    let r: DebugTokensRequest = read(bytes)?;
    let max_tokens = usize::try_from(r.max_tokens.0).map_err(|_| {
        ApiError::bad_value(
            "max_tokens",
            format!("'max_tokens' {} is too large.", r.max_tokens.0),
        )
    })?;
    let sampling = sampling(r.sampling_fields(), 0.0, 0)?;
    Ok(DebugTokensParams {
        model: r.model.map(|m| m.0),
        ids: r.ids.0,
        max_tokens,
        sampling,
        ignore_eos: r.ignore_eos.unwrap_or(false),
    })
}

/// What a `POST /tokenize` body asks to tokenize.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizePrompt {
    /// The text form: `prompt`, with BOS unless `add_special_tokens` is false.
    Text {
        /// The text.
        text: String,
        /// `add_special_tokens` (default true): start with BOS, as `/v1/completions` does.
        bos: bool,
    },
    /// The chat form: the body read as the `/v1/chat/completions` body of the same messages,
    /// tools and settings, validated as that route validates it.
    Chat(Box<ChatParams>),
}

/// A validated `POST /tokenize` body.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizeParams {
    /// Optional `model`; when present it must be the served id.
    pub model: Option<String>,
    /// What to tokenize.
    pub prompt: TokenizePrompt,
    /// `return_token_strs` (default false).
    pub token_strs: bool,
}

/// Parses and validates a `POST /tokenize` body (vLLM's `TokenizeCompletionRequest` or
/// `TokenizeChatRequest`): a body with `messages` is the chat form, any other the text form.
/// The chat form goes through [`parse_chat`]'s checks, as a chat completion request carrying
/// its `messages`, `tools`, `reasoning_effort`, `continue_final_message` and
/// `add_generation_prompt`; vLLM's template knobs (`add_special_tokens`, `chat_template`,
/// `chat_template_kwargs`, ...) are refused by name unless at their default.
///
/// Errors: 400 for malformed JSON, a missing `prompt` (or `messages`), an unknown field (a chat
/// completion parameter such as `temperature` included), a refused parameter, or what
/// [`parse_chat`] refuses.
pub fn parse_tokenize(bytes: &[u8]) -> Result<TokenizeParams, ApiError> {
    let body = object(bytes)?;
    if body.get("messages").is_none() {
        let r: TokenizeCompletionRequest = typed(body)?;
        return Ok(TokenizeParams {
            model: r.model.map(|m| m.0),
            prompt: TokenizePrompt::Text {
                text: r.prompt,
                bos: r.add_special_tokens.unwrap_or(true),
            },
            token_strs: r.return_token_strs.unwrap_or(false),
        });
    }
    let r: TokenizeChatRequest = typed(body)?;
    refuse(&r.refused(), "")?;
    let model = r.model.map(|m| m.0);
    let chat = validate_chat(ChatCompletionRequest {
        model: ModelId(model.clone().unwrap_or_default()),
        messages: r.messages,
        tools: r.tools,
        reasoning_effort: r.reasoning_effort,
        continue_final_message: r.continue_final_message,
        add_generation_prompt: r.add_generation_prompt,
        ..ChatCompletionRequest::default()
    })?;
    Ok(TokenizeParams {
        model,
        prompt: TokenizePrompt::Chat(Box::new(chat)),
        token_strs: r.return_token_strs.unwrap_or(false),
    })
}

/// A validated `POST /detokenize` body.
#[derive(Clone, Debug, PartialEq)]
pub struct DetokenizeParams {
    /// Optional `model`; when present it must be the served id.
    pub model: Option<String>,
    /// The ids (each a u32; the route checks them against the vocabulary).
    pub tokens: Vec<u32>,
}

/// Parses a `POST /detokenize` body (vLLM's `DetokenizeRequest`): `{"tokens": [ids]}` and an
/// optional `model`. An empty `tokens` is accepted, as vLLM accepts it.
///
/// Errors: 400 for malformed JSON, a missing `tokens`, an element that is not a u32 (named
/// `tokens[i]` in the message), or an unknown field.
pub fn parse_detokenize(bytes: &[u8]) -> Result<DetokenizeParams, ApiError> {
    let r: DetokenizeRequest = read(bytes)?;
    let tokens = token_ids("tokens", &r.tokens.0)
        .map_err(|e| ApiError::bad_value("tokens", format!("{e}.")))?;
    Ok(DetokenizeParams {
        model: r.model.map(|m| m.0),
        tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(extra: &str) -> Result<ChatParams, ApiError> {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#);
        parse_chat(body.as_bytes())
    }

    #[test]
    fn a_leading_byte_order_mark_is_skipped() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
        let marked = format!("\u{feff}{body}");
        let p = parse_chat(marked.as_bytes()).unwrap();
        assert_eq!(p.generation.max_tokens, Some(2));
        // Only at the start: elsewhere it is not JSON whitespace.
        let inside = body.replacen('{', "{\u{feff}", 1);
        assert_eq!(
            parse_chat(inside.as_bytes()).unwrap_err().code,
            Some("invalid_json")
        );
    }

    #[test]
    fn add_generation_prompt_is_vllms_switch() {
        // vLLM's prefill recipe: continue the final message, without a generation prompt.
        let prefill = r#","continue_final_message":true,"add_generation_prompt":false"#;
        assert!(chat(prefill).unwrap().chat.continue_final_message);
        let answer = chat(r#","add_generation_prompt":true"#).unwrap();
        assert!(!answer.chat.continue_final_message);
        let e = chat(r#","continue_final_message":true,"add_generation_prompt":true"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("add_generation_prompt"));
        assert_eq!(e.code, Some("invalid_value"));
    }

    #[test]
    fn defaults_follow_openai() {
        let p = chat("").unwrap();
        assert_eq!(p.generation.sampling.temperature, 1.0);
        assert_eq!(p.generation.sampling.top_p, 1.0);
        assert_eq!(p.generation.max_tokens, None);
        assert!(!p.generation.stream);
        let c = parse_completion(br#"{"model":"m","prompt":"x"}"#).unwrap();
        assert_eq!(c.generation.max_tokens, Some(16));
    }

    #[test]
    fn every_refused_chat_parameter_is_named_when_not_default() {
        let non_default: &[(&str, &str)] = &[
            ("functions", r#"[{"name":"f"}]"#),
            ("function_call", r#"{"name":"f"}"#),
            ("audio", r#"{"voice":"alloy","format":"wav"}"#),
            ("modalities", r#"["text","audio"]"#),
            ("prediction", r#"{"type":"content","content":"x"}"#),
            ("web_search_options", "{}"),
            ("store", "true"),
            ("metadata", r#"{"a":"b"}"#),
            ("service_tier", r#""flex""#),
            ("verbosity", r#""low""#),
        ];
        let names: Vec<&str> = refused_chat_parameters().collect();
        assert_eq!(
            names,
            non_default.iter().map(|(n, _)| *n).collect::<Vec<_>>()
        );
        for (name, value) in non_default {
            let e = chat(&format!(r#","{name}":{value}"#)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(*name), "{name}");
            assert_eq!(e.code, Some("unsupported_parameter"), "{name}");
            assert!(e.message.contains(name), "{}", e.message);
        }
    }

    #[test]
    fn refused_parameters_are_accepted_at_their_defaults() {
        let defaults = r#","n":1,"tools":[],"tool_choice":"none","parallel_tool_calls":true,
            "functions":null,"function_call":"auto","logprobs":false,"top_logprobs":0,"logit_bias":{},
            "response_format":{"type":"text"},"presence_penalty":0,"frequency_penalty":0.0,
            "repetition_penalty":1,"min_p":0,"ignore_eos":false,"audio":null,"modalities":["text"],
            "prediction":null,"store":false,"metadata":{},"service_tier":"auto","verbosity":"medium",
            "user":"u1""#;
        chat(defaults).unwrap();
        let c = br#"{"model":"m","prompt":"x","n":1,"best_of":1,"echo":false,"suffix":null,
            "logprobs":null,"logit_bias":{},"presence_penalty":0,"frequency_penalty":0}"#;
        parse_completion(c).unwrap();
    }

    #[test]
    fn logit_bias_is_read_by_id_and_each_bad_key_is_named() {
        let bias = |extra: &str| chat(extra).map(|p| p.generation.sampling.logit_bias);
        assert_eq!(bias("").unwrap(), vec![]);
        assert_eq!(bias(r#","logit_bias":null"#).unwrap(), vec![]);
        assert_eq!(
            bias(r#","logit_bias":{"20":-100,"3":2.5,"0":100,"4294967295":-0.5}"#).unwrap(),
            vec![(0, 100.0), (3, 2.5), (20, -100.0), (u32::MAX, -0.5)]
        );
        let c = br#"{"model":"m","prompt":"x","logit_bias":{"7":-1}}"#;
        assert_eq!(
            parse_completion(c).unwrap().generation.sampling.logit_bias,
            vec![(7, -1.0)]
        );
        let many: Vec<String> = (0..=MAX_LOGIT_BIAS)
            .map(|i| format!(r#""{i}":1"#))
            .collect();
        let at_most = format!(r#","logit_bias":{{{}}}"#, many[1..].join(","));
        assert_eq!(bias(&at_most).unwrap().len(), MAX_LOGIT_BIAS);
        let too_many = format!("{{{}}}", many.join(","));
        for (value, shown) in [
            (r#"{"x":1}"#, r#""x""#),
            (r#"{"-1":1}"#, r#""-1""#),
            (r#"{"+1":1}"#, r#""+1""#),
            (r#"{"01":1}"#, r#""01""#),
            (r#"{" 1":1}"#, r#"" 1""#),
            (r#"{"1.0":1}"#, r#""1.0""#),
            (r#"{"":1}"#, r#"key """#),
            (r#"{"4294967296":1}"#, r#""4294967296""#),
            (r#"{"5":100.5}"#, r#""5""#),
            (r#"{"5":-101}"#, r#""5""#),
            (r#"{"5":"1"}"#, r#""5""#),
            (r#"{"5":null}"#, r#""5""#),
            (r#"{"1":1,"5":true}"#, r#""5""#),
            (too_many.as_str(), "301"),
            ("[1]", "map"),
            ("3", "map"),
        ] {
            let e = chat(&format!(r#","logit_bias":{value}"#)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("logit_bias"), "{value}");
            assert_eq!(e.code, Some("invalid_value"), "{value}");
            assert!(e.message.contains(shown), "{value}: {}", e.message);
        }
    }

    #[test]
    fn ignore_eos_min_tokens_and_stop_token_ids_are_vllms() {
        let ends = |extra: &str| chat(extra).map(|p| p.generation.ends);
        assert_eq!(ends("").unwrap(), Ends::default());
        assert_eq!(
            ends(r#","ignore_eos":true,"min_tokens":3.0,"stop_token_ids":[7,2,7],"max_tokens":3"#)
                .unwrap(),
            Ends {
                ignore_eos: true,
                min_tokens: 3,
                stop_token_ids: vec![2, 7],
            }
        );
        assert_eq!(ends(r#","min_tokens":9"#).unwrap().min_tokens, 9);
        let completion = |extra: &str| {
            let body = format!(r#"{{"model":"m","prompt":"x"{extra}}}"#);
            parse_completion(body.as_bytes()).map(|p| p.generation.ends)
        };
        // The completions default max_tokens is 16, and min_tokens may not pass it.
        assert_eq!(completion(r#","min_tokens":16"#).unwrap().min_tokens, 16);
        for (extra, param) in [
            (r#","min_tokens":17"#, "min_tokens"),
            (r#","min_tokens":5,"max_tokens":4"#, "min_tokens"),
            (r#","stop_token_ids":[1,-1]"#, "stop_token_ids"),
            (r#","stop_token_ids":7"#, "stop_token_ids"),
            (r#","ignore_eos":"yes""#, "ignore_eos"),
        ] {
            let e = completion(extra).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}");
        }
        let e = completion(r#","stop_token_ids":[1,-1]"#).unwrap_err();
        assert!(
            e.message.contains("'stop_token_ids[1]' is not a token id"),
            "{}",
            e.message
        );
        let e = ends(r#","min_tokens":5,"max_completion_tokens":4"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("min_tokens"));
    }

    #[test]
    fn every_refused_completion_parameter_is_named() {
        let non_default: &[(&str, &str)] =
            &[("best_of", "2"), ("echo", "true"), ("suffix", r#""end""#)];
        let names: Vec<&str> = refused_completion_parameters().collect();
        assert_eq!(
            names,
            non_default.iter().map(|(n, _)| *n).collect::<Vec<_>>()
        );
        for (name, value) in non_default {
            let body = format!(r#"{{"model":"m","prompt":"x","{name}":{value}}}"#);
            let e = parse_completion(body.as_bytes()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(*name));
            assert_eq!(e.code, Some("unsupported_parameter"));
        }
    }

    #[test]
    fn unknown_parameters_and_bad_values_are_refused_by_name() {
        let e = chat(r#","frobnicate":1"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("frobnicate"));
        assert_eq!(e.code, Some("unknown_parameter"));
        for (extra, param) in [
            (r#","temperature":2.5"#, "temperature"),
            (r#","temperature":"hot""#, "temperature"),
            (r#","top_p":0"#, "top_p"),
            (r#","top_k":-2"#, "top_k"),
            (r#","top_k":-1.5"#, "top_k"),
            (r#","seed":-3"#, "seed"),
            (r#","max_tokens":0"#, "max_tokens"),
            (r#","max_tokens":5,"max_completion_tokens":6"#, "max_tokens"),
            (r#","stop":["a","b","c","d","e"]"#, "stop"),
            (r#","stop":[""]"#, "stop"),
            (r#","stop":7"#, "stop"),
            (
                r#","stream_options":{"include_usage":true}"#,
                "stream_options",
            ),
            (
                r#","stream":true,"stream_options":{"x":1}"#,
                "stream_options.x",
            ),
        ] {
            let e = chat(extra).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
            assert_eq!(e.status, 400);
        }
    }

    #[test]
    fn four_stops_and_usage_option_are_accepted() {
        let p = chat(
            r#","stop":["a","b","c","d"],"stream":true,"stream_options":{"include_usage":true}"#,
        )
        .unwrap();
        assert_eq!(p.generation.stop.len(), 4);
        assert!(p.generation.stream && p.generation.include_usage);
        assert_eq!(
            chat(r#","stop":"x""#).unwrap().generation.stop,
            vec!["x".to_owned()]
        );
    }

    #[test]
    fn malformed_json_and_missing_fields_are_400() {
        for body in [&b"{"[..], b"[1]", b"\"x\""] {
            let e = parse_chat(body).unwrap_err();
            assert_eq!(e.code, Some("invalid_json"));
            assert_eq!(e.status, 400);
        }
        let e = parse_chat(br#"{"model":"m"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = parse_completion(br#"{"model":"m","prompt":["a"]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }

    #[test]
    fn sampling_values_are_checked_as_the_engine_narrows_them() {
        for top_p in ["5e-324", "1e-46", "7.006492321624085e-46"] {
            let e = chat(&format!(r#","top_p":{top_p}"#)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("top_p"), "{top_p}");
            assert!(e.message.contains("32-bit"), "{}", e.message);
        }
        // Just above 2^-150 rounds up to the smallest f32, which the sampler accepts.
        let p = chat(r#","top_p":7.006492321624087e-46"#).unwrap();
        assert!(p.generation.sampling.top_p > 0.0);
        let p = chat(r#","temperature":1e-46"#).unwrap();
        assert_eq!(p.generation.sampling.temperature, 0.0);
        let e = chat(r#","temperature":2.0000000000000004"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse_debug_tokens(br#"{"ids":[1],"max_tokens":1,"top_p":1e-300}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_p"));
    }

    #[test]
    fn top_k_minus_one_is_off_as_in_vllm_and_llama_cpp() {
        for extra in [r#","top_k":-1"#, r#","top_k":-1.0"#, r#","top_k":0"#] {
            assert_eq!(chat(extra).unwrap().generation.sampling.top_k, 0, "{extra}");
        }
        let e = chat(r#","top_k":-2"#).unwrap_err();
        assert!(e.message.contains("-1 (off)"), "{}", e.message);
    }

    #[test]
    fn integers_may_be_written_as_integral_floats() {
        let p = chat(r#","max_tokens":2.0,"seed":3.0,"top_k":4e0"#).unwrap();
        assert_eq!(
            (
                p.generation.max_tokens,
                p.generation.sampling.seed,
                p.generation.sampling.top_k
            ),
            (Some(2), 3, 4)
        );
        for extra in [
            r#","seed":0.5"#,
            r#","seed":1.8446744073709552e19"#,
            r#","top_k":-0.5"#,
        ] {
            assert_eq!(
                chat(extra).unwrap_err().code,
                Some("invalid_value"),
                "{extra}"
            );
        }
        let p = parse_debug_tokens(br#"{"ids":[5.0],"max_tokens":1.0}"#).unwrap();
        assert_eq!((p.ids, p.max_tokens), (vec![5], 1));
    }

    #[test]
    fn counts_below_one_are_invalid_with_one_message() {
        for (extra, name) in [
            (r#","n":0"#, "n"),
            (r#","n":-2"#, "n"),
            (r#","max_tokens":0"#, "max_tokens"),
            (r#","max_tokens":-1"#, "max_tokens"),
            (r#","max_completion_tokens":0"#, "max_completion_tokens"),
        ] {
            let e = chat(extra).unwrap_err();
            assert_eq!(e.code, Some("invalid_value"), "{extra}");
            assert!(
                e.message
                    .starts_with(&format!("'{name}' must be an integer >= 1, got ")),
                "{}",
                e.message
            );
        }
        let e = parse_completion(br#"{"model":"m","prompt":"x","best_of":0}"#).unwrap_err();
        assert_eq!(e.code, Some("invalid_value"));
        let e = chat(r#","n":9"#).unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.code),
            (Some("n"), Some("invalid_value"))
        );
    }

    #[test]
    fn penalties_and_min_p_are_taken_and_range_checked() {
        let p = chat(
            r#","min_p":0.05,"presence_penalty":-2,"frequency_penalty":2,"repetition_penalty":1.3"#,
        )
        .unwrap();
        let s = &p.generation.sampling;
        assert_eq!(
            (
                s.min_p,
                s.presence_penalty,
                s.frequency_penalty,
                s.repetition_penalty
            ),
            (0.05, -2.0, 2.0, 1.3)
        );
        let d = chat("").unwrap().generation.sampling;
        assert_eq!(
            (
                d.min_p,
                d.presence_penalty,
                d.frequency_penalty,
                d.repetition_penalty
            ),
            (0.0, 0.0, 0.0, 1.0)
        );
        for (extra, param) in [
            (r#","min_p":1.5"#, "min_p"),
            (r#","min_p":-0.1"#, "min_p"),
            (r#","presence_penalty":2.5"#, "presence_penalty"),
            (r#","frequency_penalty":-2.01"#, "frequency_penalty"),
            (r#","frequency_penalty":"x""#, "frequency_penalty"),
            (r#","repetition_penalty":0"#, "repetition_penalty"),
            (r#","repetition_penalty":-1"#, "repetition_penalty"),
            // Positive, but 0 once narrowed to f32; and just past f32's range.
            (r#","repetition_penalty":1e-50"#, "repetition_penalty"),
            (
                r#","repetition_penalty":3.4028234663852894e38"#,
                "repetition_penalty",
            ),
            // The double just above f32::MAX (parsed to the nearest f64, not one below).
            (
                r#","repetition_penalty":3.402823466385289e38"#,
                "repetition_penalty",
            ),
        ] {
            let e = chat(extra).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
            assert_eq!(e.code, Some("invalid_value"), "{extra}");
            let body = format!(r#"{{"model":"m","prompt":"x"{extra}}}"#);
            let e = parse_completion(body.as_bytes()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}");
        }
    }

    #[test]
    fn n_and_logprobs_are_parsed_and_bounded() {
        let p = chat(r#","n":8,"logprobs":true,"top_logprobs":20"#).unwrap();
        assert_eq!((p.generation.n, p.generation.logprobs), (8, Some(20)));
        assert_eq!(
            chat(r#","logprobs":true"#).unwrap().generation.logprobs,
            Some(0)
        );
        let p = chat(r#","logprobs":false,"top_logprobs":0"#).unwrap();
        assert_eq!((p.generation.n, p.generation.logprobs), (1, None));
        for (extra, param) in [
            (r#","logprobs":true,"top_logprobs":21"#, "top_logprobs"),
            (r#","top_logprobs":3"#, "top_logprobs"),
            (r#","logprobs":false,"top_logprobs":1"#, "top_logprobs"),
            (r#","logprobs":1"#, "logprobs"),
            (r#","n":"2""#, "n"),
        ] {
            let e = chat(extra).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
            assert_eq!(e.code, Some("invalid_value"), "{extra}");
        }
        let c = |extra: &str| {
            parse_completion(format!(r#"{{"model":"m","prompt":"x"{extra}}}"#).as_bytes())
        };
        let p = c(r#","n":3,"logprobs":5"#).unwrap();
        assert_eq!((p.generation.n, p.generation.logprobs), (3, Some(5)));
        assert_eq!(c(r#","logprobs":0"#).unwrap().generation.logprobs, Some(0));
        assert_eq!(c("").unwrap().generation.logprobs, None);
        for (extra, param) in [
            (r#","logprobs":6"#, "logprobs"),
            (r#","logprobs":true"#, "logprobs"),
            (r#","n":9"#, "n"),
        ] {
            assert_eq!(
                c(extra).unwrap_err().param.as_deref(),
                Some(param),
                "{extra}"
            );
        }
    }

    #[test]
    fn a_completion_prompt_is_a_string_or_token_ids() {
        let prompt =
            |p: &str| parse_completion(format!(r#"{{"model":"m","prompt":{p}}}"#).as_bytes());
        assert_eq!(
            prompt(r#""hi""#).unwrap().prompt,
            Prompt::Text("hi".to_owned())
        );
        assert_eq!(
            prompt("[1, 2.0, 3]").unwrap().prompt,
            Prompt::Ids(vec![1, 2, 3])
        );
        assert_eq!(prompt("[]").unwrap().prompt, Prompt::Ids(Vec::new()));
        for (p, code) in [
            ("[1, -2]", "invalid_value"),
            ("[4294967296]", "invalid_value"),
            (r#"[1, "a"]"#, "invalid_value"),
            ("7", "invalid_value"),
            (r#"["a", "b"]"#, "unsupported_parameter"),
            ("[[1, 2]]", "unsupported_parameter"),
        ] {
            let e = prompt(p).unwrap_err();
            assert_eq!(
                (e.param.as_deref(), e.code),
                (Some("prompt"), Some(code)),
                "{p}"
            );
        }
    }

    #[test]
    fn messages_follow_the_unknown_field_policy() {
        let body = |messages: &str| format!(r#"{{"model":"m","messages":{messages}}}"#);
        for (messages, param, code) in [
            (
                r#"[{"role":"user","content":"x","extra":1}]"#,
                "messages[0].extra",
                "unknown_parameter",
            ),
            (
                r#"[{"role":"user","content":[{"type":"thinking","thinking":"t","x":0}]}]"#,
                "messages[0].content[0].x",
                "unknown_parameter",
            ),
            (
                r#"[{"role":"assistant","audio":{"id":"a"}}]"#,
                "messages[0].audio",
                "unsupported_parameter",
            ),
        ] {
            let e = parse_chat(body(messages).as_bytes()).unwrap_err();
            assert_eq!((e.param.as_deref(), e.code), (Some(param), Some(code)));
        }
        // Known keys, and refused ones at their defaults, pass through to the template.
        let p = parse_chat(
            body(r#"[{"role":"user","content":"x","name":"n","refusal":null,"annotations":[]}]"#)
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(p.chat.messages[0].name.as_deref(), Some("n"));
    }

    fn tokenize(body: &str) -> Result<TokenizeParams, ApiError> {
        parse_tokenize(body.as_bytes())
    }

    #[test]
    fn tokenize_reads_the_text_form_or_the_chat_form_by_messages() {
        let p = tokenize(r#"{"prompt":"hi"}"#).unwrap();
        assert_eq!(p.model, None);
        assert!(!p.token_strs);
        let text = |text: &str, bos| TokenizePrompt::Text {
            text: text.to_owned(),
            bos,
        };
        assert_eq!(p.prompt, text("hi", true));
        let p = tokenize(
            r#"{"model":"m","prompt":"","add_special_tokens":false,"return_token_strs":true}"#,
        )
        .unwrap();
        assert_eq!(
            (p.model.as_deref(), p.prompt, p.token_strs),
            (Some("m"), text("", false), true)
        );
        // The chat form is read as the chat completion body of the same fields.
        let messages = r#""messages":[{"role":"user","content":"hi"}]"#;
        let extra = r#","reasoning_effort":"high","continue_final_message":false,"add_generation_prompt":true,"tools":[{"type":"function","function":{"name":"f"}}]"#;
        let TokenizePrompt::Chat(p) = tokenize(&format!("{{{messages}{extra}}}")).unwrap().prompt
        else {
            panic!("the chat form")
        };
        let chat = parse_chat(format!(r#"{{"model":"m",{messages}{extra}}}"#).as_bytes()).unwrap();
        assert_eq!((&p.chat, &p.structured), (&chat.chat, &chat.structured));
        assert!(chat.chat.tools.is_some());
        assert_eq!(chat.chat.reasoning_effort.as_deref(), Some("high"));
    }

    #[test]
    fn tokenize_refuses_what_the_chat_route_refuses_and_vllms_other_knobs_by_name() {
        let messages = r#""messages":[{"role":"user","content":"hi"}]"#;
        for (extra, param, code) in [
            (r#","temperature":1"#, "temperature", "unknown_parameter"),
            (
                r#","tool_choice":"auto""#,
                "tool_choice",
                "unknown_parameter",
            ),
            (r#","prompt":"x""#, "prompt", "unknown_parameter"),
            (
                r#","add_special_tokens":true"#,
                "add_special_tokens",
                "unsupported_parameter",
            ),
            (
                r#","chat_template":"{{ x }}""#,
                "chat_template",
                "unsupported_parameter",
            ),
            (
                r#","chat_template_kwargs":{"a":1}"#,
                "chat_template_kwargs",
                "unsupported_parameter",
            ),
            (
                r#","mm_processor_kwargs":{"a":1}"#,
                "mm_processor_kwargs",
                "unsupported_parameter",
            ),
            (
                r#","media_io_kwargs":{"image":{}}"#,
                "media_io_kwargs",
                "unsupported_parameter",
            ),
            (
                r#","continue_final_message":true,"add_generation_prompt":true"#,
                "add_generation_prompt",
                "invalid_value",
            ),
            (
                r#","tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]"#,
                "tools[1].function.name",
                "invalid_value",
            ),
            (
                r#","reasoning_effort":"medium""#,
                "reasoning_effort",
                "invalid_value",
            ),
            (
                r#","return_token_strs":1"#,
                "return_token_strs",
                "invalid_value",
            ),
        ] {
            let e = tokenize(&format!("{{{messages}{extra}}}")).unwrap_err();
            assert_eq!(
                (e.param.as_deref(), e.code),
                (Some(param), Some(code)),
                "{extra}: {}",
                e.message
            );
        }
        let defaults = r#","add_special_tokens":false,"chat_template":null,"chat_template_kwargs":{},"mm_processor_kwargs":null,"media_io_kwargs":{}"#;
        tokenize(&format!("{{{messages}{defaults}}}")).unwrap();
        let names: Vec<&str> = TokenizeChatRequest::default()
            .refused()
            .into_iter()
            .map(|(name, _, _)| name)
            .collect();
        assert_eq!(
            names,
            [
                "add_special_tokens",
                "chat_template",
                "chat_template_kwargs",
                "mm_processor_kwargs",
                "media_io_kwargs"
            ]
        );
        for (body, param, code) in [
            (r#"{}"#, Some("prompt"), "missing_required_parameter"),
            (
                r#"{"prompt":"x","temperature":1}"#,
                Some("temperature"),
                "unknown_parameter",
            ),
            (r#"{"prompt":["x"]}"#, Some("prompt"), "invalid_value"),
            (
                r#"{"prompt":"x","add_special_tokens":"yes"}"#,
                Some("add_special_tokens"),
                "invalid_value",
            ),
            (r#"{"messages":null}"#, Some("messages"), "invalid_value"),
            (
                r#"{"messages":[{"role":"user","content":"x","colour":1}]}"#,
                Some("messages[0].colour"),
                "unknown_parameter",
            ),
            (r#"["prompt"]"#, None, "invalid_json"),
            (r#"{"prompt":"x""#, None, "invalid_json"),
        ] {
            let e = tokenize(body).unwrap_err();
            assert_eq!((e.param.as_deref(), e.code), (param, Some(code)), "{body}");
        }
    }

    #[test]
    fn detokenize_reads_token_ids_and_names_a_bad_one() {
        let p = parse_detokenize(br#"{"tokens":[1,2.0,3]}"#).unwrap();
        assert_eq!((p.model, p.tokens), (None, vec![1, 2, 3]));
        let p = parse_detokenize(br#"{"model":"m","tokens":[]}"#).unwrap();
        assert_eq!((p.model.as_deref(), p.tokens), (Some("m"), Vec::new()));
        for (body, code, named) in [
            (r#"{"tokens":[1,-2]}"#, "invalid_value", "'tokens[1]'"),
            (r#"{"tokens":[4294967296]}"#, "invalid_value", "'tokens[0]'"),
            (r#"{"tokens":[1,"a"]}"#, "invalid_value", "'tokens[1]'"),
            (r#"{"tokens":"1"}"#, "invalid_value", "'tokens'"),
            (r#"{}"#, "missing_required_parameter", "'tokens'"),
            (r#"{"tokens":[1],"x":1}"#, "unknown_parameter", "'x'"),
        ] {
            let e = parse_detokenize(body.as_bytes()).unwrap_err();
            assert_eq!(e.code, Some(code), "{body}");
            assert!(e.message.contains(named), "{body}: {}", e.message);
        }
    }

    #[test]
    fn debug_tokens_is_greedy_by_default() {
        let p = parse_debug_tokens(br#"{"ids":[1,2,3],"max_tokens":4}"#).unwrap();
        assert_eq!(p.ids, vec![1, 2, 3]);
        assert_eq!(p.sampling.temperature, 0.0);
        assert_eq!(p.sampling.seed, 0);
        let e = parse_debug_tokens(br#"{"ids":[1,-2],"max_tokens":4}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("ids"));
        let e = parse_debug_tokens(br#"{"ids":[1]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
    }
}
