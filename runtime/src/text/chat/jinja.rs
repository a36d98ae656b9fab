//! The template path of steps 3-4: what a GGUF's Jinja `tokenizer.chat_template` is given (the
//! normalised conversation as HF's `messages` list; the `tojson` filter as Python `json.dumps`,
//! `raise_exception`, `strftime_now`), the [`ControlTable`] that splits the rendered text into
//! control tokens (longest match first) and text, and the [`Escaper`] that swaps the first
//! character of every control-token lookalike in the request for a private-use sentinel before
//! rendering and back after splitting, so request content can never become a control id.

use std::collections::HashSet;

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};
use serde_json::{json, Value as Json};

use super::error::ChatError;
use super::pyjson::python_json_dumps;
use super::segment::Segment;
use super::validate::{AssistantContent, Chunk, Conversation, Turn};

/// Control-token texts, matched longest-first.
#[derive(Clone, Debug)]
pub(super) struct ControlTable {
    texts: HashSet<String>,
    /// Distinct lengths in bytes, longest first.
    lengths: Vec<usize>,
    /// First characters of the texts (`<` and `[` for tekken), sorted.
    firsts: Vec<char>,
}

impl ControlTable {
    pub(super) fn new(texts: impl IntoIterator<Item = String>) -> ControlTable {
        let texts: HashSet<String> = texts.into_iter().filter(|t| !t.is_empty()).collect();
        let mut lengths: Vec<usize> = texts
            .iter()
            .map(String::len)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        lengths.sort_unstable_by(|a, b| b.cmp(a));
        let mut firsts: Vec<char> = texts
            .iter()
            .filter_map(|t| t.chars().next())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        firsts.sort_unstable();
        ControlTable {
            texts,
            lengths,
            firsts,
        }
    }

    /// Length of the longest control text starting at byte `at` (a char boundary) of `s`.
    fn match_at(&self, s: &str, at: usize) -> Option<usize> {
        let rest = &s[at..];
        let first = rest.chars().next()?;
        if self.firsts.binary_search(&first).is_err() {
            return None;
        }
        self.lengths.iter().copied().find(|&len| {
            rest.len() >= len && rest.is_char_boundary(len) && self.texts.contains(&rest[..len])
        })
    }

    /// Splits `s` into control tokens and text runs.
    pub(super) fn split(&self, s: &str) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut text_start = 0;
        let mut at = 0;
        while at < s.len() {
            if let Some(len) = self.match_at(s, at) {
                if text_start < at {
                    out.push(Segment::Text(s[text_start..at].to_owned()));
                }
                out.push(Segment::Control(s[at..at + len].to_owned()));
                at += len;
                text_start = at;
            } else {
                at += s[at..].chars().next().map_or(1, char::len_utf8);
            }
        }
        if text_start < s.len() {
            out.push(Segment::Text(s[text_start..].to_owned()));
        }
        out
    }
}

/// Swaps the first character of every control-token lookalike for a private-use sentinel.
pub(super) struct Escaper<'a> {
    table: &'a ControlTable,
    /// `(original, sentinel)` pairs, one per first character of a control text.
    pairs: Vec<(char, char)>,
}

