//! `POST /v1/responses`: the response object and its typed event stream (fake engine: scripted
//! text, reasoning, the store), refused and invalid parameters named, and on the real engine with
//! the bundled model a function call answered by its output, `text.format` json_schema, and a
//! continuation by `previous_response_id` that reuses the prompt cache (`cached_tokens` > 0).
//! The last test runs openai-python and the OpenAI Agents SDK against the demo
//! (`server/tests/python/responses_test.py`); like the README's Python examples it is ignored by
//! default and `.ci/run` runs it with `$AUBIER_TEST_PYTHON`.

mod serve_common;

use serde_json::{json, Value};
use serve_common::process::{scratch_dir, Proc};
use serve_common::*;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A body for the served model with `input` "Hello!" and the fields of `extra`.
fn body(extra: Value) -> Value {
    let mut b = json!({"model": MODEL_ID, "input": "Hello!"});
    if let (Some(b), Value::Object(extra)) = (b.as_object_mut(), extra) {
        b.extend(extra);
    }
    b
}

async fn post(addr: SocketAddr, body: &Value) -> RawResponse {
    raw_request(addr, "POST", "/v1/responses", body.to_string().as_bytes()).await
}

/// POSTs `body` and returns the response object, asserting 200.
async fn create(addr: SocketAddr, body: &Value) -> Value {
    let resp = post(addr, body).await;
    resp.assert_status(200, &body.to_string());
    resp.json()
}

/// POSTs `body` and returns its error object, asserting 400.
async fn refused(addr: SocketAddr, body: &Value) -> Value {
    let resp = post(addr, body).await;
    resp.assert_status(400, &body.to_string());
    resp.json()["error"].clone()
}

/// The events of a streamed response: each transfer chunk is one SSE event whose `event:` field
/// is its data's `type`, numbered 0, 1, 2, … by `sequence_number`.
async fn events(addr: SocketAddr, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let resp = post(addr, &body).await;
    resp.assert_status(200, &body.to_string());
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    resp.chunks
        .iter()
        .enumerate()
        .map(|(i, frame)| {
            let v = sse_event(frame);
            assert_eq!(v["sequence_number"], i, "{v}");
            v
        })
        .collect()
}

/// The data of one transfer chunk of a Responses stream: one SSE event whose `event:` field is
/// its data's `type`.
fn sse_event(frame: &[u8]) -> Value {
    let text = std::str::from_utf8(frame).expect("UTF-8");
    let fields = text.strip_suffix("\n\n").expect("a blank line ends it");
    let (mut event, mut data) = (None, None);
    for line in fields.lines() {
        match line.split_once(": ") {
            Some(("event", v)) => event = Some(v),
            Some(("data", v)) => data = Some(v),
            _ => panic!("an unexpected line {line:?} in {text:?}"),
        }
    }
    let v: Value = serde_json::from_str(data.expect("data")).expect("JSON data");
    assert_eq!(Some(v["type"].as_str().expect("type")), event, "{text}");
    v
}

/// Starts a streamed `POST /v1/responses` of `body` on its own connection: the reader after
/// the first event, and that event (`response.created`).
async fn open_response_stream(addr: SocketAddr, body: &Value) -> (HttpReader, Value) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let body = body.to_string();
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("send");
    let mut reader = HttpReader::new(conn);
    assert_eq!(reader.read_head().await.0, 200, "{body}");
    let created = sse_event(&reader.read_chunk().await.expect("the first event"));
    assert_eq!(created["type"], "response.created", "{created}");
    (reader, created)
}

/// The last event of a Responses stream, read to its end.
async fn last_event(reader: &mut HttpReader) -> Value {
    let mut last = None;
    while let Some(frame) = reader.read_chunk().await {
        last = Some(frame);
    }
    sse_event(&last.expect("events"))
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().expect("type"))
        .collect()
}

/// The concatenated `delta`s of events of type `kind`.
fn deltas(events: &[Value], kind: &str) -> String {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| e["delta"].as_str().expect("delta"))
        .collect()
}

#[tokio::test]
async fn a_string_input_gets_a_response_object() {
    let srv = start_fake(script(byte_ids("Hi there")), 4096, limits()).await;
    let v = create(srv.addr, &body(json!({"instructions": "Be brief."}))).await;
    assert!(
        v["id"].as_str().is_some_and(|id| id.starts_with("resp_")),
        "{v}"
    );
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], MODEL_ID);
    assert_eq!(v["instructions"], "Be brief.");
    assert!(
        v["error"].is_null() && v["incomplete_details"].is_null(),
        "{v}"
    );
    let output = v["output"].as_array().expect("output");
    assert_eq!(output.len(), 1, "{v}");
    let message = &output[0];
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["status"], "completed");
    assert!(message["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(
        message["content"],
        json!([{"type": "output_text", "text": "Hi there", "annotations": [], "logprobs": []}])
    );
    let u = &v["usage"];
    assert_eq!(u["output_tokens"], 8);
    assert!(u["input_tokens"].as_u64().is_some_and(|n| n > 0), "{u}");
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["input_tokens"].as_u64().unwrap_or(0) + 8)
    );
    assert_eq!(u["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(
        (&v["tool_choice"], &v["tools"]),
        (&json!("auto"), &json!([]))
    );
    assert_eq!(v["text"], json!({"format": {"type": "text"}}));
    srv.stop().await;
}

