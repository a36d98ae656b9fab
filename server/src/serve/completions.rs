//! `POST /v1/completions` (legacy completions): the completion kind of the generation route
//! ([`super::generation`]). The prompt is one string (tokenized with BOS) or one array of token
//! ids; the answer is the text of each choice, streamed as `text_completion` chunks.

use super::api::response::{
    Completion, CompletionChoice, CompletionChunk, CompletionChunkChoice, Usage,
};
use super::engine::{Chunk, Summary};
use super::error::ApiError;
use super::generation::{
    usage, Answer, BuildPrompt, ChoiceChunks, ChoiceStream, Head, PromptSource, RequestKind,
};
use super::params::{self, CompletionParams, Generation, Prompt};
use super::state::AppState;
use super::text::{TextMode, TextModel};
use aubier_runtime::text::grammar::GrammarSpec;
use axum::response::{IntoResponse, Response};
use axum::Json;

impl RequestKind for CompletionParams {
    const PROMPT_PARAM: &'static str = "prompt";
    const ID_PREFIX: &'static str = "cmpl-";
    type Chunks = ChoiceChunks<CompletionShape>;

    fn parse(_app: &AppState, bytes: &[u8]) -> Result<CompletionParams, ApiError> {
        params::parse_completion(bytes)
    }

    fn generation(&self) -> &Generation {
        &self.generation
    }

    fn take_prompt(&mut self) -> PromptSource {
        match std::mem::replace(&mut self.prompt, Prompt::Ids(Vec::new())) {
            Prompt::Text(text) => PromptSource::Build(text_prompt(text, true)),
            Prompt::Ids(ids) => PromptSource::Ids(ids),
        }
    }

    fn mode(&self) -> TextMode {
        TextMode::Completion {
            stops: self.generation.stop.clone(),
        }
    }

    fn take_grammar(&mut self) -> Option<GrammarSpec> {
        None
    }

    fn answer(self, app: &AppState, head: Head, answers: Vec<Answer>) -> Response {
        let choices = answers
            .iter()
            .map(|a| CompletionChoice {
                index: a.summary.choice,
                text: a.content.clone(),
                logprobs: self
                    .generation
                    .logprobs
                    .map(|_| super::logprobs::completion(&app.text, &a.logprobs)),
                finish_reason: a.summary.finish,
            })
            .collect();
        let done: Vec<Summary> = answers.into_iter().map(|a| a.summary).collect();
        Json(Completion::new(&head.object, choices, usage(&done))).into_response()
    }

    fn chunks(self, app: &AppState, head: Head) -> ChoiceChunks<CompletionShape> {
        ChoiceChunks::new(app, head, self.generation.logprobs)
    }
}

/// The builder of the ids of a string prompt: BOS when `bos` (this route always asks for it),
/// then the text's encoding (`/tokenize` of a prompt reads the same).
pub(super) fn text_prompt(text: String, bos: bool) -> BuildPrompt {
    Box::new(move |t: &TextModel, limit| t.completion_prompt_within(&text, bos, limit))
}

/// The completion kind's stream: `text_completion` chunks.
pub(super) struct CompletionShape;

impl ChoiceStream for CompletionShape {
    type Choice = CompletionChunkChoice;
    type Chunk = CompletionChunk;

    fn chunk(
        head: &Head,
        choices: Vec<CompletionChunkChoice>,
        usage: Option<Option<Usage>>,
    ) -> CompletionChunk {
        CompletionChunk::new(&head.object, choices, usage)
    }

    fn opening(_index: usize) -> Option<CompletionChunkChoice> {
        None
    }

    fn text(c: &Chunk, logprobs: Option<&TextModel>) -> CompletionChunkChoice {
        CompletionChunkChoice {
            index: c.choice,
            text: c.delta.content.clone(),
            logprobs: logprobs.map(|t| super::logprobs::completion(t, &c.logprobs)),
            finish_reason: None,
        }
    }

    fn finish(s: &Summary) -> CompletionChunkChoice {
        CompletionChunkChoice {
            index: s.choice,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(s.finish),
        }
    }
}
