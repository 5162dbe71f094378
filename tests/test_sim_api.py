"""`ctax sim` HTTP API against vLLM 0.33.0's OpenAI server as read from its source
(vllm/entrypoints/): endpoints, body and SSE formats, errors, metrics, request and step logs. One module-scoped server with default faults does most of the work.
"""

from __future__ import annotations

import json
import random
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim_server import (
    MODEL,
    SimProcess,
    assert_error,
    json_events,
    poll,
    running_sim,
    scrape,
    small_config,
    split_sse,
    stream_post,
    words,
)

SMALL_LEN = 4096
COMPLETION_KEYS = ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                   "usage", "kv_transfer_params", "ec_transfer_params", "metrics"]  # fmt: skip
COMPLETION_CHOICE_KEYS = ["index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
                          "prompt_logprobs", "prompt_token_ids", "routed_experts", "weight_versions"]  # fmt: skip
FULL_USAGE_KEYS = ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
                   "completion_tokens_details"]  # fmt: skip
USAGE_KEYS = ["prompt_tokens", "total_tokens", "completion_tokens"]
STREAM_CHOICE_KEYS = ["index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids",
                      "token_ids", "weight_versions"]  # fmt: skip
HEAD_KEYS = ["id", "object", "created", "model", "choices"]
FINGERPRINT_RE = re.compile(r"vllm-0\.33\.0-[0-9a-f]{8}")


def token_prompt(n: int, offset: int = 0) -> list[int]:
    return [(offset + 7 * i) % 30000 + 1 for i in range(n)]