#[tokio::test]
async fn a_stream_sends_the_typed_events_in_order() {
    let srv = start_fake(script(byte_ids("Hi there")), 4096, limits()).await;
    let ev = events(srv.addr, &body(json!({}))).await;
    let t = types(&ev);
    let n = t.len();
    assert_eq!(
        t[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert!(
        t[4..n - 4]
            .iter()
            .all(|t| *t == "response.output_text.delta"),
        "{t:?}"
    );
    assert_eq!(
        t[n - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert_eq!(deltas(&ev, "response.output_text.delta"), "Hi there");
    assert_eq!(ev[0]["response"]["status"], "in_progress");
    assert!(ev[0]["response"]["usage"].is_null());
    assert_eq!(ev[2]["item"]["content"], json!([]));
    assert_eq!(ev[n - 4]["text"], "Hi there");
    let done = &ev[n - 1]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0], ev[n - 2]["item"]);
    assert_eq!(done["id"], ev[0]["response"]["id"]);
    assert_eq!(done["usage"]["output_tokens"], 8);

    // Cut by max_output_tokens: the last event is response.incomplete.
    let ev = events(srv.addr, &body(json!({"max_output_tokens": 3}))).await;
    let last = &ev[ev.len() - 1];
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(last["response"]["status"], "incomplete");
    assert_eq!(
        last["response"]["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(last["response"]["output"][0]["status"], "incomplete");
    assert_eq!(deltas(&ev, "response.output_text.delta"), "Hi ");
    let v = create(srv.addr, &body(json!({"max_output_tokens": 3}))).await;
    assert_eq!(v["status"], "incomplete", "{v}");
    srv.stop().await;
}

/// The ids of "[THINK]plan[/THINK]answer".
fn plan_then_answer() -> Vec<u32> {
    let tok = text_model();
    let special = |s: &str| tok.tokenizer().special_id(s).expect("in the vocabulary");
    let mut ids = vec![special("[THINK]")];
    ids.extend(byte_ids("plan"));
    ids.push(special("[/THINK]"));
    ids.extend(byte_ids("answer"));
    ids
}

#[tokio::test]
async fn reasoning_is_a_reasoning_item_before_the_message() {
    let srv = start_fake(script(plan_then_answer()), 4096, limits()).await;
    let high = body(json!({"reasoning": {"effort": "high"}}));
    let v = create(srv.addr, &high).await;
    assert_eq!(v["reasoning"]["effort"], "high");
    let output = &v["output"];
    assert_eq!(output[0]["type"], "reasoning", "{v}");
    assert!(output[0]["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("rs_")));
    assert_eq!(
        output[0]["content"],
        json!([{"type": "reasoning_text", "text": "plan"}])
    );
    assert_eq!(output[1]["content"][0]["text"], "answer");
    assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 6);
    let ev = events(srv.addr, &high).await;
    assert_eq!(deltas(&ev, "response.reasoning_text.delta"), "plan");
    assert_eq!(deltas(&ev, "response.output_text.delta"), "answer");
    let added: Vec<&Value> = ev
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .map(|e| &e["output_index"])
        .collect();
    assert_eq!(added, [&json!(0), &json!(1)]);
    // The reasoning item sent back as input is past reasoning of an assistant turn.
    let mut items = vec![json!({"role": "user", "content": "x"})];
    items.extend(output.as_array().expect("output").iter().cloned());
    items.push(json!({"role": "user", "content": [{"type": "input_text", "text": "y"}]}));
    create(srv.addr, &body(json!({"input": items}))).await;
    srv.stop().await;
}

#[tokio::test]
async fn previous_response_id_continues_a_stored_response() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let first = create(srv.addr, &body(json!({}))).await;
    let id = first["id"].as_str().expect("id");
    let next = create(
        srv.addr,
        &body(json!({"previous_response_id": id, "input": "And then?"})),
    )
    .await;
    assert_eq!(next["previous_response_id"], id);
    // The continued prompt holds the first input and output before the new input.
    assert!(
        next["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64(),
        "{first}\n{next}"
    );
    let unknown = post(
        srv.addr,
        &body(json!({"previous_response_id": "resp_0123"})),
    )
    .await;
    unknown.assert_status(400, "an unknown previous_response_id");
    let e = &unknown.json()["error"];
    assert_eq!(e["code"], "previous_response_not_found", "{e}");
    assert_eq!(e["param"], "previous_response_id", "{e}");
    // A response not stored cannot be continued.
    let unstored = create(srv.addr, &body(json!({"store": false}))).await;
    assert_eq!(unstored["store"], false);
    let resp = post(
        srv.addr,
        &body(json!({"previous_response_id": unstored["id"]})),
    )
    .await;
    resp.assert_status(400, "an unstored response");
    srv.stop().await;
}

/// With `include: ["reasoning.encrypted_content"]` a done reasoning item carries
/// `encrypted_content`, and sent back without the store (and without its content) it is the
/// same past reasoning as its content: the prompt has as many tokens. A blob aubier did not
/// write is a 400 naming it; `reasoning.summary` `auto` is echoed and the summary stays empty;
/// another `include` value or summary mode is refused by name.
#[tokio::test]
async fn encrypted_reasoning_comes_back_without_the_store() {
    let srv = start_fake(script(plan_then_answer()), 4096, limits()).await;
    let asked = body(
        json!({"reasoning": {"effort": "high", "summary": "auto"}, "store": false,
        "include": ["reasoning.encrypted_content"]}),
    );
    let v = create(srv.addr, &asked).await;
    assert_eq!(v["reasoning"], json!({"effort": "high", "summary": "auto"}));
    let reasoning = &v["output"][0];
    assert_eq!(
        (&reasoning["type"], &reasoning["summary"]),
        (&json!("reasoning"), &json!([]))
    );
    let blob = reasoning["encrypted_content"]
        .as_str()
        .expect("encrypted_content");
    assert!(blob.starts_with("aubier.reasoning.v1."), "{blob}");
    let ev = events(srv.addr, &asked).await;
    let item = |kind: &str| {
        ev.iter()
            .find(|e| e["type"] == kind && e["item"]["type"] == "reasoning")
            .map(|e| e["item"].clone())
            .expect("a reasoning item event")
    };
    assert!(item("response.output_item.added")
        .get("encrypted_content")
        .is_none());
    assert_eq!(item("response.output_item.done")["encrypted_content"], blob);
    let older = body(json!({"reasoning": {"effort": "high", "generate_summary": "auto"}}));
    assert_eq!(
        create(srv.addr, &older).await["reasoning"]["summary"],
        "auto"
    );
    let plain = create(srv.addr, &body(json!({"reasoning": {"effort": "high"}}))).await;
    assert!(
        plain["output"][0].get("encrypted_content").is_none(),
        "{plain}"
    );
    assert_eq!(plain["reasoning"]["summary"], Value::Null);

    let sent_back = |reasoning: Value| {
        body(json!({"store": false, "input": [
            {"role": "user", "content": "x"}, reasoning,
            {"role": "assistant", "content": "answer"}, {"role": "user", "content": "y"}]}))
    };
    let sealed = create(
        srv.addr,
        &sent_back(json!({"type": "reasoning", "summary": [], "encrypted_content": blob})),
    )
    .await;
    let with_text = create(
        srv.addr,
        &sent_back(json!({"type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": "plan"}]})),
    )
    .await;
    let without = create(
        srv.addr,
        &sent_back(json!({"type": "reasoning", "summary": []})),
    )
    .await;
    let tokens = |v: &Value| v["usage"]["input_tokens"].as_u64().expect("input_tokens");
    assert_eq!(tokens(&sealed), tokens(&with_text));
    assert!(tokens(&sealed) > tokens(&without), "{sealed}\n{without}");

    let foreign = sent_back(json!({"type": "reasoning", "summary": [],
        "encrypted_content": "gAAAAABoOpaqueBlobFromElsewhere"}));
    let e = refused(srv.addr, &foreign).await;
    assert_eq!(e["param"], "input[1].encrypted_content", "{e}");
    // Refused with content beside it too: a blob is never silently dropped.
    let beside = sent_back(json!({"type": "reasoning", "summary": [],
        "content": [{"type": "reasoning_text", "text": "plan"}],
        "encrypted_content": "gAAAAABoOpaqueBlobFromElsewhere"}));
    let e = refused(srv.addr, &beside).await;
    assert_eq!(e["param"], "input[1].encrypted_content", "{e}");
    for (extra, param) in [
        (
            json!({"include": ["message.output_text.logprobs"]}),
            "include[0]",
        ),
        (
            json!({"reasoning": {"summary": "concise"}}),
            "reasoning.summary",
        ),
    ] {
        let e = refused(srv.addr, &body(extra.clone())).await;
        assert_eq!(e["param"], param, "{extra}: {e}");
    }
    srv.stop().await;
}

/// An input whose calls and outputs pair up but which Mistral's chat template refuses is a 400
/// naming the item, `input[i]`, in Responses terms; not the chat message the template's rules
/// count (instructions and answer items in a row are one message each) nor chat roles.
#[tokio::test]
async fn what_the_template_refuses_is_named_by_item() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let tools = json!([{"type": "function", "name": "f", "strict": false}]);
    let msg = |role: &str, text: &str| json!({"role": role, "content": text});
    let call = json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"});
    let output = json!({"type": "function_call_output", "call_id": "c1", "output": "1"});
    let cases = [
        (
            json!([call, output, msg("user", "x")]),
            "input[0]",
            "input[0]: the conversation must start with a user, system or developer message \
             (or instructions), not a function_call.",
        ),
        (
            json!([
                msg("user", "x"),
                msg("assistant", "a"),
                msg("system", "s"),
                msg("user", "y")
            ]),
            "input[2]",
            "input[2]: a system message cannot follow an assistant message in Mistral's chat \
             template (after an answer comes a user message or a function_call_output; a system \
             or developer message comes after a user or system message).",
        ),
        (
            json!([msg("user", "x"), call, msg("user", "y"), output]),
            "input[3]",
            "input[3]: a function_call_output cannot follow a user message in Mistral's chat \
             template (after an answer comes a user message or a function_call_output; a system \
             or developer message comes after a user or system message).",
        ),
        (
            json!([msg("user", "x"), msg("assistant", ""), msg("user", "y")]),
            "input[1]",
            "input[1]: an answer (assistant messages, reasoning and function calls in a row) \
             needs non-empty text or a function call.",
        ),
        (
            json!([msg("user", "x"), call, call, output, output]),
            "input[1]",
            "input[1]: in the answer that starts here: duplicate call_id \"c1\".",
        ),
        (
            json!([msg("user", "x"),
                {"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "", "output": "1"}]),
            "input[1]",
            "input[1]: in the answer that starts here: every function_call needs a call_id.",
        ),
        (
            json!([msg("user", "x"), msg("system", "s")]),
            "input[1]",
            "input[1]: the input ends with a system message; end it with what the model should \
             answer: a user message or a function_call_output.",
        ),
    ];
    for (input, param, message) in cases {
        let b = body(json!({"input": input, "tools": tools}));
        let e = refused(srv.addr, &b).await;
        assert_eq!(
            (e["param"].as_str(), e["message"].as_str()),
            (Some(param), Some(message)),
            "{b}\n{e}"
        );
    }
    // Another model is a 404 before the conversation is looked at.
    let other = json!({"model": "gpt-4o", "input": [call, output, msg("user", "x")]});
    post(srv.addr, &other)
        .await
        .assert_status(404, "another model");
    // With instructions first, the same input is accepted.
    let b = body(
        json!({"input": [call, output, msg("user", "x")], "tools": tools,
        "instructions": "Be brief."}),
    );
    create(srv.addr, &b).await;
    srv.stop().await;
}

async fn get(addr: SocketAddr, path: &str) -> RawResponse {
    raw_request(addr, "GET", path, b"").await
}

/// A validator of answers against the served document's schema `name`.
async fn answer_schema(addr: SocketAddr, name: &str) -> jsonschema::Validator {
    let doc = get(addr, "/openapi.json").await.json();
    let schema = json!({
        "$ref": format!("#/components/schemas/{name}"),
        "components": doc["components"],
    });
    jsonschema::validator_for(&schema).expect("a valid JSON Schema")
}

/// The string field `key` of each item of a page of input items, in its order.
fn item_fields<'a>(page: &'a Value, key: &str) -> Vec<&'a str> {
    page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|i| i[key].as_str().expect(key))
        .collect()
}

/// The ids of a page of input items, in its order.
fn item_ids(page: &Value) -> Vec<&str> {
    item_fields(page, "id")
}

/// A stored response comes back by GET as it was answered; its input items (the continued
/// response's first, each keeping its id, the output left out) page newest first or oldest
/// first; DELETE drops it (then GET, DELETE and previous_response_id miss) and leaves the
/// response that continued it; what aubier does not do is a 400 naming the query parameter.
#[tokio::test]
async fn stored_responses_are_retrieved_listed_and_deleted() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let (object, list) = (
        answer_schema(srv.addr, "ResponseObject").await,
        answer_schema(srv.addr, "InputItemList").await,
    );
    let call = json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"});
    let output = json!({"type": "function_call_output", "call_id": "c1", "output": "1"});
    let tools = json!([{"type": "function", "name": "f", "strict": false}]);
    let first = create(
        srv.addr,
        &body(json!({"tools": tools, "input": [
            {"role": "user", "content": "one"}, call, output, {"role": "user", "content": "two"}]})),
    )
    .await;
    let id = first["id"].as_str().expect("id");
    let got = get(srv.addr, &format!("/v1/responses/{id}")).await;
    got.assert_status(200, "GET a stored response");
    assert_eq!(got.header("content-type"), Some("application/json"));
    assert_eq!(got.json(), first);
    assert!(object.is_valid(&got.json()), "{first}");

    let items = get(
        srv.addr,
        &format!("/v1/responses/{id}/input_items?order=asc"),
    )
    .await;
    items.assert_status(200, "input_items");
    let items = items.json();
    assert!(list.is_valid(&items), "{items}");
    let data = &items["data"];
    assert_eq!(data.as_array().map(Vec::len), Some(4), "{items}");
    assert_eq!(
        (&data[0]["type"], &data[0]["role"], &data[0]["content"]),
        (
            &json!("message"),
            &json!("user"),
            &json!([{"type": "input_text", "text": "one"}])
        ),
        "{items}"
    );
    assert_eq!(data[1]["type"], "function_call");
    assert_eq!(
        (&data[1]["call_id"], &data[1]["name"]),
        (&json!("c1"), &json!("f"))
    );
    assert_eq!(data[2]["type"], "function_call_output");
    assert_eq!(data[2]["output"], "1");
    assert_eq!(data[3]["content"][0]["text"], "two");
    let ids = item_ids(&items);
    assert!(
        ids[0].starts_with("msg_") && ids[1].starts_with("fc_"),
        "{items}"
    );
    assert!(ids[2].starts_with("fco_"), "{items}");
    assert_eq!(items["first_id"], ids[0]);
    assert_eq!(items["last_id"], ids[3]);
    assert_eq!(items["has_more"], false);

    let next = create(
        srv.addr,
        &body(json!({"previous_response_id": id, "input": "three"})),
    )
    .await;
    let next_id = next["id"].as_str().expect("id");
    let page = |query: String| {
        let path = format!("/v1/responses/{next_id}/input_items{query}");
        async move {
            let r = get(srv.addr, &path).await;
            r.assert_status(200, &path);
            r.json()
        }
    };
    // Newest first: the new input, the first response's answer (its output item's id), then
    // the first response's inputs with their ids.
    let newest = page("?limit=2".to_owned()).await;
    assert!(list.is_valid(&newest), "{newest}");
    let answer_id = first["output"][0]["id"].as_str().expect("output id");
    assert_eq!(item_ids(&newest)[1], answer_id, "{newest}");
    assert_eq!(newest["data"][1]["role"], "assistant");
    assert_eq!(newest["data"][1]["content"][0]["type"], "output_text");
    assert_eq!(newest["data"][0]["content"][0]["text"], "three");
    assert_eq!(newest["has_more"], true);
    let rest = page(format!("?limit=10&after={answer_id}")).await;
    let mut carried = ids.clone();
    carried.reverse();
    assert_eq!(item_ids(&rest), carried, "{rest}");
    assert_eq!(rest["has_more"], false);

    let deleted = raw_request(srv.addr, "DELETE", &format!("/v1/responses/{id}"), b"").await;
    deleted.assert_status(200, "DELETE a stored response");
    assert_eq!(
        deleted.json(),
        json!({"id": id, "object": "response", "deleted": true})
    );
    for (method, path) in [
        ("GET", format!("/v1/responses/{id}")),
        ("GET", format!("/v1/responses/{id}/input_items")),
        ("DELETE", format!("/v1/responses/{id}")),
    ] {
        let r = raw_request(srv.addr, method, &path, b"").await;
        r.assert_status(404, &format!("{method} {path} after DELETE"));
        let message = r.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(message.contains(id), "{message}");
    }
    let e = post(srv.addr, &body(json!({"previous_response_id": id}))).await;
    e.assert_status(400, "previous_response_id of a deleted response");
    let again = get(srv.addr, &format!("/v1/responses/{next_id}")).await;
    again.assert_status(200, "the continuation stays");
    assert_eq!(
        page(String::new()).await["data"].as_array().map(Vec::len),
        Some(6)
    );

    let unstored = create(srv.addr, &body(json!({"store": false}))).await;
    let path = format!("/v1/responses/{}", unstored["id"].as_str().expect("id"));
    get(srv.addr, &path)
        .await
        .assert_status(404, "store: false");

    for (query, param) in [
        ("?stream=true", "stream"),
        ("?stream=yes", "stream"),
        ("?include=reasoning.encrypted_content", "include"),
        ("?include[]=a&include[]=b", "include"),
        ("?starting_after=3", "starting_after"),
        ("?foo=1", "foo"),
    ] {
        let r = get(srv.addr, &format!("/v1/responses/{next_id}{query}")).await;
        r.assert_status(400, query);
        assert_eq!(r.json()["error"]["param"], param, "{query}");
    }
    for (query, param) in [
        ("?limit=0", "limit"),
        ("?limit=101", "limit"),
        ("?order=newest", "order"),
        ("?after=msg_0", "after"),
        ("?limit=1&limit=2", "limit"),
        ("?include=a&include=b", "include"),
    ] {
        let r = get(
            srv.addr,
            &format!("/v1/responses/{next_id}/input_items{query}"),
        )
        .await;
        r.assert_status(400, query);
        assert_eq!(r.json()["error"]["param"], param, "{query}");
    }
    let ok = get(
        srv.addr,
        &format!("/v1/responses/{next_id}?stream=false&include_obfuscation=true"),
    )
    .await;
    ok.assert_status(200, "stream=false");
    srv.stop().await;
}

/// An input item sent with the id of an item already in the conversation (the previous
/// response's answer sent back with `previous_response_id`, or an earlier input item) is a 400
/// naming it, as OpenAI's "Duplicate item found", rather than rendered twice; without
/// `previous_response_id` the answer sent back is the conversation.
#[tokio::test]
async fn an_item_sent_again_with_its_id_is_a_duplicate() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let first = create(srv.addr, &body(json!({}))).await;
    let id = first["id"].as_str().expect("id");
    let answer = &first["output"][0];
    let answer_id = answer["id"].as_str().expect("output id");
    let again = json!({"role": "user", "content": "again", "id": "msg_again"});
    let input = json!([answer, again]);
    let e = refused(
        srv.addr,
        &body(json!({"previous_response_id": id, "input": input})),
    )
    .await;
    assert_eq!(e["param"], "input[0].id", "{e}");
    let message = e["message"].as_str().unwrap_or_default();
    assert!(message.contains(answer_id), "{e}");
    let input = json!([again, answer, again]);
    let e = refused(srv.addr, &body(json!({"input": input}))).await;
    assert_eq!(e["param"], "input[2].id", "{e}");
    let input = json!([{"role": "user", "content": "hi"}, answer, again]);
    create(srv.addr, &body(json!({"input": input}))).await;
    srv.stop().await;
}

