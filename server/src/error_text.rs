//! [`error_text`]: how every command prints an error chain.

/// An error and its causes, outermost first, joined by `": "` as anyhow's `{:#}` does, except
/// that a cause whose text the message so far already contains is left out: many of the
/// runtime's errors print their source in their own message (`expert store: {0}`) and also
/// return it as `source()`, which `{:#}` then printed a second (or third) time.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[derive(Debug, thiserror::Error)]
    #[error("inner detail")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Outer(#[source] Inner);

    #[test]
    fn causes_already_in_the_message_are_printed_once() {
        let e = anyhow::Error::new(Outer(Inner)).context("loading");
        assert_eq!(
            format!("{e:#}"),
            "loading: outer: inner detail: inner detail"
        );
        assert_eq!(error_text(&e), "loading: outer: inner detail");
        let plain = anyhow::anyhow!("alone").context("step");
        assert_eq!(error_text(&plain), "step: alone");
    }
}
