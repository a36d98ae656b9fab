//! Chat rendering parity against mistral-common (tests/data/chat, see its README): every render
//! case (text and ids) through the GGUF's Jinja template and through the built-in v15 renderer,
//! and every error case rejected.

use aubier_runtime::gguf::GgufFile;
use aubier_runtime::text::chat::{ChatRequest, ChatTemplate};
use aubier_runtime::text::reasoning::{split_reasoning, ReasoningSplitter};
use aubier_runtime::text::tokenizer::Tokenizer;
use aubier_tests::{data_dir, json_ids, model_path};
use serde_json::{json, Value};

fn tekken_file() -> GgufFile {
    GgufFile::open(data_dir().join("tokenizer/tekken-v15-vocab.gguf"))
        .expect("open tekken-v15-vocab.gguf")
}

fn jsonl(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(data_dir().join("chat").join(name)).expect("read fixture");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
        .collect()
}

fn request(value: &Value) -> ChatRequest {
    serde_json::from_value(value.clone()).expect("fixture request deserialises")
}

#[test]
fn gguf_template_is_the_fixture_template() {
    let file = tekken_file();
    let in_gguf = file
        .get("tokenizer.chat_template")
        .and_then(|v| v.as_str())
        .expect("tokenizer.chat_template");
    let fixture = std::fs::read_to_string(data_dir().join("chat/chat_template.jinja"))
        .expect("read template");
    assert_eq!(in_gguf, fixture);
    assert!(!ChatTemplate::from_gguf(&file)
        .expect("compile")
        .is_builtin());
}

