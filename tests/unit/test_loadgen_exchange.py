"""Worker._exchange, the request exchange of a load-generator worker: one retry on a dropped
keep-alive connection (and only one), non-200 answers with their message, a stalled stream timed out."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))

from mini_http_server import SSE_BODY, MiniServer, make_worker, plain_response, run, sse_response, worker_exchange  # noqa: E402

from connector_tax.loadgen import ipc  # noqa: E402
from connector_tax.loadgen.worker.sse import SSEReader  # noqa: E402


# -- Worker._exchange: retry once on a dropped keep-alive connection ---------------------
def test_request_on_a_connection_the_server_dropped_is_retried_once_and_succeeds() -> None:
    # The race a keep-alive client must survive: the server closes a connection just as a
    # request is written to it. Here the second request on every connection is dropped.
    def behave(srv: MiniServer, conn: int, req: int, data: bytes) -> bytes | None:
        return None if req == 1 else sse_response()

    async def main() -> None:
        srv = MiniServer(behave)
        await srv.start()
        worker = make_worker(srv.port)
        r0 = await worker_exchange(worker, 0)
        r1 = await worker_exchange(worker, 1)
        for r in (r0, r1):
            assert (r.status, r.error, r.http_status, r.chunks, r.completion_tokens) == ("ok", None, 200, 2, 2)
        # Request 1 went out twice: on connection 0 (dropped), then on a fresh connection 1.
        assert srv.requests_per_conn == [2, 1]
        assert r1.t_send_ns is not None and r1.t_send_ns > r0.t_last_token_ns
        worker.pool.close()
        await srv.stop()

    run(main)


def test_retry_happens_only_once() -> None:
    # Every request after the very first is dropped: the retry on a fresh connection fails too,
    # and the request is an error rather than a loop of retries.
    def behave(srv: MiniServer, conn: int, req: int, data: bytes) -> bytes | None:
        return sse_response() if conn == 0 and req == 0 else None

    async def main() -> None:
        srv = MiniServer(behave)
        await srv.start()
        worker = make_worker(srv.port)
        assert (await worker_exchange(worker, 0)).status == "ok"
        r = await worker_exchange(worker, 1)
        assert (r.status, r.error, r.http_status, r.t_first_token_ns) == (
            "error",
            "ConnectionClosed: connection closed by server",
            0,
            None,
        )
        assert srv.requests_per_conn == [2, 1]
        # A fresh connection that fails is not retried at all.
        r = await worker_exchange(worker, 2)
        assert r.status == "error"
        assert srv.requests_per_conn == [2, 1, 1]
        worker.pool.close()
        await srv.stop()

    run(main)


@pytest.mark.parametrize("chunked", [False, True])
def test_exchange_reports_non_200_with_its_message(chunked: bool) -> None:
    def behave(srv: MiniServer, conn: int, req: int, data: bytes) -> bytes:
        if req == 0:
            return plain_response(
                "503 Service Unavailable", b'{"error":{"message":"overloaded","type":"x","code":503}}', chunked=chunked
            )
        if req == 1:
            return plain_response("404 Not Found", b'{"detail":"Not Found"}', chunked=chunked)
        return sse_response()

    async def main() -> None:
        srv = MiniServer(behave)
        await srv.start()
        worker = make_worker(srv.port)
        r0, r1, r2 = [await worker_exchange(worker, i) for i in range(3)]
        assert (r0.status, r0.http_status, r0.error, r0.chunks) == ("error", 503, "HTTP 503: overloaded", 0)
        assert (r1.status, r1.http_status, r1.error) == ("error", 404, 'HTTP 404: {"detail":"Not Found"}')
        assert (r2.status, r2.http_status) == ("ok", 200)
        assert srv.requests_per_conn == [3]  # error bodies were read to the end: the connection lived on
        worker.pool.close()
        await srv.stop()

    run(main)


def test_exchange_times_out_a_stalled_stream() -> None:
    first_event = SSE_BODY.split(b"\n\n")[0] + b"\n\n"
    # Headers and one token, then nothing: the stream stalls without closing.
    stalled = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n" % (len(first_event), first_event)
    )

    async def main() -> None:
        srv = MiniServer(lambda *a: stalled)
        await srv.start()
        worker = make_worker(srv.port, timeout_s=0.2)
        spec = ipc.RequestSpec(0, "t_c-0", 8, 2)
        body = worker.builder.body(spec.request_id, 8, 2, None)
        data = (worker._head % (spec.request_id, len(body))).encode() + body
        task = asyncio.get_running_loop().create_task(worker._exchange(spec, data, SSEReader(), None))
        worker._tasks[0] = task  # as _fire registers it, so the timeout can find it
        r = await task
        elapsed_ns = time.monotonic_ns() - r.t_send_ns
        assert (r.status, r.error, r.http_status, r.chunks) == ("timeout", "timeout after 0.2 s", 200, 1)
        assert r.t_first_token_ns == r.t_last_token_ns
        # never before its 0.2 s (libuv timers have 1 ms granularity); how late is a loaded host's
        # loop, so the bound above only tells the request timeout from a much longer one
        assert 0.19e9 <= elapsed_ns < 5e9, elapsed_ns
        for _ in range(200):  # the server sees the close within a loop pass or two; a busy host's take longer
            await asyncio.sleep(0.05)
            if srv.open_now == 0:
                break
        assert srv.open_now == 0  # the timed-out connection was aborted, not pooled
        worker.pool.close()
        await srv.stop()

    run(main)
