//! `POST /v1/chat/completions`: the chat kind of the generation route ([`super::generation`]).
//! The prompt is the chat template's rendering of `messages` (with `tools` and the reasoning
//! setting); `tools` / `tool_choice` / `response_format` become the grammar; the answer is an
//! assistant message (content, `reasoning_content`, `tool_calls`) per choice, streamed as
//! `chat.completion.chunk` deltas.

use super::api::response::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, Delta,
    FunctionDelta, ResponseFunction, ResponseToolCall, ToolCallDelta as WireToolCallDelta, Usage,
};
use super::engine::{Chunk, Summary};
use super::error::ApiError;
use super::generation::{
    non_empty, usage, Answer, BuildPrompt, ChoiceChunks, ChoiceStream, Head, PromptSource,
    RequestKind,
};
use super::params::{self, ChatParams, Generation};
use super::state::AppState;
use super::text::{TextMode, TextModel, ToolCall, ToolCallDelta};
use aubier_runtime::text::grammar::{ContentFormat, GrammarSpec};
use axum::response::{IntoResponse, Response};
use axum::Json;

impl RequestKind for ChatParams {
    const PROMPT_PARAM: &'static str = "messages";
    const ID_PREFIX: &'static str = "chatcmpl-";
    type Chunks = ChoiceChunks<ChatShape>;

    fn parse(_app: &AppState, bytes: &[u8]) -> Result<ChatParams, ApiError> {
        params::parse_chat(bytes)
    }

    fn generation(&self) -> &Generation {
        &self.generation
    }

    fn take_prompt(&mut self) -> PromptSource {
        PromptSource::Build(self.take_build())
    }

    fn mode(&self) -> TextMode {
        // Stop strings cut free text only: JSON held to `response_format` is never cut, as
        // tool-call arguments are not (a cut value would not parse).
        let json_content = self
            .structured
            .grammar
            .as_ref()
            .is_some_and(|g| g.content != ContentFormat::Text);
        TextMode::Chat {
            stops: if json_content {
                Vec::new()
            } else {
                self.generation.stop.clone()
            },
            tool_calls: self.structured.tool_calls,
        }
    }

    fn take_grammar(&mut self) -> Option<GrammarSpec> {
        self.structured.grammar.take()
    }

    fn answer(self, app: &AppState, head: Head, answers: Vec<Answer>) -> Response {
        let choices = answers
            .iter()
            .map(|a| ChatChoice {
                index: a.summary.choice,
                message: AssistantMessage {
                    role: "assistant",
                    content: (!a.content.is_empty() || a.tool_calls.is_empty())
                        .then(|| a.content.clone()),
                    reasoning_content: non_empty(&a.reasoning),
                    refusal: (),
                    tool_calls: response_tool_calls(&a.tool_calls),
                },
                logprobs: self
                    .generation
                    .logprobs
                    .map(|_| super::logprobs::chat(&app.text, &a.logprobs)),
                finish_reason: a.summary.finish,
            })
            .collect();
        let done: Vec<Summary> = answers.into_iter().map(|a| a.summary).collect();
        Json(ChatCompletion::new(&head.object, choices, usage(&done))).into_response()
    }

    fn chunks(self, app: &AppState, head: Head) -> ChoiceChunks<ChatShape> {
        ChoiceChunks::new(app, head, self.generation.logprobs)
    }
}

impl ChatParams {
    /// Takes the conversation out as the builder of its prompt: the chat template's rendering,
    /// tokenized (`/tokenize` of messages reads the same).
    pub(super) fn take_build(&mut self) -> BuildPrompt {
        let chat = std::mem::take(&mut self.chat);
        Box::new(move |t: &TextModel, limit| t.chat_prompt_within(&chat, limit))
    }
}

/// The chat kind's stream: `chat.completion.chunk` deltas.
pub(super) struct ChatShape;

impl ChoiceStream for ChatShape {
    type Choice = ChatChunkChoice;
    type Chunk = ChatCompletionChunk;

    fn chunk(
        head: &Head,
        choices: Vec<ChatChunkChoice>,
        usage: Option<Option<Usage>>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk::new(&head.object, choices, usage)
    }

    fn opening(index: usize) -> Option<ChatChunkChoice> {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            ..Delta::default()
        };
        Some(ChatChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason: None,
        })
    }

    fn text(c: &Chunk, logprobs: Option<&TextModel>) -> ChatChunkChoice {
        let delta = Delta {
            role: None,
            content: non_empty(&c.delta.content),
            reasoning_content: non_empty(&c.delta.reasoning),
            tool_calls: tool_call_deltas(&c.delta.tool_calls),
        };
        ChatChunkChoice {
            index: c.choice,
            delta,
            logprobs: logprobs.map(|t| super::logprobs::chat(t, &c.logprobs)),
            finish_reason: None,
        }
    }

    fn finish(s: &Summary) -> ChatChunkChoice {
        ChatChunkChoice {
            index: s.choice,
            delta: Delta::default(),
            logprobs: None,
            finish_reason: Some(s.finish),
        }
    }
}

/// The OpenAI `tool_calls` array of a message.
fn response_tool_calls(calls: &[ToolCall]) -> Vec<ResponseToolCall> {
    calls
        .iter()
        .map(|c| ResponseToolCall {
            id: c.id.clone(),
            kind: "function",
            function: ResponseFunction {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        })
        .collect()
}

/// The OpenAI `delta.tool_calls` array of a streamed chunk.
fn tool_call_deltas(pieces: &[ToolCallDelta]) -> Vec<WireToolCallDelta> {
    pieces
        .iter()
        .map(|p| {
            let (id, name) = match &p.head {
                Some((id, name)) => (Some(id.clone()), Some(name.clone())),
                None => (None, None),
            };
            WireToolCallDelta {
                index: p.index,
                kind: id.is_some().then_some("function"),
                id,
                function: FunctionDelta {
                    name,
                    arguments: p.arguments.clone(),
                },
            }
        })
        .collect()
}
