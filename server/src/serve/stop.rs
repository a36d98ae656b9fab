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

/// Matches up to four stop strings over streamed text (see the module note).
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
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
        }
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
        // A stop longer than the text held cannot occur in it; `find` would still read all of
        // it (a client's megabyte stop string cost every token milliseconds).
        let first = self
            .stops
            .iter()
            .filter(|s| s.len() <= self.pending.len())
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first {
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
    fn stop_inside_one_token_and_multibyte_holdback() {
        let (out, stopped) = run(&["\n\n"], &["line one\n\nline two"]);
        assert!(stopped);
        assert_eq!(out.concat(), "line one");
        let mut m = StopMatcher::new(vec!["€x".to_owned()]);
        assert_eq!(m.push("a€").text, "a");
        assert_eq!(m.push("y").text, "€y");
    }
}
