//! Constrained decoding through the server with the real engine on the bundled model (random
//! weights: it would never call a tool or write JSON on its own, so every call and every JSON
//! document below is the grammar's doing). For many seeds: forced calls (`tool_choice` required or
//! named) and `response_format` JSON parse and validate against their schemas (`jsonschema`);
//! `tool_choice: none` never calls; a single-value `enum` at temperature 0 is exactly that value;
//! the streamed deltas join to the non-stream answer; async-openai parses both into its types;
//! a schema the engine cannot enforce is a 400 naming it.

mod serve_common;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionMessageToolCalls, CreateChatCompletionRequest, FinishReason,
};
use async_openai::Client;
use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::engine::Model;
use aubier_runtime::store::expert_store::StoreOptions;
use aubier_server::serve::real::RealEngine;
use futures::StreamExt;
use serde_json::{json, Value};
use serve_common::*;

/// A server with the real engine on the bundled model (default backend).
async fn start_real() -> TestServer {
    let model = Model::load_with(&bundled_model(), &BackendSpec::default()).expect("bundled model");
    let kv_max = model.config.n_ctx_train.min(4096);
    let ubatch = aubier_server::run::BackendArgs::default().ubatch;
    let engine =
        RealEngine::open(model, kv_max, &StoreOptions::default(), ubatch).expect("session");
    start(Box::new(engine), None, limits()).await
}

/// Arguments every call must satisfy: short, bounded values, so a random model ends them.
fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "city": {"type": "string", "maxLength": 8},
            "alerts": {"type": "boolean"}
        },
        "required": ["unit", "days", "city", "alerts"],
        "additionalProperties": false
    })
}

/// Two strict tools, small, so that each request's prompt (the chat template's system prompt and
/// the rendered tools) stays short to prefill on the debug build.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "weather", "strict": true, "parameters": {
            "type": "object",
            "properties": {"u": {"enum": ["c", "f"]}, "d": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["u", "d"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "time", "strict": true, "parameters": {
            "type": "object", "properties": {"z": {"enum": ["UTC", "CET"]}},
            "required": ["z"], "additionalProperties": false}}}
    ])
}

fn body(extra: Value) -> String {
    let mut b = json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Weather?"}],
        "max_tokens": 100,
    });
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b.to_string()
}

async fn post(srv: &TestServer, body: &str) -> RawResponse {
    raw_request(srv.addr, "POST", "/v1/chat/completions", body.as_bytes()).await
}

fn assert_valid(schema: &Value, instance: &Value) {
    let validator = jsonschema::validator_for(schema).expect("a valid schema");
    assert!(
        validator.is_valid(instance),
        "{instance} does not validate against {schema}"
    );
}

/// The parsed arguments of each call, checked against its tool's schema.
fn checked_calls(message: &Value) -> Vec<(String, Value)> {
    let tools = tools();
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    calls
        .iter()
        .map(|c| {
            let name = c["function"]["name"].as_str().expect("name").to_owned();
            let text = c["function"]["arguments"].as_str().expect("arguments");
            let args: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("arguments {text:?} are not JSON: {e}"));
            let tool = tools
                .as_array()
                .expect("tools")
                .iter()
                .find(|t| t["function"]["name"] == name.as_str())
                .unwrap_or_else(|| panic!("{name} is not a tool"));
            assert_valid(&tool["function"]["parameters"], &args);
            (name, args)
        })
        .collect()
}

