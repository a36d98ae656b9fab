//! Request parameters: parse and validate the JSON bodies of `/v1/chat/completions`,
//! `/v1/completions` and `/debug/tokens`.
//!
//! Algorithm: the body is read as one JSON object; each accepted parameter is taken out of it and
//! type- and range-checked; each recognised but unimplemented parameter is taken out and refused
//! **by name** unless it carries its default value (a silently ignored parameter would give an answer
//! that looks like the one the client asked for); any key left over is refused by name as
//! unrecognised, as the OpenAI API itself does. The same policy holds inside each message of
//! `messages` (its content chunks and tool calls): known keys are taken, known but unimplemented
//! ones refused unless at their default, unknown ones refused by name (`messages[1].foo`).
//! Integers follow JSON Schema: `2.0` is the integer 2. Floats the engine computes in f32
//! (`temperature`, `top_p`) are checked after narrowing, with the sampler's own rule, so no value
//! a client sends can reach the engine invalid. The parameter names and defaults follow the OpenAI
//! API reference (Chat Completions and legacy Completions) and, for `top_k` / `repetition_penalty` /
//! `min_p` / `ignore_eos` / `continue_final_message`, vLLM's OpenAI server.

use super::error::ApiError;
use super::tools::{structured, Structured};
use aubier_runtime::sampler::{SampleError, Sampler, SamplingParams};
use serde_json::{Map, Number, Value};

/// Most stop strings one request may carry (the OpenAI limit).
pub const MAX_STOPS: usize = 4;

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 8;

/// Most `top_logprobs` of a chat request (the OpenAI limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// Most `logprobs` of a legacy completion request (the OpenAI limit).
pub const MAX_COMPLETION_LOGPROBS: u64 = 5;

/// Sampling settings of one request (OpenAI names; `top_k`, `min_p` and `repetition_penalty` are
/// the vLLM extensions). The semantics and their order: `aubier_runtime::sampler`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature in [0, 2]; 0 is greedy. Default 1 (OpenAI), 0 on `/debug/tokens`.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; default 1 (off).
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 (default) is off.
    pub top_k: usize,
    /// Drop tokens below `min_p` × the top probability, in [0, 1]; 0 (default) is off.
    pub min_p: f32,
    /// OpenAI's presence penalty, in [-2, 2]; default 0.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty, in [-2, 2]; default 0.
    pub frequency_penalty: f32,
    /// The repetition penalty (> 0; default 1, off).
    pub repetition_penalty: f32,
    /// Seed of the sampler; `None` = a fresh random seed per request (OpenAI semantics).
    pub seed: Option<u64>,
}

/// A validated `POST /v1/chat/completions` body.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatParams {
    /// The `model` field.
    pub model: String,
    /// `messages`, `tools`, `reasoning_effort` and `continue_final_message`, as a JSON object
    /// for `aubier_runtime::text::chat::ChatRequest`'s deserializer.
    pub chat: Value,
    /// `tools`, `tool_choice`, `parallel_tool_calls` and `response_format`: the grammar to
    /// enforce and whether tool calls are read.
    pub structured: Structured,
    /// `max_completion_tokens` (or its older name `max_tokens`); `None` = up to the KV capacity.
    pub max_tokens: Option<usize>,
    /// Sampling settings.
    pub sampling: Sampling,
    /// Stop strings (≤ [`MAX_STOPS`], each non-empty).
    pub stop: Vec<String>,
    /// `stream`: answer with server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: send a last chunk with the token counts.
    pub include_usage: bool,
    /// `n`: choices to generate, in [1, [`MAX_CHOICES`]].
    pub n: usize,
    /// `Some(k)` with `logprobs: true`: each token's log-probability and the `k` most likely
    /// (`top_logprobs`, ≤ [`MAX_TOP_LOGPROBS`]).
    pub logprobs: Option<usize>,
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
    /// The `model` field.
    pub model: String,
    /// The prompt: one string or one array of token ids.
    pub prompt: Prompt,
    /// `max_tokens`; default 16 (the OpenAI default of this endpoint).
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampling: Sampling,
    /// Stop strings (≤ [`MAX_STOPS`], each non-empty).
    pub stop: Vec<String>,
    /// `stream`: answer with server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `n`: choices to generate, in [1, [`MAX_CHOICES`]].
    pub n: usize,
    /// `logprobs` (≤ [`MAX_COMPLETION_LOGPROBS`]): each token's log-probability and the `k` most
    /// likely.
    pub logprobs: Option<usize>,
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
    /// Sampling settings; greedy unless `temperature` is given (as `aubier run`).
    pub sampling: Sampling,
    /// Keep generating past EOS (as `aubier run --ignore-eos`).
    pub ignore_eos: bool,
}

