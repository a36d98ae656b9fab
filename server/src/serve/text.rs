//! The text side of serving, shared by the real and the fake engine: prompts in (chat template or
//! plain text → token ids), text out (token ids → whole characters → reasoning / content → stop
//! strings).
//!
//! Algorithm of [`TextPipeline`], per generated id:
//! 1. detokenize with the tokenizer's `StreamDecoder`, which returns whole UTF-8 characters only
//!    (a character whose bytes span several tokens is held back until complete). `[THINK]` and
//!    `[/THINK]` are decoded as their text; every other control token is dropped, as OpenAI-style
//!    servers skip special tokens;
//! 2. chat only: route the text through `aubier_runtime::text::reasoning::ReasoningSplitter`, so
//!    text inside `[THINK]…[/THINK]` becomes `reasoning_content` and the rest `content`;
//! 3. match stop strings on the content with [`StopMatcher`] (the reasoning is never cut by a
//!    stop string), which holds back any suffix that could still become a stop;
//! 4. chat with tools only: the output is read at the token level. `[TOOL_CALLS]` ends the content
//!    (everything held back is flushed) and opens a call; the text up to `[ARGS]` is its name, the
//!    text after it its arguments, up to the next `[TOOL_CALLS]` (the next call) or the end. A
//!    call's first delta carries its index, a fresh id (`call_` and 96 random bits, unique within
//!    the response) and its name; its arguments follow in whole-character fragments under the same
//!    index. Stop strings apply to the content only.
//!
//! At the end, everything held back at each stage is flushed through the later stages; a call cut
//! off inside its name (before its `[ARGS]`) is dropped, since its name may be partial: a client
//! dispatches on it.

use super::error::ApiError;
use super::stop::StopMatcher;
use aubier_runtime::gguf::GgufFile;
use aubier_runtime::text::chat::{ChatError, ChatRequest, ChatTemplate};
use aubier_runtime::text::grammar::{GrammarCompiler, GrammarError};
use aubier_runtime::text::reasoning::ReasoningSplitter;
use aubier_runtime::text::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

/// The GGUF's tokenizer and chat template, plus what the server needs to know about them.
#[derive(Debug)]
pub struct TextModel {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    add_bos: bool,
    think: Option<(u32, u32)>,
    calls: Option<(u32, u32)>,
    grammar: GrammarCompiler,
}

/// Errors of [`TextModel::from_gguf`].
#[derive(Debug, thiserror::Error)]
pub enum TextModelError {
    /// The tokenizer metadata is unusable.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// The chat template is unusable.
    #[error("chat template: {0}")]
    Chat(#[from] ChatError),
    /// The grammar engine cannot index the vocabulary.
    #[error("grammar engine: {0}")]
    Grammar(#[from] GrammarError),
    /// `tokenizer.ggml.add_bos_token` is present but not a boolean.
    #[error("GGUF metadata key `tokenizer.ggml.add_bos_token` must be a bool, found {0}")]
    AddBos(&'static str),
}

/// Which stages a request's output goes through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TextMode {
    /// `/v1/chat/completions`: reasoning split, then stop strings on the content.
    Chat {
        /// Stop strings.
        stops: Vec<String>,
        /// Read `[TOOL_CALLS]name[ARGS]arguments` as tool calls (the request has tools and
        /// `tool_choice` is not `none`).
        tool_calls: bool,
    },
    /// `/v1/completions`: stop strings on the text.
    Completion {
        /// Stop strings.
        stops: Vec<String>,
    },
    /// `/debug/tokens`: no text at all.
    Ids,
}

/// Text released for one step: `reasoning_content`, `content` and tool-call deltas (whole
/// characters).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// New reasoning text (chat only).
    pub reasoning: String,
    /// New answer text.
    pub content: String,
    /// New tool-call pieces, in order (chat with tools only).
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A piece of one tool call, in OpenAI's streaming shape: the call's first piece has `head`,
/// later ones only `arguments`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// 0-based position of the call in the response.
    pub index: usize,
    /// The call's id and function name (first piece only).
    pub head: Option<(String, String)>,
    /// The next fragment of `function.arguments` (JSON text, whole characters; may be empty).
    pub arguments: String,
}

/// A whole tool call, as the non-streaming response carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// The minted call id.
    pub id: String,
    /// The function name, as generated.
    pub name: String,
    /// `function.arguments`: the JSON text as generated.
    pub arguments: String,
}