/// POSTs `body` to `/v1/responses/input_tokens`; its `input_tokens`.
async fn counted(addr: SocketAddr, body: &Value) -> Value {
    let path = "/v1/responses/input_tokens";
    let r = raw_request(addr, "POST", path, body.to_string().as_bytes()).await;
    r.assert_status(200, &body.to_string());
    r.json()["input_tokens"].clone()
}

/// Input items keep the `id` they were sent with (OpenAI's), those sent without one (or with an
/// empty one) get one of aubier's. An `item_reference` (`type` given or left out) takes the
/// place of the stored item it names, an input or an output of any kept response, with that
/// item's id: the prompt is the one of the items written out. One not kept (unknown, of a
/// `store: false` response, or of responses all deleted) is a 400 naming `input[i].id` with
/// OpenAI's message and null code; one naming an item already in the conversation is OpenAI's
/// "Duplicate item found".
#[tokio::test]
async fn item_references_take_the_place_of_stored_items() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let list = &answer_schema(srv.addr, "InputItemList").await;
    let input = json!([{"role": "user", "content": "one", "id": "msg_mine"},
        {"role": "user", "content": "two", "id": ""}]);
    let first = create(srv.addr, &body(json!({"input": input}))).await;
    let first_id = first["id"].as_str().expect("id");
    let answer_id = first["output"][0]["id"].as_str().expect("output id");
    let items = |id: String| async move {
        let path = format!("/v1/responses/{id}/input_items?order=asc");
        let r = get(srv.addr, &path).await;
        r.assert_status(200, &path);
        let page = r.json();
        assert!(list.is_valid(&page), "{page}");
        page
    };
    let page = items(first_id.to_owned()).await;
    let ids = item_ids(&page);
    assert_eq!(ids[0], "msg_mine", "{page}");
    assert!(ids[1].starts_with("msg_") && ids[1] != "msg_mine", "{page}");

    let referring = json!([{"type": "item_reference", "id": "msg_mine"}, {"id": answer_id},
        {"type": null, "id": ids[1]}]);
    let written = json!([{"role": "user", "content": "one"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "two"}]);
    let second = create(srv.addr, &body(json!({"input": referring}))).await;
    assert_eq!(
        second["usage"]["input_tokens"],
        counted(srv.addr, &body(json!({"input": written}))).await,
        "{second}"
    );
    assert_eq!(
        counted(srv.addr, &body(json!({"input": referring}))).await,
        second["usage"]["input_tokens"]
    );
    let second_id = second["id"].as_str().expect("id");
    let page = items(second_id.to_owned()).await;
    assert_eq!(item_ids(&page), ["msg_mine", answer_id, ids[1]], "{page}");
    assert_eq!(
        item_fields(&page, "role"),
        ["user", "assistant", "user"],
        "{page}"
    );
    assert_eq!(page["data"][0]["content"][0]["text"], "one", "{page}");
    assert_eq!(page["data"][1]["content"][0]["text"], "ok", "{page}");

    let not_found = |e: &Value, param: &str, id: &str| {
        assert_eq!(e["param"], param, "{e}");
        assert_eq!(e["type"], "invalid_request_error", "{e}");
        assert_eq!(e["code"], Value::Null, "{e}");
        let message = e["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("Item with id '{id}' not found.")),
            "{e}"
        );
    };
    let unstored = body(json!({"store": false,
        "input": [{"role": "user", "content": "x", "id": "msg_unstored"}]}));
    create(srv.addr, &unstored).await;
    for id in ["msg_unknown", "msg_unstored"] {
        let input = json!([{"role": "user", "content": "x"}, {"type": "item_reference", "id": id}]);
        let e = refused(srv.addr, &body(json!({"input": input}))).await;
        not_found(&e, "input[1].id", id);
    }
    let twice = json!([{"id": "msg_mine"}, {"type": "item_reference", "id": "msg_mine"}]);
    let e = refused(srv.addr, &body(json!({"input": twice}))).await;
    assert_eq!(e["param"], "input[1].id", "{e}");
    let message = e["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Duplicate item found with id msg_mine."),
        "{e}"
    );
    let again = json!([{"id": answer_id}, {"role": "user", "content": "three"}]);
    let e = refused(
        srv.addr,
        &body(json!({"previous_response_id": first_id, "input": again})),
    )
    .await;
    assert_eq!(e["param"], "input[0].id", "{e}");

    // The second response holds the first's items too: deleting the first leaves them.
    for (id, kept) in [(first_id, true), (second_id, false)] {
        let path = format!("/v1/responses/{id}");
        let r = raw_request(srv.addr, "DELETE", &path, b"").await;
        r.assert_status(200, &path);
        let b = body(json!({"store": false, "input": [{"id": "msg_mine"}]}));
        match kept {
            true => drop(create(srv.addr, &b).await),
            false => not_found(&refused(srv.addr, &b).await, "input[0].id", "msg_mine"),
        }
    }
    srv.stop().await;
}

