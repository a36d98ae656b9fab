//! The generation route, one for every request kind that runs the model (chat completions,
//! legacy completions, responses; each kind is a [`RequestKind`]).
//!
//! Flow of [`generation`]: read the body (413 past the limit), parse and validate it into the
//! kind's request (400 naming the parameter), check the model id (404), build the prompt ids on
//! a blocking thread, at most `tokenizers` at once, stopping as soon as the prompt is longer than
//! the KV cache (400), clamp the kind's `max_tokens` to the room the context leaves
//! (`aubier_runtime::generate::completion_room`, the one rule; a prompt leaving no room is a
//! 400), compile one grammar matcher per choice off the async threads, wait for the
//! single-flight engine (503 + `Retry-After` past `--queue-wait-ms`), then either collect the
//! engine's events into the kind's one JSON answer of `n` choices (the engine runs them one
//! after the other) or stream them as SSE through the kind's [`ChunkFormat`]: for each choice
//! its opening, a chunk per released text, its finish; after the last choice the optional usage
//! chunk and `data: [DONE]`. Each SSE event is one `data: <json>\n\n` in its own HTTP chunk; an
//! engine failure after the stream began is sent as `data: {"error": …}` before the end.

use super::api::response::{CompletionTokensDetails, ObjectHead, PromptTokensDetails, Usage};
use super::engine::{Chunk, Event, JobSpec, Summary, TokenEntry};
use super::error::ApiError;
use super::guard::StreamFailed;
use super::params::Generation;
use super::state::{unix_now, AppState};
use super::text::{TextMode, TextModel, ToolCall, ToolCallDelta};
use super::tools;
use aubier_runtime::generate::{completion_room, GenerateError, GenerateParams};
use aubier_runtime::sampler::SamplingParams;
use aubier_runtime::text::grammar::GrammarSpec;
use axum::extract::{Request, State};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream, StreamExt};
use serde::Serialize;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// A request kind of the generation route: how its body becomes a job, and how the job's
/// answers become its response.
pub(super) trait RequestKind: Sized + Send + 'static {
    /// The parameter a prompt error names (`messages`, `prompt`, `input`).
    const PROMPT_PARAM: &'static str;
    /// The start of the kind's ids (`chatcmpl-`, `cmpl-`, `resp_`); 128 random bits follow.
    const ID_PREFIX: &'static str;
    /// The kind's SSE chunks.
    type Chunks: ChunkFormat;

    /// Parses and validates a body. Errors: 400 naming the parameter at fault.
    fn parse(app: &AppState, bytes: &[u8]) -> Result<Self, ApiError>;
    /// Model, limits, sampling, stops, `n`, `stream`, `logprobs`.
    fn generation(&self) -> &Generation;
    /// Takes the prompt out of the request.
    fn take_prompt(&mut self) -> PromptSource;
    /// How the engine turns the tokens into text.
    fn mode(&self) -> TextMode;
    /// Takes the grammar the output must follow, if any.
    fn take_grammar(&mut self) -> Option<GrammarSpec>;
    /// A grammar error as the kind names its parameters (the chat shapes' names by default).
    fn rename(e: ApiError) -> ApiError {
        e
    }
    /// The whole answer of a request that did not ask for a stream.
    fn answer(self, app: &AppState, head: Head, answers: Vec<Answer>) -> Response;
    /// The chunk writer of a streamed request.
    fn chunks(self, app: &AppState, head: Head) -> Self::Chunks;
}

/// Renders and tokenizes a prompt within a KV capacity: `None` past it (see [`prompt_ids`]).
pub(super) type BuildPrompt =
    Box<dyn FnOnce(&TextModel, usize) -> Result<Option<Vec<u32>>, ApiError> + Send>;

/// Where a request's prompt ids come from.
pub(super) enum PromptSource {
    /// Text the tokenizer turns into ids on a blocking thread.
    Build(BuildPrompt),
    /// Token ids as sent (each checked to be below the vocabulary size).
    Ids(Vec<u32>),
}

/// What every answer and chunk of one request shares: its [`ObjectHead`], and whether a stream
/// carries `usage` (`stream_options.include_usage`).
pub(super) struct Head {
    /// Id (the kind's prefix and 128 random bits), time, model, fingerprint.
    pub(super) object: ObjectHead,
    /// `stream_options.include_usage`.
    pub(super) include_usage: bool,
}

impl Head {
    /// The `usage` of a choice's chunk: `null` with `include_usage`, absent otherwise.
    pub(super) fn no_usage_yet(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }
}

