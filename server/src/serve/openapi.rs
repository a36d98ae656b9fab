//! `GET /openapi.json`: the OpenAPI 3.1 description of what the server accepts and returns,
//! generated from the wire types (`super::api`) the routes parse and write with.
//!
//! Algorithm: two schemars generators (JSON Schema 2020-12, definitions under
//! `#/components/schemas/`) walk the request types under serde's deserialize contract and the
//! response types under its serialize contract; their definitions are merged into
//! `components.schemas`, and the route table below refers to them. At boot, the served model id,
//! the vocabulary size and the KV capacity are written into `ModelId`, `TokenId`, `TokenIds` and
//! the key pattern of `LogitBias`.
//! CI runs schemathesis against the result (`server/tests/schemathesis/`).

use super::api::request::{
    ChatCompletionRequest, CompletionRequest, DebugTokensRequest, DetokenizeRequest,
    TokenizeChatRequest, TokenizeCompletionRequest,
};
use super::api::response::{
    ChatCompletion, ChatCompletionChunk, Completion, CompletionChunk, DebugTokens,
    DetokenizeResponse, ErrorBody, Health, Model, ModelList, TokenizeResponse,
};
use super::api::responses::{
    InputItemList, InputTokenCount, ResponseDeleted, ResponseEvent, ResponseObject, ResponseRequest,
};
use super::api::scalar::decimal_below;
use schemars::generate::{Contract, SchemaSettings};
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Map, Value};

fn generator(contract: Contract) -> SchemaGenerator {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas/".into();
    settings.meta_schema = None;
    settings.contract = contract;
    settings.into_generator()
}

/// `$ref`s to generated definitions.
struct Refs {
    requests: SchemaGenerator,
    responses: SchemaGenerator,
}

impl Refs {
    fn request<T: JsonSchema>(&mut self) -> Value {
        self.requests.subschema_for::<T>().to_value()
    }

    fn response<T: JsonSchema>(&mut self) -> Value {
        self.responses.subschema_for::<T>().to_value()
    }

    /// The definitions of both generators. A name both define (a type used on both sides)
    /// keeps the request's definition; the tests check that no name is defined twice.
    fn definitions(mut self) -> (Map<String, Value>, Vec<String>) {
        let mut all = self.requests.take_definitions(true);
        let mut twice = Vec::new();
        for (name, schema) in self.responses.take_definitions(true) {
            if all.contains_key(&name) {
                twice.push(name);
            } else {
                all.insert(name, schema);
            }
        }
        (all, twice)
    }
}

/// A response of `description` whose body is `schema` as JSON.
fn json_response(description: &str, schema: &Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

/// The 503 answer: `body`, with `Retry-After`.
fn busy(description: &str, body: &Value) -> Value {
    let mut r = json_response(description, body);
    r["headers"] = json!({"Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer", "minimum": 1},
    }});
    r
}

/// The SSE body whose events carry `chunk` (or an error): `data: <JSON>` …, `data: [DONE]`.
fn event_stream(chunk: &Value, error: &Value) -> Value {
    json!({
        "type": "object",
        "description": "Each event is 'data: <chunk JSON>' (an error object if the engine fails \
            mid-stream); the last is 'data: [DONE]'.",
        "required": ["data"],
        "properties": {
            "event": {"const": "message"},
            "data": {"anyOf": [
                {"const": "[DONE]"},
                {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"anyOf": [chunk, error]},
                },
            ]},
        },
    })
}

/// The SSE body of a response stream: typed events, `event: <type>` and `data: <event JSON>`.
fn typed_event_stream(event: &Value) -> Value {
    json!({
        "type": "object",
        "description": "Each event is 'event: <type>' and 'data: <event JSON>' with that type and \
            its sequence_number; the last is response.completed, response.incomplete or \
            response.failed.",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string", "pattern": "^response\\."},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": event,
            },
        },
    })
}

