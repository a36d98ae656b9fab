//! Tool calls read from the output at the token level, over HTTP with the fake engine (scripted
//! ids, so every token boundary is chosen by the test): the non-stream `tool_calls`, the streamed
//! deltas and their reassembly, ids, indices, whole characters in argument fragments, the finish
//! reasons, and the request checks of `tools` / `tool_choice` / `response_format`.

mod serve_common;

use serde_json::{json, Value};
use serve_common::*;

/// `[TOOL_CALLS]name[ARGS]arguments`, one token per byte of the text.
fn call_ids(name: &str, arguments: &str) -> Vec<u32> {
    let text = text_model();
    let tok = text.tokenizer();
    let mut ids = vec![tok.special_id("[TOOL_CALLS]").expect("[TOOL_CALLS]")];
    ids.extend(byte_ids(name));
    ids.push(tok.special_id("[ARGS]").expect("[ARGS]"));
    ids.extend(byte_ids(arguments));
    ids
}

const TOOLS: &str = r#","tools":[
  {"type":"function","function":{"name":"get_weather","description":"Weather of a city",
   "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
  {"type":"function","function":{"name":"noop"}}]"#;

/// Content, then two calls in a row (the first one's arguments with a 2-byte and a 4-byte
/// character, each spread over one token per byte).
fn two_calls() -> Vec<u32> {
    let mut ids = byte_ids("Sure.");
    ids.extend(call_ids("get_weather", r#"{"city": "Orléans 🌧"}"#));
    ids.extend(call_ids("noop", "{}"));
    ids
}

async fn chat(srv: &TestServer, extra: &str) -> RawResponse {
    raw_request(
        srv.addr,
        "POST",
        "/v1/chat/completions",
        chat_body("weather?", extra).as_bytes(),
    )
    .await
}

#[tokio::test]
async fn calls_after_content_become_tool_calls_with_distinct_ids() {
    let srv = start_fake(script(two_calls()), 4096, limits()).await;
    let resp = chat(&srv, TOOLS).await;
    assert_eq!(
        resp.status,
        200,
        "{}",
        String::from_utf8_lossy(&resp.body())
    );
    let v = resp.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let message = &choice["message"];
    assert_eq!(message["content"], "Sure.");
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(
        calls[0]["function"]["arguments"],
        r#"{"city": "Orléans 🌧"}"#
    );
    assert_eq!(calls[1]["function"]["name"], "noop");
    assert_eq!(calls[1]["function"]["arguments"], "{}");
    let ids: Vec<&str> = calls
        .iter()
        .map(|c| c["id"].as_str().expect("id"))
        .collect();
    assert!(ids
        .iter()
        .all(|id| id.starts_with("call_") && id.len() == 29));
    assert_ne!(ids[0], ids[1]);
    srv.stop().await;
}

/// The tool calls of streamed chat payloads, joined by `index`, checking OpenAI's delta shape:
/// a call's first delta has `id`, `type` and `function.name`, later ones only arguments; indices
/// appear in order without gaps.
fn streamed_calls(payloads: &[String]) -> Vec<Value> {
    let mut calls: Vec<Value> = Vec::new();
    for p in payloads.iter().filter(|p| p.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(p).expect("chunk JSON");
        let Some(deltas) = v["choices"][0]["delta"]["tool_calls"].as_array() else {
            continue;
        };
        for d in deltas {
            let index = d["index"].as_u64().expect("index") as usize;
            let fragment = d["function"]["arguments"].as_str().expect("arguments");
            assert!(
                !fragment.contains('\u{FFFD}'),
                "split character in {fragment:?}"
            );
            if index == calls.len() {
                assert!(d["id"].is_string() && d["type"] == "function", "{d}");
                calls.push(json!({
                    "id": d["id"],
                    "type": "function",
                    "function": {"name": d["function"]["name"], "arguments": fragment},
                }));
            } else {
                assert_eq!(index + 1, calls.len(), "index out of order: {d}");
                assert!(
                    d.get("id").is_none() && d["function"].get("name").is_none(),
                    "{d}"
                );
                let args = &mut calls[index]["function"]["arguments"];
                *args = Value::String(format!("{}{fragment}", args.as_str().unwrap_or("")));
            }
        }
    }
    calls
}

#[tokio::test]
async fn streamed_deltas_join_to_the_non_stream_response() {
    let srv = start_fake(script(two_calls()), 4096, limits()).await;
    let whole = chat(&srv, TOOLS).await.json();
    let payloads = sse_events(
        srv.addr,
        "/v1/chat/completions",
        &chat_body("weather?", &format!(r#"{TOOLS},"stream":true"#)),
    )
    .await;
    let (content, reasoning, finish) = chat_stream_text(&payloads);
    assert_eq!((content.as_str(), reasoning.as_str()), ("Sure.", ""));
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    let streamed = streamed_calls(&payloads);
    let expected = whole["choices"][0]["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert_eq!(streamed.len(), expected.len());
    for (s, e) in streamed.iter().zip(expected) {
        // Ids are minted per response; everything else is the same.
        assert_eq!(s["function"], e["function"]);
        assert!(s["id"].as_str().is_some_and(|id| id.starts_with("call_")));
    }
    // More than one argument fragment: the arguments are streamed, not sent at the end.
    let fragments = payloads
        .iter()
        .filter(|p| p.contains(r#""arguments":"#) && !p.contains(r#""name":"#))
        .count();
    assert!(fragments > 2, "{fragments} argument fragments");
    srv.stop().await;
}

#[tokio::test]
async fn a_call_cut_off_by_max_tokens_ends_with_length_and_the_arguments_so_far() {
    let ids = two_calls();
    // "Sure." (5), [TOOL_CALLS], "get_weather" (11), [ARGS], then 5 bytes of the arguments.
    let cut = 5 + 1 + 11 + 1 + 5;
    let srv = start_fake(script(ids), 4096, limits()).await;
    let v = chat(&srv, &format!(r#"{TOOLS},"max_tokens":{cut}"#))
        .await
        .json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], r#"{"cit"#);
    // Cut off inside a name, a call is dropped (its name may be partial): the first call's
    // name ("get_wea"), then the second's ("no"), streamed and not.
    let first_args = r#"{"city": "Orléans 🌧"}"#.len();
    for (cut, n_calls) in [(5 + 1 + 7, 0), (5 + 1 + 11 + 1 + first_args + 1 + 2, 1)] {
        let extra = format!(r#"{TOOLS},"max_tokens":{cut}"#);
        let v = chat(&srv, &extra).await.json();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{v}");
        let names: Vec<&str> = choice["message"]["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .filter_map(|c| c["function"]["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(names, ["get_weather"][..n_calls], "{v}");
        if n_calls == 0 {
            assert_eq!(choice["message"]["content"], "Sure.", "{v}");
        }
        let streamed = chat(&srv, &format!(r#"{extra},"stream":true"#)).await;
        let body = String::from_utf8(streamed.body()).expect("UTF-8");
        assert!(!body.contains(r#""name":"get_wea""#) && !body.contains(r#""name":"no""#));
        assert_eq!(
            body.matches(r#""name":"get_weather""#).count(),
            n_calls,
            "{body}"
        );
    }
    srv.stop().await;
}

#[tokio::test]
async fn without_tools_the_call_tokens_are_not_read_as_calls() {
    let srv = start_fake(script(two_calls()), 4096, limits()).await;
    let v = chat(&srv, "").await.json();
    let message = &v["choices"][0]["message"];
    assert!(message.get("tool_calls").is_none(), "{message}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    srv.stop().await;
}

#[tokio::test]
async fn malformed_tool_parameters_are_400s_naming_the_field() {
    let srv = start_fake(script(vec![]), 4096, limits()).await;
    let cases: &[(&str, &str)] = &[
        (r#","tools":{}"#, "tools"),
        (r#","tools":[{"type":"function"}]"#, "tools[0].function"),
        (
            r#","tools":[{"type":"x","function":{"name":"f"}}]"#,
            "tools[0].type",
        ),
        (
            r#","tools":[{"type":"function","function":{"name":"f g"}}]"#,
            "tools[0].function.name",
        ),
        (
            r#","tools":[{"type":"function","function":{"name":"f","foo":1}}]"#,
            "tools[0].function.foo",
        ),
        (
            r#","tools":[{"type":"function","function":{"name":"f","parameters":[]}}]"#,
            "tools[0].function.parameters",
        ),
        (
            r#","tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]"#,
            "tools[1].function.name",
        ),
        (r#","tool_choice":"required""#, "tool_choice"),
        (r#","tool_choice":"always""#, "tool_choice"),
        (
            r#","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}"#,
            "tool_choice.function.name",
        ),
        (r#","parallel_tool_calls":1"#, "parallel_tool_calls"),
        (
            r#","response_format":{"type":"xml"}"#,
            "response_format.type",
        ),
        (
            r#","response_format":{"type":"json_schema","json_schema":{"name":"s"}}"#,
            "response_format.json_schema.schema",
        ),
        (
            r#","response_format":{"type":"json_schema","json_schema":{"schema":{}}}"#,
            "response_format.json_schema.name",
        ),
        (
            r#","response_format":{"type":"json_object","extra":1}"#,
            "response_format.extra",
        ),
        (r#","functions":[{"name":"f"}]"#, "functions"),
        // Schemas no finite value satisfies, and strict arguments that could not be an object:
        // a 400 before anything is generated, streamed or not.
        (
            r##","stream":true,"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"$ref":"#"}}}"##,
            "response_format",
        ),
        (
            r##","response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]}}}"##,
            "response_format",
        ),
        (
            r##","stream":true,"tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}}}]"##,
            "tools[0].function.parameters",
        ),
        (
            r#","tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":{"type":"integer"}}}]"#,
            "tools[0].function.parameters",
        ),
    ];
    for (extra, param) in cases {
        let resp = chat(&srv, extra).await;
        assert_eq!(
            resp.status,
            400,
            "{extra}: {}",
            String::from_utf8_lossy(&resp.body())
        );
        let v = resp.json();
        assert_eq!(v["error"]["param"], *param, "{extra}: {v}");
    }
    srv.stop().await;
}
