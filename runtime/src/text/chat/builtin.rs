//! The built-in v15 renderer (mistral-common `InstructTokenizerV15`), for a GGUF without
//! `tokenizer.chat_template`: writes the normalised [`Conversation`] as control tokens and text:
//! `<s>`, then per turn `[SYSTEM_PROMPT]…[/SYSTEM_PROMPT]`, `[INST]…[/INST]` (the first one
//! preceded by `[AVAILABLE_TOOLS]` and `[MODEL_SETTINGS]`), assistant text, `[THINK]` chunks and
//! `[TOOL_CALLS]name[ARGS]args` closed by `</s>` (left open for a continued final turn), and
//! `[TOOL_RESULTS]…[/TOOL_RESULTS]`.

use serde_json::json;

use super::pyjson::python_json_dumps;
use super::segment::Segment;
use super::validate::{AssistantContent, Chunk, Conversation, Turn};

/// The built-in v15 renderer (mistral-common `InstructTokenizerV15`), as segments.
pub(super) fn render_builtin(conv: &Conversation) -> Vec<Segment> {
    use Segment::{Control, Text};
    let ctl = |s: &str| Control(s.to_owned());
    let mut out = vec![ctl("<s>")];
    let mut first_user = true;
    let n = conv.turns.len();
    for (i, turn) in conv.turns.iter().enumerate() {
        match turn {
            Turn::System(text) => {
                out.extend([
                    ctl("[SYSTEM_PROMPT]"),
                    Text(text.clone()),
                    ctl("[/SYSTEM_PROMPT]"),
                ]);
            }
            Turn::User(text) => {
                if first_user {
                    first_user = false;
                    if let Some(tools) = &conv.tools {
                        out.extend([
                            ctl("[AVAILABLE_TOOLS]"),
                            Text(python_json_dumps(tools)),
                            ctl("[/AVAILABLE_TOOLS]"),
                        ]);
                    }
                    let settings = json!({ "reasoning_effort": conv.reasoning_effort });
                    out.extend([
                        ctl("[MODEL_SETTINGS]"),
                        Text(python_json_dumps(&settings)),
                        ctl("[/MODEL_SETTINGS]"),
                    ]);
                }
                out.extend([ctl("[INST]"), Text(text.clone()), ctl("[/INST]")]);
            }
            Turn::Assistant {
                content,
                tool_calls,
            } => {
                match content {
                    AssistantContent::Str(text) => {
                        out.push(Text(text.trim_end_matches(' ').to_owned()))
                    }
                    AssistantContent::Chunks(chunks) => {
                        for chunk in chunks {
                            match chunk {
                                Chunk::Text(text) => out.push(Text(text.clone())),
                                Chunk::Thinking { text, closed } => {
                                    out.extend([ctl("[THINK]"), Text(text.clone())]);
                                    if *closed {
                                        out.push(ctl("[/THINK]"));
                                    }
                                }
                            }
                        }
                    }
                }
                for (_, name, arguments) in tool_calls {
                    out.extend([
                        ctl("[TOOL_CALLS]"),
                        Text(name.clone()),
                        ctl("[ARGS]"),
                        Text(arguments.clone()),
                    ]);
                }
                if !(conv.prefix && i + 1 == n) {
                    out.push(ctl("</s>"));
                }
            }
            Turn::Tool { content, .. } => {
                out.extend([
                    ctl("[TOOL_RESULTS]"),
                    Text(content.clone()),
                    ctl("[/TOOL_RESULTS]"),
                ]);
            }
        }
    }
    out
}
