//! Steps 1-2 of the module note of `chat`: [`validate_and_normalize`] checks an OpenAI-shaped
//! [`ChatRequest`] against mistral-common's v15 rules (a broken rule is returned as its
//! [`ChatError`]) and returns the [`Conversation`] both renderers read: runs of user or assistant
//! messages merged, reasoning as leading thinking chunks, tool-call arguments re-serialised as
//! Python `json.dumps`, tool results in call order, tools in canonical form.

use std::collections::HashSet;

use serde_json::{json, Map, Value as Json};

use super::error::ChatError;
use super::pyjson::python_json_dumps;
use super::request::{
    ChatMessage, ChatRequest, ContentChunk, MessageContent, Role, REASONING_EFFORTS,
};

/// mistral-common's tool-call argument normalisation: empty → `{}`; valid JSON → re-serialised
/// Python-style; anything else → that text as a JSON string literal (`json.dumps(text)`).
fn normalize_arguments(arguments: &Json) -> String {
    match arguments {
        Json::Null => "{}".into(),
        Json::String(s) if s.is_empty() => "{}".into(),
        Json::String(s) => match serde_json::from_str::<Json>(s) {
            Ok(parsed) => python_json_dumps(&parsed),
            Err(_) => python_json_dumps(arguments),
        },
        other => python_json_dumps(other),
    }
}

/// A piece of assistant content after normalisation.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Chunk {
    Text(String),
    Thinking { text: String, closed: bool },
}