/// `POST /v1/responses/input_tokens` counts the prompt `POST /v1/responses` renders from the
/// same body (its `usage.input_tokens`), refuses what that route refuses, and answers a prompt
/// past the context as it does; cancelling is refused (no background responses), for a stored
/// response with a 400 and for another id with a 404; compaction is a 404 that says it is not
/// implemented; GET and DELETE on both paths are the 404 of an id not stored.
#[tokio::test]
async fn input_tokens_count_what_a_response_would_read_and_cancel_is_refused() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let count = |b: Value| async move {
        raw_request(
            srv.addr,
            "POST",
            "/v1/responses/input_tokens",
            b.to_string().as_bytes(),
        )
        .await
    };
    let tools = json!([{"type": "function", "name": "f", "strict": false}]);
    let b = body(json!({"instructions": "Be brief.", "tools": tools}));
    let made = create(srv.addr, &b).await;
    let counted = count(b.clone()).await;
    counted.assert_status(200, "input_tokens");
    assert_eq!(
        counted.json(),
        json!({"object": "response.input_tokens",
            "input_tokens": made["usage"]["input_tokens"]})
    );
    let id = made["id"].as_str().expect("id");
    let next = body(json!({"previous_response_id": id, "input": "And?"}));
    let continued = create(srv.addr, &next).await;
    assert_eq!(
        count(next).await.json()["input_tokens"],
        continued["usage"]["input_tokens"]
    );
    let e = count(body(json!({"input": [{"role": "user", "content": "x"},
        {"type": "function_call_output", "call_id": "c", "output": "1"}]})))
    .await;
    e.assert_status(400, "an output without its call");
    assert_eq!(e.json()["error"]["param"], "input[1]");
    let long = count(body(json!({"input": "word ".repeat(5000)}))).await;
    long.assert_status(400, "past the context");
    assert_eq!(long.json()["error"]["code"], "context_length_exceeded");

    let cancel = |id: String| async move {
        raw_request(srv.addr, "POST", &format!("/v1/responses/{id}/cancel"), b"").await
    };
    let r = cancel(id.to_owned()).await;
    r.assert_status(400, "cancel a stored response");
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("background"), "{message}");
    cancel("resp_0".to_owned())
        .await
        .assert_status(404, "cancel another id");
    let r = raw_request(srv.addr, "POST", "/v1/responses/compact", b"{}").await;
    r.assert_status(404, "compact");
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("not implemented"), "{message}");
    // GET and DELETE on these POST paths are those of an id not stored (not 405s, which would
    // say the path exists for them).
    for method in ["GET", "DELETE"] {
        let unknown = raw_request(srv.addr, method, "/v1/responses/resp_0", b"").await;
        unknown.assert_status(404, "an id not stored");
        let unknown = unknown.json().to_string();
        for name in ["input_tokens", "compact"] {
            let path = format!("/v1/responses/{name}");
            let r = raw_request(srv.addr, method, &path, b"").await;
            r.assert_status(404, &format!("{method} {path}"));
            assert_eq!(r.json().to_string(), unknown.replace("resp_0", name));
        }
    }
    // Their methods stay POST alone: another is a 405 whose Allow says so.
    for name in ["input_tokens", "compact"] {
        let path = format!("/v1/responses/{name}");
        let r = raw_request(srv.addr, "PUT", &path, b"{}").await;
        r.assert_status(405, &format!("PUT {path}"));
        assert_eq!(r.header("allow"), Some("POST"), "PUT {path}");
    }
    srv.stop().await;
}