/// How a refused parameter's default is recognised.
#[derive(Clone, Copy, Debug)]
enum DefaultValue {
    /// Only `null` (absent).
    Null,
    /// `null` or the count 1; any other integer >= 1 is unsupported, anything else invalid.
    One,
    /// `null` or `false`.
    False,
    /// `null`, `""`, `[]` or `{}`.
    Empty,
    /// `null` or one of these strings.
    OneOf(&'static [&'static str]),
    /// `null` or `["text"]`.
    TextModality,
}

impl DefaultValue {
    fn holds(self, v: &Value) -> bool {
        match (self, v) {
            (_, Value::Null) => true,
            (DefaultValue::One, Value::Number(n)) => as_uint(n) == Some(1),
            (DefaultValue::False, Value::Bool(b)) => !b,
            (DefaultValue::Empty, Value::String(s)) => s.is_empty(),
            (DefaultValue::Empty, Value::Array(a)) => a.is_empty(),
            (DefaultValue::Empty, Value::Object(o)) => o.is_empty(),
            (DefaultValue::OneOf(names), Value::String(s)) => names.contains(&s.as_str()),
            (DefaultValue::TextModality, Value::Array(a)) => {
                a.len() == 1 && a[0].as_str() == Some("text")
            }
            _ => false,
        }
    }

    fn describe(self) -> String {
        match self {
            DefaultValue::Null => "null".to_owned(),
            DefaultValue::One => "1".to_owned(),
            DefaultValue::False => "false".to_owned(),
            DefaultValue::Empty => "empty".to_owned(),
            DefaultValue::OneOf(names) => names.join(" or "),
            DefaultValue::TextModality => "[\"text\"]".to_owned(),
        }
    }
}

/// Parameters of `/v1/chat/completions` that are recognised but not implemented, with their default.
const REFUSED_CHAT: &[(&str, DefaultValue)] = &[
    ("functions", DefaultValue::Empty),
    ("function_call", DefaultValue::OneOf(&["none", "auto"])),
    ("logit_bias", DefaultValue::Empty),
    ("ignore_eos", DefaultValue::False),
    ("audio", DefaultValue::Null),
    ("modalities", DefaultValue::TextModality),
    ("prediction", DefaultValue::Null),
    ("web_search_options", DefaultValue::Null),
    ("store", DefaultValue::False),
    ("metadata", DefaultValue::Empty),
    ("service_tier", DefaultValue::OneOf(&["auto", "default"])),
    ("verbosity", DefaultValue::OneOf(&["medium"])),
];

/// Parameters of `/v1/completions` that are recognised but not implemented, with their default.
const REFUSED_COMPLETIONS: &[(&str, DefaultValue)] = &[
    ("best_of", DefaultValue::One),
    ("echo", DefaultValue::False),
    ("suffix", DefaultValue::Empty),
    ("logit_bias", DefaultValue::Empty),
    ("ignore_eos", DefaultValue::False),
];

/// Identifier-only parameters: accepted and ignored, because they never change the answer
/// (`user`, `safety_identifier` and `prompt_cache_key` label the caller for the provider).
const IDENTIFIERS: &[&str] = &["user", "safety_identifier", "prompt_cache_key"];

/// The names refused on `/v1/chat/completions` when not at their default, in table order.
pub fn refused_chat_parameters() -> impl Iterator<Item = &'static str> {
    REFUSED_CHAT.iter().map(|(n, _)| *n)
}

