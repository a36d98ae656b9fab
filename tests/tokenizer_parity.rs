//! Tekken tokenizer parity against mistral-common (tests/data/tokenizer, see its README):
//! encode and decode of every fixture case on the full v15 vocab, the streaming decoder, and the
//! fixture models' cut vocab on the shared prompt.

use aubier_runtime::gguf::GgufFile;
use aubier_runtime::text::tokenizer::Tokenizer;
use aubier_tests::{data_dir, json_ids, model_path, read_json};
use serde_json::Value;

fn tekken() -> Tokenizer {
    let path = data_dir().join("tokenizer/tekken-v15-vocab.gguf");
    let file = GgufFile::open(&path).expect("open tekken-v15-vocab.gguf");
    Tokenizer::from_gguf(&file).expect("build the tekken tokenizer")
}

fn jsonl(name: &str) -> Vec<Value> {
    let path = data_dir().join("tokenizer").join(name);
    let text = std::fs::read_to_string(&path).expect("read fixture");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn vocab_layout_matches_the_v15_table() {
    let tok = tekken();
    assert_eq!(tok.n_vocab(), 131072);
    assert_eq!((tok.bos_id(), tok.eos_id()), (1, 2));
    // The special-token table of tests/data/tokenizer/README.md.
    let table = [
        ("<unk>", 0),
        ("<s>", 1),
        ("</s>", 2),
        ("[INST]", 3),
        ("[/INST]", 4),
        ("[AVAILABLE_TOOLS]", 5),
        ("[/AVAILABLE_TOOLS]", 6),
        ("[TOOL_RESULTS]", 7),
        ("[/TOOL_RESULTS]", 8),
        ("[TOOL_CALLS]", 9),
        ("<pad>", 11),
        ("[SYSTEM_PROMPT]", 17),
        ("[/SYSTEM_PROMPT]", 18),
        ("[ARGS]", 32),
        ("[CALL_ID]", 33),
        ("[THINK]", 34),
        ("[/THINK]", 35),
        ("[MODEL_SETTINGS]", 36),
        ("[/MODEL_SETTINGS]", 37),
    ];
    for (text, id) in table {
        assert_eq!(tok.special_id(text), Some(id), "{text}");
        assert_eq!(tok.token_bytes(id), Some(text.as_bytes()), "{text}");
    }
    assert!((0..1000).all(|id| tok.is_control(id)));
    assert!((1000..131072).all(|id| !tok.is_control(id)));
    assert!(!tok.is_control(131072));
    assert_eq!(tok.token_bytes(131072), None);
    // Byte tokens: id = 1000 + byte.
    assert!((0..=255u8).all(|b| tok.token_bytes(1000 + u32::from(b)) == Some(&[b][..])));
}

#[test]
fn encode_cases_match_mistral_common() {
    let tok = tekken();
    let cases = jsonl("encode_cases.jsonl");
    assert_eq!(cases.len(), 625);
    let mut failures = Vec::new();
    for case in &cases {
        let text = case["text"].as_str().expect("text");
        let want = json_ids(case, "ids");
        let got = tok.encode(text).expect("encode");
        if got != want {
            failures.push(format!(
                "[{}] {text:?}\n  got  {got:?}\n  want {want:?}",
                case["category"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} encode cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn special_lookalikes_encode_as_text() {
    let tok = tekken();
    for case in jsonl("encode_cases.jsonl") {
        let ids = tok
            .encode(case["text"].as_str().expect("text"))
            .expect("encode");
        assert!(ids.iter().all(|&id| !tok.is_control(id)), "{case}");
    }
}

#[test]
fn decode_cases_match_mistral_common() {
    let tok = tekken();
    let cases = jsonl("decode_cases.jsonl");
    assert_eq!(cases.len(), 124);
    let mut failures = Vec::new();
    for case in &cases {
        let ids = json_ids(case, "ids");
        let text = tok.decode(&ids);
        let keep = tok.decode_keep_special(&ids);
        let raw: Vec<u8> = ids
            .iter()
            .filter(|&&id| !tok.is_control(id))
            .flat_map(|&id| tok.token_bytes(id).expect("id in range").to_vec())
            .collect();
        if text != case["text"]
            || keep != case["text_keep_special"]
            || hex(&raw) != case["bytes_hex"]
        {
            failures.push(format!(
                "[{}] {ids:?}\n  got  {text:?} / {keep:?}\n  want {} / {}",
                case["category"], case["text"], case["text_keep_special"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} decode cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Feeds `ids` one by one and checks that every emitted prefix is a prefix of `want` (so no
/// partial character was ever emitted) and that the whole equals `want`.
fn check_stream(
    tok: &Tokenizer,
    ids: &[u32],
    want: &str,
    keep_special: bool,
) -> Result<(), String> {
    let mut decoder = tok.stream_decoder();
    let mut out = String::new();
    for &id in ids {
        let piece = if keep_special {
            decoder.push_keep_special(id)
        } else {
            decoder.push(id)
        };
        out.push_str(&piece);
        if !want.starts_with(&out) {
            return Err(format!(
                "after id {id}: emitted {out:?}, not a prefix of {want:?}"
            ));
        }
    }
    out.push_str(&decoder.finish());
    if out != want {
        return Err(format!("streamed {out:?}, decode gives {want:?}"));
    }
    Ok(())
}

#[test]
fn stream_decoder_equals_decode_and_never_splits_a_character() {
    let tok = tekken();
    let mut failures = Vec::new();
    for case in jsonl("decode_cases.jsonl") {
        let ids = json_ids(&case, "ids");
        for (field, keep) in [("text", false), ("text_keep_special", true)] {
            let want = case[field].as_str().expect("text");
            if let Err(e) = check_stream(&tok, &ids, want, keep) {
                failures.push(format!("[{}] {field}: {e}", case["category"]));
            }
        }
    }
    // Every encode case is valid UTF-8 text whose ids decode back to it (mistral-common round
    // trip, README check 1), so streaming its ids must rebuild it prefix by prefix.
    for case in jsonl("encode_cases.jsonl") {
        let text = case["text"].as_str().expect("text");
        if let Err(e) = check_stream(&tok, &json_ids(&case, "ids"), text, false) {
            failures.push(format!("[{}] {e}", case["category"]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn fixture_model_vocab_encodes_the_shared_prompt() {
    let file = GgufFile::open(model_path("ms4-tiny256-q2k.gguf")).expect("open the bundled model");
    let tok = Tokenizer::from_gguf(&file).expect("build the tokenizer");
    assert_eq!(tok.n_vocab(), 8192);
    let prompt = read_json(&data_dir().join("models/prompt-shared.json"));
    let all_ids = json_ids(&prompt, "all_ids");
    // `all_ids` is mistral-common's encode(text, bos=True, eos=False).
    assert_eq!(all_ids.first(), Some(&tok.bos_id()));
    let text = prompt["text"].as_str().expect("text");
    assert_eq!(tok.encode(text).expect("encode"), all_ids[1..]);
    assert_eq!(tok.decode(&all_ids), text);
}
