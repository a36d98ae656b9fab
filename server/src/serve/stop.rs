//! Stop strings matched across token boundaries, with nothing of a stop ever leaked.
//!
//! Algorithm: decoded text is appended to a pending buffer. If any stop string occurs in it, the
//! text before the earliest occurrence is released and generation ends (the stop itself and
//! everything after it are dropped, as the OpenAI API does). Otherwise the longest suffix of the
//! buffer that is a proper prefix of some stop string is held back, because the next token may
//! complete it, and the rest is released. The cut is always on a `char` boundary, so released text
//! is whole characters. When generation ends for another reason the held-back text is released by
//! [`StopMatcher::finish`]. A stop can therefore be split over any number of tokens and no prefix
//! of it reaches the client before we know it is not a stop.
//!
//! Under vLLM's `min_tokens`, text pushed with checking off ([`StopMatcher::check`]) is never
//! searched on its own: a stop must end in text pushed with checking on, though it may start
//! earlier (vLLM's v1 detokenizer moves its stop-check offset past the text of the first
//! `min_tokens` tokens, `vllm/v1/engine/detokenizer.py`).

/// Matches up to four stop strings over streamed text (see the module note).
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
    /// Bytes at the start of `pending` within which no stop may end (pushed with checking off).
    floor: usize,
    /// Whether the next pushes are searched for stops.
    checking: bool,
}

/// What [`StopMatcher::push`] released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    /// Text that is safe to send to the client now.
    pub text: String,
    /// A stop string was matched: generation must end; `text` is everything before it.
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (each non-empty; an empty list never stops and holds nothing back).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            stopped: false,
            floor: 0,
            checking: true,
        }
    }

    /// Turns the search for stops on or off for the next pushes (on at first).
    pub fn check(&mut self, on: bool) {
        self.checking = on;
    }

    /// Appends `text` and releases what can no longer be part of a stop. After a stop has been
    /// matched every further push releases nothing.
    pub fn push(&mut self, text: &str) -> Released {
        if self.stopped {
            return Released {
                text: String::new(),
                stopped: true,
            };
        }
        self.pending.push_str(text);
        if !self.checking {
            self.floor = self.pending.len();
        }
        if let Some(at) = self.first_stop() {
            self.pending.truncate(at);
            self.stopped = true;
            return Released {
                text: std::mem::take(&mut self.pending),
                stopped: true,
            };
        }
        let keep = self.held_suffix_len();
        let cut = self.pending.len() - keep;
        let rest = self.pending.split_off(cut);
        self.floor = self.floor.saturating_sub(cut);
        Released {
            text: std::mem::replace(&mut self.pending, rest),
            stopped: false,
        }
    }

    /// Whether text that may start a stop string is held back.
    pub fn holds_back(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Releases the held-back text at the end of generation (nothing after a stop).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Where the earliest stop in `pending` that ends past `floor` starts, if any.
    fn first_stop(&self) -> Option<usize> {
        let p = self.pending.as_str();
        // A stop longer than the text held cannot occur in it; `find` would still read all of
        // it (a client's megabyte stop string cost every token milliseconds).
        self.stops
            .iter()
            .filter(|s| s.len() <= p.len())
            .filter_map(|s| {
                // A match ending past `floor` starts at `floor + 1 − len` or later, on a char.
                let mut from = (self.floor + 1).saturating_sub(s.len());
                while !p.is_char_boundary(from) {
                    from += 1;
                }
                p[from..].find(s.as_str()).map(|at| from + at)
            })
            .min()
    }

    /// Byte length of the longest suffix of `pending` (on a char boundary) that is a proper prefix
    /// of a stop string.
    fn held_suffix_len(&self) -> usize {
        let p = self.pending.as_str();
        let mut best = 0;
        for (start, _) in p.char_indices() {
            let suffix = &p[start..];
            if self
                .stops
                .iter()
                .any(|s| s.len() > suffix.len() && s.starts_with(suffix))
            {
                best = suffix.len();
                break;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes `pieces` one by one and returns (released pieces, stopped).
    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let r = m.push(p);
            out.push(r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push(m.finish());
        (out, false)
    }

    #[test]
    fn holds_back_only_while_a_stop_may_start() {
        let mut m = StopMatcher::new(vec!["END".to_owned()]);
        assert_eq!(m.push("xE").text, "x");
        assert!(m.holds_back());
        assert_eq!(m.push("x").text, "Ex");
        assert!(!m.holds_back());
    }

    #[test]
    fn stop_split_over_tokens_is_never_leaked() {
        let (out, stopped) = run(&["STOP"], &["Hello ", "S", "T", "O", "P", " after"]);
        assert!(stopped);
        assert_eq!(out.concat(), "Hello ");
        assert!(out.iter().all(|t| !t.contains('S')));
    }

    #[test]
    fn false_start_is_released_when_it_diverges() {
        let (out, stopped) = run(&["STOP"], &["a ST", "ART b"]);
        assert!(!stopped);
        assert_eq!(
            out,
            vec!["a ".to_owned(), "START b".to_owned(), String::new()]
        );
    }

    #[test]
    fn earliest_of_several_stops_wins_and_tail_is_flushed() {
        let (out, stopped) = run(&["xyz", "b", "cd", "é!"], &["aé", "!cd"]);
        assert!(stopped);
        assert_eq!(out.concat(), "a");
        let (out, stopped) = run(&["xyz"], &["ab", "cx", "y"]);
        assert!(!stopped);
        assert_eq!(out.concat(), "abcxy");
    }

    #[test]
    fn unchecked_text_is_never_a_stop_alone_but_may_start_one() {
        // vLLM's test_min_tokens_with_stop: with the first pieces unchecked, the "e" in them
        // does not stop; the first "e" after them does.
        let mut m = StopMatcher::new(vec!["e".to_owned()]);
        m.check(false);
        assert_eq!(m.push(" is").text, " is");
        assert_eq!(m.push(" Lee").text, " Lee");
        m.check(true);
        let r = m.push(", and I'm a stude");
        assert_eq!((r.text.as_str(), r.stopped), (", and I'm a stud", true));
        // A stop begun in unchecked text and ended in checked text matches; one wholly inside
        // the unchecked text does not, even when the checked text follows it at once.
        let mut m = StopMatcher::new(vec!["STOP".to_owned(), "é!".to_owned()]);
        m.check(false);
        assert_eq!(m.push("STOP aé!x ST").text, "STOP aé!x ");
        m.check(true);
        let r = m.push("OP");
        assert_eq!((r.text.as_str(), r.stopped), ("", true));
    }

    #[test]
    fn stop_inside_one_token_and_multibyte_holdback() {
        let (out, stopped) = run(&["\n\n"], &["line one\n\nline two"]);
        assert!(stopped);
        assert_eq!(out.concat(), "line one");
        let mut m = StopMatcher::new(vec!["€x".to_owned()]);
        assert_eq!(m.push("a€").text, "a");
        assert_eq!(m.push("y").text, "€y");
    }
}