#[tokio::test]
async fn forced_calls_parse_and_validate_for_many_seeds() {
    let srv = start_real().await;
    for seed in 0..8 {
        let v = post(
            &srv,
            &body(
                json!({"tools": tools(), "tool_choice": "required", "temperature": 1.0,
                         "seed": seed, "parallel_tool_calls": false}),
            ),
        )
        .await
        .json();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "seed {seed}: {v}");
        assert_eq!(checked_calls(&choice["message"]).len(), 1, "{v}");
    }
    // Parallel calls: a random model keeps calling until the context is full, so the last call
    // may be cut off (finish_reason length); every call before it is complete and valid.
    for seed in 0..4 {
        let v = post(
            &srv,
            &body(
                json!({"tools": tools(), "tool_choice": "required", "temperature": 1.0,
                         "seed": seed}),
            ),
        )
        .await
        .json();
        let choice = &v["choices"][0];
        let mut message = choice["message"].clone();
        let calls = message["tool_calls"].as_array_mut().expect("tool_calls");
        if choice["finish_reason"] == "length" {
            calls.pop();
        } else {
            assert_eq!(choice["finish_reason"], "tool_calls", "seed {seed}: {v}");
        }
        assert!(!calls.is_empty(), "seed {seed}: {v}");
        checked_calls(&message);
    }
    for seed in 0..4 {
        let v = post(
            &srv,
            &body(json!({"tools": tools(), "temperature": 1.0, "seed": seed,
                "tool_choice": {"type": "function", "function": {"name": "time"}}})),
        )
        .await
        .json();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "seed {seed}: {v}");
        let calls = checked_calls(&choice["message"]);
        assert_eq!(calls.len(), 1, "{v}");
        assert_eq!(calls[0].0, "time");
    }
    srv.stop().await;
}

#[tokio::test]
async fn tool_choice_none_never_calls() {
    let srv = start_real().await;
    for seed in 0..4 {
        let v = post(
            &srv,
            &body(
                json!({"tools": tools(), "tool_choice": "none", "temperature": 1.0,
                         "seed": seed, "max_tokens": 40}),
            ),
        )
        .await
        .json();
        let choice = &v["choices"][0];
        assert!(choice["message"].get("tool_calls").is_none(), "{v}");
        assert_ne!(choice["finish_reason"], "tool_calls");
    }
    srv.stop().await;
}

#[tokio::test]
async fn response_format_json_schema_and_json_object_hold_for_many_seeds() {
    let srv = start_real().await;
    let schema = weather_schema();
    let format = json!({"type": "json_schema",
        "json_schema": {"name": "forecast", "schema": schema, "strict": true}});
    for seed in 0..8 {
        let v = post(
            &srv,
            &body(json!({"response_format": format, "temperature": 1.0, "seed": seed})),
        )
        .await
        .json();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "seed {seed}: {v}");
        let text = choice["message"]["content"].as_str().expect("content");
        let doc: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("seed {seed}: {text:?} is not JSON: {e}"));
        assert_valid(&schema, &doc);
    }
    for seed in 0..4 {
        let v = post(
            &srv,
            &body(
                json!({"response_format": {"type": "json_object"}, "temperature": 1.0,
                         "seed": seed, "max_tokens": 400}),
            ),
        )
        .await
        .json();
        let choice = &v["choices"][0];
        if choice["finish_reason"] == "stop" {
            let text = choice["message"]["content"].as_str().expect("content");
            let doc: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("seed {seed}: {text:?} is not JSON: {e}"));
            assert!(doc.is_object(), "{doc}");
        } else {
            // An unbounded object may run out of tokens; what was generated is still a prefix
            // of an object.
            assert_eq!(choice["finish_reason"], "length", "{v}");
            let text = choice["message"]["content"].as_str().expect("content");
            assert!(text.trim_start().starts_with('{'), "{text:?}");
        }
    }
    srv.stop().await;
}

#[tokio::test]
async fn a_single_value_enum_at_temperature_zero_is_exactly_that_value() {
    let srv = start_real().await;
    let schema = json!({"type": "object", "properties": {"answer": {"enum": ["lighthouse keeper"]}},
                        "required": ["answer"], "additionalProperties": false});
    let v = post(
        &srv,
        &body(
            json!({"temperature": 0.0, "response_format": {"type": "json_schema",
            "json_schema": {"name": "one", "schema": schema}}}),
        ),
    )
    .await
    .json();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    let doc: Value = serde_json::from_str(text).expect("JSON");
    assert_eq!(doc, json!({"answer": "lighthouse keeper"}));
    srv.stop().await;
}