impl<'a> Escaper<'a> {
    /// Picks sentinels from the supplementary private-use planes (U+F0000.., U+100000..) that
    /// occur nowhere in `haystack` (the template source and every request string).
    ///
    /// Errors: [`ChatError::NoSentinel`] if the request uses every such character.
    pub(super) fn new(table: &'a ControlTable, haystack: &str) -> Result<Escaper<'a>, ChatError> {
        let used: HashSet<char> = haystack.chars().collect();
        let mut free = (0xF0000u32..=0xFFFFD)
            .chain(0x100000..=0x10FFFD)
            .filter_map(char::from_u32)
            .filter(|c| !used.contains(c));
        let pairs = table
            .firsts
            .iter()
            .map(|&c| free.next().map(|s| (c, s)).ok_or(ChatError::NoSentinel))
            .collect::<Result<_, _>>()?;
        Ok(Escaper { table, pairs })
    }

    fn escape(&self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        for (at, c) in s.char_indices() {
            let sentinel = self
                .table
                .match_at(s, at)
                .and_then(|_| self.pairs.iter().find(|(o, _)| *o == c).map(|(_, s)| *s));
            out.push(sentinel.unwrap_or(c));
        }
        out
    }

    pub(super) fn unescape(&self, s: &str) -> String {
        s.chars()
            .map(|c| {
                self.pairs
                    .iter()
                    .find(|(_, s)| *s == c)
                    .map_or(c, |(o, _)| *o)
            })
            .collect()
    }

    pub(super) fn escape_json(&self, value: &Json) -> Json {
        match value {
            Json::String(s) => Json::String(self.escape(s)),
            Json::Array(items) => Json::Array(items.iter().map(|v| self.escape_json(v)).collect()),
            Json::Object(map) => Json::Object(
                map.iter()
                    .map(|(k, v)| (self.escape(k), self.escape_json(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

pub(super) fn collect_strings(value: &Json, out: &mut String) {
    match value {
        Json::String(s) => out.push_str(s),
        Json::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        Json::Object(map) => map.iter().for_each(|(k, v)| {
            out.push_str(k);
            collect_strings(v, out);
        }),
        _ => {}
    }
}

/// The normalised conversation as the HF-style `messages` list a Jinja template expects.
pub(super) fn template_messages(conv: &Conversation) -> Json {
    let chunk_json = |c: &Chunk| match c {
        Chunk::Text(t) => json!({"type": "text", "text": t}),
        Chunk::Thinking { text, closed } => {
            json!({"type": "thinking", "thinking": text, "closed": closed})
        }
    };
    let list = conv
        .turns
        .iter()
        .map(|turn| match turn {
            Turn::System(text) => json!({"role": "system", "content": text}),
            Turn::User(text) => json!({"role": "user", "content": text}),
            Turn::Tool { call_id, content } => json!({"role": "tool", "tool_call_id": call_id, "content": content}),
            Turn::Assistant { content, tool_calls } => {
                let content = match content {
                    AssistantContent::Str(s) if s.trim_end_matches(' ').is_empty() => Json::Null,
                    AssistantContent::Str(s) => Json::String(s.trim_end_matches(' ').to_owned()),
                    AssistantContent::Chunks(chunks) => Json::Array(chunks.iter().map(chunk_json).collect()),
                };
                let mut message = json!({"role": "assistant", "content": content});
                if !tool_calls.is_empty() {
                    let calls: Vec<Json> = tool_calls
                        .iter()
                        .map(|(id, name, arguments)| {
                            json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
                        })
                        .collect();
                    message["tool_calls"] = Json::Array(calls);
                }
                message
            }
        })
        .collect();
    Json::Array(list)
}

/// minijinja filter `tojson`: Python `json.dumps(x, ensure_ascii=False)`, as HF's chat-template
/// environment defines it (minijinja's own `tojson` is compact and HTML-escapes).
pub(super) fn tojson_filter(value: Value) -> Result<Value, minijinja::Error> {
    let json = serde_json::to_value(&value).map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: value is not JSON")
            .with_source(e)
    })?;
    Ok(Value::from_safe_string(python_json_dumps(&json)))
}

pub(super) fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time formatted with C `strftime` specifiers, as
/// transformers' chat-template environment provides it (Mistral templates use it for the date).
pub(super) fn strftime_now(format: String) -> Result<Value, minijinja::Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Utc::now().format(&format)).map_err(|_| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(Value::from(out))
}

/// A compiled Jinja chat template and what rendering it needs.
pub(super) struct JinjaTemplate {
    pub(super) env: Environment<'static>,
    pub(super) controls: ControlTable,
    pub(super) source: String,
    pub(super) bos: String,
    pub(super) eos: String,
}