def usage_of(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


# -- fixtures -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    with running_sim(tmp_path_factory.mktemp("sim-api")) as server:
        yield server


@pytest.fixture(scope="module")
def client(sim: SimProcess):
    with httpx.Client(base_url=sim.url, timeout=10.0) as c:
        yield c


@pytest.fixture(scope="module")
def small_client(tmp_path_factory: pytest.TempPathFactory):
    """A server whose max_model_len is 4096, for the context-length rules."""
    workdir = tmp_path_factory.mktemp("sim-small")
    config = small_config(workdir / "small.yaml", SMALL_LEN)
    with running_sim(workdir, config=config, logs=False) as server:
        with httpx.Client(base_url=server.url, timeout=10.0) as c:
            yield c


def completion(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/v1/completions", json={"model": MODEL, **body})


def assert_healthy(client: httpx.Client) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.content == b""


# -- start-up -----------------------------------------------------------------------------
def test_ready_line_fast_free_port_on_loopback(sim: SimProcess, client: httpx.Client) -> None:
    assert sim.ready_line == f"ready http://127.0.0.1:{sim.port}"
    # A bound that only catches a hang: the < 2 s start-up bar is benchmarks/sim_startup.py's,
    # measured on a quiet machine; a timed unit test on a shared CI core cannot hold it.
    assert sim.ready_s is not None and sim.ready_s < 15.0, sim.ready_s
    assert 0 < sim.port < 65536 and sim.port != 8000  # --port 0: the OS picked one
    assert client.get("/health").status_code == 200  # ... and it is the one served
    tcp = Path("/proc/net/tcp")
    if tcp.exists():  # the listening socket's local address is 127.0.0.1 (0100007F), not 0.0.0.0
        listening = [
            line.split()[1] for line in tcp.read_text().splitlines()[1:]
            if line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) == sim.port
        ]  # fmt: skip
        assert listening == [f"0100007F:{sim.port:04X}"]


def test_two_servers_get_different_free_ports(sim: SimProcess, tmp_path: Path) -> None:
    with running_sim(tmp_path, logs=False) as other:
        assert other.port != sim.port
        assert httpx.get(f"{other.url}/health", timeout=5).status_code == 200


# -- simple endpoints ---------------------------------------------------------------------
def test_health(client: httpx.Client) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.content == b""


def test_models(client: httpx.Client) -> None:
    before = int(time.time())
    response = client.get("/v1/models")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["object", "data"]
    assert body["object"] == "list"
    assert len(body["data"]) == 1
    card = body["data"][0]
    assert list(card) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"]
    assert card["id"] == MODEL
    assert card["object"] == "model"
    assert card["owned_by"] == "vllm"
    assert card["parent"] is None
    assert card["max_model_len"] == 200000
    assert before - 1 <= card["created"] <= time.time() + 1
    assert isinstance(card["permission"], list) and len(card["permission"]) == 1
    perm = card["permission"][0]
    assert re.fullmatch(r"modelperm-[0-9a-f]{16}", perm["id"])
    assert {k: v for k, v in perm.items() if k not in ("id", "created")} == {
        "object": "model_permission", "allow_create_engine": False, "allow_sampling": True,
        "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
        "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False,
    }  # fmt: skip


def test_small_server_reports_its_max_model_len(small_client: httpx.Client) -> None:
    assert small_client.get("/v1/models").json()["data"][0]["max_model_len"] == SMALL_LEN


def test_version(client: httpx.Client) -> None:
    response = client.get("/version")
    assert response.status_code == 200
    assert response.json() == {"version": "0.33.0"}


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_unknown_route_404(client: httpx.Client, method: str) -> None:
    response = client.request(method, "/v1/nope")
    assert response.status_code == 404
    assert response.content == b'{"detail":"Not Found"}'


def test_wrong_method_405(client: httpx.Client) -> None:
    response = client.get("/v1/completions")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json() == {"detail": "Method Not Allowed"}
    assert client.get("/v1/chat/completions").headers["allow"] == "POST"
    assert client.post("/health").status_code == 405


# -- /v1/completions ----------------------------------------------------------------------
def test_completion_non_streaming_exact(client: httpx.Client) -> None:
    n, max_tokens = 37, 7
    t0 = int(time.time())
    response = completion(client, prompt=token_prompt(n), max_tokens=max_tokens, ignore_eos=True, temperature=0)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    # compact JSON, as Starlette's JSONResponse writes it
    assert b": " not in response.content and b", " not in response.content.replace(b"\\", b"")
    body = response.json()
    assert list(body) == COMPLETION_KEYS
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}", body["id"]), body["id"]
    assert body["object"] == "text_completion"
    assert t0 - 1 <= body["created"] <= time.time() + 1
    assert body["model"] == MODEL
    assert body["service_tier"] is None
    assert FINGERPRINT_RE.fullmatch(body["system_fingerprint"])
    assert body["kv_transfer_params"] is None and body["ec_transfer_params"] is None and body["metrics"] is None
    assert len(body["choices"]) == 1
    choice = body["choices"][0]
    assert list(choice) == COMPLETION_CHOICE_KEYS
    assert choice["index"] == 0
    assert choice["finish_reason"] == "length"
    assert all(choice[k] is None for k in COMPLETION_CHOICE_KEYS[2:] if k != "finish_reason")
    assert len(words(choice["text"])) == max_tokens
    assert list(body["usage"]) == FULL_USAGE_KEYS
    assert body["usage"] == {**usage_of(n, max_tokens), "prompt_tokens_details": None,
                             "completion_tokens_details": None}  # fmt: skip