/// The document, before the boot-time values; the second value lists names defined twice.
fn document() -> (Value, Vec<String>) {
    let mut refs = Refs {
        requests: generator(Contract::Deserialize),
        responses: generator(Contract::Serialize),
    };
    let error = refs.response::<ErrorBody>();
    let err = |description: &str| json_response(description, &error);
    let forbidden = err("Host or Origin not served (--allow-host, --cors-origin).");
    let overloaded = busy(
        "Too many connections or requests in progress, or the engine stayed busy for \
         --queue-wait-ms.",
        &error,
    );
    let not_found = err("Another model id than the served one.");
    // The answers of a route that reads a JSON body: `ok`, or a 400 for what `invalid` says.
    let with_body = |ok: Value, invalid: &str| {
        json!({
            "200": ok,
            "400": err(invalid),
            "403": forbidden,
            "404": not_found,
            "408": err("The body did not arrive within --read-timeout-ms."),
            "413": err("The body is larger than --body-limit."),
            "415": err("The body is not declared as 'Content-Type: application/json', or has a Content-Encoding other than identity."),
            "503": overloaded,
        })
    };
    let generation = |ok: Value| {
        let mut r = with_body(
            ok,
            "Invalid request: a parameter of the wrong type or out of range, an unsupported or \
             unknown parameter (named in 'param'), a conversation the template refuses, or a \
             prompt longer than the context.",
        );
        r["500"] = err("The engine failed while generating.");
        r
    };
    let body = |schema: Value| json!({"required": true, "content": {"application/json": {"schema": schema}}});
    let streamed = |description: &str, whole: Value, chunk: Value| {
        json!({"description": description, "content": {
            "application/json": {"schema": whole},
            "text/event-stream": {"schema": event_stream(&chunk, &error)},
        }})
    };
    let chat = json!({"post": {
        "operationId": "createChatCompletion",
        "summary": "Chat completion (SSE with 'stream': true).",
        "requestBody": body(refs.request::<ChatCompletionRequest>()),
        "responses": generation(streamed(
            "The answer, or its stream.",
            refs.response::<ChatCompletion>(),
            refs.response::<ChatCompletionChunk>(),
        )),
    }});
    let completions = json!({"post": {
        "operationId": "createCompletion",
        "summary": "Text completion of one prompt (a string or token ids).",
        "requestBody": body(refs.request::<CompletionRequest>()),
        "responses": generation(streamed(
            "The completion, or its stream.",
            refs.response::<Completion>(),
            refs.response::<CompletionChunk>(),
        )),
    }});
    // A stored response's id, for the routes of stored responses (OpenAPI links).
    let by_id = |operation: &str| json!({"operationId": operation, "parameters": {"response_id": "$response.body#/id"}});
    let responses = json!({"post": {
        "operationId": "createResponse",
        "summary": "A response of the Responses API (typed SSE with 'stream': true).",
        "requestBody": body(refs.request::<ResponseRequest>()),
        "responses": generation(json!({"description": "The response, or its stream.", "content": {
            "application/json": {"schema": refs.response::<ResponseObject>()},
            "text/event-stream": {"schema": typed_event_stream(&refs.response::<ResponseEvent>())},
        }, "links": {
            "RetrieveResponse": by_id("retrieveResponse"),
            "ListInputItems": by_id("listInputItems"),
            "DeleteResponse": by_id("deleteResponse"),
        }})),
    }});
    let debug_tokens = json!({"post": {
        "operationId": "debugTokens",
        "summary": "Token ids in, generated ids out (no tokenizer).",
        "requestBody": body(refs.request::<DebugTokensRequest>()),
        "responses": generation(json_response(
            "The generated ids.",
            &refs.response::<DebugTokens>(),
        )),
    }});
    let tokenize = json!({"post": {
        "operationId": "tokenize",
        "summary": "The token ids of a text as /v1/completions reads it, or of messages as \
            /v1/chat/completions renders them (vLLM's /tokenize); a prompt longer than the \
            context is counted too.",
        "requestBody": body(json!({"anyOf": [
            refs.request::<TokenizeCompletionRequest>(),
            refs.request::<TokenizeChatRequest>(),
        ]})),
        "responses": with_body(
            json_response("The ids.", &refs.response::<TokenizeResponse>()),
            "Invalid request: a parameter of the wrong type, an unsupported or unknown \
             parameter (named in 'param'), or a conversation the template refuses.",
        ),
    }});
    let detokenize = json!({"post": {
        "operationId": "detokenize",
        "summary": "The text of token ids, control tokens included (vLLM's /detokenize).",
        "requestBody": body(refs.request::<DetokenizeRequest>()),
        "responses": with_body(
            json_response("The text.", &refs.response::<DetokenizeResponse>()),
            "Invalid request: an id that is not below the vocabulary size, a parameter of the \
             wrong type, or an unknown parameter (named in 'param').",
        ),
    }});
    let model = refs.response::<Model>();
    let models = json!({"get": {
        "operationId": "listModels",
        "summary": "The served model.",
        "responses": {
            "200": json_response("A list of one model.", &refs.response::<ModelList>()),
            "403": forbidden,
            "503": overloaded,
        },
    }});
    let retrieve = json!({"get": {
        "operationId": "retrieveModel",
        "summary": "The served model, by id.",
        "parameters": [{"name": "model", "in": "path", "required": true,
            "schema": {"type": "string"}}],
        "responses": {
            "200": json_response("The model.", &model),
            "400": err("The id in the path is not UTF-8 once percent-decoded."),
            "403": forbidden,
            "404": not_found,
            "503": overloaded,
        },
    }});
    let input_tokens = json!({"post": {
        "operationId": "countInputTokens",
        "summary": "The tokens of the prompt a response of this body would have.",
        "requestBody": body(refs.request::<ResponseRequest>()),
        "responses": generation(json_response(
            "The count.",
            &refs.response::<InputTokenCount>(),
        )),
    }});
    let response_id = json!({"name": "response_id", "in": "path", "required": true,
        "schema": {"type": "string"}});
    let gone = err(
        "No response stored under this id (never created, created with 'store': \
        false, past the store's bounds, or deleted).",
    );
    let refused = err(
        "A query parameter unknown, repeated, out of range, or asking for what \
        aubier does not do (streamed retrieval, 'include'), named in 'param'; or an id in \
        the path that is not UTF-8 once percent-decoded.",
    );
    let stored = json!({
        "get": {
            "operationId": "retrieveResponse",
            "summary": "A stored response, as it was answered (status in_progress while a \
                stream is generating it).",
            "parameters": [response_id,
                {"name": "stream", "in": "query", "schema": {"const": false}},
                {"name": "include_obfuscation", "in": "query", "schema": {"type": "boolean"}}],
            "responses": {
                "200": json_response("The response.", &refs.response::<ResponseObject>()),
                "400": refused,
                "403": forbidden,
                "404": gone,
            },
        },
        "delete": {
            "operationId": "deleteResponse",
            "summary": "Drops a stored response.",
            "parameters": [response_id],
            "responses": {
                "200": json_response("It was dropped.", &refs.response::<ResponseDeleted>()),
                "400": refused,
                "403": forbidden,
                "404": gone,
            },
        },
    });
    let input_items = json!({"get": {
        "operationId": "listInputItems",
        "summary": "The items before a stored response's output, one page at a time.",
        "parameters": [response_id,
            {"name": "after", "in": "query", "schema": {"type": "string"},
                "description": "The id of the item before the page."},
            {"name": "limit", "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}},
            {"name": "order", "in": "query",
                "schema": {"enum": ["asc", "desc"], "default": "desc"}}],
        "responses": {
            "200": json_response("One page.", &refs.response::<InputItemList>()),
            "400": refused,
            "403": forbidden,
            "404": gone,
        },
    }});
    let health_body = refs.response::<Health>();
    let health = json!({"get": {
        "operationId": "health",
        "summary": "Whether a request sent now would be admitted.",
        "responses": {
            "200": json_response("Admitting requests.", &health_body),
            "403": forbidden,
            "503": busy("Not admitting requests now (the reason says why).", &health_body),
        },
    }});
    let metrics = json!({"get": {
        "operationId": "metrics",
        "summary": "Prometheus text format.",
        "responses": {
            "200": {"description": "Every metric.",
                "content": {"text/plain": {"schema": {"type": "string"}}}},
            "403": forbidden,
        },
    }});
    let openapi = json!({"get": {
        "operationId": "openapi",
        "summary": "This description.",
        "responses": {
            "200": json_response("The OpenAPI document.", &json!({"type": "object"})),
            "403": forbidden,
        },
    }});
    let (schemas, twice) = refs.definitions();
    let doc = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "aubier",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "OpenAI-compatible server of aubier (ARCHITECTURE.md § server). Every \
                error body is OpenAI's {\"error\": {message, type, param, code}}.",
        },
        "paths": {
            "/v1/chat/completions": chat,
            "/v1/completions": completions,
            "/v1/responses": responses,
            "/v1/responses/input_tokens": input_tokens,
            "/v1/responses/{response_id}": stored,
            "/v1/responses/{response_id}/input_items": input_items,
            "/tokenize": tokenize,
            "/detokenize": detokenize,
            "/debug/tokens": debug_tokens,
            "/v1/models": models,
            "/v1/models/{model}": retrieve,
            "/health": health,
            "/metrics": metrics,
            "/openapi.json": openapi,
        },
        "components": {"schemas": schemas},
    });
    (doc, twice)
}