/// A tool or `text.format` schema the grammar cannot enforce (a look-behind in a `pattern`)
/// is `POST /v1/responses`' 400 and `input_tokens`' same 400: `input_tokens` once counted such
/// a body, telling the client a request the route refuses was fine.
#[tokio::test]
async fn input_tokens_refuse_a_schema_the_grammar_cannot_enforce() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "(?<=x)a"}},
        "required": ["a"],
    });
    let tools = json!([{"type": "function", "name": "f", "strict": true, "parameters": schema}]);
    let format = json!({"format": {"type": "json_schema", "name": "x", "strict": true,
        "schema": schema}});
    for (b, param) in [
        (body(json!({"tools": tools})), "tools[0].parameters"),
        (body(json!({"text": format})), "text.format"),
    ] {
        let made = refused(srv.addr, &b).await;
        assert_eq!(made["param"], param, "{made}");
        let path = "/v1/responses/input_tokens";
        let r = raw_request(srv.addr, "POST", path, b.to_string().as_bytes()).await;
        r.assert_status(400, &format!("input_tokens {b}"));
        assert_eq!(r.json()["error"], made, "{b}");
    }
    srv.stop().await;
}

/// An output item cut off by `max_output_tokens` is listed `incomplete` among the input items
/// of the response that continues it, as the response answered it; the items sent are
/// `completed`.
#[tokio::test]
async fn a_cut_off_answer_is_listed_incomplete_where_it_is_carried_over() {
    let srv = start_fake(script(byte_ids("a long answer")), 4096, limits()).await;
    let cut = create(srv.addr, &body(json!({"max_output_tokens": 2}))).await;
    assert_eq!(cut["output"][0]["status"], "incomplete", "{cut}");
    let id = cut["id"].as_str().expect("id");
    let next = body(json!({"previous_response_id": id, "input": "go on"}));
    let next = create(srv.addr, &next).await;
    let next_id = next["id"].as_str().expect("id");
    let page = get(
        srv.addr,
        &format!("/v1/responses/{next_id}/input_items?order=asc"),
    )
    .await
    .json();
    assert_eq!(
        item_fields(&page, "status"),
        ["completed", "incomplete", "completed"],
        "{page}"
    );
    srv.stop().await;
}

