"""`POST /v1/responses` as its clients use it, against `aubier serve` on the bundled demo model.

Usage: python responses_test.py http://127.0.0.1:PORT (run by server/tests/serve_responses.rs, which
starts the server; .ci/run installs openai and openai-agents into the interpreter it names).

openai-python: `client.responses.create` parses the answer (`output_text`), streamed and not, and
a function call answered by its output through `previous_response_id` reuses the prompt cache;
the stored response comes back by `responses.retrieve`, the continuation's input by
`responses.input_items.list` (paged), the same conversation sent as `item_reference`s reads the
same prompt, and `responses.delete` drops it; `responses.input_tokens.count` gives a response's
input_tokens.
The OpenAI Agents SDK on its default model (the Responses API) runs a tool round trip streamed,
chained by `previous_response_id`, then a continued run. The demo model's text is gibberish: the
tool calls are forced (`tool_choice` required) and only the protocol is checked.
"""

import asyncio
import json
import os
import sys
from typing import Literal

# Never send traces anywhere: the test talks to nothing but the server on loopback.
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"

from agents import (  # noqa: E402
    Agent,
    ModelSettings,
    Runner,
    ToolsToFinalOutputResult,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, BadRequestError, NotFoundError, OpenAI  # noqa: E402

MODEL = "ms4-tiny256-q2k"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def openai_python(url):
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    r = client.responses.create(model=MODEL, input="Hello!", max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_"), r
    assert r.status in ("completed", "incomplete"), r
    assert isinstance(r.output_text, str), r
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage
    counted = client.responses.input_tokens.count(model=MODEL, input="Hello!")
    assert counted.input_tokens == r.usage.input_tokens, (counted, r.usage)

    events = list(
        client.responses.create(
            model=MODEL, input="Hello!", max_output_tokens=8, temperature=0, stream=True
        )
    )
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] in ("response.completed", "response.incomplete"), types
    assert [e.sequence_number for e in events] == list(range(len(events))), types
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text, (deltas, final.output_text)
    assert final.output_text == r.output_text, "greedy: the same text streamed or not"

    first = client.responses.create(
        model=MODEL,
        instructions="Answer with the tools.",
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=48,
        temperature=0,
    )
    call = next(o for o in first.output if o.type == "function_call")
    assert call.name == "get_weather" and call.call_id.startswith("call_"), call
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome"), call
    second = client.responses.create(
        model=MODEL,
        instructions="Answer with the tools.",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
    )
    assert second.previous_response_id == first.id, second
    cached = second.usage.input_tokens_details.cached_tokens
    assert 0 < cached < second.usage.input_tokens, second.usage

    got = client.responses.retrieve(first.id)
    assert got.model_dump() == first.model_dump(), (got, first)
    # The continuation's input: the first response's input message, its call (the id of its
    # output item), then the call's output; paged oldest first, one at a time.
    items = list(client.responses.input_items.list(second.id, order="asc", limit=1))
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"], items
    assert items[0].role == "user" and items[0].content[0].text == "Weather in Paris?", items
    assert items[1].id == call.id and items[1].call_id == call.call_id, (items, call)
    assert items[2].call_id == call.call_id and items[2].output == "sunny", items
    # The same conversation by item references (one without its optional type), the output
    # sent with an id of the client's: the stored items take their places, so the prompt and
    # the greedy answer are the continuation's, and the output is listed under its own id.
    referred = client.responses.create(
        model=MODEL,
        instructions="Answer with the tools.",
        input=[
            {"type": "item_reference", "id": items[0].id},
            {"id": call.id},
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": "sunny",
                "id": "fco_mine",
            },
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
    )
    assert referred.usage.input_tokens == second.usage.input_tokens, (referred.usage, second.usage)
    assert referred.output_text == second.output_text, (referred, second)
    listed = [i.id for i in client.responses.input_items.list(referred.id, order="asc")]
    assert listed == [items[0].id, call.id, "fco_mine"], listed
    try:
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_none"}])
        raise AssertionError("an unknown item was referred to")
    except BadRequestError as e:
        assert e.param == "input[0].id" and "msg_none" in e.message, e
    deleted = client.responses.delete(first.id)
    assert deleted is None, deleted
    for fetch in (lambda: client.responses.retrieve(first.id), lambda: client.responses.delete(first.id)):
        try:
            fetch()
            raise AssertionError("a deleted response was found")
        except NotFoundError:
            pass
    assert client.responses.retrieve(second.id).id == second.id
    print("openai-python: ok, cached", cached, "of", second.usage.input_tokens)


async def agents_sdk(url):
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=f"{url}/v1", api_key="unused"), False)
    calls = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny"

    def every_second_call(_context, _results):
        # Each forced call gets its output sent back once; the second one ends the run.
        return ToolsToFinalOutputResult(is_final_output=len(calls) % 2 == 0, final_output="done")

    agent = Agent(
        name="weather",
        instructions="Answer with the tools.",
        model=MODEL,
        tools=[get_weather],
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=48, temperature=0
        ),
        reset_tool_choice=False,
        tool_use_behavior=every_second_call,
    )
    run = Runner.run_streamed(agent, "Weather in Paris?", max_turns=4, auto_previous_response_id=True)
    kinds = [e.type async for e in run.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds, kinds
    assert run.final_output == "done" and len(calls) == 2, (run.final_output, calls)
    assert len(run.raw_responses) == 2, run.raw_responses
    chained = run.raw_responses[1].usage.input_tokens_details.cached_tokens
    assert chained > 0, run.raw_responses[1].usage

    last_output = [i for i in run.new_items if i.type == "tool_call_output_item"][-1]
    more = Runner.run_streamed(
        agent,
        [last_output.to_input_item(), {"role": "user", "content": "And in Rome?"}],
        previous_response_id=run.last_response_id,
        max_turns=4,
    )
    async for _ in more.stream_events():
        pass
    assert more.final_output == "done" and len(calls) == 4, (more.final_output, calls)
    continued = more.raw_responses[0].usage.input_tokens_details.cached_tokens
    assert continued > 0, more.raw_responses[0].usage
    print("openai-agents: ok, cached", chained, "then", continued)


if __name__ == "__main__":
    openai_python(sys.argv[1])
    asyncio.run(agents_sdk(sys.argv[1]))