def test_completion_is_deterministic_for_greedy(client: httpx.Client) -> None:
    body = {"prompt": token_prompt(20, 3), "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    first = completion(client, **body).json()["choices"][0]["text"]
    second = completion(client, **body).json()["choices"][0]["text"]
    assert first == second


def test_streaming_include_usage(client: httpx.Client) -> None:
    n, max_tokens = 11, 9
    response, raw = stream_post(client, "/v1/completions", {
        "model": MODEL, "prompt": token_prompt(n, 5), "max_tokens": max_tokens, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    })  # fmt: skip
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert "content-length" not in response.headers
    events = json_events(split_sse(raw))
    *content, usage_chunk = events
    assert content, "no content chunk"
    ids = {e["id"] for e in events}
    assert len(ids) == 1 and re.fullmatch(r"cmpl-[0-9a-f]{16}", ids.pop())
    assert len({e["created"] for e in events}) == 1
    for chunk in content:
        assert list(chunk) == [*HEAD_KEYS, "kv_transfer_params"], chunk  # no usage, no fingerprint
        assert chunk["object"] == "text_completion" and chunk["model"] == MODEL
        assert chunk["kv_transfer_params"] is None
        (choice,) = chunk["choices"]
        assert list(choice) == STREAM_CHOICE_KEYS
        assert choice["index"] == 0 and choice["logprobs"] is None and choice["stop_reason"] is None
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (len(content) - 1) + ["length"]
    text = "".join(c["choices"][0]["text"] for c in content)
    assert len(words(text)) == max_tokens
    assert list(usage_chunk) == [*HEAD_KEYS, "usage", "system_fingerprint"]
    assert usage_chunk["choices"] == []
    assert list(usage_chunk["usage"]) == USAGE_KEYS
    assert usage_chunk["usage"] == usage_of(n, max_tokens)
    assert FINGERPRINT_RE.fullmatch(usage_chunk["system_fingerprint"])


def test_streaming_without_usage_has_fingerprint_on_final_chunk(client: httpx.Client) -> None:
    max_tokens = 6
    response, raw = stream_post(client, "/v1/completions", {
        "model": MODEL, "prompt": token_prompt(8), "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
    })  # fmt: skip
    assert response.status_code == 200
    events = json_events(split_sse(raw))
    assert all("usage" not in e for e in events)
    assert all(e["choices"] for e in events)
    *middle, last = events
    for chunk in middle:
        assert list(chunk) == [*HEAD_KEYS, "kv_transfer_params"]
        assert chunk["choices"][0]["finish_reason"] is None
    assert list(last) == [*HEAD_KEYS, "system_fingerprint", "kv_transfer_params"]
    assert FINGERPRINT_RE.fullmatch(last["system_fingerprint"])
    assert last["choices"][0]["finish_reason"] == "length"
    assert len(words("".join(e["choices"][0]["text"] for e in events))) == max_tokens


def test_streaming_continuous_usage(client: httpx.Client) -> None:
    n, max_tokens = 9, 7
    response, raw = stream_post(client, "/v1/completions", {
        "model": MODEL, "prompt": token_prompt(n, 11), "max_tokens": max_tokens, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    })  # fmt: skip
    assert response.status_code == 200
    *content, final = json_events(split_sse(raw))
    seen = 0
    for chunk in content:
        assert list(chunk) == [*HEAD_KEYS, "usage", "kv_transfer_params"]
        seen += len(words(chunk["choices"][0]["text"]))
        assert list(chunk["usage"]) == USAGE_KEYS
        assert chunk["usage"] == usage_of(n, seen)  # cumulative
    assert seen == max_tokens
    assert final["choices"] == [] and final["usage"] == usage_of(n, max_tokens)


def test_text_prompt_and_list_of_one_string(client: httpx.Client) -> None:
    text = "Write a function that adds two numbers, then test it."
    a = completion(client, prompt=text, max_tokens=4, ignore_eos=True)
    b = completion(client, prompt=[text], max_tokens=4, ignore_eos=True)
    assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
    ua, ub = a.json()["usage"], b.json()["usage"]
    assert ua["prompt_tokens"] > 0
    assert ua["prompt_tokens"] == ub["prompt_tokens"]
    assert ua["completion_tokens"] == ub["completion_tokens"] == 4
    assert a.json()["choices"][0]["text"] == b.json()["choices"][0]["text"]
    longer = completion(client, prompt=text + " And again, please.", max_tokens=1).json()["usage"]
    assert longer["prompt_tokens"] > ua["prompt_tokens"]


def test_token_batch_of_one(client: httpx.Client) -> None:
    response = completion(client, prompt=[token_prompt(6)], max_tokens=3, ignore_eos=True)
    assert response.status_code == 200, response.text
    assert response.json()["usage"] == {**usage_of(6, 3), "prompt_tokens_details": None,
                                        "completion_tokens_details": None}  # fmt: skip


def test_without_ignore_eos_stops_within_max_tokens(client: httpx.Client) -> None:
    reasons = set()
    for offset in range(4):
        max_tokens = 24
        body = completion(client, prompt=token_prompt(10, 100 * offset), max_tokens=max_tokens).json()
        choice, usage = body["choices"][0], body["usage"]
        assert choice["finish_reason"] in ("stop", "length")
        assert 1 <= usage["completion_tokens"] <= max_tokens
        if choice["finish_reason"] == "length":
            assert usage["completion_tokens"] == max_tokens
        else:
            assert usage["completion_tokens"] < max_tokens
        assert len(words(choice["text"])) == usage["completion_tokens"]
        reasons.add(choice["finish_reason"])
    assert reasons  # at least one answer


def test_max_tokens_null_means_16(client: httpx.Client) -> None:
    body = completion(client, prompt=token_prompt(4), max_tokens=None, ignore_eos=True).json()
    assert body["usage"]["completion_tokens"] == 16


def test_unknown_fields_are_ignored_and_model_is_optional(client: httpx.Client) -> None:
    response = client.post("/v1/completions", json={"prompt": token_prompt(3), "max_tokens": 2,
                                                    "ignore_eos": True, "frobnicate": {"x": 1}})  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json()["model"] == MODEL


# -- /v1/chat/completions -----------------------------------------------------------------
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]


