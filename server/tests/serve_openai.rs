//! A real third-party OpenAI client, `async-openai`, against `aubier serve`: models, chat
//! (non-stream and stream), completions — with the fake engine and with the real engine on the
//! bundled model: on the default backend, and on the `vulkan` backend (lavapipe in CI), whose
//! greedy text is the oracle's.

mod serve_common;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs, FinishReason,
};
use async_openai::types::completions::CreateCompletionRequestArgs;
use async_openai::Client;
use aubier_runtime::backend::registry::BackendSpec;
use aubier_runtime::engine::Model;
use aubier_runtime::store::expert_store::StoreOptions;
use aubier_runtime::store::FastBudget;
use aubier_server::serve::real::RealEngine;
use futures::StreamExt;
use serve_common::*;

fn client(srv: &TestServer) -> Client<OpenAIConfig> {
    Client::with_config(
        OpenAIConfig::new()
            .with_api_base(srv.url("/v1"))
            .with_api_key("unused"),
    )
}

fn chat_request(max_tokens: u32, stream: bool) -> CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model(MODEL_ID)
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("Tell me about the lighthouse.")
            .build()
            .expect("user message")
            .into()])
        .max_completion_tokens(max_tokens)
        .temperature(0.0)
        .seed(7)
        .stream(stream)
        .build()
        .expect("chat request")
}

/// Models, chat non-stream, chat stream (same greedy text), completions non-stream and stream.
/// Returns the non-stream chat text.
async fn exercise(srv: &TestServer, max_tokens: u32) -> String {
    let c = client(srv);
    let models = c.models().list().await.expect("models.list");
    assert_eq!(models.data.len(), 1);
    assert_eq!(models.data[0].id, MODEL_ID);
    assert_eq!(
        c.models().retrieve(MODEL_ID).await.expect("retrieve").id,
        MODEL_ID
    );
    assert!(c.models().retrieve("gpt-4o").await.is_err());

    let resp = c
        .chat()
        .create(chat_request(max_tokens, false))
        .await
        .expect("chat.create");
    assert_eq!(resp.object, "chat.completion");
    assert_eq!(resp.model, MODEL_ID);
    let choice = &resp.choices[0];
    let text = choice.message.content.clone().unwrap_or_default();
    let usage = resp.usage.expect("usage");
    assert!(usage.completion_tokens >= 1 && usage.completion_tokens <= max_tokens);
    assert_eq!(
        usage.total_tokens,
        usage.prompt_tokens + usage.completion_tokens
    );
    match choice.finish_reason {
        Some(FinishReason::Length) => assert_eq!(usage.completion_tokens, max_tokens),
        Some(FinishReason::Stop) => {}
        other => panic!("finish_reason {other:?}"),
    }

    let mut stream = c
        .chat()
        .create_stream(chat_request(max_tokens, true))
        .await
        .expect("chat.create_stream");
    let mut streamed = String::new();
    let mut finish = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("stream chunk");
        for ch in chunk.choices {
            streamed.push_str(ch.delta.content.as_deref().unwrap_or(""));
            if ch.finish_reason.is_some() {
                finish = ch.finish_reason;
            }
        }
    }
    assert_eq!(streamed, text, "greedy stream and non-stream differ");
    assert_eq!(finish, choice.finish_reason);

    let req = CreateCompletionRequestArgs::default()
        .model(MODEL_ID)
        .prompt("The old lighthouse")
        .max_tokens(max_tokens)
        .temperature(0.0)
        .build()
        .expect("completion request");
    let done = c
        .completions()
        .create(req.clone())
        .await
        .expect("completions.create");
    assert_eq!(done.object, "text_completion");
    let whole = done.choices[0].text.clone();
    let mut req_stream = req;
    req_stream.stream = Some(true);
    let mut stream = c
        .completions()
        .create_stream(req_stream)
        .await
        .expect("completions.create_stream");
    let mut streamed = String::new();
    while let Some(chunk) = stream.next().await {
        for ch in chunk.expect("completion chunk").choices {
            streamed.push_str(&ch.text);
        }
    }
    assert_eq!(streamed, whole);
    text
}

#[tokio::test]
async fn async_openai_against_the_fake_engine() {
    let srv = start_fake(script(byte_ids("Scripted reply.")), 4096, limits()).await;
    let text = exercise(&srv, 64).await;
    assert_eq!(text, "Scripted reply.");
    srv.stop().await;
}

/// `aubier serve`'s engine on the bundled model bound to `backend` (the default store and prompt
/// pass size), exercised; the non-stream chat text.
async fn exercise_real(backend: BackendSpec, budget: FastBudget, max_tokens: u32) -> String {
    let made = backend.make().expect("the backend");
    let model = Model::load_backend(&bundled_model(), made, budget)
        .unwrap_or_else(|e| panic!("load the bundled model on {backend:?}: {e}"));
    let kv_max = model.config.n_ctx_train.min(4096);
    let ubatch = aubier_server::run::BackendArgs::default().ubatch;
    let engine =
        RealEngine::open(model, kv_max, &StoreOptions::default(), ubatch).expect("session");
    let srv = start(Box::new(engine), None, limits()).await;
    let text = exercise(&srv, max_tokens).await;
    srv.stop().await;
    text
}

#[tokio::test]
async fn async_openai_against_the_real_engine() {
    exercise_real(BackendSpec::default(), FastBudget::Auto, 8).await;
}

#[tokio::test]
async fn async_openai_against_the_vulkan_backend() {
    let oracle = exercise_real(BackendSpec::named("oracle"), FastBudget::Auto, 12).await;
    let vulkan = exercise_real(BackendSpec::named("vulkan"), FastBudget::Auto, 12).await;
    assert_eq!(vulkan, oracle);
    // A fast store of a quarter of the experts: they rotate, the text stays the oracle's.
    let quarter = exercise_real(BackendSpec::named("vulkan"), FastBudget::Slots(4), 12).await;
    assert_eq!(quarter, oracle);
}