/// The names refused on `/v1/completions` when not at their default, in table order.
pub fn refused_completion_parameters() -> impl Iterator<Item = &'static str> {
    REFUSED_COMPLETIONS.iter().map(|(n, _)| *n)
}

/// The request body as a JSON object whose keys are taken out as they are validated.
struct Body {
    map: Map<String, Value>,
}

impl Body {
    /// Parses `bytes`. Errors: 400 `invalid_json` naming serde's position, or when the body is not an
    /// object.
    fn parse(bytes: &[u8]) -> Result<Body, ApiError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            ApiError::invalid(
                None,
                "invalid_json",
                format!("The request body is not valid JSON: {e}."),
            )
        })?;
        match value {
            Value::Object(map) => Ok(Body { map }),
            other => Err(ApiError::invalid(
                None,
                "invalid_json",
                format!(
                    "The request body must be a JSON object, got {}.",
                    json_kind(&other)
                ),
            )),
        }
    }

    /// Removes `name`; an explicit `null` counts as absent.
    fn take(&mut self, name: &str) -> Option<Value> {
        self.map.remove(name).filter(|v| !v.is_null())
    }

    fn string(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(name, "a string", &other)),
        }
    }

    fn bool(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(wrong_type(name, "a boolean", &other)),
        }
    }

    fn number(&mut self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(x) => Ok(Some(x)),
                None => Err(ApiError::bad_value(
                    name,
                    format!("'{name}' is not a finite number."),
                )),
            },
            Some(other) => Err(wrong_type(name, "a number", &other)),
        }
    }

    fn uint(&mut self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Number(n)) => as_uint(&n).map(Some).ok_or_else(|| {
                ApiError::bad_value(
                    name,
                    format!("'{name}' must be an integer in [0, 2^64), got {n}."),
                )
            }),
            Some(other) => Err(wrong_type(name, "an integer", &other)),
        }
    }

    /// A count of at least 1 (`max_tokens`, `n`): one message for 0, -1, 2.5 or `"x"`.
    fn count(&mut self, name: &str) -> Result<Option<usize>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => count_of(name, &v).map(Some),
        }
    }

    /// Refuses each parameter of `table` present with a non-default value.
    fn refuse(&mut self, table: &[(&str, DefaultValue)]) -> Result<(), ApiError> {
        refuse_in(&mut self.map, table, "")
    }

    /// Removes identifier-only parameters after checking they are strings.
    fn identifiers(&mut self) -> Result<(), ApiError> {
        for name in IDENTIFIERS {
            self.string(name)?;
        }
        Ok(())
    }

    /// Refuses the first key nobody took.
    fn finish(self) -> Result<(), ApiError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(k) => Err(unknown_parameter(k)),
        }
    }
}

/// The integer `n` holds, if any: JSON Schema counts `2.0` as the integer 2.
fn as_uint(n: &Number) -> Option<u64> {
    // 2^64: every integral f64 below it converts to u64 exactly.
    const LIMIT: f64 = 18_446_744_073_709_551_616.0;
    n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|x| x.fract() == 0.0 && *x >= 0.0 && *x < LIMIT)
            .map(|x| x as u64)
    })
}

/// `v` as a count >= 1. Errors: 400 naming `name` for anything else.
fn count_of(name: &str, v: &Value) -> Result<usize, ApiError> {
    v.as_number()
        .and_then(as_uint)
        .filter(|&n| n >= 1)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            ApiError::bad_value(name, format!("'{name}' must be an integer >= 1, got {v}."))
        })
}

/// Refuses each parameter of `table` in `map` present with a non-default value (`prefix` names
/// the enclosing object, as `messages[0].`). A [`DefaultValue::One`] parameter that is not a
/// count at all is invalid rather than unsupported.
fn refuse_in(
    map: &mut Map<String, Value>,
    table: &[(&str, DefaultValue)],
    prefix: &str,
) -> Result<(), ApiError> {
    for (name, default) in table {
        if let Some(v) = map.remove(*name) {
            let full = format!("{prefix}{name}");
            if matches!(default, DefaultValue::One) && !v.is_null() {
                count_of(&full, &v)?;
            }
            if !default.holds(&v) {
                return Err(ApiError::unsupported(
                    &full,
                    &format!("is not implemented (default {})", default.describe()),
                ));
            }
        }
    }
    Ok(())
}