def test_chat_streaming(client: httpx.Client) -> None:
    max_tokens = 5
    response, raw = stream_post(client, "/v1/chat/completions", {
        "model": MODEL, "messages": CHAT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    })  # fmt: skip
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    first, *content, usage_chunk = json_events(split_sse(raw))
    assert list(first) == [*HEAD_KEYS, "prompt_token_ids", "prompt_text"]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", first["id"])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}]  # fmt: skip
    assert first["prompt_token_ids"] is None and first["prompt_text"] is None
    for chunk in content:
        assert chunk["id"] == first["id"] and chunk["object"] == "chat.completion.chunk"
        assert list(chunk) == [*HEAD_KEYS, "kv_transfer_params"]
        assert list(chunk["choices"][0]["delta"]) == ["content"]
    *middle, last = content
    for chunk in middle:
        assert list(chunk["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        assert chunk["choices"][0]["finish_reason"] is None
    assert list(last["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "stop_reason",
                                        "token_ids", "weight_versions"]  # fmt: skip
    assert last["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    assert len(words(text)) == max_tokens
    assert usage_chunk["choices"] == [] and usage_chunk["id"] == first["id"]
    assert list(usage_chunk) == [*HEAD_KEYS, "usage", "system_fingerprint"]
    assert usage_chunk["usage"]["completion_tokens"] == max_tokens
    assert usage_chunk["usage"]["prompt_tokens"] > 0


def test_chat_streaming_without_usage(client: httpx.Client) -> None:
    response, raw = stream_post(client, "/v1/chat/completions", {
        "model": MODEL, "messages": CHAT, "max_tokens": 3, "ignore_eos": True, "stream": True,
    })  # fmt: skip
    first, *content = json_events(split_sse(raw))
    assert all("usage" not in e for e in [first, *content])
    assert FINGERPRINT_RE.fullmatch(content[-1]["system_fingerprint"])
    assert content[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_non_streaming(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": CHAT, "max_completion_tokens": 4, "ignore_eos": True,
    })  # fmt: skip
    assert response.status_code == 200, response.text
    body = response.json()
    assert list(body) == ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                          "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
                          "ec_transfer_params", "metrics"]  # fmt: skip
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", body["id"])
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
                            "routed_experts", "weight_versions"]  # fmt: skip
    message = choice["message"]
    assert list(message) == ["role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"]
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str) and len(words(message["content"])) == 4
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 4


# -- errors -------------------------------------------------------------------------------
BAD_REQUEST = "BadRequestError"
SCHEMA = "Bad Request"  # FastAPI's RequestValidationError as vLLM rewrites it
MISSING_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"

ERROR_CASES: list[tuple[str, str, bytes, int, str, str | None, str]] = [
    # id, path, raw body, status, type, param, message (exact, or "^prefix" / "~substring")
    ("malformed_json", "/v1/completions", b'{"model": "m", "prompt": ', 400, SCHEMA, "body.25",
     "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.25', 'msg': 'JSON decode error', "
     "'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}"),
    ("empty_body", "/v1/completions", b"", 400, SCHEMA, "body",
     "1 validation error:\n  {'type': 'missing', 'loc': 'body', 'msg': 'Field required', 'input': 'None'}"),
    ("json_array", "/v1/completions", b"[1, 2]", 400, SCHEMA, "body",
     "1 validation error:\n  {'type': 'model_attributes_type', 'loc': 'body', 'msg': 'Input should be a "
     "valid dictionary or object to extract fields from', 'input': '<list of 2 items>'}"),
    ("missing_prompt", "/v1/completions", json.dumps({"model": MODEL}).encode(), 400, BAD_REQUEST, "prompt",
     MISSING_PROMPT),
    ("empty_prompt", "/v1/completions", json.dumps({"model": MODEL, "prompt": ""}).encode(), 400, BAD_REQUEST,
     "prompt", MISSING_PROMPT),
    ("empty_token_list", "/v1/completions", json.dumps({"model": MODEL, "prompt": []}).encode(), 400,
     BAD_REQUEST, "prompt", MISSING_PROMPT),
    ("unknown_model", "/v1/completions", json.dumps({"model": "x", "prompt": "hi"}).encode(), 404,
     "NotFoundError", "model", f"The model `x` does not exist. Valid aliases: {MODEL}."),
    ("unknown_model_chat", "/v1/chat/completions",
     json.dumps({"model": "gpt-x", "messages": CHAT}).encode(), 404, "NotFoundError", "model",
     f"The model `gpt-x` does not exist. Valid aliases: {MODEL}."),
    ("negative_max_tokens", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": -1}).encode(), 400,
     BAD_REQUEST, "max_tokens", "max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)"),
    ("zero_max_tokens", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 0}).encode(), 400,
     BAD_REQUEST, "max_tokens", "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
    ("string_max_tokens", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": "abc"}).encode(), 400,
     SCHEMA, "body.max_tokens", "^1 validation error:\n  {'type': "),
    ("max_tokens_over_len", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 200001}).encode(),
     400, BAD_REQUEST, "max_tokens",
     "max_tokens=200001 cannot be greater than max_model_len=200000. Please request fewer output tokens. "
     "(parameter=max_tokens, value=200001)"),
    ("stream_options_without_stream", "/v1/completions",
     json.dumps({"prompt": "hi", "stream_options": {"include_usage": True}}).encode(), 400, BAD_REQUEST,
     "stream_options", "Stream options can only be defined when `stream=True`. (parameter=stream_options)"),
    ("stream_options_stream_false", "/v1/completions",
     json.dumps({"prompt": "hi", "stream": False, "stream_options": {}}).encode(), 400, BAD_REQUEST,
     "stream_options", "Stream options can only be defined when `stream=True`. (parameter=stream_options)"),
    ("negative_token_id", "/v1/completions", json.dumps({"prompt": [1, -2]}).encode(), 400, SCHEMA,
     "body.prompt*", "~'type': 'greater_than_equal'"),
    ("prompt_number", "/v1/completions", json.dumps({"prompt": 123}).encode(), 400, SCHEMA, "body.prompt",
     "~validation error"),
    ("negative_temperature", "/v1/completions", json.dumps({"prompt": "hi", "temperature": -0.5}).encode(),
     400, BAD_REQUEST, "temperature", "^temperature must be non-negative"),
    ("chat_without_messages", "/v1/chat/completions", json.dumps({"model": MODEL}).encode(), 400, SCHEMA,
     "body.messages",
     "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', "
     "'input': '<dict of 1 items>'}"),
    ("chat_messages_not_list", "/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), 400, SCHEMA,
     "body.messages", "~validation error"),
    ("chat_negative_max_tokens", "/v1/chat/completions",
     json.dumps({"messages": CHAT, "max_tokens": -1}).encode(), 400, BAD_REQUEST, "max_tokens",
     "max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)"),
]  # fmt: skip


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
    assert message == ("max_tokens=5000 cannot be greater than max_model_len=4096. Please request fewer output "
                       "tokens. (parameter=max_tokens, value=5000)")  # fmt: skip
    # a prompt longer than max_model_len: 400, param input_tokens
    message = assert_error(completion(c, prompt=token_prompt(5000), max_tokens=1), 400, BAD_REQUEST, "input_tokens")
    assert message == (
        "This model's maximum context length is 4096 tokens. However, your prompt contains 5000 input tokens, "
        "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
        "(parameter=input_tokens, value=5000)"
    )
    # prompt == max_model_len: the clamp leaves 0 tokens
    message = assert_error(completion(c, prompt=token_prompt(SMALL_LEN), max_tokens=10), 400, BAD_REQUEST,
                           "max_tokens")  # fmt: skip
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
        return "".join(rng.choice("ab ,.\"\\\u00e9\u4e2d\n{}[]") for _ in range(rng.randint(0, 12)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_junk_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["prompt", "a", "", "messages", "role"]): _junk_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}  # fmt: skip


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
    fields = ["model", "max_tokens", "stream", "stream_options", "temperature", "ignore_eos", "n",
              "prompt" if not chat else "messages"]  # fmt: skip
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
            body[key] = rng.choice([{"include_usage": True}, {"continuous_usage_stats": True, "include_usage": True},
                                    [], "x", None])  # fmt: skip
        elif key == "prompt":
            body[key] = rng.choice([[[1, 2]], [["a"]], [[]], [1.5], "hi there", ["hi there"], [-1], [True],
                                    _junk_value(rng)])  # fmt: skip
        elif key == "messages":
            body[key] = rng.choice([[], [{"role": "user"}], [{"content": "x"}],
                                    [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                    [{"role": "user", "content": None}], _junk_value(rng)])  # fmt: skip
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


# -- X-Request-Id and the request log -----------------------------------------------------
def _record(sim: SimProcess, request_id: str) -> dict[str, Any] | None:
    found = [r for r in sim.request_records() if r["request_id"] == request_id]
    assert len(found) <= 1, found
    return found[0] if found else None


def _check_record(record: dict[str, Any] | None, prompt: int, completion: int, status: str = "ok") -> None:
    assert record is not None
    assert list(record) == ["request_id", "t_arrival_ns", "t_first_token_ns", "t_last_token_ns", "prompt_tokens",
                            "completion_tokens", "cached_tokens", "finish_reason", "status"]  # fmt: skip
    assert record["t_arrival_ns"] <= record["t_first_token_ns"] <= record["t_last_token_ns"]
    assert record["t_last_token_ns"] <= time.monotonic_ns()  # the same clock as ours
    assert record["prompt_tokens"] == prompt
    assert record["completion_tokens"] == completion
    assert 0 <= record["cached_tokens"] <= prompt
    assert record["finish_reason"] == "length"
    assert record["status"] == status


def test_x_request_id_and_request_log(sim: SimProcess, client: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": token_prompt(12, 77), "max_tokens": 5, "ignore_eos": True}
    response = client.post("/v1/completions", json=body, headers={"X-Request-Id": "abc"})
    assert response.json()["id"] == "cmpl-abc"
    assert "x-request-id" not in response.headers  # echoed only with --enable-request-id-headers
    _check_record(poll(lambda: _record(sim, "abc")), 12, 5)

    rid = f"stream-{uuid.uuid4().hex[:8]}"
    _, raw = stream_post(client, "/v1/completions", {**body, "stream": True}, headers={"X-Request-Id": rid})
    events = json_events(split_sse(raw))
    assert {e["id"] for e in events} == {f"cmpl-{rid}"}
    _check_record(poll(lambda: _record(sim, rid)), 12, 5)

    rid = f"chat-{uuid.uuid4().hex[:8]}"
    response = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3, "ignore_eos": True},
                           headers={"X-Request-Id": rid})  # fmt: skip
    assert response.json()["id"] == f"chatcmpl-{rid}"
    _check_record(poll(lambda: _record(sim, rid)), response.json()["usage"]["prompt_tokens"], 3)


