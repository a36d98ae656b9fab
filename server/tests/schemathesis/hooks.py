"""Schemathesis hooks of aubier's OpenAPI run (`run.sh` beside this file).

Two rules of `/v1/chat/completions` (and of `/tokenize`'s chat form, which reads its messages and
tools as that route does) compare values, which JSON Schema cannot: `max_tokens` and
`max_completion_tokens` must agree when both are sent, and the chat conversation rules (the first and last roles, role order, content per role, tool calls
each answered by a tool result: runtime/src/text/chat/validate.rs) cannot be written in JSON
Schema, so a schema-valid conversation may rightly be a 400, and random generation almost never
meets the rules. Each positive chat case is therefore mapped onto a conversation the rules
accept: tool turns are dropped, roles and contents are fixed up where a rule requires, a closing
user (or, with continue_final_message, assistant) message is added; a `max_tokens` that
disagrees takes the value of `max_completion_tokens`, and a `min_tokens` above `max_tokens` (vLLM
refuses it) is lowered to it on both generation routes. Tools and formats have rules of the same
kind: tool names distinct, a named `tool_choice` naming one of `tools`, `required` only with
tools; `/v1/responses` (and `/v1/responses/input_tokens`) bodies get the same, their input reduced to messages the rules accept and
without a `previous_response_id` or item references (no response is stored for a random id); and the grammar engine enforces a practical subset of JSON Schema, not every object the
meta-schema allows, so generated schemas are replaced by a fixed one (the tests in
server/tests/serve_structured.rs try many). Every other generated value is kept. A 400 on a
positive case is then a defect. Negative cases are sent as generated.
"""

import schemathesis


def accepted_conversation(body):
    """Rewrites the messages of a chat body in place into a conversation the server accepts."""
    messages = []
    for m in body["messages"]:
        if m["role"] == "tool":
            continue
        m = {k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")}
        role = "system" if m["role"] == "developer" else m["role"]
        if not messages and role not in ("system", "user"):
            m["role"] = role = "user"
        if messages and role == "system" and messages[-1]["role"] == "assistant":
            m["role"] = role = "user"
        content = m.get("content")
        thinking = isinstance(content, list) and any(c["type"] == "thinking" for c in content)
        if role != "assistant" or thinking:
            # Past reasoning belongs to assistant turns only, as chunks or as a field, not both.
            m.pop("reasoning", None)
            m.pop("reasoning_content", None)
        if isinstance(content, list) and role != "assistant":
            # Thinking chunks belong to assistant turns only.
            m["content"] = content = [
                {"type": "text", "text": c["thinking"]} if c["type"] == "thinking" else c
                for c in content
            ]
        if role == "assistant":
            nonempty = (
                any(c["type"] == "thinking" or c["text"] for c in content)
                if isinstance(content, list)
                else bool(content)
            )
            if not nonempty:
                m["content"] = "ok"
        elif content is None:
            m["content"] = ""
        messages.append(m)
    last = messages[-1]["role"] if messages else None
    if body.get("continue_final_message") is True:
        if not messages:
            # A conversation does not start with an answer.
            messages.append({"role": "user", "content": "hi"})
        if last != "assistant":
            messages.append({"role": "assistant", "content": "ok"})
    elif last not in ("user",) and not (len(messages) == 1 and last in ("system", "developer")):
        messages.append({"role": "user", "content": "hi"})
    body["messages"] = messages


SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}


def accepted_structure(body):
    """Rewrites tools / tool_choice / response_format of a chat body in place to meet the rules."""
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, t in enumerate(tools):
            t["function"]["name"] = f"f{i}"
            if isinstance(t["function"].get("parameters"), dict):
                t["function"]["parameters"] = SCHEMA
    has_tools = isinstance(tools, list) and len(tools) > 0
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if has_tools:
            choice["function"]["name"] = "f0"
        else:
            body["tool_choice"] = "auto"
    elif choice == "required" and not has_tools:
        body["tool_choice"] = "auto"
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        fmt["json_schema"]["schema"] = SCHEMA


def accepted_input(body):
    """Rewrites a Responses body in place to meet the rules JSON Schema cannot state: the input's
    messages form a conversation the chat rules accept (other items dropped), a stored response
    is not assumed (previous_response_id and item references dropped), and the tools as in
    accepted_structure."""
    body.pop("previous_response_id", None)
    items = body.get("input")
    if isinstance(items, list):
        messages = []
        for m in items:
            if m.get("type") not in (None, "message") or "role" not in m:
                # Not a message: another item type, or an item_reference without its type.
                continue
            m = dict(m)
            role = "system" if m["role"] == "developer" else m["role"]
            if not messages and role not in ("system", "user"):
                role = "user"
            if messages and role == "system" and messages[-1]["role"] == "assistant":
                role = "user"
            m["role"] = role
            content = m["content"]
            texts = content if isinstance(content, str) else "".join(p["text"] for p in content)
            if role == "assistant" and not texts:
                m["content"] = "ok"
            messages.append(m)
        last = messages[-1]["role"] if messages else None
        if last != "user" and not (len(messages) == 1 and last == "system"):
            messages.append({"role": "user", "content": "hi"})
        body["input"] = messages
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, t in enumerate(tools):
            t["name"] = f"f{i}"
            if isinstance(t.get("parameters"), dict):
                t["parameters"] = SCHEMA
    has_tools = isinstance(tools, list) and len(tools) > 0
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if has_tools:
            choice["name"] = "f0"
        else:
            body["tool_choice"] = "auto"
    elif choice == "required" and not has_tools:
        body["tool_choice"] = "auto"
    fmt = (body.get("text") or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        fmt["schema"] = SCHEMA


def at_most_max_tokens(body, path):
    """Lowers a min_tokens above max_tokens (or above the legacy route's default of 16) to it:
    vLLM's rule, which compares two values."""
    low = body.get("min_tokens")
    if not isinstance(low, (int, float)):
        return
    high = body.get("max_completion_tokens", body.get("max_tokens"))
    if high is None and path == "/v1/completions":
        high = 16
    if isinstance(high, (int, float)) and low > high:
        body["min_tokens"] = high


@schemathesis.hook
def map_case(ctx, case):
    meta = case.meta
    positive = meta is None or meta.generation.mode.is_positive
    if (
        positive
        and case.operation.path in ("/v1/chat/completions", "/tokenize")
        and isinstance(case.body, dict)
        and isinstance(case.body.get("messages"), list)
    ):
        accepted_conversation(case.body)
        accepted_structure(case.body)
        both = [case.body.get(k) for k in ("max_tokens", "max_completion_tokens")]
        if None not in both and both[0] != both[1]:
            case.body["max_tokens"] = both[1]
    if (
        positive
        and case.operation.path in ("/v1/chat/completions", "/v1/completions")
        and isinstance(case.body, dict)
    ):
        at_most_max_tokens(case.body, case.operation.path)
    if (
        positive
        and case.operation.path in ("/v1/responses", "/v1/responses/input_tokens")
        and isinstance(case.body, dict)
    ):
        accepted_input(case.body)
    return case