/// An id no client can guess: `prefix` and 128 random bits (from the thread-local generator,
/// seeded from the OS).
pub(super) fn request_id(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::random::<u128>())
}

/// The generation route of kind `K` (module note).
pub(super) async fn generation<K: RequestKind>(
    State(app): State<Arc<AppState>>,
    req: Request,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let bytes = app.read_body(req).await?;
    let body_len = bytes.len();
    let mut request = K::parse(&app, &bytes)?;
    drop(bytes);
    app.check_model(&request.generation().model)?;
    check_logit_bias(&app, &request.generation().sampling.logit_bias)?;
    check_vocab(
        &app,
        "stop_token_ids",
        &request.generation().ends.stop_token_ids,
    )?;
    let prompt = match request.take_prompt() {
        PromptSource::Build(build) => {
            prompt_ids(&app, K::PROMPT_PARAM, body_len, app.engine.kv_max(), build).await?
        }
        PromptSource::Ids(ids) => {
            check_vocab(&app, K::PROMPT_PARAM, &ids)?;
            ids
        }
    };
    let g = request.generation();
    let (n, stream, include_usage) = (g.n, g.stream, g.include_usage);
    let max_tokens = budget(&app, prompt.len(), g.max_tokens, K::PROMPT_PARAM)?;
    let mut params = generate_params(&app, g.sampling.clone(), max_tokens, g.logprobs);
    params.ignore_eos = g.ends.ignore_eos;
    params.min_tokens = g.ends.min_tokens;
    params.stop_token_ids = g.ends.stop_token_ids.clone();
    let mode = request.mode();
    let constraints = constraints(&app, request.take_grammar(), n)
        .await
        .map_err(K::rename)?;
    let spec = JobSpec {
        prompt,
        params,
        mode,
        constraints,
        received,
        choices: n,
    };
    let rx = app.engine.submit(spec, app.limits.queue_wait).await?;
    let head = Head {
        object: ObjectHead {
            id: request_id(K::ID_PREFIX),
            created: unix_now(),
            model: app.limits.model_id.clone(),
            fingerprint: app.fingerprint.clone(),
        },
        include_usage,
    };
    if !stream {
        let answers = collect(rx, n).await?;
        return Ok(request.answer(&app, head, answers));
    }
    let chunks = request.chunks(&app, head);
    Ok(sse_response(rx, n, chunks))
}

/// One fresh matcher of `grammar` per choice, compiled off the async threads; none without a
/// grammar. Errors: 400 naming the parameter whose schema cannot be enforced.
pub(super) async fn constraints(
    app: &AppState,
    grammar: Option<GrammarSpec>,
    n: usize,
) -> Result<Vec<aubier_runtime::text::grammar::Constraint>, ApiError> {
    let Some(spec) = grammar else {
        return Ok(Vec::new());
    };
    let text = app.text.clone();
    tokio::task::spawn_blocking(move || {
        (0..n)
            .map(|_| tools::compile(text.grammar(), &spec))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("The grammar compiler task failed: {e}.")))?
}

/// Bodies from this size on give their memory back to the OS once the prompt is built.
const TRIM_BYTES: usize = 1 << 20;

/// Returns the allocator's free memory to the OS (glibc keeps freed heap pages mapped otherwise,
/// so the copies a multi-MiB prompt makes would stay in the RSS).
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists; it has no preconditions.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Builds the prompt on the tokenizer pool ([`on_tokenizer`]). `build` gets `limit` (the KV
/// capacity, or `usize::MAX` to count a prompt whatever its length) and stops tokenizing past it
/// (`None`), which is a 400 naming `param`.
pub(super) async fn prompt_ids<F>(
    app: &Arc<AppState>,
    param: &str,
    body_len: usize,
    limit: usize,
    build: F,
) -> Result<Vec<u32>, ApiError>
where
    F: FnOnce(&TextModel, usize) -> Result<Option<Vec<u32>>, ApiError> + Send + 'static,
{
    let built = on_tokenizer(app, body_len, move |text| build(text, limit)).await??;
    built.ok_or_else(|| too_long(param, &format!("more than {limit}"), app.engine.kv_max()))
}

/// Runs `work` on a blocking thread (template rendering, BPE and decoding are CPU work that
/// would stall the connections sharing an async worker), at most `tokenizers` at once (waiting
/// up to `--queue-wait-ms` for a turn, 503 past it). After a body of `body_len` >= 1 MiB, whose
/// text `work` owns and drops, free memory goes back to the OS.
///
/// Errors: 503 when no turn comes in time or the server is shutting down; 500 when the task
/// panics.
pub(super) async fn on_tokenizer<T, F>(
    app: &Arc<AppState>,
    body_len: usize,
    work: F,
) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&TextModel) -> T + Send + 'static,
{
    let wait = app.limits.queue_wait;
    let permit = tokio::time::timeout(wait, app.tokenize.clone().acquire_owned())
        .await
        .map_err(|_| {
            ApiError::busy(
                format!(
                    "Every tokenizer is busy with other prompts; waited {} ms (--queue-wait-ms).",
                    wait.as_millis()
                ),
                wait.as_secs().max(1),
            )
        })?
        .map_err(|_| ApiError::busy("The server is shutting down.", 1))?;
    let text = app.text.clone();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let done = work(&text);
        if body_len >= TRIM_BYTES {
            release_free_memory();
        }
        done
    })
    .await
    .map_err(|e| ApiError::internal(format!("The tokenizer task failed: {e}.")))
}