def test_request_log_first_token_before_last_for_streams(sim: SimProcess, client: httpx.Client) -> None:
    rid = f"ttft-{uuid.uuid4().hex[:8]}"
    stream_post(client, "/v1/completions", {"prompt": token_prompt(30), "max_tokens": 8, "ignore_eos": True,
                                            "stream": True}, headers={"X-Request-Id": rid})  # fmt: skip
    record = poll(lambda: _record(sim, rid))
    _check_record(record, 30, 8)
    # 8 tokens from separate engine steps (~4 ms each): last strictly after first
    assert record["t_last_token_ns"] - record["t_first_token_ns"] >= 5 * 1_000_000


# -- /metrics -----------------------------------------------------------------------------
LABELLED = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
            "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"]  # fmt: skip


def test_metrics(client: httpx.Client) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    before = scrape(client)
    types = {name: before.families[name].type for name in LABELLED}
    assert types == {
        "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge", "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter", "vllm:time_to_first_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
    }  # fmt: skip
    for name in LABELLED:
        for sample in before.families[name].samples:
            assert sample.labels["model_name"] == MODEL and sample.labels["engine"] == "0", sample
    assert "vllm:engine_core_failed" not in before.families
    assert not any("engine_core_failed" in key[0] for key in before.samples)
    for reason in ("stop", "length", "abort", "error", "repetition"):  # all pre-created
        before.value("vllm:request_success_total", finished_reason=reason)
    assert 0.0 <= before.value("vllm:kv_cache_usage_perc") <= 1.0

    shapes = [(13, 3), (21, 5), (34, 8)]
    for i, (n, m) in enumerate(shapes):
        r = completion(client, prompt=token_prompt(n, 1000 + i), max_tokens=m, ignore_eos=True)
        assert r.status_code == 200
    sent_prompt, sent_generated = sum(n for n, _ in shapes), sum(m for _, m in shapes)

    def delta(after, name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    def settled():
        after = scrape(client)
        done = delta(after, "vllm:request_success_total", finished_reason="length") >= len(shapes)
        counted = delta(after, "vllm:generation_tokens_total") >= sent_generated
        return after if done and counted else None

    after = poll(settled) or scrape(client)
    assert delta(after, "vllm:prompt_tokens_total") == sent_prompt
    assert delta(after, "vllm:generation_tokens_total") == sent_generated
    assert delta(after, "vllm:request_success_total", finished_reason="length") == len(shapes)
    assert delta(after, "vllm:request_success_total", finished_reason="stop") == 0
    assert delta(after, "vllm:time_to_first_token_seconds_count") == len(shapes)
    assert delta(after, "vllm:e2e_request_latency_seconds_count") == len(shapes)
    assert delta(after, "vllm:e2e_request_latency_seconds_sum") > 0
    inf = after.value("vllm:time_to_first_token_seconds_bucket", le="+Inf")
    assert inf == after.value("vllm:time_to_first_token_seconds_count")
    assert after.value("vllm:num_requests_waiting") == 0
    assert 0.0 <= after.value("vllm:kv_cache_usage_perc") <= 1.0
    # vLLM's bucket boundaries (vllm/v1/metrics/buckets.py)
    ttft_les = sorted({float(s.labels["le"]) for s in after.families["vllm:time_to_first_token_seconds"].samples
                       if "le" in s.labels})  # fmt: skip
    assert ttft_les[:4] == [0.001, 0.005, 0.01, 0.02] and ttft_les[-2:] == [2560.0, float("inf")]


# -- concurrency --------------------------------------------------------------------------
def test_twenty_concurrent_streams(sim: SimProcess) -> None:
    def one(i: int) -> tuple[int, int, int, str | None]:
        max_tokens = 5 + i % 7
        with httpx.Client(base_url=sim.url, timeout=20.0) as c:
            response, raw = stream_post(c, "/v1/completions", {
                "prompt": token_prompt(10 + 3 * i, 500 + i), "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True},
            })  # fmt: skip
        assert response.status_code == 200
        *content, final = json_events(split_sse(raw))
        text = "".join(e["choices"][0]["text"] for e in content)
        return max_tokens, len(words(text)), final["usage"]["completion_tokens"], content[-1]["choices"][0][
            "finish_reason"]

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one, range(20)))
    for max_tokens, streamed, counted, reason in results:
        assert streamed == counted == max_tokens
        assert reason == "length"