impl Delta {
    /// Every part is empty.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.tool_calls.is_empty()
    }

    fn append(&mut self, other: Delta) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
        self.tool_calls.extend(other.tool_calls);
    }
}

/// Joins the tool-call pieces of a whole response, in index order.
pub fn join_tool_calls<'a>(pieces: impl IntoIterator<Item = &'a ToolCallDelta>) -> Vec<ToolCall> {
    let mut calls: Vec<ToolCall> = Vec::new();
    for p in pieces {
        if calls.len() <= p.index {
            calls.resize_with(p.index + 1, ToolCall::default);
        }
        let call = &mut calls[p.index];
        if let Some((id, name)) = &p.head {
            call.id.clone_from(id);
            call.name.clone_from(name);
        }
        call.arguments.push_str(&p.arguments);
    }
    calls
}

impl TextModel {
    /// Reads the tokenizer and chat template of `file` (a file without a template gets the
    /// built-in v15 renderer, see `aubier_runtime::text::chat`).
    ///
    /// Errors: [`TextModelError`] naming the key at fault.
    pub fn from_gguf(file: &GgufFile) -> Result<TextModel, TextModelError> {
        let tokenizer = Tokenizer::from_gguf(file)?;
        let template = ChatTemplate::from_gguf(file)?;
        let add_bos = match file.get("tokenizer.ggml.add_bos_token") {
            None => true,
            Some(v) => v.as_bool().ok_or(TextModelError::AddBos(v.type_name()))?,
        };
        let think = tokenizer
            .special_id("[THINK]")
            .zip(tokenizer.special_id("[/THINK]"));
        let calls = tokenizer
            .special_id("[TOOL_CALLS]")
            .zip(tokenizer.special_id("[ARGS]"));
        let grammar = GrammarCompiler::new(&tokenizer)?;
        Ok(TextModel {
            tokenizer,
            template,
            add_bos,
            think,
            calls,
            grammar,
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The grammar compiler over this vocabulary (constrained decoding).
    pub fn grammar(&self) -> &GrammarCompiler {
        &self.grammar
    }

    /// Token ids of a chat request (`chat` holds `messages`, `reasoning_effort`,
    /// `continue_final_message`), rendered with the file's chat template; starts with BOS.
    /// `None` when the prompt has more than `limit` ids: tokenizing stops a chunk past that
    /// point, however long the messages are.
    ///
    /// Errors: 400 naming `messages` (or `reasoning_effort`) when the conversation is malformed or
    /// the template refuses it; 500 when the template itself fails to compile or names an unknown
    /// control token.
    pub fn chat_prompt_within(
        &self,
        request: &ChatRequest,
        limit: usize,
    ) -> Result<Option<Vec<u32>>, ApiError> {
        self.template
            .render_ids_within(request, &self.tokenizer, limit)
            .map_err(|e| match e {
                ChatError::ReasoningEffort(_) => {
                    ApiError::bad_value("reasoning_effort", e.to_string())
                }
                ChatError::Compile(_) | ChatError::Gguf { .. } | ChatError::UnknownControl(_) => {
                    ApiError::internal(e.to_string())
                }
                _ => ApiError::bad_value("messages", e.to_string()),
            })
    }

    /// [`TextModel::chat_prompt_within`] with no limit.
    ///
    /// Errors: those of [`TextModel::chat_prompt_within`].
    pub fn chat_prompt(&self, request: &ChatRequest) -> Result<Vec<u32>, ApiError> {
        // No prompt has more than usize::MAX ids, so the limit never applies.
        Ok(self
            .chat_prompt_within(request, usize::MAX)?
            .unwrap_or_default())
    }

    /// Token ids of a completion prompt: with `bos`, BOS (when `tokenizer.ggml.add_bos_token` is
    /// true or absent — every Mistral prompt starts with `<s>`), then the plain-text encoding of
    /// `text` (control-token lookalikes stay text). `None` when that is more than `limit` ids
    /// (found without tokenizing far past the limit).
    ///
    /// Errors: 400 naming `prompt` when the tokenizer gives up on the text.
    pub fn completion_prompt_within(
        &self,
        text: &str,
        bos: bool,
        limit: usize,
    ) -> Result<Option<Vec<u32>>, ApiError> {
        let mut ids = Vec::new();
        if bos && self.add_bos {
            ids.push(self.tokenizer.bos_id());
        }
        let encoded = self
            .tokenizer
            .encode_within(text, limit.saturating_sub(ids.len()))
            .map_err(|e| {
                ApiError::bad_value("prompt", format!("'prompt' cannot be tokenized: {e}."))
            })?;
        Ok(encoded.map(|more| {
            ids.extend(more);
            ids
        }))
    }

    /// Ids that end generation (`tokenizer.ggml.eos_token_id`).
    pub fn eos_ids(&self) -> Vec<u32> {
        vec![self.tokenizer.eos_id()]
    }
}

/// Per-request detokenizer + reasoning split + stop matching (see the module note).
#[derive(Debug)]
pub struct TextPipeline<'t> {
    text: &'t TextModel,
    decoder: Option<StreamDecoder<'t>>,
    reasoning: Option<ReasoningSplitter>,
    stops: StopMatcher,
    stopped: bool,
    calls: Option<CallReader>,
    /// Ids pushed inside the reasoning, markers included.
    reasoning_tokens: usize,
    /// Ids pushed so far.
    pushed: usize,
    /// vLLM's `min_tokens`: the text of the first this many ids is not searched for stops.
    min_tokens: usize,
}

/// Where the tool-call reader is: before any call, in a call's name, or in its arguments.
#[derive(Debug)]
enum CallPhase {
    Content,
    Name(String),
    Arguments,
}

/// The tool-call state of a chat pipeline whose request has tools.
#[derive(Debug)]
struct CallReader {
    open: u32,
    args: u32,
    phase: CallPhase,
    /// Calls opened so far (the current one is `count - 1`).
    count: usize,
    ids: Vec<String>,
}

impl CallReader {
    /// A fresh call id, distinct from the ids this response already has.
    fn mint(&mut self) -> String {
        loop {
            let id = format!("call_{:024x}", rand::random::<u128>() >> 32);
            if !self.ids.contains(&id) {
                self.ids.push(id.clone());
                return id;
            }
        }
    }
}

impl<'t> TextPipeline<'t> {
    /// A pipeline for one request in `mode`; a stop string must end in the text of an id past
    /// the first `min_tokens` (vLLM's `min_tokens`; 0 = every id).
    pub fn new(text: &'t TextModel, mode: &TextMode, min_tokens: usize) -> TextPipeline<'t> {
        let (decoder, reasoning, stops, tool_calls) = match mode {
            TextMode::Chat { stops, tool_calls } => (
                Some(text.tokenizer.stream_decoder()),
                Some(ReasoningSplitter::new()),
                stops.clone(),
                *tool_calls,
            ),
            TextMode::Completion { stops } => (
                Some(text.tokenizer.stream_decoder()),
                None,
                stops.clone(),
                false,
            ),
            TextMode::Ids => (None, None, Vec::new(), false),
        };
        let calls = text
            .calls
            .filter(|_| tool_calls)
            .map(|(open, args)| CallReader {
                open,
                args,
                phase: CallPhase::Content,
                count: 0,
                ids: Vec::new(),
            });
        TextPipeline {
            text,
            decoder,
            reasoning,
            stops: StopMatcher::new(stops),
            stopped: false,
            calls,
            reasoning_tokens: 0,
            pushed: 0,
            min_tokens,
        }
    }

    /// How many tool calls the output has opened.
    pub fn tool_calls(&self) -> usize {
        self.calls.as_ref().map_or(0, |c| c.count)
    }

    /// Whether a stop string has matched (generation must end; later input is ignored).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Whether any stage holds text back (an incomplete character, a possible `[THINK]` /
    /// `[/THINK]` marker, a possible stop-string prefix): when it does not, everything pushed so
    /// far has been released.
    pub fn holds_back(&self) -> bool {
        self.decoder.as_ref().is_some_and(StreamDecoder::holds_back)
            || self
                .reasoning
                .as_ref()
                .is_some_and(ReasoningSplitter::holds_back)
            || self.stops.holds_back()
    }

    /// Feeds one generated id; returns the released text and whether a stop string matched.
    pub fn push(&mut self, id: u32) -> (Delta, bool) {
        if self.stopped {
            return (Delta::default(), true);
        }
        self.pushed += 1;
        self.stops.check(self.pushed > self.min_tokens);
        if let Some(delta) = self.push_call(id) {
            return (delta, self.stopped);
        }
        let keep = self.reasoning.is_some()
            && self
                .text
                .think
                .is_some_and(|(open, close)| id == open || id == close);
        let piece = match self.decoder.as_mut() {
            None => return (Delta::default(), false),
            Some(d) if keep => d.push_keep_special(id),
            Some(d) => d.push(id),
        };
        let thinking = |p: &Self| {
            p.reasoning
                .as_ref()
                .is_some_and(ReasoningSplitter::in_reasoning)
        };
        let before = thinking(self);
        let delta = self.route(&piece, false);
        if keep || before || thinking(self) {
            self.reasoning_tokens += 1;
        }
        (delta, self.stopped)
    }

    /// Ids pushed inside the reasoning so far (`[THINK]` … `[/THINK]`, markers included).
    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    /// The tool-call reading of `id` (see the module note); `None` while the output is still
    /// in its content and `id` does not open a call.
    fn push_call(&mut self, id: u32) -> Option<Delta> {
        let calls = self.calls.as_ref()?;
        let (open, args) = (calls.open, calls.args);
        let in_content = matches!(calls.phase, CallPhase::Content);
        if in_content && id != open {
            return None;
        }
        let mut delta = Delta::default();
        if in_content {
            delta = self.finish_content();
            if self.stopped {
                return Some(delta);
            }
        } else if id == open || id == args {
            delta.tool_calls.extend(self.close_piece());
        }
        let decoder = self.decoder.as_mut()?;
        let calls = self.calls.as_mut()?;
        if id == open {
            calls.count += 1;
            calls.phase = CallPhase::Name(String::new());
        } else if id != args {
            // (`[ARGS]` itself was handled by `close_piece`: the name's end releases the head.)
            let piece = decoder.push(id);
            match &mut calls.phase {
                CallPhase::Name(name) => name.push_str(&piece),
                _ if piece.is_empty() => {}
                _ => delta.tool_calls.push(ToolCallDelta {
                    index: calls.count - 1,
                    head: None,
                    arguments: piece,
                }),
            }
        }
        Some(delta)
    }

    /// Ends the current call piece at a control token: the held-back bytes of the arguments, or
    /// the end of the name, which releases the call's head.
    fn close_piece(&mut self) -> Option<ToolCallDelta> {
        let tail = self
            .decoder
            .as_mut()
            .map(|d| d.finish())
            .unwrap_or_default();
        let calls = self.calls.as_mut()?;
        let index = calls.count.checked_sub(1)?;
        match &mut calls.phase {
            CallPhase::Content => None,
            CallPhase::Arguments => (!tail.is_empty()).then_some(ToolCallDelta {
                index,
                head: None,
                arguments: tail,
            }),
            CallPhase::Name(name) => {
                name.push_str(&tail);
                let name = std::mem::take(name);
                calls.phase = CallPhase::Arguments;
                Some(ToolCallDelta {
                    index,
                    head: Some((calls.mint(), name)),
                    arguments: String::new(),
                })
            }
        }
    }

    /// Flushes everything held back in the content stages (an incomplete character becomes
    /// U+FFFD).
    fn finish_content(&mut self) -> Delta {
        let tail = self
            .decoder
            .as_mut()
            .map(|d| d.finish())
            .unwrap_or_default();
        self.route(&tail, true)
    }

    /// Flushes everything held back (an incomplete character becomes U+FFFD) unless a stop
    /// string has matched, in which case nothing more is released.
    pub fn finish(&mut self) -> Delta {
        if self.stopped {
            return Delta::default();
        }
        if self.tool_calls() > 0 {
            let mut delta = Delta::default();
            match self.calls.as_mut() {
                Some(calls) if matches!(calls.phase, CallPhase::Name(_)) => {
                    // Cut off inside its name: nothing of the call was released; drop it.
                    calls.count -= 1;
                    calls.phase = CallPhase::Content;
                }
                _ => delta.tool_calls.extend(self.close_piece()),
            }
            return delta;
        }
        self.finish_content()
    }

    /// Sends decoded text through the reasoning split and the stop matcher.
    fn route(&mut self, piece: &str, last: bool) -> Delta {
        let mut split = match self.reasoning.as_mut() {
            Some(r) => {
                let d = r.push(piece);
                let mut out = Delta {
                    reasoning: d.reasoning,
                    content: d.content,
                    ..Delta::default()
                };
                if last {
                    let f = r.finish();
                    out.append(Delta {
                        reasoning: f.reasoning,
                        content: f.content,
                        ..Delta::default()
                    });
                }
                out
            }
            None => Delta {
                content: piece.to_owned(),
                ..Delta::default()
            },
        };
        let released = self.stops.push(&split.content);
        split.content = released.text;
        if released.stopped {
            self.stopped = true;
        } else if last {
            split.content.push_str(&self.stops.finish());
        }
        split
    }
}
