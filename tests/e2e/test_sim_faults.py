"""`ctax sim` fault switches: one short-lived server per fault.

The faults run in real time on a live server (the end-to-end tier); their bounds are a hang's, not a
speed's: each fault fires seconds after the server is ready, so that a loaded host's slow client
still meets the server before it. The command-line errors are the fast tier's
(tests/unit/test_sim_fault_flags.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from sim_server import (
    MODEL,
    WAIT_S,
    assert_error,
    json_events,
    launch,
    poll,
    running_sim,
    split_sse,
)

e2e = pytest.mark.e2e  # a live server for each fault, seconds each

ENGINE_DEAD_MESSAGE = "The server had an error while processing your request."


def body(max_tokens: int = 2, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": [11, 12, 13, 14], "max_tokens": max_tokens, "ignore_eos": True, **extra}


# -- start-up faults ----------------------------------------------------------------------
@e2e
def test_fail_start(tmp_path: Path) -> None:
    sim = launch(tmp_path, "--fail-start", "no GPU visible (simulated)")
    try:
        assert sim.proc.wait(WAIT_S) == 3
        assert sim.read_line(WAIT_S) is None  # stdout closed without a ready line
        assert "no GPU visible (simulated)" in sim.stderr()
    finally:
        sim.stop()


@e2e
def test_slow_start(tmp_path: Path) -> None:
    with running_sim(tmp_path, "--slow-start-s", "1.0") as sim:
        # never sooner; how much later than a plain start is load, not the fault (sim_startup's bar)
        assert sim.ready_s is not None and sim.ready_s >= 1.0, sim.ready_s
        assert httpx.get(f"{sim.url}/health", timeout=WAIT_S).status_code == 200


# -- crashes ------------------------------------------------------------------------------
@e2e
def test_crash_after_s(tmp_path: Path) -> None:
    # 2 s after ready: time for a loaded host's client to see it alive first
    with running_sim(tmp_path, "--crash-after-s", "2.0") as sim:
        t_ready = time.monotonic()
        assert httpx.get(f"{sim.url}/health", timeout=WAIT_S).status_code == 200
        code = sim.proc.wait(WAIT_S)
        lived = time.monotonic() - t_ready  # less than its life since ready: seen after the line
        assert code == 70
        assert lived >= 1.0, lived
        assert "simulated crash" in sim.stderr()
        with pytest.raises(httpx.ConnectError):
            httpx.post(f"{sim.url}/v1/completions", json=body(), timeout=2)


@e2e
def test_crash_after_requests(tmp_path: Path) -> None:
    with running_sim(tmp_path, "--crash-after-requests", "3") as sim:
        with httpx.Client(base_url=sim.url, timeout=WAIT_S) as client:
            for _ in range(3):
                assert client.post("/v1/completions", json=body()).status_code == 200
                # neither /health nor a rejected request counts as an accepted request
                assert client.get("/health").status_code == 200
                assert client.post("/v1/completions", json={"prompt": ""}).status_code == 400
            assert sim.proc.poll() is None
            with pytest.raises(httpx.TransportError):  # the 4th accepted request kills it
                client.post("/v1/completions", json=body())
        assert sim.proc.wait(WAIT_S) == 70
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{sim.url}/health", timeout=2)


# -- stalls -------------------------------------------------------------------------------
def _read_until_stall(url: str, max_tokens: int) -> tuple[bytes, bool]:
    """Reads a stream with a 3 s read timeout (a token comes every few ms: a gap that long is a
    stall even on a loaded host); returns what arrived and whether it stalled."""
    timeout = httpx.Timeout(WAIT_S, read=3.0)
    received = b""
    with httpx.Client(base_url=url, timeout=timeout) as client:
        with client.stream("POST", "/v1/completions", json=body(max_tokens, stream=True)) as response:
            assert response.status_code == 200
            try:
                for piece in response.iter_raw():
                    received += piece
            except httpx.ReadTimeout:
                return received, True
    return received, False


def _complete_events(raw: bytes) -> list[dict[str, object]]:
    done = raw[: raw.rfind(b"\n\n") + 2] if b"\n\n" in raw else b""
    return [json.loads(p) for p in split_sse(done)] if done else []


@e2e
def test_hang_after_tokens(tmp_path: Path) -> None:
    with running_sim(tmp_path, "--hang-after-tokens", "3") as sim:
        raw, stalled = _read_until_stall(sim.url, 50)
        assert stalled, raw
        assert b"[DONE]" not in raw
        events = _complete_events(raw)
        text = "".join(e["choices"][0]["text"] for e in events)  # type: ignore[index]
        assert 1 <= len(text.split()) <= 3, text
        assert all(e["choices"][0]["finish_reason"] is None for e in events)  # type: ignore[index]
        # the server itself is fine, and a non-streaming request is not affected
        with httpx.Client(base_url=sim.url, timeout=WAIT_S) as client:
            assert client.get("/health").status_code == 200
            response = client.post("/v1/completions", json=body(5))
            assert response.json()["usage"]["completion_tokens"] == 5


@e2e
def test_hang_after_tokens_delivers_exactly_n(tmp_path: Path) -> None:
    with running_sim(tmp_path, "--hang-after-tokens", "3", logs=False) as sim:
        raw, stalled = _read_until_stall(sim.url, 50)
    assert stalled
    events = _complete_events(raw)
    assert len("".join(e["choices"][0]["text"] for e in events).split()) == 3  # type: ignore[index]


# -- HTTP 500s ----------------------------------------------------------------------------
@e2e
def test_http_500_rate_always(tmp_path: Path) -> None:
    with running_sim(tmp_path, "--http-500-rate", "1.0") as sim:
        with httpx.Client(base_url=sim.url, timeout=WAIT_S) as client:
            for _ in range(5):
                response = client.post("/v1/completions", json=body())
                assert_error(response, 500, "InternalServerError", None)
            response = client.post("/v1/completions", json=body(stream=True))
            assert_error(response, 500, "InternalServerError", None)
            response = client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            )
            assert_error(response, 500, "InternalServerError", None)
            assert client.get("/health").status_code == 200
            assert client.get("/v1/models").status_code == 200
        assert sim.request_records() == []  # nothing reached the engine


def _error_pattern(tmp_path: Path, name: str, n: int) -> list[int]:
    with running_sim(tmp_path, "--http-500-rate", "0.5", "--seed", "1", logs=False, name=name) as sim:
        with httpx.Client(base_url=sim.url, timeout=WAIT_S) as client:
            return [client.post("/v1/completions", json=body(1)).status_code for _ in range(n)]


@e2e
def test_http_500_rate_half_is_seeded(tmp_path: Path) -> None:
    statuses = _error_pattern(tmp_path, "a", 40)
    assert set(statuses) <= {200, 500}
    assert 8 <= statuses.count(500) <= 32, statuses  # between 20 % and 80 %
    assert _error_pattern(tmp_path, "b", 40) == statuses  # same seed, same pattern


# -- malformed SSE ------------------------------------------------------------------------
@e2e
def test_malformed_sse(tmp_path: Path) -> None:
    with running_sim(tmp_path, "--malformed-sse-rate", "1.0") as sim:
        with httpx.Client(base_url=sim.url, timeout=WAIT_S) as client:
            with client.stream("POST", "/v1/completions", json=body(5, stream=True)) as response:
                raw = response.read()
            payloads = split_sse(raw)  # the framing itself stays intact
            assert payloads[-1] == b"[DONE]"
            bad = 0
            for payload in payloads[:-1]:
                try:
                    json.loads(payload)
                except json.JSONDecodeError:
                    bad += 1
            assert bad >= 1
            # non-streaming bodies are untouched
            assert client.post("/v1/completions", json=body(3)).json()["usage"]["completion_tokens"] == 3


@e2e
def test_no_malformed_sse_by_default(tmp_path: Path) -> None:
    with running_sim(tmp_path, logs=False) as sim:
        with httpx.Client(base_url=sim.url, timeout=WAIT_S) as client:
            with client.stream("POST", "/v1/completions", json=body(5, stream=True)) as response:
                events = json_events(split_sse(response.read()))
    assert len(events) >= 1


# -- engine death -------------------------------------------------------------------------
@e2e
def test_health_503_after_s(tmp_path: Path) -> None:
    # 2 s after ready: the requests below must reach a live engine first, on a loaded host too
    with running_sim(tmp_path, "--health-503-after-s", "2.0") as sim:
        t_ready = time.monotonic()
        with httpx.Client(base_url=sim.url, timeout=WAIT_S) as client:
            assert client.get("/health").status_code == 200
            assert client.post("/v1/completions", json=body()).status_code == 200
            time.sleep(max(0.0, 2.2 - (time.monotonic() - t_ready)))
            # the death is the server's loop timer: on a loaded host it may fire late, not never
            health = poll(lambda: (r := client.get("/health")).status_code == 503 and r, timeout=WAIT_S)
            assert health and health.status_code == 503
            assert health.content == b""
            response = client.post("/v1/completions", json=body())
            message = assert_error(response, 500, "InternalServerError", None)
            assert message == ENGINE_DEAD_MESSAGE
            assert response.json() == {
                "error": {"message": ENGINE_DEAD_MESSAGE, "type": "InternalServerError", "param": None, "code": 500}
            }
            response = client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            )
            assert assert_error(response, 500, "InternalServerError", None) == ENGINE_DEAD_MESSAGE


# The engine dies 1 s after ready: the stream below has begun by then, on a loaded host too.
DIES_AFTER = ("--health-503-after-s", "1.0")


def _stream_through_death(sim_url: str) -> tuple[bytes, Exception | None, float]:
    """A long stream that is in flight when the engine dies; returns what arrived, the
    transport error if the stream broke off, and how long it lasted. A 5 s gap between reads
    is a hang (a token comes every few ms)."""
    raw, error = b"", None
    t0 = time.monotonic()
    with httpx.Client(base_url=sim_url, timeout=httpx.Timeout(WAIT_S, read=5.0)) as client:
        try:
            with client.stream("POST", "/v1/completions", json=body(3000, stream=True)) as response:
                assert response.status_code == 200
                for piece in response.iter_raw():
                    raw += piece
        except httpx.TransportError as exc:
            error = exc
    return raw, error, time.monotonic() - t0


@e2e
def test_stream_in_flight_when_engine_dies_ends_promptly(tmp_path: Path) -> None:
    with running_sim(tmp_path, *DIES_AFTER) as sim:
        raw, error, lasted = _stream_through_death(sim.url)
        assert not isinstance(error, httpx.ReadTimeout), "the stream hung after the engine died"
        # 3,000 tokens take about 20 s to stream; one that ends at the death, about 1 s
        assert lasted < 10.0, lasted
        assert b'"finish_reason":"length"' not in raw  # 3000 tokens could not have finished
        # The record is written once the server's handler has ended, which can be a moment after
        # the client saw the stream end (seen: none yet beside a second test process): a bail-out.
        deadline = time.monotonic() + 10.0
        while not (records := sim.request_records()) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(records) == 1
    assert records[0]["status"] == "error"
    assert 0 < records[0]["completion_tokens"] < 3000


@e2e
def test_stream_in_flight_when_engine_dies_gets_error_event(tmp_path: Path) -> None:
    with running_sim(tmp_path, *DIES_AFTER, logs=False) as sim:
        raw, error, _ = _stream_through_death(sim.url)
    assert error is None, repr(error)
    payloads = split_sse(raw)
    assert payloads[-1] == b"[DONE]"
    assert json.loads(payloads[-2])["error"]["code"] == 500