# -- client disconnect --------------------------------------------------------------------
def _disconnect_mid_stream(sim: SimProcess, rid: str) -> None:
    with httpx.Client(base_url=sim.url, timeout=10.0) as c:
        with c.stream("POST", "/v1/completions", headers={"X-Request-Id": rid}, json={
            "prompt": token_prompt(16), "max_tokens": 5000, "ignore_eos": True, "stream": True,
        }) as response:  # fmt: skip
            assert response.status_code == 200
            chunks = response.iter_raw()
            next(chunks)
            next(chunks)
        # leaving both blocks closes the connection mid-stream


def test_client_disconnect_aborts_request(sim: SimProcess, client: httpx.Client) -> None:
    rid = f"gone-{uuid.uuid4().hex[:8]}"
    _disconnect_mid_stream(sim, rid)
    record = poll(lambda: _record(sim, rid), timeout=1.0)
    assert record is not None, "no request-log record within 1 s of the disconnect"
    assert record["status"] == "aborted"
    assert record["completion_tokens"] < 200  # generation stopped long before 5000
    # the engine went idle: no new steps are being logged
    steps = len(sim.step_records())
    time.sleep(0.2)
    assert len(sim.step_records()) == steps
    assert_healthy(client)


def test_running_gauge_back_to_zero_after_disconnect(sim: SimProcess, client: httpx.Client) -> None:
    _disconnect_mid_stream(sim, f"gone-{uuid.uuid4().hex[:8]}")
    values = poll(lambda: scrape(client).value("vllm:num_requests_running") == 0, timeout=1.0)
    assert values, scrape(client).value("vllm:num_requests_running")