/// An engine failure mid-stream ends the stream with `response.failed`: the response failed, its
/// open message incomplete with the text so far, and `error.code` one of OpenAI's codes
/// (`server_error`), which strict clients (openai-python's `_strict_response_validation`)
/// require. With `store` the failed response is kept, as OpenAI keeps one.
#[tokio::test]
async fn a_failure_mid_stream_is_response_failed_with_an_openai_code() {
    let mut s = script(byte_ids("abcdefghij"));
    s.fail_at_step = Some(4);
    let srv = start_fake(s, 4096, limits()).await;
    let ev = events(srv.addr, &body(json!({}))).await;
    let last = ev.last().expect("events");
    assert_eq!(last["type"], "response.failed", "{last}");
    let r = &last["response"];
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["error"]["code"], "server_error", "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("step 4"), "{r}");
    assert_eq!(r["output"][0]["status"], "incomplete", "{r}");
    assert_eq!(deltas(&ev, "response.output_text.delta"), "abc");
    // Kept as OpenAI keeps a failed response: retrieved as response.failed carried it.
    let path = format!("/v1/responses/{}", r["id"].as_str().expect("id"));
    let got = get(srv.addr, &path).await;
    got.assert_status(200, &path);
    assert_eq!(&got.json(), r);
    let items = get(srv.addr, &format!("{path}/input_items")).await;
    items.assert_status(200, "input_items of a failed response");
    assert_eq!(items.json()["data"][0]["content"][0]["text"], "Hello!");
    let unstored = events(srv.addr, &body(json!({"store": false}))).await;
    let id = unstored.last().expect("events")["response"]["id"].clone();
    let path = format!("/v1/responses/{}", id.as_str().expect("id"));
    get(srv.addr, &path)
        .await
        .assert_status(404, "a failed response with store: false");
    srv.stop().await;
}