/// 400 `missing_required_parameter` for `name`.
pub(super) fn missing_parameter(name: &str) -> ApiError {
    ApiError::invalid(
        Some(name),
        "missing_required_parameter",
        format!("Missing required parameter: '{name}'."),
    )
}

/// 400 `unknown_parameter` for `name`.
pub(super) fn unknown_parameter(name: &str) -> ApiError {
    ApiError::invalid(
        Some(name),
        "unknown_parameter",
        format!("Unrecognized request argument supplied: '{name}'."),
    )
}

/// Keys of a message the chat template reads (`reasoning` is `reasoning_content`'s other name).
const MESSAGE_KEYS: &[&str] = &[
    "role",
    "content",
    "reasoning_content",
    "reasoning",
    "tool_calls",
    "tool_call_id",
    "name",
];

/// Message keys of the OpenAI API that aubier does not implement, with their default.
const REFUSED_MESSAGE: &[(&str, DefaultValue)] = &[
    ("refusal", DefaultValue::Null),
    ("audio", DefaultValue::Null),
    ("function_call", DefaultValue::Null),
    ("annotations", DefaultValue::Empty),
];

/// Applies the unknown-key policy to an object inside `messages`: `known` keys stay, `refused`
/// ones are taken out (and refused unless at their default), anything else is refused by name.
/// Values that are not objects are left to the chat deserializer, which names their type.
fn check_object(
    value: &mut Value,
    known: &[&str],
    refused: &[(&str, DefaultValue)],
    prefix: &str,
) -> Result<(), ApiError> {
    let Value::Object(map) = value else {
        return Ok(());
    };
    refuse_in(map, refused, prefix)?;
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(unknown_parameter(&format!("{prefix}{k}"))),
    }
}