/// The document for a server of `model_id` with a vocabulary of `n_vocab` ids and a KV cache of
/// `kv_max` tokens, as JSON text: a prompt of token ids leaves room for one generated token (the
/// context holds prompt and completion together), so it has at most `kv_max − 1` ids.
pub fn spec(model_id: &str, n_vocab: usize, kv_max: usize) -> String {
    let (mut doc, _) = document();
    let schemas = &mut doc["components"]["schemas"];
    schemas["ModelId"]["enum"] = json!([model_id]);
    schemas["TokenId"]["maximum"] = json!(n_vocab.saturating_sub(1));
    schemas["LogitBias"]["propertyNames"]["pattern"] = json!(decimal_below(n_vocab as u64));
    schemas["TokenIds"]["maxItems"] = json!(kv_max.saturating_sub(1));
    doc.to_string()
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
        assert_eq!(s["TokenIds"]["maxItems"], 39);
    }

    /// Every `$ref` in `v`.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|x| refs(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }

    #[test]
    fn every_reference_resolves_and_no_name_is_defined_twice() {
        let (doc, twice) = document();
        assert!(
            twice.is_empty(),
            "defined by a request and a response type: {twice:?}"
        );
        let mut all = Vec::new();
        refs(&doc, &mut all);
        assert!(all.len() > 20, "{all:?}");
        for r in all {
            assert!(doc.pointer(r.trim_start_matches('#')).is_some(), "{r}");
        }
    }

    /// Asserts that `validator` accepts `body` exactly when the parser does (`parsed`).
    fn assert_agree(validator: &jsonschema::Validator, body: &str, parsed: bool) {
        let v: Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(validator.is_valid(&v), parsed, "{body}");
    }

    /// A validator of request bodies against the document's schema `name`.
    fn request_validator(doc: &Value, name: &str) -> jsonschema::Validator {
        let schema = json!({
            "$ref": format!("#/components/schemas/{name}"),
            "components": doc["components"],
        });
        jsonschema::validator_for(&schema).expect("a valid JSON Schema")
    }

    #[test]
    fn only_the_parameters_the_parser_needs_are_required() {
        let (doc, _) = document();
        let s = &doc["components"]["schemas"];
        assert_eq!(
            s["ChatCompletionRequest"]["required"],
            json!(["model", "messages"])
        );
        assert_eq!(
            s["CompletionRequest"]["required"],
            json!(["model", "prompt"])
        );
        assert_eq!(
            s["DebugTokensRequest"]["required"],
            json!(["ids", "max_tokens"])
        );
        assert_eq!(s["ResponseRequest"]["required"], json!(["model", "input"]));
    }

    #[test]
    fn the_request_schemas_accept_what_the_parser_accepts() {
        use super::super::params::{parse_chat, parse_completion, parse_debug_tokens};
        let doc: Value = serde_json::from_str(&spec("m", 1000, 64)).expect("JSON");
        let chat = request_validator(&doc, "ChatCompletionRequest");
        let msg = r#""model":"m","messages":[{"role":"user","content":"hi"}]"#;
        let chat_cases = [
            "",
            r#","temperature":2.5"#,
            r#","temperature":"hot""#,
            r#","top_p":0"#,
            r#","top_p":1e-46"#,
            r#","top_k":-1"#,
            r#","top_k":4.0"#,
            r#","seed":0.5"#,
            r#","max_tokens":0"#,
            r#","n":9"#,
            r#","n":8"#,
            r#","stop":["a","b","c","d","e"]"#,
            r#","stop":[""]"#,
            r#","stop":"x""#,
            r#","stream_options":{"include_usage":true}"#,
            r#","stream":true,"stream_options":{"include_usage":true}"#,
            r#","stream":true,"stream_options":{"x":1}"#,
            r#","logprobs":true,"top_logprobs":20"#,
            r#","top_logprobs":3"#,
            r#","logprobs":1"#,
            r#","frobnicate":1"#,
            r#","store":true"#,
            r#","store":false"#,
            r#","modalities":["text"]"#,
            r#","modalities":["text","audio"]"#,
            r#","service_tier":"flex""#,
            r#","repetition_penalty":0"#,
            r#","repetition_penalty":3.402823466385289e38"#,
            r#","tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"tool_choice":"required""#,
            r#","tools":[{"type":"function","function":{"name":"f g"}}]"#,
            r#","tools":[{"type":"function","function":{"name":"f","foo":1}}]"#,
            r#","tool_choice":"sometimes""#,
            r#","response_format":{"type":"json_object"}"#,
            r#","response_format":{"type":"text","x":1}"#,
            r#","response_format":{"type":"json_schema"}"#,
            r#","response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{}}}"#,
            r#","response_format":{"type":"text","json_schema":{"name":"s","schema":{}}}"#,
            r#","response_format":{"type":"text","json_schema":null}"#,
            r#","response_format":{"type":"json_schema","json_schema":{"name":"s","schema":3}}"#,
            r#","reasoning_effort":"medium""#,
            r#","logit_bias":{"0":-100,"999":100,"5":0.5}"#,
            r#","logit_bias":null"#,
            r#","logit_bias":{"01":1}"#,
            r#","logit_bias":{"-1":1}"#,
            r#","logit_bias":{"5":100.5}"#,
            r#","logit_bias":{"5":"1"}"#,
            r#","logit_bias":[1]"#,
            r#","ignore_eos":true,"min_tokens":2,"stop_token_ids":[3,999]"#,
            r#","ignore_eos":null,"min_tokens":null,"stop_token_ids":null"#,
            r#","min_tokens":-1"#,
            r#","min_tokens":1.5"#,
            r#","stop_token_ids":[1.5]"#,
            r#","stop_token_ids":[]"#,
            r#","ignore_eos":"yes""#,
        ];
        for extra in chat_cases {
            let body = format!("{{{msg}{extra}}}");
            assert_agree(&chat, &body, parse_chat(body.as_bytes()).is_ok());
        }
        for messages in [
            r#"[{"role":"user","content":"x","extra":1}]"#,
            r#"[{"role":"user","content":[{"type":"thinking","thinking":"t","x":0}]}]"#,
            r#"[{"role":"user","content":[{"type":"image_url","image_url":"u"}]}]"#,
            r#"[{"role":"assistant","audio":{"id":"a"}}]"#,
            r#"[{"role":"assistant","content":"a","reasoning":"r","reasoning_content":"r"}]"#,
            r#"[{"role":"user","content":"x","name":"n","refusal":null,"annotations":[]}]"#,
            r#"[{"role":"robot","content":"x"}]"#,
        ] {
            let body = format!(r#"{{"model":"m","messages":{messages}}}"#);
            assert_agree(&chat, &body, parse_chat(body.as_bytes()).is_ok());
        }
        let completion = request_validator(&doc, "CompletionRequest");
        for extra in [
            r#""prompt":"x""#,
            r#""prompt":[1,2.0,3]"#,
            r#""prompt":[1,-2]"#,
            r#""prompt":["a","b"]"#,
            r#""prompt":7"#,
            r#""prompt":"x","best_of":1"#,
            r#""prompt":"x","best_of":2"#,
            r#""prompt":"x","logprobs":6"#,
            r#""prompt":"x","echo":true"#,
            r#""prompt":"x","logit_bias":{"12":-3}"#,
            r#""prompt":"x","logit_bias":{"x":-3}"#,
            r#""prompt":"x","min_tokens":3,"stop_token_ids":[4.0],"ignore_eos":false"#,
            r#""prompt":"x","stop_token_ids":[-4]"#,
        ] {
            let body = format!(r#"{{"model":"m",{extra}}}"#);
            assert_agree(
                &completion,
                &body,
                parse_completion(body.as_bytes()).is_ok(),
            );
        }
        let responses = request_validator(&doc, "ResponseRequest");
        for extra in [
            r#""input":"x""#,
            r#""input":[{"role":"user","content":"x"}]"#,
            r#""input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"x"}]}]"#,
            r#""input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]"#,
            r#""input":[{"role":"tool","content":"x"}]"#,
            r#""input":[{"type":"web_search_call","id":"w"}]"#,
            r#""input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]"#,
            r#""input":[{"type":"function_call_output","call_id":"c","output":"o","x":1}]"#,
            r#""input":[{"type":"reasoning","summary":[]}]"#,
            r#""input":[{"type":"item_reference","id":"msg_1"}]"#,
            r#""input":[{"type":null,"id":"msg_1"}]"#,
            r#""input":[{"id":"msg_1"}]"#,
            r#""input":[{"type":"item_reference"}]"#,
            r#""input":[{"id":"msg_1","x":1}]"#,
            r#""input":[{"type":"item_reference","id":"msg_1","role":"user"}]"#,
            r#""input":[{"content":"x","id":"msg_1"}]"#,
            r#""input":[{"role":"user","content":"x","id":"msg_1"}]"#,
            r#""input":[{"type":"reasoning","summary":[],"encrypted_content":"e"}]"#,
            r#""input":[{"type":"reasoning","summary":[],"encrypted_content":"aubier.reasoning.v1.cGxhbg=="},{"role":"user","content":"x"}]"#,
            r#""input":"x","include":["reasoning.encrypted_content"],"reasoning":{"summary":"auto"}"#,
            r#""input":"x","reasoning":{"summary":"concise"}"#,
            r#""input":"x","text":{"format":{"type":"json_schema","name":"s","schema":{}}}"#,
            r#""input":"x","text":{"format":{"type":"json_schema","name":"s"}}"#,
            r#""input":"x","text":{"format":{"type":"text","name":"s"}}"#,
            r#""input":"x","text":{"verbosity":"low"}"#,
            r#""input":"x","reasoning":{"effort":"high"}"#,
            r#""input":"x","reasoning":{"effort":"medium"}"#,
            r#""input":"x","reasoning":[null,null]"#,
            r#""input":"x","tool_choice":["function","f"]"#,
            r#""input":"x","include":[]"#,
            r#""input":"x","include":["a"]"#,
            r#""input":"x","truncation":"disabled""#,
            r#""input":"x","truncation":"auto""#,
            r#""input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"}"#,
            r#""input":"x","stream":true,"stream_options":{"include_obfuscation":true}"#,
            r#""input":"x","max_output_tokens":0"#,
            r#""input":"x","previous_response_id":"resp_1","store":false"#,
        ] {
            let body = format!(r#"{{"model":"m",{extra}}}"#);
            assert_agree(
                &responses,
                &body,
                super::super::responses::parse(body.as_bytes()).is_ok(),
            );
        }
        let debug = request_validator(&doc, "DebugTokensRequest");
        for body in [
            r#"{"ids":[1,2],"max_tokens":4}"#,
            r#"{"ids":[1,-2],"max_tokens":4}"#,
            r#"{"ids":[1]}"#,
            r#"{"ids":[5.0],"max_tokens":1.0}"#,
            r#"{"ids":[1],"max_tokens":1,"ignore_eos":true,"x":1}"#,
        ] {
            assert_agree(&debug, body, parse_debug_tokens(body.as_bytes()).is_ok());
        }
    }

    /// A validator of the request bodies of `POST path`, against the document's schema of them.
    fn body_validator(doc: &Value, path: &str) -> jsonschema::Validator {
        let mut schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
            ["schema"]
            .clone();
        schema["components"] = doc["components"].clone();
        jsonschema::validator_for(&schema).expect("a valid JSON Schema")
    }

    #[test]
    fn the_tokenizer_schemas_accept_what_their_parsers_accept() {
        use super::super::params::{parse_detokenize, parse_tokenize};
        let doc: Value = serde_json::from_str(&spec("m", 1000, 64)).expect("JSON");
        let tokenize = body_validator(&doc, "/tokenize");
        let msg = r#""messages":[{"role":"user","content":"hi"}]"#;
        for body in [
            r#"{"prompt":"x"}"#.to_owned(),
            r#"{"model":"m","prompt":"","add_special_tokens":false,"return_token_strs":true}"#
                .to_owned(),
            r#"{"prompt":"x","messages":[]}"#.to_owned(),
            r#"{"prompt":7}"#.to_owned(),
            r#"{"prompt":"x","temperature":1}"#.to_owned(),
            r#"{}"#.to_owned(),
            format!("{{{msg}}}"),
            format!(r#"{{{msg},"model":"m","return_token_strs":true}}"#),
            format!(r#"{{{msg},"tools":[{{"type":"function","function":{{"name":"f"}}}}]}}"#),
            format!(r#"{{{msg},"tools":[{{"type":"function","function":{{"name":"f g"}}}}]}}"#),
            format!(r#"{{{msg},"reasoning_effort":"high"}}"#),
            format!(r#"{{{msg},"reasoning_effort":"low"}}"#),
            format!(r#"{{{msg},"continue_final_message":true,"add_generation_prompt":false}}"#),
            format!(r#"{{{msg},"continue_final_message":true,"add_generation_prompt":true}}"#),
            format!(r#"{{{msg},"continue_final_message":false,"add_generation_prompt":true}}"#),
            format!(r#"{{{msg},"add_special_tokens":false,"chat_template_kwargs":{{}}}}"#),
            format!(r#"{{{msg},"add_special_tokens":true}}"#),
            format!(r#"{{{msg},"chat_template":"t"}}"#),
            format!(r#"{{{msg},"chat_template_kwargs":{{"a":1}}}}"#),
            format!(r#"{{{msg},"mm_processor_kwargs":{{"a":1}}}}"#),
            format!(r#"{{{msg},"media_io_kwargs":{{"a":{{}}}}}}"#),
            format!(r#"{{{msg},"temperature":1}}"#),
            r#"{"messages":[{"role":"user","content":"x","extra":1}]}"#.to_owned(),
            r#"{"messages":[{"role":"robot","content":"x"}]}"#.to_owned(),
        ] {
            assert_agree(&tokenize, &body, parse_tokenize(body.as_bytes()).is_ok());
        }
        let detokenize = body_validator(&doc, "/detokenize");
        for body in [
            r#"{"tokens":[1,2]}"#,
            r#"{"tokens":[]}"#,
            r#"{"model":"m","tokens":[5.0]}"#,
            r#"{"tokens":[1,-2]}"#,
            r#"{"tokens":[1,"a"]}"#,
            r#"{"tokens":"1"}"#,
            r#"{}"#,
            r#"{"tokens":[1],"x":1}"#,
        ] {
            assert_agree(&detokenize, body, parse_detokenize(body.as_bytes()).is_ok());
        }
        // The vocabulary bound is the schema's and the route's (the parser takes any u32).
        assert!(!detokenize.is_valid(&serde_json::json!({"tokens": [1000]})));
        assert!(detokenize.is_valid(&serde_json::json!({"tokens": [999]})));
    }

    #[test]
    fn the_logit_bias_schema_bounds_ids_by_the_vocabulary_and_entries_by_300() {
        use super::super::api::scalar::MAX_LOGIT_BIAS;
        let doc: Value = serde_json::from_str(&spec("m", 1000, 64)).expect("JSON");
        let chat = request_validator(&doc, "ChatCompletionRequest");
        let body = |bias: Value| json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logit_bias": bias});
        // Past the vocabulary: the route's 400 (the parser takes any u32).
        assert!(chat.is_valid(&body(json!({"999": 1}))));
        assert!(!chat.is_valid(&body(json!({"1000": 1}))));
        let entries = |n: usize| Value::Object((0..n).map(|i| (i.to_string(), json!(1))).collect());
        assert!(chat.is_valid(&body(entries(MAX_LOGIT_BIAS))));
        assert!(!chat.is_valid(&body(entries(MAX_LOGIT_BIAS + 1))));
    }

    #[test]
    fn what_json_schema_cannot_compare_is_the_parsers_alone() {
        use super::super::params::parse_chat;
        let doc: Value = serde_json::from_str(&spec("m", 1000, 64)).expect("JSON");
        let chat = request_validator(&doc, "ChatCompletionRequest");
        let msg = r#""model":"m","messages":[{"role":"user","content":"hi"}]"#;
        // Valid for the schema, refused by the parser: rules between values.
        for extra in [
            r#","max_tokens":5,"max_completion_tokens":6"#,
            r#","tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]"#,
            r#","tool_choice":"required""#,
            r#","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}"#,
            r#","max_tokens":2,"min_tokens":3"#,
        ] {
            let body = format!("{{{msg}{extra}}}");
            let v: Value = serde_json::from_str(&body).expect("JSON");
            assert!(chat.is_valid(&v), "{body}");
            assert!(parse_chat(body.as_bytes()).is_err(), "{body}");
        }
    }
}