/// 400 `context_length_exceeded` for a prompt of `prompt` tokens.
fn too_long(param: &str, prompt: &str, kv_max: usize) -> ApiError {
    ApiError::invalid(
        Some(param),
        "context_length_exceeded",
        format!(
            "The prompt is {prompt} tokens, but the context (KV cache, --kv-max) holds {kv_max} tokens; shorten the prompt."
        ),
    )
}

/// The tokens a request of `prompt` tokens may generate: [`completion_room`] (prompt and
/// completion together are at most `kv_max` tokens), and at least one.
///
/// Errors: 400 naming `param` for a prompt without tokens, and `context_length_exceeded` for
/// one that leaves no room.
pub(super) fn budget(
    app: &AppState,
    prompt: usize,
    max_tokens: Option<usize>,
    param: &str,
) -> Result<usize, ApiError> {
    let kv_max = app.engine.kv_max();
    match completion_room(prompt, max_tokens, kv_max) {
        Err(GenerateError::EmptyPrompt) => Err(ApiError::bad_value(
            param,
            format!("'{param}' produced no tokens."),
        )),
        Ok(room) if prompt < kv_max => Ok(room),
        _ => Err(too_long(param, &prompt.to_string(), kv_max)),
    }
}

/// The decode loop's settings of a request: its sampler, `max_tokens` already clamped, the
/// model's EOS ids, and log-probabilities when asked for.
pub(super) fn generate_params(
    app: &AppState,
    sampling: SamplingParams,
    max_tokens: usize,
    logprobs: Option<usize>,
) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling,
        min_tokens: 0,
        stop_token_ids: Vec::new(),
        ignore_eos: false,
        eos_ids: app.text.eos_ids(),
        keep_prompt_logits: false,
        logprobs,
    }
}

/// Refuses a token id at or past the vocabulary size. Errors: 400 naming `param`.
pub(super) fn check_vocab(app: &AppState, param: &str, ids: &[u32]) -> Result<(), ApiError> {
    let n_vocab = app.text.tokenizer().n_vocab();
    match ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= n_vocab)
    {
        None => Ok(()),
        Some((i, id)) => Err(ApiError::bad_value(
            param,
            format!("'{param}[{i}]' = {id} is not below the vocabulary size {n_vocab}."),
        )),
    }
}

/// Refuses a `logit_bias` id at or past the vocabulary size. Errors: 400 naming `logit_bias`.
fn check_logit_bias(app: &AppState, bias: &[(u32, f32)]) -> Result<(), ApiError> {
    let n_vocab = app.text.tokenizer().n_vocab();
    match bias.iter().find(|&&(id, _)| id as usize >= n_vocab) {
        None => Ok(()),
        Some((id, _)) => Err(ApiError::bad_value(
            "logit_bias",
            format!("'logit_bias' key \"{id}\" is not below the vocabulary size {n_vocab}."),
        )),
    }
}

/// One choice of a job, collected: its whole text, its log-probability entries, its summary.
pub(super) struct Answer {
    pub(super) reasoning: String,
    pub(super) content: String,
    pub(super) tool_calls: Vec<ToolCall>,
    pub(super) logprobs: Vec<TokenEntry>,
    pub(super) summary: Summary,
}

