"""`ctax sim` observability: X-Request-Id and the request log, /metrics, concurrent streams, a
client that disconnects, and the engine-step log."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from sim_api_common import (
    CHAT,
    assert_healthy,
    completion,
    token_prompt,
)
from sim_server import (
    MODEL,
    SimProcess,
    json_events,
    poll,
    running_sim,
    scrape,
    split_sse,
    stream_post,
    words,
)


# -- X-Request-Id and the request log -----------------------------------------------------
def _record(sim: SimProcess, request_id: str) -> dict[str, Any] | None:
    found = [r for r in sim.request_records() if r["request_id"] == request_id]
    assert len(found) <= 1, found
    return found[0] if found else None


def _check_record(record: dict[str, Any] | None, prompt: int, completion: int, status: str = "ok") -> None:
    assert record is not None
    assert list(record) == [
        "request_id",
        "t_arrival_ns",
        "t_first_token_ns",
        "t_last_token_ns",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "finish_reason",
        "status",
    ]
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
    response = client.post(
        "/v1/chat/completions",
        json={"messages": CHAT, "max_tokens": 3, "ignore_eos": True},
        headers={"X-Request-Id": rid},
    )
    assert response.json()["id"] == f"chatcmpl-{rid}"
    _check_record(poll(lambda: _record(sim, rid)), response.json()["usage"]["prompt_tokens"], 3)


def test_request_log_first_token_before_last_for_streams(sim: SimProcess, client: httpx.Client) -> None:
    rid = f"ttft-{uuid.uuid4().hex[:8]}"
    stream_post(
        client,
        "/v1/completions",
        {"prompt": token_prompt(30), "max_tokens": 8, "ignore_eos": True, "stream": True},
        headers={"X-Request-Id": rid},
    )
    record = poll(lambda: _record(sim, rid))
    _check_record(record, 30, 8)
    # 8 tokens from separate engine steps (~4 ms each): last strictly after first
    assert record["t_last_token_ns"] - record["t_first_token_ns"] >= 5 * 1_000_000


# -- /metrics -----------------------------------------------------------------------------
LABELLED = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
]


def test_metrics(client: httpx.Client) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    before = scrape(client)
    types = {name: before.families[name].type for name in LABELLED}
    assert types == {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
    }
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
    ttft_les = sorted(
        {float(s.labels["le"]) for s in after.families["vllm:time_to_first_token_seconds"].samples if "le" in s.labels}
    )
    assert ttft_les[:4] == [0.001, 0.005, 0.01, 0.02] and ttft_les[-2:] == [2560.0, float("inf")]


# -- concurrency --------------------------------------------------------------------------
def test_twenty_concurrent_streams(sim: SimProcess) -> None:
    def one(i: int) -> tuple[int, int, int, str | None]:
        max_tokens = 5 + i % 7
        with httpx.Client(base_url=sim.url, timeout=20.0) as c:
            response, raw = stream_post(
                c,
                "/v1/completions",
                {
                    "prompt": token_prompt(10 + 3 * i, 500 + i),
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
        assert response.status_code == 200
        *content, final = json_events(split_sse(raw))
        text = "".join(e["choices"][0]["text"] for e in content)
        return (
            max_tokens,
            len(words(text)),
            final["usage"]["completion_tokens"],
            content[-1]["choices"][0]["finish_reason"],
        )

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one, range(20)))
    for max_tokens, streamed, counted, reason in results:
        assert streamed == counted == max_tokens
        assert reason == "length"


# -- client disconnect --------------------------------------------------------------------
def _disconnect_mid_stream(sim: SimProcess, rid: str) -> None:
    with httpx.Client(base_url=sim.url, timeout=10.0) as c:
        with c.stream(
            "POST",
            "/v1/completions",
            headers={"X-Request-Id": rid},
            json={
                "prompt": token_prompt(16),
                "max_tokens": 5000,
                "ignore_eos": True,
                "stream": True,
            },
        ) as response:
            assert response.status_code == 200
            chunks = response.iter_raw()
            next(chunks)
            next(chunks)
        # leaving both blocks closes the connection mid-stream


def test_client_disconnect_aborts_request(sim: SimProcess, client: httpx.Client) -> None:
    rid = f"gone-{uuid.uuid4().hex[:8]}"
    _disconnect_mid_stream(sim, rid)
    record = poll(lambda: _record(sim, rid))
    assert record is not None, "no request-log record after the disconnect"
    assert record["status"] == "aborted"
    assert record["completion_tokens"] < 200  # generation stopped long before 5000
    # the engine went idle: no new steps are being logged
    steps = len(sim.step_records())
    time.sleep(0.2)
    assert len(sim.step_records()) == steps
    assert_healthy(client)


def test_running_gauge_back_to_zero_after_disconnect(sim: SimProcess, client: httpx.Client) -> None:
    _disconnect_mid_stream(sim, f"gone-{uuid.uuid4().hex[:8]}")
    values = poll(lambda: scrape(client).value("vllm:num_requests_running") == 0)
    assert values, scrape(client).value("vllm:num_requests_running")


def test_running_gauge_zero_when_idle(client: httpx.Client) -> None:
    assert completion(client, prompt=token_prompt(5), max_tokens=2, ignore_eos=True).status_code == 200
    assert poll(lambda: scrape(client).value("vllm:num_requests_running") == 0)


# -- step log -----------------------------------------------------------------------------
STEP_KEYS = [
    "t_ns",
    "step_id",
    "step_duration_us",
    "build_meta_us",
    "get_finished_us",
    "start_load_kv_us",
    "num_running",
    "num_waiting",
    "prefill_tokens",
    "decode_tokens",
]


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
