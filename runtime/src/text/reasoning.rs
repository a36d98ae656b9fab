//! Generated text → reasoning and answer. The text inside `[THINK]…[/THINK]` is the reasoning
//! (`reasoning_content`), the rest the content; a `[THINK]` never closed makes the remainder
//! reasoning. Input is text decoded with control tokens kept as text. [`split_reasoning`] splits a
//! whole text; [`ReasoningSplitter`] routes streamed pieces the same way, holding back a piece's
//! tail while it may be the start of a marker, so a marker cut across pieces never leaks as text.

const THINK_OPEN: &str = "[THINK]";
const THINK_CLOSE: &str = "[/THINK]";

/// Splits generated text (decoded with control tokens kept as text) into reasoning and answer:
/// the text inside `[THINK]…[/THINK]` is the reasoning (`reasoning_content`), the rest the
/// content. A `[THINK]` that is never closed (generation stopped) makes the remainder reasoning.
/// Returns `(None, text)` when there is no `[THINK]`.
pub fn split_reasoning(text: &str) -> (Option<String>, String) {
    let mut splitter = ReasoningSplitter::new();
    let first = splitter.push(text);
    let last = splitter.finish();
    let reasoning = first.reasoning + &last.reasoning;
    let content = first.content + &last.content;
    (splitter.saw_think.then_some(reasoning), content)
}

/// Text routed by a [`ReasoningSplitter`] step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReasoningDelta {
    /// New `reasoning_content` text.
    pub reasoning: String,
    /// New `content` text.
    pub content: String,
}

/// Streaming version of [`split_reasoning`] for SSE: feed decoded pieces (from
/// [`crate::text::tokenizer::StreamDecoder::push_keep_special`]) and get the reasoning and content
/// deltas. A piece ending in a possible prefix of `[THINK]`/`[/THINK]` is held back until the
/// next piece decides it, so a marker split across pieces is never leaked as text.
#[derive(Clone, Debug, Default)]
pub struct ReasoningSplitter {
    in_reasoning: bool,
    saw_think: bool,
    held: String,
}

impl ReasoningSplitter {
    /// A splitter in content mode.
    pub fn new() -> ReasoningSplitter {
        ReasoningSplitter::default()
    }

    /// Whether the text so far is inside `[THINK]…`.
    pub fn in_reasoning(&self) -> bool {
        self.in_reasoning
    }

    /// Feeds one decoded piece.
    pub fn push(&mut self, piece: &str) -> ReasoningDelta {
        let mut text = std::mem::take(&mut self.held);
        text.push_str(piece);
        let mut delta = ReasoningDelta::default();
        let mut rest = text.as_str();
        loop {
            let marker = if self.in_reasoning {
                THINK_CLOSE
            } else {
                THINK_OPEN
            };
            if let Some(pos) = rest.find(marker) {
                self.emit(&mut delta, &rest[..pos]);
                self.in_reasoning = !self.in_reasoning;
                self.saw_think |= self.in_reasoning;
                rest = &rest[pos + marker.len()..];
                continue;
            }
            // Hold back the longest suffix that is a proper prefix of the marker.
            let hold = (1..marker.len())
                .rev()
                .find(|&k| {
                    rest.len() >= k
                        && rest.is_char_boundary(rest.len() - k)
                        && marker.starts_with(&rest[rest.len() - k..])
                })
                .unwrap_or(0);
            let (now, later) = rest.split_at(rest.len() - hold);
            self.emit(&mut delta, now);
            self.held = later.to_owned();
            break;
        }
        delta
    }

    /// Whether text that may start a marker is held back.
    pub fn holds_back(&self) -> bool {
        !self.held.is_empty()
    }

    /// Flushes held-back text.
    pub fn finish(&mut self) -> ReasoningDelta {
        let mut delta = ReasoningDelta::default();
        let held = std::mem::take(&mut self.held);
        self.emit(&mut delta, &held);
        delta
    }

    fn emit(&self, delta: &mut ReasoningDelta, text: &str) {
        if self.in_reasoning {
            delta.reasoning.push_str(text);
        } else {
            delta.content.push_str(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_only_a_possible_marker() {
        let mut s = ReasoningSplitter::new();
        assert_eq!(s.push("a [TH").content, "a ");
        assert!(s.holds_back());
        assert_eq!(s.push("e").content, "[THe");
        assert!(!s.holds_back());
    }

    #[test]
    fn reasoning_splitter_handles_split_markers() {
        let text = "[THINK]plan it[/THINK]answer";
        let whole = split_reasoning(text);
        assert_eq!(whole, (Some("plan it".into()), "answer".into()));
        for cut in 1..text.len() {
            let mut s = ReasoningSplitter::new();
            let a = s.push(&text[..cut]);
            let b = s.push(&text[cut..]);
            let c = s.finish();
            assert_eq!(
                a.reasoning + &b.reasoning + &c.reasoning,
                "plan it",
                "cut {cut}"
            );
            assert_eq!(a.content + &b.content + &c.content, "answer", "cut {cut}");
        }
        assert_eq!(
            split_reasoning("no think [here"),
            (None, "no think [here".into())
        );
        assert_eq!(
            split_reasoning("[THINK]unfinished"),
            (Some("unfinished".into()), String::new())
        );
    }
}
