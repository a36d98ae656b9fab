//! `GET /openapi.json`: the hand-written OpenAPI 3.1 description of what the server accepts and
//! returns (`openapi.json` beside this file), with the served model id, the vocabulary size and
//! the KV capacity filled in at boot. CI runs schemathesis against it (`server/tests/schemathesis/`).

use serde_json::{json, Value};

/// The spec as written, before the boot-time values are filled in.
const TEMPLATE: &str = include_str!("openapi.json");

/// The spec for a server of `model_id` with a vocabulary of `n_vocab` ids and a KV cache of
/// `kv_max` tokens, as JSON text.
pub fn spec(model_id: &str, n_vocab: usize, kv_max: usize) -> String {
    let mut spec: Value = serde_json::from_str(TEMPLATE)
        .unwrap_or_else(|e| unreachable!("openapi.json is checked by the tests: {e}"));
    let fills = [
        ("/components/schemas/ModelId/enum", json!([model_id])),
        (
            "/components/schemas/TokenId/maximum",
            json!(n_vocab.saturating_sub(1)),
        ),
        (
            "/components/schemas/DebugTokensRequest/properties/ids/maxItems",
            json!(kv_max),
        ),
        (
            "/components/schemas/CompletionRequest/properties/prompt/anyOf/1/maxItems",
            json!(kv_max),
        ),
    ];
    for (pointer, value) in fills {
        match spec.pointer_mut(pointer) {
            Some(slot) => *slot = value,
            None => unreachable!("openapi.json has no {pointer}"),
        }
    }
    spec.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_values_are_filled_in() {
        let v: Value = serde_json::from_str(&spec("m-1", 100, 40)).expect("JSON");
        assert_eq!(v["openapi"], "3.1.0");
        let s = &v["components"]["schemas"];
        assert_eq!(s["ModelId"]["enum"], json!(["m-1"]));
        assert_eq!(s["TokenId"]["maximum"], 99);
        assert_eq!(s["DebugTokensRequest"]["properties"]["ids"]["maxItems"], 40);
        assert_eq!(
            s["CompletionRequest"]["properties"]["prompt"]["anyOf"][1]["maxItems"],
            40
        );
    }
}
