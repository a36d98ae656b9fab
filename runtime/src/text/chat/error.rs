//! [`ChatError`], the errors of chat rendering, in a file of its own: the validator and the
//! template path return it without importing the parent module.

use crate::text::tokenizer::TokenizerError;

/// Errors of chat rendering. Each names the message index (0-based) or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// `messages` is empty.
    #[error("the conversation must have at least one message")]
    NoMessages,
    /// `reasoning_effort` is not `none`/`high`.
    #[error("reasoning_effort must be one of \"none\", \"high\"; got {0:?}")]
    ReasoningEffort(String),
    /// The first message is neither user nor system.
    #[error("the conversation must start with a user or system message, got {0}")]
    FirstRole(&'static str),
    /// Two roles that may not follow each other.
    #[error("messages[{index}]: unexpected role '{role}' after role '{previous}'")]
    RoleOrder {
        /// Index of the offending message.
        index: usize,
        /// Its role.
        role: &'static str,
        /// The role before it.
        previous: &'static str,
    },
    /// The last message cannot be answered.
    #[error(
        "the last message must be user or tool (or assistant with continue_final_message), got {0}"
    )]
    LastRole(&'static str),
    /// `continue_final_message` without a final assistant message.
    #[error("continue_final_message needs a final assistant message, got {0}")]
    ContinueNotAssistant(&'static str),
    /// A message lacks the content its role requires.
    #[error("messages[{index}] ({role}): {reason}")]
    Content {
        /// Index of the message.
        index: usize,
        /// Its role.
        role: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A tool call or tool result is malformed or unmatched.
    #[error("messages[{index}]: {reason}")]
    ToolCalls {
        /// Index of the message.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The `tools` field is malformed.
    #[error("tools: {0}")]
    Tools(String),
    /// The GGUF holds `tokenizer.chat_template` but not as a string, or lacks the token list.
    #[error("GGUF metadata key `{key}` must be {expected}")]
    Gguf {
        /// The metadata key.
        key: &'static str,
        /// What it should hold.
        expected: &'static str,
    },
    /// The chat template does not compile.
    #[error("chat template does not compile: {0}")]
    Compile(#[source] minijinja::Error),
    /// Rendering failed, including the template's own `raise_exception`.
    #[error("chat template rendering failed: {0}")]
    Render(#[source] minijinja::Error),
    /// With `continue_final_message`, the rendered prompt did not end with the EOS text.
    #[error("continue_final_message: the rendered prompt does not end with the EOS text {0:?}")]
    OpenTurn(String),
    /// The request uses every supplementary private-use character, so control-token lookalikes
    /// in it cannot be kept apart from the template's control tokens.
    #[error("the request uses every supplementary private-use character; cannot isolate control-token lookalikes")]
    NoSentinel,
    /// The template wrote a control-token string the tokenizer does not know.
    #[error("control token {0:?} is not in the tokenizer's vocabulary")]
    UnknownControl(String),
    /// Encoding a text piece failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}