#[tokio::test]
async fn streamed_tool_calls_join_to_the_non_stream_answer_and_async_openai_parses_both() {
    let srv = start_real().await;
    let request = json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Weather and time?"}],
        "max_tokens": 100, "temperature": 1.0, "seed": 3,
        "tools": tools(), "tool_choice": "required", "parallel_tool_calls": false,
    });
    let client = Client::with_config(
        OpenAIConfig::new()
            .with_api_base(srv.url("/v1"))
            .with_api_key("unused"),
    );
    let req: CreateChatCompletionRequest =
        serde_json::from_value(request.clone()).expect("async-openai request");
    let resp = client
        .chat()
        .create(req.clone())
        .await
        .expect("chat.create");
    let choice = &resp.choices[0];
    assert_eq!(choice.finish_reason, Some(FinishReason::ToolCalls));
    let calls: Vec<(String, String)> = choice
        .message
        .tool_calls
        .as_ref()
        .expect("tool_calls")
        .iter()
        .map(|c| match c {
            ChatCompletionMessageToolCalls::Function(f) => {
                (f.function.name.clone(), f.function.arguments.clone())
            }
            other => panic!("not a function call: {other:?}"),
        })
        .collect();
    assert!(!calls.is_empty());

    let mut stream = client
        .chat()
        .create_stream(CreateChatCompletionRequest {
            stream: Some(true),
            ..req
        })
        .await
        .expect("create_stream");
    let mut streamed: Vec<(String, String)> = Vec::new();
    let mut finish = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("chunk parses");
        for c in chunk.choices {
            for d in c.delta.tool_calls.unwrap_or_default() {
                let i = d.index as usize;
                let f = d.function.expect("function");
                if i == streamed.len() {
                    assert!(d.id.is_some(), "first delta of call {i} has no id");
                    streamed.push((f.name.expect("name"), String::new()));
                }
                streamed[i].1.push_str(&f.arguments.unwrap_or_default());
            }
            if c.finish_reason.is_some() {
                finish = c.finish_reason;
            }
        }
    }
    assert_eq!(finish, Some(FinishReason::ToolCalls));
    assert_eq!(streamed, calls);
    srv.stop().await;
}

#[tokio::test]
async fn a_schema_the_engine_cannot_enforce_is_a_400_naming_it() {
    let srv = start_real().await;
    let bad = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}},
                     "required": ["a"]});
    let resp = post(
        &srv,
        &body(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "bad", "schema": bad}}})),
    )
    .await;
    assert_eq!(
        resp.status,
        400,
        "{}",
        String::from_utf8_lossy(&resp.body())
    );
    assert_eq!(resp.json()["error"]["param"], "response_format");
    let mut tools = tools();
    tools[1]["function"]["parameters"] = bad;
    let resp = post(&srv, &body(json!({"tools": tools}))).await;
    assert_eq!(
        resp.status,
        400,
        "{}",
        String::from_utf8_lossy(&resp.body())
    );
    assert_eq!(
        resp.json()["error"]["param"],
        "tools[1].function.parameters"
    );
    srv.stop().await;
}

#[tokio::test]
async fn logprobs_are_the_raw_distribution_before_the_grammar_mask() {
    let srv = start_real().await;
    let ask = |extra: Value| {
        let mut b = json!({"temperature": 0.0, "max_tokens": 4, "logprobs": true,
                           "top_logprobs": 5});
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        body(b)
    };
    let free = post(&srv, &ask(json!({}))).await.json();
    let json_mode = post(
        &srv,
        &ask(json!({"response_format": {"type": "json_object"}})),
    )
    .await
    .json();
    let first = |v: &Value| v["choices"][0]["logprobs"]["content"][0].clone();
    // The same prompt, so the same raw distribution at the first position, whatever the mask
    // then lets the sampler take.
    assert_eq!(
        first(&free)["top_logprobs"],
        first(&json_mode)["top_logprobs"]
    );
    let token = first(&json_mode)["token"]
        .as_str()
        .expect("token")
        .to_owned();
    assert!(token.trim_start().starts_with('{'), "{token:?}");
    srv.stop().await;
}

