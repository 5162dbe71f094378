"""`ctax sim` errors as vLLM 0.33.0 answers them: status codes, error bodies, length rules, fuzzed
bodies that must never be a 5xx, and the edge cases where vLLM behaves in a particular way."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest
from sim_api_common import (
    CHAT,
    SMALL_LEN,
    assert_healthy,
    completion,
    token_prompt,
)
from sim_server import (
    MODEL,
    assert_error,
    json_events,
    split_sse,
)

# -- errors -------------------------------------------------------------------------------
BAD_REQUEST = "BadRequestError"
SCHEMA = "Bad Request"  # FastAPI's RequestValidationError as vLLM rewrites it
MISSING_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"

ERROR_CASES: list[tuple[str, str, bytes, int, str, str | None, str]] = [
    # id, path, raw body, status, type, param, message (exact, or "^prefix" / "~substring")
    (
        "malformed_json",
        "/v1/completions",
        b'{"model": "m", "prompt": ',
        400,
        SCHEMA,
        "body.25",
        "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.25', 'msg': 'JSON decode error', "
        "'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}",
    ),
    (
        "empty_body",
        "/v1/completions",
        b"",
        400,
        SCHEMA,
        "body",
        "1 validation error:\n  {'type': 'missing', 'loc': 'body', 'msg': 'Field required', 'input': 'None'}",
    ),
    (
        "json_array",
        "/v1/completions",
        b"[1, 2]",
        400,
        SCHEMA,
        "body",
        "1 validation error:\n  {'type': 'model_attributes_type', 'loc': 'body', 'msg': 'Input should be a "
        "valid dictionary or object to extract fields from', 'input': '<list of 2 items>'}",
    ),
    (
        "missing_prompt",
        "/v1/completions",
        json.dumps({"model": MODEL}).encode(),
        400,
        BAD_REQUEST,
        "prompt",
        MISSING_PROMPT,
    ),
    (
        "empty_prompt",
        "/v1/completions",
        json.dumps({"model": MODEL, "prompt": ""}).encode(),
        400,
        BAD_REQUEST,
        "prompt",
        MISSING_PROMPT,
    ),
    (
        "empty_token_list",
        "/v1/completions",
        json.dumps({"model": MODEL, "prompt": []}).encode(),
        400,
        BAD_REQUEST,
        "prompt",
        MISSING_PROMPT,
    ),
    (
        "unknown_model",
        "/v1/completions",
        json.dumps({"model": "x", "prompt": "hi"}).encode(),
        404,
        "NotFoundError",
        "model",
        f"The model `x` does not exist. Valid aliases: {MODEL}.",
    ),
    (
        "unknown_model_chat",
        "/v1/chat/completions",
        json.dumps({"model": "gpt-x", "messages": CHAT}).encode(),
        404,
        "NotFoundError",
        "model",
        f"The model `gpt-x` does not exist. Valid aliases: {MODEL}.",
    ),
    (
        "negative_max_tokens",
        "/v1/completions",
        json.dumps({"prompt": "hi", "max_tokens": -1}).encode(),
        400,
        BAD_REQUEST,
        "max_tokens",
        "max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)",
    ),
    (
        "zero_max_tokens",
        "/v1/completions",
        json.dumps({"prompt": "hi", "max_tokens": 0}).encode(),
        400,
        BAD_REQUEST,
        "max_tokens",
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
    ),
    (
        "string_max_tokens",
        "/v1/completions",
        json.dumps({"prompt": "hi", "max_tokens": "abc"}).encode(),
        400,
        SCHEMA,
        "body.max_tokens",
        "^1 validation error:\n  {'type': ",
    ),
    (
        "max_tokens_over_len",
        "/v1/completions",
        json.dumps({"prompt": "hi", "max_tokens": 200001}).encode(),
        400,
        BAD_REQUEST,
        "max_tokens",
        "max_tokens=200001 cannot be greater than max_model_len=200000. Please request fewer output tokens. "
        "(parameter=max_tokens, value=200001)",
    ),
    (
        "stream_options_without_stream",
        "/v1/completions",
        json.dumps({"prompt": "hi", "stream_options": {"include_usage": True}}).encode(),
        400,
        BAD_REQUEST,
        "stream_options",
        "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
    ),
    (
        "stream_options_stream_false",
        "/v1/completions",
        json.dumps({"prompt": "hi", "stream": False, "stream_options": {}}).encode(),
        400,
        BAD_REQUEST,
        "stream_options",
        "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
    ),
    (
        "negative_token_id",
        "/v1/completions",
        json.dumps({"prompt": [1, -2]}).encode(),
        400,
        SCHEMA,
        "body.prompt*",
        "~'type': 'greater_than_equal'",
    ),
    (
        "prompt_number",
        "/v1/completions",
        json.dumps({"prompt": 123}).encode(),
        400,
        SCHEMA,
        "body.prompt",
        "~validation error",
    ),
    (
        "negative_temperature",
        "/v1/completions",
        json.dumps({"prompt": "hi", "temperature": -0.5}).encode(),
        400,
        BAD_REQUEST,
        "temperature",
        "^temperature must be non-negative",
    ),
    (
        "chat_without_messages",
        "/v1/chat/completions",
        json.dumps({"model": MODEL}).encode(),
        400,
        SCHEMA,
        "body.messages",
        "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', "
        "'input': '<dict of 1 items>'}",
    ),
    (
        "chat_messages_not_list",
        "/v1/chat/completions",
        json.dumps({"messages": "hi"}).encode(),
        400,
        SCHEMA,
        "body.messages",
        "~validation error",
    ),
    (
        "chat_negative_max_tokens",
        "/v1/chat/completions",
        json.dumps({"messages": CHAT, "max_tokens": -1}).encode(),
        400,
        BAD_REQUEST,
        "max_tokens",
        "max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)",
    ),
]


@pytest.mark.parametrize(
    "path, raw, status, err_type, param, message", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_error_responses(
    client: httpx.Client, path: str, raw: bytes, status: int, err_type: str, param: str | None, message: str
) -> None:
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    expected_param = None if param is None else param.rstrip("*")
    if param is not None and param.endswith("*"):  # param may be refined by an index (body.prompt.1)
        got = response.json()["error"]["param"] if response.status_code == status else None
        assert got is not None and got.startswith(expected_param), response.text
        expected_param = got
    got_message = assert_error(response, status, err_type, expected_param)
    if message.startswith("^"):
        assert got_message.startswith(message[1:]), got_message
    elif message.startswith("~"):
        assert message[1:] in got_message, got_message
    else:
        assert got_message == message
    # compact JSON, as Starlette writes it
    assert response.content.startswith(b'{"error":{"message":')
    assert_healthy(client)


def test_length_errors_and_clamp(small_client: httpx.Client) -> None:
    c = small_client
    # max_tokens above max_model_len: 400, message exactly as in vLLM 0.33 (renderers/params.py)
    message = assert_error(completion(c, prompt="hi", max_tokens=5000), 400, BAD_REQUEST, "max_tokens")
    assert message == (
        "max_tokens=5000 cannot be greater than max_model_len=4096. Please request fewer output "
        "tokens. (parameter=max_tokens, value=5000)"
    )
    # a prompt longer than max_model_len: 400, param input_tokens
    message = assert_error(completion(c, prompt=token_prompt(5000), max_tokens=1), 400, BAD_REQUEST, "input_tokens")
    assert message == (
        "This model's maximum context length is 4096 tokens. However, your prompt contains 5000 input tokens, "
        "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
        "(parameter=input_tokens, value=5000)"
    )
    # prompt == max_model_len: the clamp leaves 0 tokens
    message = assert_error(completion(c, prompt=token_prompt(SMALL_LEN), max_tokens=10), 400, BAD_REQUEST, "max_tokens")
    assert message == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    # prompt + max_tokens > max_model_len, each below: accepted, max_tokens clamped (vLLM 0.33)
    prompt_len, max_tokens = SMALL_LEN - 6, 50
    response = completion(c, prompt=token_prompt(prompt_len, 9), max_tokens=max_tokens, ignore_eos=True)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == prompt_len
    assert body["usage"]["completion_tokens"] == SMALL_LEN - prompt_len == 6
    # exactly max_model_len in total is fine too
    response = completion(c, prompt=token_prompt(SMALL_LEN - 2, 4), max_tokens=2, ignore_eos=True)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2
    assert_healthy(c)


def _junk_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["int", "float", "str", "bool", "null", "list", "dict", "bigint"]
    if depth >= 3:
        kinds = kinds[:5]
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-5, 40)
    if kind == "bigint":
        return rng.choice([2**63, -(2**63), 10**30])
    if kind == "float":
        return rng.choice([0.5, -1.5, 1e308, 3.0])
    if kind == "str":
        return "".join(rng.choice('ab ,."\\\u00e9\u4e2d\n{}[]') for _ in range(rng.randint(0, 12)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_junk_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {
        rng.choice(["prompt", "a", "", "messages", "role"]): _junk_value(rng, depth + 1)
        for _ in range(rng.randint(0, 3))
    }


def _junk_body(rng: random.Random, chat: bool) -> bytes:
    roll = rng.random()
    if roll < 0.25:  # random bytes
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 48)))
    if roll < 0.45:  # any JSON value, nested junk included
        return json.dumps(_junk_value(rng)).encode()
    if roll < 0.55:  # truncated / mangled JSON text
        text = json.dumps({"prompt": "hello", "max_tokens": 3, "x": [1, {"y": None}]})
        cut = rng.randint(0, len(text))
        return (text[:cut] + rng.choice(["", "}", "]", ",", ":", "\x00", "\ufffd"])).encode()
    # a valid request with 0-2 fields replaced by junk (or dropped); max_tokens is never dropped,
    # null or large, so a request that is accepted finishes quickly
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 3, "ignore_eos": rng.random() < 0.5}
    if chat:
        body["messages"] = CHAT
    else:
        body["prompt"] = token_prompt(rng.randint(1, 6), rng.randint(0, 999))
    if rng.random() < 0.4:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    fields = [
        "model",
        "max_tokens",
        "stream",
        "stream_options",
        "temperature",
        "ignore_eos",
        "n",
        "prompt" if not chat else "messages",
    ]
    for key in rng.sample(fields, rng.randint(0, 2)):
        if key == "max_tokens":
            body[key] = rng.choice([-3, 0, 1, 4, "4", 2.5, True, [], {}, 10**12])
        elif rng.random() < 0.2:
            body.pop(key, None)
        elif key == "model":
            body[key] = rng.choice(["x", None, 3, ""])
        elif key == "stream":
            body[key] = rng.choice([True, False, "yes", None, 1])
        elif key == "stream_options":
            body[key] = rng.choice(
                [{"include_usage": True}, {"continuous_usage_stats": True, "include_usage": True}, [], "x", None]
            )
        elif key == "prompt":
            body[key] = rng.choice(
                [[[1, 2]], [["a"]], [[]], [1.5], "hi there", ["hi there"], [-1], [True], _junk_value(rng)]
            )
        elif key == "messages":
            body[key] = rng.choice(
                [
                    [],
                    [{"role": "user"}],
                    [{"content": "x"}],
                    [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                    [{"role": "user", "content": None}],
                    _junk_value(rng),
                ]
            )
        else:
            body[key] = _junk_value(rng)
    return json.dumps(body).encode()


def test_fuzz_garbage_bodies_never_5xx(client: httpx.Client) -> None:
    rng = random.Random(20260526)
    statuses: list[int] = []
    for i in range(50):
        chat = i % 3 == 2
        path = "/v1/chat/completions" if chat else "/v1/completions"
        raw = _junk_body(rng, chat)
        response = client.post(path, content=raw, headers={"content-type": "application/json"})
        statuses.append(response.status_code)
        assert response.status_code == 200 or 400 <= response.status_code < 500, (raw, response.text)
        if response.status_code != 200:
            error = response.json()["error"]
            assert list(error) == ["message", "type", "param", "code"], (raw, response.text)
            assert error["code"] == response.status_code
        elif response.headers["content-type"].startswith("text/event-stream"):
            json_events(split_sse(response.content))
        else:
            assert response.json()["usage"]["completion_tokens"] >= 1
        if i % 10 == 9:
            assert_healthy(client)
    assert_healthy(client)
    assert any(400 <= s < 500 for s in statuses)
    assert statuses.count(200) >= 5, statuses  # the mutations leave some requests valid


# -- edge cases where vLLM 0.33 behaves in a particular way (vllm/entrypoints/serve/) ----------------------
def test_deeply_nested_json_is_a_400(client: httpx.Client) -> None:
    response = client.post("/v1/completions", content=b"[" * 100_000, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.status_code
    assert list(response.json()["error"]) == ["message", "type", "param", "code"]


def test_non_json_content_type_is_rejected(client: httpx.Client) -> None:
    response = client.post(
        "/v1/completions", content=b'{"prompt": "hi", "max_tokens": 1}', headers={"content-type": "text/plain"}
    )
    message = assert_error(response, 400, "Bad Request", None)
    assert message == "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"


def test_validation_runs_before_model_check(client: httpx.Client) -> None:
    response = client.post("/v1/completions", json={"model": "x", "prompt": ""})
    assert_error(response, 400, BAD_REQUEST, "prompt")


def test_chat_content_part_with_non_string_text_is_a_400(client: httpx.Client) -> None:
    response = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}],
            "max_tokens": 2,
        },
    )
    assert 400 <= response.status_code < 500, response.status_code
    assert list(response.json()["error"]) == ["message", "type", "param", "code"]
    assert_healthy(client)
