"""No response body crashes or hangs a worker: arbitrary bytes (and SSE-like ones) streamed
with status 200 end as one result each, ok or error with a reason, and the next request on the
same worker is served normally; oversize bodies and lines are cut at their bounds."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mini_http_server import (
    MiniServer,
    make_worker,
    plain_response,
    run,
    sse_response,
    worker_exchange,
)

from connector_tax.loadgen.worker.process import MAX_ERROR_BODY
from connector_tax.loadgen.worker.sse import MAX_EVENT_BYTES

PIECES = [
    b"data:",
    b"data: ",
    b"\n",
    b"\r",
    b"\r\n",
    b": ping",
    b"event: error",
    b"[DONE]",
    b"{",
    b"}",
    b'{"choices": [{"text": "a"}]}',
    b'{"choices": [], "usage": {"completion_tokens": 1}}',
    b"\xff",
    b'"',
]


def _streamed(body: bytes, chunked: bool) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    if chunked:
        half = len(body) // 2
        parts = [p for p in (body[:half], body[half:]) if p]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + framed
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def _serve(body_for_first: bytes) -> tuple:
    async def main() -> tuple:
        srv = MiniServer(lambda s, conn, req, data: body_for_first if len(s.bodies) == 1 else sse_response())
        await srv.start()
        # timeouts far past a local exchange's milliseconds: no body here may end as a timeout
        worker = make_worker(srv.port, timeout_s=30.0)
        first = await asyncio.wait_for(worker_exchange(worker, 0), 60)
        second = await asyncio.wait_for(worker_exchange(worker, 1), 60)
        worker.pool.close()
        await srv.stop()
        return first, second

    return run(main)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=400), st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join)), st.booleans())
def test_any_streamed_body_gives_one_result_and_the_worker_goes_on(body: bytes, chunked: bool) -> None:
    first, second = _serve(_streamed(body, chunked))
    assert first.status in ("ok", "error") and first.http_status == 200
    assert (first.status == "ok") == (first.error is None)
    assert first.chunks == len(first.itl_us) // 4 + (1 if first.chunks else 0)
    assert (second.status, second.error, second.chunks) == ("ok", None, 2)


def test_oversize_line_and_error_body_are_cut_at_their_bounds() -> None:
    first, second = _serve(_streamed(b"data: " + b"x" * (MAX_EVENT_BYTES + 10), chunked=True))
    assert (first.status, first.error) == ("error", f"SSE line over {MAX_EVENT_BYTES} bytes")
    assert second.status == "ok"
    first, second = _serve(plain_response("500 Internal Server Error", b"e" * (MAX_ERROR_BODY * 3)))
    assert first.status == "error" and first.error.endswith(f"(body over {MAX_ERROR_BODY} bytes, not read further)")
    assert first.error.startswith("HTTP 500: eeee") and second.status == "ok"
    first, _ = _serve(plain_response("200 OK", b'{"choices": [{"text": "not streamed"}]}'))
    assert first.error.startswith("not an event stream (content-type 'application/json'): HTTP 200: ")