/// Checks every message, content chunk and tool call of `messages` for unknown keys (see the
/// module note).
fn check_messages(messages: &mut [Value]) -> Result<(), ApiError> {
    for (i, message) in messages.iter_mut().enumerate() {
        let prefix = format!("messages[{i}].");
        check_object(message, MESSAGE_KEYS, REFUSED_MESSAGE, &prefix)?;
        if let Some(Value::Array(chunks)) = message.get_mut("content") {
            for (j, chunk) in chunks.iter_mut().enumerate() {
                let known: &[&str] = match chunk.get("type").and_then(Value::as_str) {
                    Some("text") => &["type", "text"],
                    Some("thinking") => &["type", "thinking", "closed"],
                    // Other chunk types (images, audio) are refused by the template as a whole.
                    _ => continue,
                };
                check_object(chunk, known, &[], &format!("{prefix}content[{j}]."))?;
            }
        }
        if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
            for (j, call) in calls.iter_mut().enumerate() {
                let call_prefix = format!("{prefix}tool_calls[{j}].");
                check_object(call, &["id", "type", "function"], &[], &call_prefix)?;
                if let Some(f) = call.get_mut("function") {
                    check_object(
                        f,
                        &["name", "arguments"],
                        &[],
                        &format!("{call_prefix}function."),
                    )?;
                }
            }
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

/// 400 `invalid_value`: `name` must be `want` (`"a string"`) but is another JSON kind.
pub(super) fn wrong_type(name: &str, want: &str, got: &Value) -> ApiError {
    ApiError::bad_value(
        name,
        format!("'{name}' must be {want}, got {}.", json_kind(got)),
    )
}

fn required_model(body: &mut Body) -> Result<String, ApiError> {
    body.string("model")?
        .ok_or_else(|| missing_parameter("model"))
}

/// `name` as an f32 in `[lo, hi]`, or `default` when absent; also the value sent.
///
/// Errors: 400 naming `name` outside the range.
fn bounded(
    body: &mut Body,
    name: &str,
    default: f32,
    (lo, hi): (f64, f64),
) -> Result<(f32, Option<f64>), ApiError> {
    let sent = body.number(name)?;
    match sent {
        None => Ok((default, None)),
        Some(x) if (lo..=hi).contains(&x) => Ok((x as f32, sent)),
        Some(x) => Err(ApiError::bad_value(
            name,
            format!("'{name}' must be in [{lo}, {hi}], got {x}."),
        )),
    }
}

/// `temperature` / `top_p` / `top_k` / `min_p` / `presence_penalty` / `frequency_penalty` /
/// `repetition_penalty` / `seed` with the given temperature default.
///
/// Errors: 400 for a value outside the documented range, and for one the engine's f32 makes
/// invalid (`top_p` 1e-46 is 0 in f32): the narrowed values are checked with the sampler's own
/// rule ([`Sampler::new`]), so a request that passes here never fails in the sampler.
fn sampling(body: &mut Body, default_temperature: f32) -> Result<Sampling, ApiError> {
    let (temperature, sent_temperature) =
        bounded(body, "temperature", default_temperature, (0.0, 2.0))?;
    let sent_top_p = body.number("top_p")?;
    let top_p = match sent_top_p {
        None => 1.0,
        Some(p) if p > 0.0 && p <= 1.0 => p as f32,
        Some(p) => {
            return Err(ApiError::bad_value(
                "top_p",
                format!("'top_p' must be in (0, 1], got {p}."),
            ))
        }
    };
    let top_k = match body.uint("top_k")? {
        None => 0,
        Some(k) => usize::try_from(k)
            .map_err(|_| ApiError::bad_value("top_k", format!("'top_k' {k} is too large.")))?,
    };
    let (min_p, sent_min_p) = bounded(body, "min_p", 0.0, (0.0, 1.0))?;
    let (presence_penalty, sent_presence) = bounded(body, "presence_penalty", 0.0, (-2.0, 2.0))?;
    let (frequency_penalty, sent_frequency) = bounded(body, "frequency_penalty", 0.0, (-2.0, 2.0))?;
    let sent_repetition = body.number("repetition_penalty")?;
    let repetition_penalty = match sent_repetition {
        None => 1.0,
        Some(p) if p > 0.0 && p <= f64::from(f32::MAX) => p as f32,
        Some(p) => {
            return Err(ApiError::bad_value(
                "repetition_penalty",
                format!(
                    "'repetition_penalty' must be > 0 and at most {:e} (the largest 32-bit float), got {p}.",
                    f32::MAX
                ),
            ))
        }
    };
    let seed = body.uint("seed")?;
    let engine_params = SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p,
        presence_penalty,
        frequency_penalty,
        repetition_penalty,
        seed: seed.unwrap_or(0),
    };
    if let Err(e) = Sampler::new(engine_params) {
        let (name, sent) = match e {
            SampleError::Temperature(_) => ("temperature", sent_temperature),
            SampleError::TopP(_) => ("top_p", sent_top_p),
            SampleError::MinP(_) => ("min_p", sent_min_p),
            SampleError::PresencePenalty(_) => ("presence_penalty", sent_presence),
            SampleError::FrequencyPenalty(_) => ("frequency_penalty", sent_frequency),
            SampleError::RepetitionPenalty(_) => ("repetition_penalty", sent_repetition),
            SampleError::Empty | SampleError::NoFinite => {
                return Err(ApiError::internal(format!(
                    "The sampler refused its parameters: {e}."
                )))
            }
        };
        return Err(ApiError::bad_value(
            name,
            format!(
                "'{name}' {} is out of range once narrowed to the engine's 32-bit float ({e}).",
                sent.map_or_else(|| "(default)".to_owned(), |x| x.to_string())
            ),
        ));
    }
    Ok(Sampling {
        temperature,
        top_p,
        top_k,
        min_p,
        presence_penalty,
        frequency_penalty,
        repetition_penalty,
        seed,
    })
}

/// `n`: a count in [1, [`MAX_CHOICES`]], default 1.
///
/// Errors: 400 naming `n` for anything else.
fn choices(body: &mut Body) -> Result<usize, ApiError> {
    match body.count("n")? {
        None => Ok(1),
        Some(n) if n <= MAX_CHOICES => Ok(n),
        Some(n) => Err(ApiError::bad_value(
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
fn chat_logprobs(body: &mut Body) -> Result<Option<usize>, ApiError> {
    let on = body.bool("logprobs")?.unwrap_or(false);
    let top = body.uint("top_logprobs")?;
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
fn completion_logprobs(body: &mut Body) -> Result<Option<usize>, ApiError> {
    match body.uint("logprobs")? {
        Some(k) if k > MAX_COMPLETION_LOGPROBS => Err(ApiError::bad_value(
            "logprobs",
            format!("'logprobs' must be in [0, {MAX_COMPLETION_LOGPROBS}], got {k}."),
        )),
        k => Ok(k.map(|k| k as usize)),
    }
}

/// The elements of a JSON array of token ids as u32 (`name[i]` names a bad one).
///
/// Errors: 400 naming `name` for an element that is not an integer in [0, 2^32).
fn token_ids(name: &str, items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_number()
                .and_then(as_uint)
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| {
                    ApiError::bad_value(
                        name,
                        format!("'{name}[{i}]' is not a token id (u32): {v}."),
                    )
                })
        })
        .collect()
}

/// `stop`: a string or an array of up to [`MAX_STOPS`] non-empty strings.
fn stop(body: &mut Body) -> Result<Vec<String>, ApiError> {
    let stops = match body.take("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                other => Err(wrong_type(
                    "stop",
                    "a string or an array of strings",
                    &other,
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(wrong_type(
                "stop",
                "a string or an array of strings",
                &other,
            ))
        }
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

/// `stream` and `stream_options` (`include_usage`; `include_obfuscation` is accepted and has no
/// effect, since aubier never pads its chunks). `stream_options` without `stream` is refused, as
/// the OpenAI API does.
fn stream(body: &mut Body) -> Result<(bool, bool), ApiError> {
    let stream = body.bool("stream")?.unwrap_or(false);
    let mut include_usage = false;
    match body.take("stream_options") {
        None => {}
        Some(Value::Object(opts)) => {
            if !stream {
                return Err(ApiError::bad_value(
                    "stream_options",
                    "'stream_options' is only allowed when 'stream' is true.",
                ));
            }
            for (k, v) in opts {
                match (k.as_str(), v) {
                    (_, Value::Null) => {}
                    ("include_usage", Value::Bool(b)) => include_usage = b,
                    ("include_obfuscation", Value::Bool(_)) => {}
                    ("include_usage" | "include_obfuscation", other) => {
                        return Err(wrong_type(
                            &format!("stream_options.{k}"),
                            "a boolean",
                            &other,
                        ))
                    }
                    (other, _) => {
                        return Err(unknown_parameter(&format!("stream_options.{other}")))
                    }
                }
            }
        }
        Some(other) => return Err(wrong_type("stream_options", "an object", &other)),
    }
    Ok((stream, include_usage))
}

/// Parses and validates a chat completion request body.
///
/// Errors: 400 for malformed JSON, a missing `model` or `messages`, a value of the wrong type or out
/// of range, more than [`MAX_STOPS`] stops, a refused parameter at a non-default value (named in
/// `param`), or an unrecognised parameter.
pub fn parse_chat(bytes: &[u8]) -> Result<ChatParams, ApiError> {
    let mut body = Body::parse(bytes)?;
    let model = required_model(&mut body)?;
    let messages = match body.take("messages") {
        Some(Value::Array(mut m)) => {
            check_messages(&mut m)?;
            Value::Array(m)
        }
        Some(other) => return Err(wrong_type("messages", "an array", &other)),
        None => return Err(missing_parameter("messages")),
    };
    let mut chat = Map::new();
    chat.insert("messages".to_owned(), messages);
    let effort = body.string("reasoning_effort")?;
    let tools = body.take("tools");
    let structured = structured(
        tools.as_ref(),
        body.take("tool_choice"),
        body.bool("parallel_tool_calls")?,
        body.take("response_format"),
        effort.as_deref() == Some("high"),
    )?;
    if let Some(tools) = tools {
        chat.insert("tools".to_owned(), tools);
    }
    if let Some(effort) = effort {
        chat.insert("reasoning_effort".to_owned(), Value::String(effort));
    }
    if let Some(cont) = body.bool("continue_final_message")? {
        chat.insert("continue_final_message".to_owned(), Value::Bool(cont));
    }
    let max_new = body.count("max_completion_tokens")?;
    let max_old = body.count("max_tokens")?;
    let max_tokens = match (max_new, max_old) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::bad_value(
                "max_tokens",
                format!("'max_tokens' ({b}) and 'max_completion_tokens' ({a}) disagree; send one."),
            ))
        }
        (a, b) => a.or(b),
    };
    let sampling = sampling(&mut body, 1.0)?;
    let stop = stop(&mut body)?;
    let (stream, include_usage) = stream(&mut body)?;
    let n = choices(&mut body)?;
    let logprobs = chat_logprobs(&mut body)?;
    body.refuse(REFUSED_CHAT)?;
    body.identifiers()?;
    body.finish()?;
    Ok(ChatParams {
        model,
        chat: Value::Object(chat),
        structured,
        max_tokens,
        sampling,
        stop,
        stream,
        include_usage,
        n,
        logprobs,
    })
}

/// Parses and validates a (legacy) completion request body. `prompt` is one string or one array
/// of token ids (OpenAI's API takes both); a batch of prompts is refused.
///
/// Errors: as [`parse_chat`], with `prompt` in place of `messages`.
pub fn parse_completion(bytes: &[u8]) -> Result<CompletionParams, ApiError> {
    let mut body = Body::parse(bytes)?;
    let model = required_model(&mut body)?;
    let prompt = match body.take("prompt") {
        Some(Value::String(s)) => Prompt::Text(s),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            Prompt::Ids(token_ids("prompt", &items)?)
        }
        Some(Value::Array(items)) if items.iter().all(|v| v.is_string() || v.is_array()) => {
            return Err(ApiError::unsupported(
                "prompt",
                "as a batch (an array of strings or of token-id arrays) is not implemented; send one string or one array of token ids",
            ))
        }
        Some(other) => {
            return Err(wrong_type(
                "prompt",
                "a string or an array of token ids",
                &other,
            ))
        }
        None => {
            return Err(missing_parameter("prompt"))
        }
    };
    let max_tokens = body.count("max_tokens")?.unwrap_or(16);
    let sampling = sampling(&mut body, 1.0)?;
    let stop = stop(&mut body)?;
    let (stream, include_usage) = stream(&mut body)?;
    let n = choices(&mut body)?;
    let logprobs = completion_logprobs(&mut body)?;
    body.refuse(REFUSED_COMPLETIONS)?;
    body.identifiers()?;
    body.finish()?;
    Ok(CompletionParams {
        model,
        prompt,
        max_tokens,
        sampling,
        stop,
        stream,
        include_usage,
        n,
        logprobs,
    })
}