/// A streamed response is kept from its first event, as OpenAI shows one in progress: GET gives
/// it as `response.in_progress` carried it (status `in_progress`), its input items are listed,
/// and continuing it is a 400 until it ends; then GET gives it as `response.completed` carried
/// it. One deleted while in progress is not kept at its end; one whose client goes away is
/// forgotten.
#[tokio::test]
async fn a_streamed_response_is_retrieved_in_progress_then_whole() {
    let mut s = script(byte_ids(&"a".repeat(40)));
    s.step_delay = Duration::from_millis(20);
    let srv = start_fake(s, 4096, limits()).await;
    let path = |created: &Value| {
        let id = created["response"]["id"].as_str().expect("id");
        format!("/v1/responses/{id}")
    };

    let (mut reader, created) = open_response_stream(srv.addr, &body(json!({}))).await;
    let at = path(&created);
    let got = get(srv.addr, &at).await;
    got.assert_status(200, "in progress");
    assert_eq!(got.json()["status"], "in_progress", "{}", got.json());
    assert_eq!(got.json(), created["response"]);
    let items = get(srv.addr, &format!("{at}/input_items")).await;
    items.assert_status(200, "input_items in progress");
    assert_eq!(items.json()["data"][0]["content"][0]["text"], "Hello!");
    let id = &created["response"]["id"];
    let e = refused(srv.addr, &body(json!({"previous_response_id": id}))).await;
    assert_eq!(e["param"], "previous_response_id", "{e}");
    let done = last_event(&mut reader).await;
    assert_eq!(done["type"], "response.completed", "{done}");
    assert_eq!(get(srv.addr, &at).await.json(), done["response"]);

    let (mut reader, created) = open_response_stream(srv.addr, &body(json!({}))).await;
    let at = path(&created);
    let deleted = raw_request(srv.addr, "DELETE", &at, b"").await;
    deleted.assert_status(200, "DELETE in progress");
    assert_eq!(last_event(&mut reader).await["type"], "response.completed");
    get(srv.addr, &at)
        .await
        .assert_status(404, "deleted while in progress");

    let (reader, created) = open_response_stream(srv.addr, &body(json!({}))).await;
    let at = path(&created);
    drop(reader);
    let start = Instant::now();
    while get(srv.addr, &at).await.status != 404 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a response whose client went away is still kept"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    srv.stop().await;
}

/// Function call outputs answer calls, calls have outputs and the last item is not an answer,
/// in the items sent (and a stored response's): one that does not is a 400 naming its item,
/// with OpenAI's message (not the chat validator's, which counts chat messages and speaks of
/// roles "tool" and continue_final_message). An answer sent back as
/// openai-python's `model_dump()` writes it, with `"phase": null`, is accepted.
#[tokio::test]
async fn calls_and_outputs_pair_up_and_dumped_answers_come_back() {
    let text = text_model();
    let tok = text.tokenizer();
    let mut ids = vec![tok.special_id("[TOOL_CALLS]").expect("[TOOL_CALLS]")];
    ids.extend(byte_ids("f"));
    ids.push(tok.special_id("[ARGS]").expect("[ARGS]"));
    ids.extend(byte_ids("{}"));
    let srv = start_fake(script(ids), 4096, limits()).await;
    let tools = json!([{"type": "function", "name": "f", "strict": false}]);
    let user = json!({"role": "user", "content": "x"});
    let call =
        |id: &str| json!({"type": "function_call", "call_id": id, "name": "f", "arguments": "{}"});
    let output = |id: &str| json!({"type": "function_call_output", "call_id": id, "output": "1"});
    let cases = [
        (
            vec![user.clone(), output("call_a")],
            "input[1]",
            "No tool call found for function call output with call_id call_a.",
        ),
        (
            vec![user.clone(), call("call_a"), output("call_b")],
            "input[1]",
            "No tool output found for function call call_a.",
        ),
        (
            vec![user.clone(), output("call_a"), call("call_a")],
            "input[1]",
            "No tool call found for function call output with call_id call_a.",
        ),
        (
            vec![user.clone(), json!({"role": "assistant", "content": "Hi"})],
            "input[1]",
            "The input ends with an answer (an assistant message or a reasoning item); end it \
             with what the model should answer: a user message or a function_call_output.",
        ),
    ];
    for (input, param, message) in cases {
        let b = body(json!({"input": input, "tools": tools, "instructions": "Be brief."}));
        let e = refused(srv.addr, &b).await;
        assert_eq!(
            (e["param"].as_str(), e["message"].as_str()),
            (Some(param), Some(message)),
            "{b}\n{e}"
        );
    }
    let answered = body(json!({"tools": tools,
        "input": [user.clone(), call("call_a"), call("call_b"), output("call_b"), output("call_a")]}));
    let first = create(srv.addr, &answered).await;
    let made = &first["output"][0];
    assert_eq!(made["type"], "function_call", "{first}");
    // Continuing without the new call's output names the stored call.
    let b = body(json!({"previous_response_id": first["id"], "input": "And?", "tools": tools}));
    let e = refused(srv.addr, &b).await;
    assert_eq!(e["param"], "previous_response_id", "{e}");
    let continued = body(json!({"previous_response_id": first["id"], "tools": tools,
        "input": [output(made["call_id"].as_str().expect("call_id"))]}));
    create(srv.addr, &continued).await;
    // An earlier answer's message as the SDK dumps it back.
    let dumped = json!({"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
        "phase": null, "content": [{"type": "output_text", "text": "Hi", "annotations": [],
        "logprobs": []}]});
    create(
        srv.addr,
        &body(json!({"input": [user.clone(), dumped, user.clone()]})),
    )
    .await;
    let final_answer = json!({"role": "assistant", "content": "Hi", "phase": "final_answer"});
    create(
        srv.addr,
        &body(json!({"input": [user.clone(), final_answer, user]})),
    )
    .await;
    srv.stop().await;
}