def test_running_gauge_zero_when_idle(client: httpx.Client) -> None:
    assert completion(client, prompt=token_prompt(5), max_tokens=2, ignore_eos=True).status_code == 200
    assert poll(lambda: scrape(client).value("vllm:num_requests_running") == 0, timeout=1.0)


# -- step log -----------------------------------------------------------------------------
STEP_KEYS = ["t_ns", "step_id", "step_duration_us", "build_meta_us", "get_finished_us", "start_load_kv_us",
             "num_running", "num_waiting", "prefill_tokens", "decode_tokens"]  # fmt: skip


def _check_steps(steps: list[dict[str, Any]], connector: bool) -> None:
    assert steps
    for step in steps:
        assert list(step)[: len(STEP_KEYS)] == STEP_KEYS, step
        assert step["step_duration_us"] > 0
        assert step["num_running"] >= 0 and step["num_waiting"] >= 0
        assert step["prefill_tokens"] >= 0 and step["decode_tokens"] >= 0
        assert step["prefill_tokens"] + step["decode_tokens"] > 0
        for hook in ("build_meta_us", "get_finished_us", "start_load_kv_us"):
            if connector:
                assert isinstance(step[hook], (int, float)) and step[hook] >= 0, step
            else:
                assert step[hook] is None, step
    ids = [s["step_id"] for s in steps]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    t = [s["t_ns"] for s in steps]
    assert t == sorted(t)