/// Collects a job's events into its `choices` answers, in choice order (the engine runs the
/// choices one after the other).
pub(super) async fn collect(
    mut rx: UnboundedReceiver<Event>,
    choices: usize,
) -> Result<Vec<Answer>, ApiError> {
    let mut answers = Vec::with_capacity(choices);
    let (mut reasoning, mut content, mut logprobs) = (String::new(), String::new(), Vec::new());
    let mut pieces: Vec<ToolCallDelta> = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Chunk(c) => {
                reasoning.push_str(&c.delta.reasoning);
                content.push_str(&c.delta.content);
                pieces.extend(c.delta.tool_calls);
                logprobs.extend(c.logprobs);
            }
            Event::Done(summary) => {
                answers.push(Answer {
                    reasoning: std::mem::take(&mut reasoning),
                    content: std::mem::take(&mut content),
                    tool_calls: super::text::join_tool_calls(&std::mem::take(&mut pieces)),
                    logprobs: std::mem::take(&mut logprobs),
                    summary,
                });
                if answers.len() == choices {
                    return Ok(answers);
                }
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal(
        "The engine stopped without finishing the request.",
    ))
}

/// The `usage` of a job: the prompt once, the completion tokens of every choice (OpenAI);
/// `prompt_tokens_details.cached_tokens` counts the prompt tokens the prompt cache reused
/// (`--prompt-cache`) for the first choice, as OpenAI and llama.cpp's server report them.
pub(super) fn usage(done: &[Summary]) -> Usage {
    let prompt = done.first().map_or(0, |s| s.prompt_tokens);
    let cached = done.first().map_or(0, |s| s.cached_tokens);
    let completion: usize = done.iter().map(|s| s.ids.len()).sum();
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        prompt_tokens_details: PromptTokensDetails {
            cached_tokens: cached,
        },
        completion_tokens_details: CompletionTokensDetails {
            reasoning_tokens: done.iter().map(|s| s.reasoning_tokens).sum(),
        },
    }
}

/// One SSE event carrying `v` as JSON, with U+2028 and U+2029 escaped (valid JSON either way,
/// but line splitters that follow Unicode, Python's `str.splitlines` among them, cut an event
/// at them).
pub(super) fn sse_data<T: Serialize>(v: &T) -> SseEvent {
    match serde_json::to_string(v) {
        Ok(json) => SseEvent::default().data(
            json.replace('\u{2028}', "\\u2028")
                .replace('\u{2029}', "\\u2029"),
        ),
        Err(e) => {
            let error = ApiError::internal(format!("A chunk did not serialize: {e}.")).body();
            SseEvent::default().data(serde_json::to_string(&error).unwrap_or_default())
        }
    }
}

/// How a request kind writes its SSE chunks. Each method returns the chunks of one moment of
/// the job, in order (none is fine).
pub(super) trait ChunkFormat: Send + 'static {
    /// The kind's chunk type.
    type Chunk: Serialize;
    /// Whether the stream ends with `data: [DONE]` (chat and legacy completions).
    const DONE_MARKER: bool = true;
    /// The chunks that open choice `choice`, sent before its text (chat: the role delta).
    fn opening(&mut self, choice: usize) -> Vec<Self::Chunk>;
    /// The chunks of a choice's released text.
    fn text(&mut self, chunk: &Chunk) -> Vec<Self::Chunk>;
    /// The chunks that close a choice (its `finish_reason`).
    fn finish(&mut self, summary: &Summary) -> Vec<Self::Chunk>;
    /// The chunks after the last choice (the usage chunk, when the request asked for it).
    fn usage(&mut self, done: &[Summary]) -> Vec<Self::Chunk>;
    /// One chunk as an SSE event: `data: <json>`.
    fn event(&self, chunk: &Self::Chunk) -> SseEvent {
        sse_data(chunk)
    }
    /// The events of a failure after the stream began: `data: {"error": …}`.
    fn failure(&mut self, error: &ApiError) -> Vec<SseEvent> {
        vec![sse_data(&error.body())]
    }
}

/// A format's chunks as SSE events.
fn events<F: ChunkFormat>(format: &F, chunks: Vec<F::Chunk>) -> Vec<SseEvent> {
    chunks.iter().map(|c| format.event(c)).collect()
}