#[tokio::test]
async fn schemas_past_the_grammar_engines_limits_are_400s_and_deep_ones_run() {
    let srv = start_real().await;
    // 600 optional properties: the parser's rows outgrow llguidance's limit once the object
    // opens, after generation began — the request's fault, a 400, not a 500.
    let properties: serde_json::Map<String, Value> = (0..600)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    let wide = json!({"type": "object", "properties": properties});
    let format = json!({"type": "json_schema", "json_schema": {"name": "w", "schema": wide}});
    let resp = post(&srv, &body(json!({"response_format": format, "seed": 1}))).await;
    assert_eq!(
        resp.status,
        400,
        "{}",
        String::from_utf8_lossy(&resp.body())
    );
    assert_eq!(resp.json()["error"]["code"], "grammar_limit");
    // 400 `$defs` deep: compiled and decoded on threads with the stack for it (it overflowed
    // the 2 MiB of a runtime thread and killed the server).
    let mut defs = serde_json::Map::new();
    for i in 0..400 {
        let next = format!("#/$defs/a{}", i + 1);
        defs.insert(
            format!("a{i}"),
            json!({"type": "object", "properties": {"x": {"$ref": next}}}),
        );
    }
    defs.insert("a400".to_owned(), json!({"type": "integer"}));
    let deep = json!({"$ref": "#/$defs/a0", "$defs": defs});
    let format = json!({"type": "json_schema", "json_schema": {"name": "d", "schema": deep}});
    let resp = post(&srv, &body(json!({"response_format": format}))).await;
    assert_eq!(
        resp.status,
        200,
        "{}",
        String::from_utf8_lossy(&resp.body())
    );
    let health = raw_request(srv.addr, "GET", "/health", b"").await;
    assert_eq!(health.status, 200);
    srv.stop().await;
}

/// The read-ahead's counters reach `/metrics`: a server whose engine reads ahead (4 of 16 slots,
/// a budget of 2, sync copies, so that none is late) answers a request that decodes; its loads
/// and the routed slots they served are counted, none late, none pending.
#[tokio::test]
async fn read_ahead_counters_reach_metrics() {
    let model = Model::load_predicting(
        &bundled_model(),
        BackendSpec::named("cpu").make().expect("cpu backend"),
        aubier_runtime::store::FastBudget::Slots(4),
        Some(2),
        &mut aubier_runtime::progress::Quiet,
    )
    .expect("bundled model");
    let opts = StoreOptions {
        prefetch_budget: 2,
        read_ahead: aubier_runtime::store::expert_store::ReadAheadMode::Sync,
        ..StoreOptions::default()
    };
    let ubatch = aubier_server::run::BackendArgs::default().ubatch;
    let kv_max = model.config.n_ctx_train.min(4096);
    let engine = RealEngine::open(model, kv_max, &opts, ubatch).expect("session");
    let srv = start(Box::new(engine), None, limits()).await;
    let body = chat_body("Hello", r#","max_tokens":8,"temperature":0"#);
    let answer = raw_request(srv.addr, "POST", "/v1/chat/completions", body.as_bytes()).await;
    assert_eq!(answer.status, 200, "{:?}", String::from_utf8(answer.body()));
    let text = String::from_utf8(raw_request(srv.addr, "GET", "/metrics", b"").await.body())
        .expect("UTF-8");
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
    };
    let loads = value("aubier_expert_read_ahead_loads_total");
    assert!(loads > 0, "no read-ahead load counted:\n{text}");
    assert!(value("aubier_expert_read_ahead_bytes_total") >= loads);
    assert!(
        value("aubier_expert_read_ahead_served_total") <= value("aubier_expert_fast_hits_total")
    );
    assert_eq!(value("aubier_expert_read_ahead_late_total"), 0);
    assert_eq!(value("aubier_expert_read_ahead_pending_total"), 0);
    srv.stop().await;
}