fn check_render_cases(template: &ChatTemplate, tok: &Tokenizer) {
    let cases = jsonl("render_cases.jsonl");
    assert_eq!(cases.len(), 41);
    let mut failures = Vec::new();
    for case in &cases {
        let name = &case["name"];
        let req = request(&case["request"]);
        match (template.render(&req), template.render_ids(&req, tok)) {
            (Ok(text), Ok(ids)) => {
                let want_ids = json_ids(case, "ids");
                if text != case["text"] {
                    failures.push(format!(
                        "{name}: text\n  got  {text:?}\n  want {}",
                        case["text"]
                    ));
                }
                if ids != want_ids {
                    failures.push(format!("{name}: ids\n  got  {ids:?}\n  want {want_ids:?}"));
                }
                // A limit of exactly the prompt's length keeps it, one less refuses it: the
                // turn count render_ids_within checks before rendering never exceeds the ids.
                let at = |limit| template.render_ids_within(&req, tok, limit).ok().flatten();
                if at(ids.len()).as_ref() != Some(&ids) || at(ids.len() - 1).is_some() {
                    failures.push(format!("{name}: render_ids_within at {} ids", ids.len()));
                }
            }
            (text, ids) => failures.push(format!("{name}: {:?} / {:?}", text.err(), ids.err())),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures over {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn render_cases_match_mistral_common_with_the_gguf_template() {
    let file = tekken_file();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    check_render_cases(&ChatTemplate::from_gguf(&file).expect("template"), &tok);
}

#[test]
fn render_cases_match_mistral_common_with_the_builtin_renderer() {
    let tok = Tokenizer::from_gguf(&tekken_file()).expect("tokenizer");
    check_render_cases(&ChatTemplate::builtin_v15(), &tok);
}

#[test]
fn render_errors_are_errors() {
    let file = tekken_file();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let cases = jsonl("render_errors.jsonl");
    assert_eq!(cases.len(), 6);
    for template in [
        ChatTemplate::from_gguf(&file).expect("template"),
        ChatTemplate::builtin_v15(),
    ] {
        for case in &cases {
            let req = request(&case["request"]);
            assert!(
                template.render(&req).is_err(),
                "{template:?} rendered {}",
                case["name"]
            );
            assert!(
                template.render_ids(&req, &tok).is_err(),
                "{template:?} rendered {}",
                case["name"]
            );
        }
    }
}

/// mistral-common (v13+ normaliser) sorts the tool results of a turn into the order of the calls;
/// a request with shuffled results must render exactly like the ordered one.
#[test]
fn tool_results_are_sorted_into_call_order() {
    let file = tekken_file();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let case = jsonl("render_cases.jsonl")
        .into_iter()
        .find(|c| c["name"] == "tools_parallel_calls")
        .expect("tools_parallel_calls case");
    let mut shuffled = case["request"].clone();
    let messages = shuffled["messages"].as_array_mut().expect("messages");
    messages[2..5].reverse();
    for template in [
        ChatTemplate::from_gguf(&file).expect("template"),
        ChatTemplate::builtin_v15(),
    ] {
        let ids = template
            .render_ids(&request(&shuffled), &tok)
            .expect("render");
        assert_eq!(ids, json_ids(&case, "ids"), "{template:?}");
    }
}

/// The bundled model carries the same template over a cut vocab; the Jinja path and the built-in
/// renderer must agree on it for every fixture request.
#[test]
fn bundled_model_template_agrees_with_builtin() {
    let file = GgufFile::open(model_path("ms4-tiny256-q2k.gguf")).expect("open the bundled model");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let jinja = ChatTemplate::from_gguf(&file).expect("template");
    assert!(!jinja.is_builtin());
    let builtin = ChatTemplate::builtin_v15();
    for case in jsonl("render_cases.jsonl") {
        let req = request(&case["request"]);
        assert_eq!(
            jinja.render(&req).ok(),
            builtin.render(&req).ok(),
            "{}",
            case["name"]
        );
        assert_eq!(
            jinja.render_ids(&req, &tok).ok(),
            builtin.render_ids(&req, &tok).ok(),
            "{}",
            case["name"]
        );
    }
}

#[test]
fn unknown_request_fields_are_ignored_and_bad_ones_rejected() {
    let file = tekken_file();
    let template = ChatTemplate::from_gguf(&file).expect("template");
    let ok: ChatRequest = serde_json::from_value(json!({
        "model": "m", "stream": true, "temperature": 0.2,
        "messages": [{"role": "user", "content": "hi"}],
    }))
    .expect("extra OpenAI fields are ignored");
    assert!(template.render(&ok).is_ok());
    let bad_role = serde_json::from_value::<ChatRequest>(
        json!({"messages": [{"role": "robot", "content": "x"}]}),
    );
    assert!(bad_role.is_err());
    let image: ChatRequest = serde_json::from_value(json!({
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    }))
    .expect("chunk types parse");
    assert!(
        template.render(&image).is_err(),
        "image chunks are refused by a text-only engine"
    );
    let assistant_first: ChatRequest = serde_json::from_value(json!({
        "messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
    }))
    .expect("parse");
    assert!(template.render(&assistant_first).is_err());
    assert!(ChatTemplate::builtin_v15()
        .render(&assistant_first)
        .is_err());
}

#[test]
fn reasoning_is_split_from_streamed_ids() {
    let tok = Tokenizer::from_gguf(&tekken_file()).expect("tokenizer");
    let think = tok.special_id("[THINK]").expect("[THINK]");
    let end_think = tok.special_id("[/THINK]").expect("[/THINK]");
    let (reasoning, answer) = (
        "Let me add 2 and 2: it is 4. ünïcödé 👋🏽",
        "The answer is 4.",
    );
    let mut ids = vec![think];
    ids.extend(tok.encode(reasoning).expect("encode"));
    ids.push(end_think);
    ids.extend(tok.encode(answer).expect("encode"));

    let mut decoder = tok.stream_decoder();
    let mut splitter = ReasoningSplitter::new();
    let (mut got_reasoning, mut got_content) = (String::new(), String::new());
    for &id in &ids {
        let delta = splitter.push(&decoder.push_keep_special(id));
        got_reasoning += &delta.reasoning;
        got_content += &delta.content;
    }
    let delta = splitter.push(&decoder.finish());
    got_reasoning += &delta.reasoning;
    got_content += &delta.content;
    let delta = splitter.finish();
    got_reasoning += &delta.reasoning;
    got_content += &delta.content;
    assert_eq!(got_reasoning, reasoning);
    assert_eq!(got_content, answer);

    let whole = tok.decode_keep_special(&ids);
    assert_eq!(
        split_reasoning(&whole),
        (Some(reasoning.to_owned()), answer.to_owned())
    );
}