/// Turns a job's events into SSE events: for each choice in turn its opening, its text chunks,
/// its finish; after the last choice the usage chunks, then `[DONE]` when the format ends so. A
/// failure becomes the format's failure events and sets `failed`.
fn sse_stream<F: ChunkFormat>(
    rx: UnboundedReceiver<Event>,
    choices: usize,
    mut format: F,
    failed: StreamFailed,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
    let opening = format.opening(0);
    let head = stream::iter(events(&format, opening).into_iter().map(Ok));
    let state = (rx, format, Vec::<Summary>::new());
    let body = stream::unfold(Some(state), move |state| {
        let failed = failed.clone();
        async move {
            let (mut rx, mut format, mut done) = state?;
            let mut out: Vec<SseEvent> = match rx.recv().await {
                Some(Event::Chunk(c)) => {
                    let chunks = format.text(&c);
                    let ev = events(&format, chunks);
                    return Some((ev, Some((rx, format, done))));
                }
                Some(Event::Done(s)) => {
                    let chunks = format.finish(&s);
                    let mut ev = events(&format, chunks);
                    done.push(s);
                    if done.len() < choices {
                        let chunks = format.opening(done.len());
                        ev.extend(events(&format, chunks));
                        return Some((ev, Some((rx, format, done))));
                    }
                    let chunks = format.usage(&done);
                    ev.extend(events(&format, chunks));
                    ev
                }
                Some(Event::Failed(e)) => {
                    failed.0.store(true, Ordering::SeqCst);
                    format.failure(&e)
                }
                None => {
                    failed.0.store(true, Ordering::SeqCst);
                    format.failure(&ApiError::internal(
                        "The engine stopped without finishing the request.",
                    ))
                }
            };
            if F::DONE_MARKER {
                out.push(SseEvent::default().data("[DONE]"));
            }
            Some((out, None))
        }
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)));
    head.chain(body)
}

/// The SSE response of a job (see [`sse_stream`]), marked so that a failed stream is not counted
/// as a 200.
fn sse_response<F: ChunkFormat>(
    rx: UnboundedReceiver<Event>,
    choices: usize,
    format: F,
) -> Response {
    let failed = StreamFailed::default();
    let mut resp = Sse::new(sse_stream(rx, choices, format, failed.clone())).into_response();
    resp.extensions_mut().insert(failed);
    resp
}

/// `s`, or `None` when empty.
pub(super) fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// The stream shape of chat and legacy completions: each chunk carries one choice (or none, in
/// the closing usage chunk).
pub(super) trait ChoiceStream: Send + 'static {
    /// The choice of one chunk.
    type Choice;
    /// The chunk.
    type Chunk: Serialize;
    /// The chunk of `choices` with `usage`.
    fn chunk(head: &Head, choices: Vec<Self::Choice>, usage: Option<Option<Usage>>) -> Self::Chunk;
    /// The choice that opens choice `index`, if the kind sends one.
    fn opening(index: usize) -> Option<Self::Choice>;
    /// The choice carrying released text, with its log-probability entries when `logprobs`
    /// gives the tokenizer to spell them.
    fn text(chunk: &Chunk, logprobs: Option<&TextModel>) -> Self::Choice;
    /// The choice carrying the `finish_reason`.
    fn finish(summary: &Summary) -> Self::Choice;
}

/// A [`ChoiceStream`] with its request's [`Head`], as a [`ChunkFormat`].
pub(super) struct ChoiceChunks<S> {
    head: Head,
    /// The tokenizer, when the request asked for log-probabilities.
    logprobs: Option<Arc<TextModel>>,
    shape: std::marker::PhantomData<S>,
}

impl<S: ChoiceStream> ChoiceChunks<S> {
    /// The chunks of a request with `head`, with log-probabilities when `logprobs` is set.
    pub(super) fn new(app: &AppState, head: Head, logprobs: Option<usize>) -> ChoiceChunks<S> {
        ChoiceChunks {
            head,
            logprobs: logprobs.map(|_| app.text.clone()),
            shape: std::marker::PhantomData,
        }
    }

    fn one(&self, choice: S::Choice) -> Vec<S::Chunk> {
        vec![S::chunk(&self.head, vec![choice], self.head.no_usage_yet())]
    }
}

impl<S: ChoiceStream> ChunkFormat for ChoiceChunks<S> {
    type Chunk = S::Chunk;

    fn opening(&mut self, choice: usize) -> Vec<S::Chunk> {
        S::opening(choice).map_or_else(Vec::new, |c| self.one(c))
    }

    fn text(&mut self, chunk: &Chunk) -> Vec<S::Chunk> {
        self.one(S::text(chunk, self.logprobs.as_deref()))
    }

    fn finish(&mut self, summary: &Summary) -> Vec<S::Chunk> {
        self.one(S::finish(summary))
    }

    fn usage(&mut self, done: &[Summary]) -> Vec<S::Chunk> {
        if self.head.include_usage {
            vec![S::chunk(&self.head, Vec::new(), Some(Some(usage(done))))]
        } else {
            Vec::new()
        }
    }
}