#[tokio::test]
async fn refused_and_invalid_parameters_are_named() {
    let srv = start_fake(script(byte_ids("ok")), 4096, limits()).await;
    let tool = json!({"type": "function", "name": "f"});
    let cases = [
        (
            json!({"include": ["file_search_call.results"]}),
            "include[0]",
            "invalid_value",
        ),
        (
            json!({"background": true}),
            "background",
            "unsupported_parameter",
        ),
        (
            json!({"truncation": "auto"}),
            "truncation",
            "unsupported_parameter",
        ),
        (
            json!({"top_logprobs": 2}),
            "top_logprobs",
            "unsupported_parameter",
        ),
        (
            json!({"metadata": {"a": "b"}}),
            "metadata",
            "unsupported_parameter",
        ),
        (
            json!({"text": {"verbosity": "low"}}),
            "text.verbosity",
            "unsupported_parameter",
        ),
        (
            json!({"reasoning": {"summary": "detailed"}}),
            "reasoning.summary",
            "invalid_value",
        ),
        (
            json!({"reasoning": {"effort": "medium"}}),
            "reasoning.effort",
            "invalid_value",
        ),
        (
            json!({"input": [{"type": "web_search_call", "id": "ws_1"}]}),
            "input[0].type",
            "unsupported_parameter",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
            "input[0].content[0].type",
            "unsupported_parameter",
        ),
        (
            json!({"input": [{"role": "user", "content": "x", "colour": 1}]}),
            "input[0].colour",
            "unknown_parameter",
        ),
        (
            json!({"tools": [{"type": "function", "name": "f", "foo": 1}]}),
            "tools[0].foo",
            "unknown_parameter",
        ),
        (
            json!({"tools": [{"type": "function", "name": "f g"}]}),
            "tools[0].name",
            "invalid_value",
        ),
        (
            json!({"tools": [tool], "tool_choice": {"type": "function", "name": "g"}}),
            "tool_choice.name",
            "invalid_value",
        ),
        (
            json!({"tool_choice": "required"}),
            "tool_choice",
            "invalid_value",
        ),
        (
            json!({"text": {"format": {"type": "json_schema", "name": "s"}}}),
            "text.format.schema",
            "missing_required_parameter",
        ),
        (
            json!({"text": {"format": {"type": "json_object", "name": "s"}}}),
            "text.format.name",
            "unknown_parameter",
        ),
        (
            json!({"text": {"format": {"type": "json_schema", "name": "s", "schema": {"$ref": "#"}}}}),
            "text.format",
            "invalid_value",
        ),
        (
            json!({"stream_options": {"include_obfuscation": false}}),
            "stream_options",
            "invalid_value",
        ),
        (
            json!({"max_output_tokens": 0}),
            "max_output_tokens",
            "invalid_value",
        ),
        (json!({"temperature": 3}), "temperature", "invalid_value"),
        (
            json!({"input": [{"role": "assistant", "content": "x"}]}),
            "input[0]",
            "invalid_value",
        ),
        (json!({"frobnicate": 1}), "frobnicate", "unknown_parameter"),
        (
            json!({"reasoning": [null, null]}),
            "reasoning",
            "invalid_value",
        ),
    ];
    for (extra, param, code) in cases {
        let b = body(extra);
        let e = refused(srv.addr, &b).await;
        assert_eq!(
            (e["param"].as_str(), e["code"].as_str()),
            (Some(param), Some(code)),
            "{b}\n{e}"
        );
    }
    let resp = post(srv.addr, &json!({"model": MODEL_ID})).await;
    resp.assert_status(400, "no input");
    assert_eq!(resp.json()["error"]["param"], "input");
    srv.stop().await;
}

/// The weather tool, strict, in the flat form.
fn weather() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "strict": true, "parameters": {"type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
        "additionalProperties": false}})
}

#[tokio::test]
async fn a_function_call_round_trip_json_text_and_a_cached_continuation() {
    let srv = start_real(true).await;
    let ask = body(json!({
        "input": "Weather in Paris?", "tools": [weather()], "tool_choice": "required",
        "parallel_tool_calls": false, "max_output_tokens": 48, "temperature": 0,
    }));
    let v = create(srv.addr, &ask).await;
    assert_eq!(v["status"], "completed", "{v}");
    let call = v["output"]
        .as_array()
        .expect("output")
        .iter()
        .find(|o| o["type"] == "function_call")
        .unwrap_or_else(|| panic!("no function call: {v}"))
        .clone();
    assert_eq!(call["name"], "get_weather");
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("fc_")));
    assert!(call["call_id"]
        .as_str()
        .is_some_and(|id| id.starts_with("call_")));
    let args: Value = serde_json::from_str(call["arguments"].as_str().expect("arguments"))
        .expect("JSON arguments");
    assert!(args["city"] == "Paris" || args["city"] == "Rome", "{args}");
    assert_eq!(v["tools"][0]["strict"], true);

    // Streamed, the same call comes as arguments deltas.
    let ev = events(srv.addr, &ask).await;
    let done = ev
        .iter()
        .find(|e| e["type"] == "response.function_call_arguments.done")
        .expect("arguments done");
    assert_eq!(done["arguments"], call["arguments"]);
    assert_eq!(
        deltas(&ev, "response.function_call_arguments.delta"),
        call["arguments"].as_str().unwrap_or_default()
    );

    // The whole history sent back: the call, then its output.
    let history = body(json!({
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            call.clone(),
            {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
        ],
        "tools": [weather()], "tool_choice": "none", "max_output_tokens": 8, "temperature": 0,
    }));
    let answer = create(srv.addr, &history).await;
    assert!(
        answer["output"]
            .as_array()
            .expect("output")
            .iter()
            .all(|o| o["type"] == "message"),
        "{answer}"
    );

    // The same by previous_response_id: the stored prompt is reused.
    let next = body(json!({
        "previous_response_id": v["id"],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}],
        "tools": [weather()], "tool_choice": "none", "max_output_tokens": 8, "temperature": 0,
    }));
    create(srv.addr, &ask).await;
    let cont = create(srv.addr, &next).await;
    let u = &cont["usage"];
    let cached = u["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached");
    assert!(
        0 < cached && cached < u["input_tokens"].as_u64().expect("input"),
        "{u}"
    );
    assert_eq!(
        u["input_tokens"], answer["usage"]["input_tokens"],
        "{cont}\n{answer}"
    );

    // JSON held to text.format.
    let pick = body(json!({
        "input": "Pick a colour.", "max_output_tokens": 64, "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "pick", "strict": true, "schema": {
            "type": "object", "properties": {"colour": {"enum": ["red", "green"]}},
            "required": ["colour"], "additionalProperties": false}}},
    }));
    let v = create(srv.addr, &pick).await;
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["text"]["format"]["name"], "pick");
    let text = v["output"][0]["content"][0]["text"].as_str().expect("text");
    let picked: Value = serde_json::from_str(text).expect("JSON text");
    assert!(
        picked["colour"] == "red" || picked["colour"] == "green",
        "{picked}"
    );
    srv.stop().await;
}

#[test]
#[ignore = "needs openai-python and openai-agents: .ci/run runs it with AUBIER_TEST_PYTHON set"]
fn openai_python_and_the_agents_sdk_run_against_the_demo() {
    let python = std::env::var("AUBIER_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let dir = scratch_dir("serve-responses", "python");
    let lock = dir.join("serve.lock");
    let mut p = Proc::serve(
        &["--port", "0", "--lock-file", lock.to_str().expect("path")],
        &dir,
        &[],
    );
    let addr = Proc::listening_address(&p.listening_line());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/responses_test.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{addr}"))
        .output()
        .unwrap_or_else(|e| panic!("{python} (AUBIER_TEST_PYTHON): {e}"));
    assert!(
        out.status.success(),
        "{python} {}: {:?}\n{}{}",
        script.display(),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    p.signal(libc::SIGINT);
    let (code, lines) = p.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
