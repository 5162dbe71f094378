"""`ctax sim` HTTP API against vLLM 0.33.0's OpenAI server as read from its source
(vllm/entrypoints/): start-up, endpoints, completion and chat bodies and SSE formats."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from sim_api_common import (
    CHAT,
    COMPLETION_CHOICE_KEYS,
    COMPLETION_KEYS,
    FINGERPRINT_RE,
    FULL_USAGE_KEYS,
    HEAD_KEYS,
    SMALL_LEN,
    STREAM_CHOICE_KEYS,
    USAGE_KEYS,
    completion,
    token_prompt,
    usage_of,
)
from sim_server import (
    MODEL,
    SimProcess,
    json_events,
    running_sim,
    split_sse,
    stream_post,
    words,
)


# -- start-up -----------------------------------------------------------------------------
def test_ready_line_free_port_on_loopback(sim: SimProcess, client: httpx.Client) -> None:
    # How soon is benchmarks/sim_startup.py's (the < 2 s bar, on a quiet host); a hang is the
    # fixture's ready timeout.
    assert sim.ready_line == f"ready http://127.0.0.1:{sim.port}"
    assert 0 < sim.port < 65536 and sim.port != 8000  # --port 0: the OS picked one
    assert client.get("/health").status_code == 200  # ... and it is the one served
    tcp = Path("/proc/net/tcp")
    if tcp.exists():  # the listening socket's local address is 127.0.0.1 (0100007F), not 0.0.0.0
        listening = [
            line.split()[1]
            for line in tcp.read_text().splitlines()[1:]
            if line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) == sim.port
        ]
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
        "object": "model_permission",
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


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
    assert body["usage"] == {
        **usage_of(n, max_tokens),
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_completion_is_deterministic_for_greedy(client: httpx.Client) -> None:
    body = {"prompt": token_prompt(20, 3), "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    first = completion(client, **body).json()["choices"][0]["text"]
    second = completion(client, **body).json()["choices"][0]["text"]
    assert first == second


def test_streaming_include_usage(client: httpx.Client) -> None:
    n, max_tokens = 11, 9
    response, raw = stream_post(
        client,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": token_prompt(n, 5),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
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
    response, raw = stream_post(
        client,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": token_prompt(8),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        },
    )
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
    response, raw = stream_post(
        client,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": token_prompt(n, 11),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
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
    assert response.json()["usage"] == {
        **usage_of(6, 3),
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


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
    response = client.post(
        "/v1/completions", json={"prompt": token_prompt(3), "max_tokens": 2, "ignore_eos": True, "frobnicate": {"x": 1}}
    )
    assert response.status_code == 200, response.text
    assert response.json()["model"] == MODEL


# -- /v1/chat/completions -----------------------------------------------------------------


def test_chat_streaming(client: httpx.Client) -> None:
    max_tokens = 5
    response, raw = stream_post(
        client,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": CHAT,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    first, *content, usage_chunk = json_events(split_sse(raw))
    assert list(first) == [*HEAD_KEYS, "prompt_token_ids", "prompt_text"]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", first["id"])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert first["prompt_token_ids"] is None and first["prompt_text"] is None
    for chunk in content:
        assert chunk["id"] == first["id"] and chunk["object"] == "chat.completion.chunk"
        assert list(chunk) == [*HEAD_KEYS, "kv_transfer_params"]
        assert list(chunk["choices"][0]["delta"]) == ["content"]
    *middle, last = content
    for chunk in middle:
        assert list(chunk["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        assert chunk["choices"][0]["finish_reason"] is None
    assert list(last["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "weight_versions",
    ]
    assert last["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    assert len(words(text)) == max_tokens
    assert usage_chunk["choices"] == [] and usage_chunk["id"] == first["id"]
    assert list(usage_chunk) == [*HEAD_KEYS, "usage", "system_fingerprint"]
    assert usage_chunk["usage"]["completion_tokens"] == max_tokens
    assert usage_chunk["usage"]["prompt_tokens"] > 0


def test_chat_streaming_without_usage(client: httpx.Client) -> None:
    response, raw = stream_post(
        client,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": CHAT,
            "max_tokens": 3,
            "ignore_eos": True,
            "stream": True,
        },
    )
    first, *content = json_events(split_sse(raw))
    assert all("usage" not in e for e in [first, *content])
    assert FINGERPRINT_RE.fullmatch(content[-1]["system_fingerprint"])
    assert content[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_non_streaming(client: httpx.Client) -> None:
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": CHAT,
            "max_completion_tokens": 4,
            "ignore_eos": True,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", body["id"])
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert list(choice) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "routed_experts",
        "weight_versions",
    ]
    message = choice["message"]
    assert list(message) == ["role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"]
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str) and len(words(message["content"])) == 4
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 4