/// Parses and validates a `/debug/tokens` body: `{"ids": [u32], "max_tokens": n}` plus optional
/// `model`, `temperature` (default 0), the other sampling parameters of the chat route, `seed`
/// (default 0) and `ignore_eos`.
///
/// Errors: 400 for malformed JSON, missing `ids` / `max_tokens`, an id that is not a u32, bad
/// sampling values, or an unrecognised parameter.
pub fn parse_debug_tokens(bytes: &[u8]) -> Result<DebugTokensParams, ApiError> {
    let mut body = Body::parse(bytes)?;
    let model = body.string("model")?;
    let ids = match body.take("ids") {
        Some(Value::Array(items)) => token_ids("ids", &items)?,
        Some(other) => return Err(wrong_type("ids", "an array of token ids", &other)),
        None => return Err(missing_parameter("ids")),
    };
    let max_tokens = match body.uint("max_tokens")? {
        Some(n) => usize::try_from(n).map_err(|_| {
            ApiError::bad_value("max_tokens", format!("'max_tokens' {n} is too large."))
        })?,
        None => return Err(missing_parameter("max_tokens")),
    };
    let mut sampling = sampling(&mut body, 0.0)?;
    sampling.seed = Some(sampling.seed.unwrap_or(0));
    let ignore_eos = body.bool("ignore_eos")?.unwrap_or(false);
    body.finish()?;
    Ok(DebugTokensParams {
        model,
        ids,
        max_tokens,
        sampling,
        ignore_eos,
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
    fn defaults_follow_openai() {
        let p = chat("").unwrap();
        assert_eq!(p.sampling.temperature, 1.0);
        assert_eq!(p.sampling.top_p, 1.0);
        assert_eq!(p.max_tokens, None);
        assert!(!p.stream);
        let c = parse_completion(br#"{"model":"m","prompt":"x"}"#).unwrap();
        assert_eq!(c.max_tokens, 16);
    }

    #[test]
    fn every_refused_chat_parameter_is_named_when_not_default() {
        let non_default: &[(&str, &str)] = &[
            ("functions", r#"[{"name":"f"}]"#),
            ("function_call", r#"{"name":"f"}"#),
            ("logit_bias", r#"{"5":10}"#),
            ("ignore_eos", "true"),
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
    fn every_refused_completion_parameter_is_named() {
        let non_default: &[(&str, &str)] = &[
            ("best_of", "2"),
            ("echo", "true"),
            ("suffix", r#""end""#),
            ("logit_bias", r#"{"1":1}"#),
            ("ignore_eos", "true"),
        ];
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
            (r#","top_k":-1"#, "top_k"),
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
        assert_eq!(p.stop.len(), 4);
        assert!(p.stream && p.include_usage);
        assert_eq!(chat(r#","stop":"x""#).unwrap().stop, vec!["x".to_owned()]);
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
        assert!(p.sampling.top_p > 0.0);
        let p = chat(r#","temperature":1e-46"#).unwrap();
        assert_eq!(p.sampling.temperature, 0.0);
        let e = chat(r#","temperature":2.0000000000000004"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse_debug_tokens(br#"{"ids":[1],"max_tokens":1,"top_p":1e-300}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_p"));
    }

    #[test]
    fn integers_may_be_written_as_integral_floats() {
        let p = chat(r#","max_tokens":2.0,"seed":3.0,"top_k":4e0"#).unwrap();
        assert_eq!(
            (p.max_tokens, p.sampling.seed, p.sampling.top_k),
            (Some(2), Some(3), 4)
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
        let s = &p.sampling;
        assert_eq!(
            (
                s.min_p,
                s.presence_penalty,
                s.frequency_penalty,
                s.repetition_penalty
            ),
            (0.05, -2.0, 2.0, 1.3)
        );
        let d = chat("").unwrap().sampling;
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
        assert_eq!((p.n, p.logprobs), (8, Some(20)));
        assert_eq!(chat(r#","logprobs":true"#).unwrap().logprobs, Some(0));
        let p = chat(r#","logprobs":false,"top_logprobs":0"#).unwrap();
        assert_eq!((p.n, p.logprobs), (1, None));
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
        assert_eq!((p.n, p.logprobs), (3, Some(5)));
        assert_eq!(c(r#","logprobs":0"#).unwrap().logprobs, Some(0));
        assert_eq!(c("").unwrap().logprobs, None);
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
        assert_eq!(p.chat["messages"][0]["name"], "n");
    }

    #[test]
    fn debug_tokens_is_greedy_by_default() {
        let p = parse_debug_tokens(br#"{"ids":[1,2,3],"max_tokens":4}"#).unwrap();
        assert_eq!(p.ids, vec![1, 2, 3]);
        assert_eq!(p.sampling.temperature, 0.0);
        assert_eq!(p.sampling.seed, Some(0));
        let e = parse_debug_tokens(br#"{"ids":[1,-2],"max_tokens":4}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("ids"));
        let e = parse_debug_tokens(br#"{"ids":[1]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
    }
}