/// A normalised turn.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Turn {
    System(String),
    User(String),
    Assistant {
        /// The aggregated content: `Str` when only text was given (then trailing spaces are
        /// stripped), chunks otherwise.
        content: AssistantContent,
        /// `(id, name, normalised arguments)`.
        tool_calls: Vec<(String, String, String)>,
    },
    Tool {
        call_id: String,
        content: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum AssistantContent {
    Str(String),
    Chunks(Vec<Chunk>),
}

/// A validated, normalised request.
#[derive(Clone, Debug)]
pub(super) struct Conversation {
    pub(super) turns: Vec<Turn>,
    /// Canonical tools list, `None` when there are none.
    pub(super) tools: Option<Json>,
    pub(super) reasoning_effort: &'static str,
    /// The final assistant turn stays open.
    pub(super) prefix: bool,
}

fn effective_role(role: Role) -> Role {
    match role {
        Role::Developer => Role::System,
        other => other,
    }
}

fn valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The message's content as chunks, with mistral-common's chunk rules for its role.
fn content_chunks(index: usize, message: &ChatMessage) -> Result<Vec<Chunk>, ChatError> {
    let role = effective_role(message.role);
    let err = |reason| ChatError::Content {
        index,
        role: role.name(),
        reason,
    };
    let mut chunks = match &message.content {
        None => Vec::new(),
        Some(MessageContent::Text(text)) => vec![Chunk::Text(text.clone())],
        Some(MessageContent::Chunks(list)) => list
            .iter()
            .map(|chunk| match chunk {
                ContentChunk::Text { text } => Ok(Chunk::Text(text.clone())),
                ContentChunk::Thinking { thinking, closed } if role == Role::Assistant => {
                    Ok(Chunk::Thinking {
                        text: thinking.clone(),
                        closed: *closed,
                    })
                }
                ContentChunk::Thinking { .. } => Err(err(
                    "thinking chunks are only allowed in assistant messages",
                )),
                ContentChunk::Unsupported => Err(err(
                    "only text (and, for assistant, thinking) chunks are supported",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    if let Some(reasoning) = &message.reasoning_content {
        if role != Role::Assistant {
            return Err(err(
                "reasoning_content is only allowed in assistant messages",
            ));
        }
        if chunks.iter().any(|c| matches!(c, Chunk::Thinking { .. })) {
            return Err(err(
                "a message cannot have both thinking chunks and reasoning_content",
            ));
        }
        chunks.insert(
            0,
            Chunk::Thinking {
                text: reasoning.clone(),
                closed: true,
            },
        );
    }
    Ok(chunks)
}

/// mistral-common `_aggregate_content_chunks_impl`: texts of one message join with `""`, texts
/// of different messages with `"\n\n"`, empty texts are skipped; a string when only text remains.
fn aggregate(contents: &[Vec<Chunk>]) -> (bool, Vec<Chunk>) {
    let mut out: Vec<Chunk> = Vec::new();
    let mut text: Option<String> = None;
    let mut only_text = true;
    for chunks in contents {
        let mut new_message = text.is_some();
        for chunk in chunks {
            match chunk {
                Chunk::Text(t) if t.is_empty() => {}
                Chunk::Text(t) => {
                    let buf = text.get_or_insert_with(String::new);
                    if new_message && !buf.is_empty() {
                        buf.push_str("\n\n");
                    }
                    buf.push_str(t);
                    new_message = false;
                }
                thinking => {
                    only_text = false;
                    if let Some(t) = text.take() {
                        out.push(Chunk::Text(t));
                    }
                    out.push(thinking.clone());
                }
            }
        }
    }
    if let Some(t) = text {
        out.push(Chunk::Text(t));
    }
    (only_text, out)
}

pub(super) fn validate_and_normalize(req: &ChatRequest) -> Result<Conversation, ChatError> {
    let messages = &req.messages;
    let reasoning_effort = match req.reasoning_effort.as_deref() {
        None => REASONING_EFFORTS[0],
        Some(value) => REASONING_EFFORTS
            .iter()
            .find(|e| **e == value)
            .copied()
            .ok_or_else(|| ChatError::ReasoningEffort(value.to_owned()))?,
    };
    let Some(first) = messages.first() else {
        return Err(ChatError::NoMessages);
    };
    let roles: Vec<Role> = messages.iter().map(|m| effective_role(m.role)).collect();
    if !matches!(roles[0], Role::User | Role::System) {
        return Err(ChatError::FirstRole(first.role.name()));
    }
    for (index, pair) in roles.windows(2).enumerate() {
        let (previous, role) = (pair[0], pair[1]);
        let allowed = match previous {
            Role::System | Role::Developer => {
                matches!(role, Role::User | Role::Assistant | Role::System)
            }
            Role::User => matches!(role, Role::Assistant | Role::System | Role::User),
            Role::Assistant => matches!(role, Role::Assistant | Role::User | Role::Tool),
            Role::Tool => matches!(role, Role::Assistant | Role::Tool | Role::User),
        };
        if !allowed {
            return Err(ChatError::RoleOrder {
                index: index + 1,
                role: role.name(),
                previous: previous.name(),
            });
        }
    }
    // A lone system message is accepted (mistral-common checks the last role only when there
    // are two or more messages).
    let last = roles[roles.len() - 1];
    let answerable = match last {
        Role::User | Role::Tool => true,
        Role::System | Role::Developer => roles.len() == 1,
        Role::Assistant => false,
    };
    if req.continue_final_message {
        if last != Role::Assistant {
            return Err(ChatError::ContinueNotAssistant(last.name()));
        }
    } else if !answerable {
        return Err(ChatError::LastRole(last.name()));
    }

    // Per-message content, tool calls and ids.
    let mut chunks = Vec::with_capacity(messages.len());
    let mut calls: Vec<Vec<(String, String, String)>> = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let role = roles[index];
        let content = content_chunks(index, message)?;
        let content_err = |reason| ChatError::Content {
            index,
            role: role.name(),
            reason,
        };
        match role {
            Role::User | Role::System | Role::Developer if message.content.is_none() => {
                return Err(content_err("content is required"));
            }
            Role::Tool if message.content.is_none() => {
                return Err(content_err("content is required"))
            }
            _ => {}
        }
        if role != Role::Assistant && message.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(content_err("only assistant messages may have tool_calls"));
        }
        let mut message_calls = Vec::new();
        for call in message.tool_calls.iter().flatten() {
            let tool_err = |reason: String| ChatError::ToolCalls { index, reason };
            if call.kind.as_deref().is_some_and(|k| k != "function") {
                return Err(tool_err(format!(
                    "tool call type {:?} is not \"function\"",
                    call.kind
                )));
            }
            if !valid_function_name(&call.function.name) {
                return Err(tool_err(format!(
                    "function name {:?} must match ^[a-zA-Z0-9_-]{{1,64}}$",
                    call.function.name
                )));
            }
            let id = match call.id.as_deref() {
                Some(id) if !id.is_empty() && id != "null" => id.to_owned(),
                _ => return Err(tool_err("every tool call needs an id".into())),
            };
            message_calls.push((
                id,
                call.function.name.clone(),
                normalize_arguments(&call.function.arguments),
            ));
        }
        if role == Role::Assistant {
            let has_content = chunks_nonempty(&content);
            if !has_content && message_calls.is_empty() {
                return Err(content_err(
                    "an assistant message needs non-empty content or tool_calls",
                ));
            }
        }
        if role == Role::Tool && message.tool_call_id.as_deref().is_none_or(str::is_empty) {
            return Err(ChatError::ToolCalls {
                index,
                reason: "a tool message needs tool_call_id".into(),
            });
        }
        chunks.push(content);
        calls.push(message_calls);
    }

    // mistral-common `MistralRequestValidatorV13._validate_tool_calls_followed_by_tool_messages`.
    let mut expected: HashSet<&str> = HashSet::new();
    let mut observed: HashSet<&str> = HashSet::new();
    for (index, message) in messages.iter().enumerate().skip(1) {
        match roles[index] {
            Role::Tool => {
                let id = message.tool_call_id.as_deref().unwrap_or_default();
                if !expected.contains(id) {
                    return Err(ChatError::ToolCalls {
                        index,
                        reason: format!("tool result for unknown tool call id {id:?}"),
                    });
                }
                if !observed.insert(id) {
                    return Err(ChatError::ToolCalls {
                        index,
                        reason: format!("duplicate tool result for tool call id {id:?}"),
                    });
                }
            }
            Role::Assistant => {
                if expected.len() != observed.len() {
                    return Err(ChatError::ToolCalls {
                        index,
                        reason: "not every tool call of the previous assistant turn has a result"
                            .into(),
                    });
                }
                expected.clear();
                observed.clear();
                for (id, _, _) in &calls[index] {
                    if !expected.insert(id) {
                        return Err(ChatError::ToolCalls {
                            index,
                            reason: format!("duplicate tool call id {id:?}"),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    if expected.len() != observed.len() {
        return Err(ChatError::ToolCalls {
            index: messages.len() - 1,
            reason: "not every tool call of the last assistant turn has a result".into(),
        });
    }

    // Aggregate runs of same-role messages (user, assistant); system and tool stay separate.
    let mut turns = Vec::new();
    let mut latest_call_ids: Vec<String> = Vec::new();
    let mut i = 0;
    while i < messages.len() {
        let role = roles[i];
        let mut j = i + 1;
        while j < messages.len() && roles[j] == role {
            j += 1;
        }
        match role {
            Role::System | Role::Developer => {
                for content in &chunks[i..j] {
                    let merged = aggregate(std::slice::from_ref(content)).1;
                    turns.push(Turn::System(text_of(&merged)));
                }
            }
            Role::User => {
                turns.push(Turn::User(text_of(&aggregate(&chunks[i..j]).1)));
            }
            Role::Assistant => {
                let (only_text, merged) = aggregate(&chunks[i..j]);
                let content = if only_text {
                    AssistantContent::Str(text_of(&merged))
                } else {
                    AssistantContent::Chunks(merged)
                };
                let tool_calls: Vec<_> = (i..j).flat_map(|k| calls[k].clone()).collect();
                latest_call_ids = tool_calls.iter().map(|(id, _, _)| id.clone()).collect();
                turns.push(Turn::Assistant {
                    content,
                    tool_calls,
                });
            }
            Role::Tool => {
                // mistral-common `InstructRequestNormalizerV13._inplace_sort_tool_messages`.
                let mut results: Vec<(usize, usize, Turn)> = (i..j)
                    .map(|k| {
                        let call_id = messages[k].tool_call_id.clone().unwrap_or_default();
                        let order = latest_call_ids
                            .iter()
                            .position(|id| *id == call_id)
                            .unwrap_or(usize::MAX);
                        let content = text_of(&aggregate(std::slice::from_ref(&chunks[k])).1);
                        (order, k, Turn::Tool { call_id, content })
                    })
                    .collect();
                results.sort_by_key(|(order, k, _)| (*order, *k));
                turns.extend(results.into_iter().map(|(_, _, turn)| turn));
            }
        }
        i = j;
    }

    Ok(Conversation {
        turns,
        tools: canonical_tools(req.tools.as_ref())?,
        reasoning_effort,
        prefix: req.continue_final_message,
    })
}

fn chunks_nonempty(chunks: &[Chunk]) -> bool {
    chunks.iter().any(|c| match c {
        Chunk::Text(t) => !t.is_empty(),
        Chunk::Thinking { .. } => true,
    })
}

/// The text of an all-text aggregate.
fn text_of(chunks: &[Chunk]) -> String {
    chunks
        .iter()
        .map(|c| match c {
            Chunk::Text(t) => t.as_str(),
            Chunk::Thinking { text, .. } => text.as_str(),
        })
        .collect()
}

/// mistral-common `Tool.from_openai`: keep `type`, `function.{name, description, parameters}`
/// (defaults `""` and `{}`), in that order; drop other fields (`strict` …).
fn canonical_tools(tools: Option<&Json>) -> Result<Option<Json>, ChatError> {
    let list = match tools {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::Array(list)) => list,
        Some(_) => return Err(ChatError::Tools("must be an array of tools".into())),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let err = |what: &str| ChatError::Tools(format!("tools[{i}]: {what}"));
        let obj = tool.as_object().ok_or_else(|| err("must be an object"))?;
        if obj.get("type").is_some_and(|t| t != "function") {
            return Err(err("type must be \"function\""));
        }
        let function = obj
            .get("function")
            .and_then(Json::as_object)
            .ok_or_else(|| err("function must be an object"))?;
        let name = function
            .get("name")
            .and_then(Json::as_str)
            .ok_or_else(|| err("function.name must be a string"))?;
        if !valid_function_name(name) {
            return Err(err("function.name must match ^[a-zA-Z0-9_-]{1,64}$"));
        }
        let description = match function.get("description") {
            None | Some(Json::Null) => Json::String(String::new()),
            Some(Json::String(s)) => Json::String(s.clone()),
            Some(_) => return Err(err("function.description must be a string")),
        };
        let parameters = match function.get("parameters") {
            None | Some(Json::Null) => Json::Object(Map::new()),
            Some(Json::Object(p)) => Json::Object(p.clone()),
            Some(_) => return Err(err("function.parameters must be an object")),
        };
        out.push(json!({
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }));
    }
    Ok((!out.is_empty()).then_some(Json::Array(out)))
}