def test_step_log_mooncake(sim: SimProcess, client: httpx.Client) -> None:
    completion(client, prompt=token_prompt(40), max_tokens=3, ignore_eos=True)
    steps = sim.step_records()
    _check_steps(steps, connector=True)
    assert any(s["prefill_tokens"] > 0 for s in steps) and any(s["decode_tokens"] > 0 for s in steps)


def test_step_log_plain_has_no_connector_timings(tmp_path: Path) -> None:
    with running_sim(tmp_path, connector="plain") as plain:
        with httpx.Client(base_url=plain.url, timeout=10) as c:
            r = c.post("/v1/completions", json={"prompt": token_prompt(20), "max_tokens": 4, "ignore_eos": True})
            assert r.status_code == 200
        steps = plain.step_records()
    # prefill step + 3 decode steps (the first token comes from the prefill step)
    assert len(steps) == 4
    _check_steps(steps, connector=False)
    assert steps[0]["step_id"] == 1
    assert [s["prefill_tokens"] for s in steps] == [20, 0, 0, 0]
    assert [s["decode_tokens"] for s in steps] == [0, 1, 1, 1]


# -- edge cases where vLLM 0.33 behaves in a particular way (vllm/entrypoints/serve/) ----------------------
def test_deeply_nested_json_is_a_400(client: httpx.Client) -> None:
    response = client.post("/v1/completions", content=b"[" * 100_000, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.status_code
    assert list(response.json()["error"]) == ["message", "type", "param", "code"]


def test_non_json_content_type_is_rejected(client: httpx.Client) -> None:
    response = client.post("/v1/completions", content=b'{"prompt": "hi", "max_tokens": 1}',
                           headers={"content-type": "text/plain"})  # fmt: skip
    message = assert_error(response, 400, "Bad Request", None)
    assert message == "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"


def test_validation_runs_before_model_check(client: httpx.Client) -> None:
    response = client.post("/v1/completions", json={"model": "x", "prompt": ""})
    assert_error(response, 400, BAD_REQUEST, "prompt")


def test_chat_content_part_with_non_string_text_is_a_400(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}], "max_tokens": 2,
    })  # fmt: skip
    assert 400 <= response.status_code < 500, response.status_code
    assert list(response.json()["error"]) == ["message", "type", "param", "code"]
    assert_healthy(client)
