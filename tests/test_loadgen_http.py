"""The worker's HTTP/1.1 client (http.py) and its request exchange (Worker._exchange), against a
real `ctax sim` and against a tiny asyncio server written here, which counts connections and
requests per connection and can misbehave on cue (close an idle keep-alive connection, drop a
request on a reused connection, answer non-200 with bodies framed either way).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

sys.path.insert(0, str(Path(__file__).parent))
from sim_server import MODEL, running_sim  # noqa: E402

from connector_tax.loadgen import ipc  # noqa: E402
from connector_tax.loadgen.firetimer import FireTimer  # noqa: E402
from connector_tax.loadgen.http import ConnectionPool, HttpConnection, Response  # noqa: E402
from connector_tax.loadgen.prompts import BodySettings  # noqa: E402
from connector_tax.loadgen.sse import SSEReader  # noqa: E402
from connector_tax.loadgen.worker import Worker, WorkerConfig  # noqa: E402

SSE_BODY = (
    b'data: {"id":"cmpl-1","choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n'
    b'data: {"id":"cmpl-1","choices":[{"index":0,"text":" b","finish_reason":"length"}]}\n\n'
    b'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


# -- a tiny HTTP/1.1 server -------------------------------------------------------------
class MiniServer:
    """Counts connections and the requests each one carried. `behave(server, conn_no,
    req_no_on_conn, request_bytes)` returns the response bytes, or None to close the
    connection without answering; `idle_close_s` closes a connection that long after its last
    response."""

    def __init__(self, behave: Callable[..., bytes | None] | None = None, idle_close_s: float | None = None,
                 delay_s: float = 0.0) -> None:  # fmt: skip
        self.behave = behave or (lambda *a: sse_response())
        self.idle_close_s = idle_close_s
        self.delay_s = delay_s
        self.requests_per_conn: list[int] = []
        self.open_now = 0
        self.max_open = 0
        self.active = 0
        self.max_active = 0
        self.bodies: list[bytes] = []
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.get_running_loop().create_server(lambda: _MiniProto(self), "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


class _MiniProto(asyncio.Protocol):
    def __init__(self, srv: MiniServer) -> None:
        self.srv = srv
        self.buf = b""
        self.conn_no = len(srv.requests_per_conn)
        srv.requests_per_conn.append(0)
        self.idle: asyncio.TimerHandle | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.srv.open_now += 1
        self.srv.max_open = max(self.srv.max_open, self.srv.open_now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.srv.open_now -= 1
        if self.idle:
            self.idle.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode()
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(self.buf) < end:
                return
            request, self.buf = self.buf[:end], self.buf[end:]
            self._handle(request)

    def _handle(self, request: bytes) -> None:
        srv = self.srv
        if self.idle:
            self.idle.cancel()
        req_no = srv.requests_per_conn[self.conn_no]
        srv.requests_per_conn[self.conn_no] += 1
        srv.bodies.append(request.split(b"\r\n\r\n", 1)[1])
        response = srv.behave(srv, self.conn_no, req_no, request)
        if response is None:
            self.transport.close()
            return
        srv.active += 1
        srv.max_active = max(srv.max_active, srv.active)
        loop = asyncio.get_running_loop()
        loop.call_later(srv.delay_s, self._respond, response)

    def _respond(self, response: bytes) -> None:
        self.srv.active -= 1
        if self.transport.is_closing():
            return
        self.transport.write(response)
        if b"\r\nConnection: close\r\n" in response:
            self.transport.close()
        elif self.srv.idle_close_s is not None:
            self.idle = asyncio.get_running_loop().call_later(self.srv.idle_close_s, self.transport.close)


def sse_response(body: bytes = SSE_BODY) -> bytes:
    """Chunked transfer encoding, one HTTP chunk per SSE event, as uvicorn streams."""
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in body.split(b"\n\n")[:-1] for e in [e + b"\n\n"])
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunks + b"0\r\n\r\n")  # fmt: skip


def plain_response(status: str, body: bytes, close: bool = False, chunked: bool = False) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
    if close:
        head += "Connection: close\r\n"
    if chunked:
        half = len(body) // 2
        framed = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + framed
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def request_bytes(port: int, body: bytes = b'{"x":1}', rid: str = "r") -> bytes:
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"X-Request-Id: {rid}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip


async def exchange(pool: ConnectionPool, data: bytes) -> tuple[int, bytes, Any]:
    conn = await pool.acquire()
    response = conn.send(data)
    status = await response.wait_headers()
    raw = await response.read_all()
    pool.release(conn)
    return status, raw, conn


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return uvloop.run(coro_fn())


# -- the pool against the mini server ---------------------------------------------------
def test_sequential_requests_reuse_one_connection() -> None:
    async def main() -> None:
        srv = MiniServer()
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=8)
        conns = set()
        for i in range(25):
            status, raw, conn = await exchange(pool, request_bytes(srv.port, rid=str(i)))
            assert (status, raw) == (200, SSE_BODY)
            conns.add(id(conn))
        assert len(conns) == 1
        assert srv.requests_per_conn == [25]
        pool.close()
        await srv.stop()

    run(main)


def test_pool_bound_is_respected() -> None:
    async def main() -> None:
        srv = MiniServer(delay_s=0.03)
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=3)
        results = await asyncio.gather(*(exchange(pool, request_bytes(srv.port)) for _ in range(12)))
        assert [(s, r) for s, r, _ in results] == [(200, SSE_BODY)] * 12
        assert len({id(c) for _, _, c in results}) == 3
        assert srv.max_open == 3 and srv.max_active == 3
        assert sorted(srv.requests_per_conn) == [4, 4, 4]
        pool.close()
        await srv.stop()

    run(main)


def test_idle_connection_closed_by_server_is_not_reused() -> None:
    async def main() -> None:
        srv = MiniServer(idle_close_s=0.02)
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=4)
        s1, _, c1 = await exchange(pool, request_bytes(srv.port))
        await asyncio.sleep(0.15)  # the server closes it meanwhile; the pool must notice
        assert c1.closed
        s2, raw, c2 = await exchange(pool, request_bytes(srv.port))
        assert (s1, s2, raw) == (200, 200, SSE_BODY)
        assert c2 is not c1
        assert srv.requests_per_conn == [1, 1]
        pool.close()
        await srv.stop()

    run(main)


@pytest.mark.parametrize("chunked", [False, True])
def test_non_200_body_read_fully_and_connection_reused(chunked: bool) -> None:
    error = json.dumps({"error": {"message": "boom " + "x" * 3000, "type": "InternalServerError"}}).encode()

    def behave(srv: MiniServer, conn: int, req: int, data: bytes) -> bytes:
        return plain_response("500 Internal Server Error", error, chunked=chunked) if req == 0 else sse_response()

    async def main() -> None:
        srv = MiniServer(behave)
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=4)
        s1, raw1, c1 = await exchange(pool, request_bytes(srv.port))
        s2, raw2, c2 = await exchange(pool, request_bytes(srv.port))
        assert (s1, raw1) == (500, error)
        assert (s2, raw2) == (200, SSE_BODY)
        assert c1 is c2
        assert srv.requests_per_conn == [2]
        pool.close()
        await srv.stop()

    run(main)


def test_connection_close_response_is_not_reused() -> None:
    def behave(srv: MiniServer, conn: int, req: int, data: bytes) -> bytes:
        return plain_response("404 Not Found", b'{"detail":"Not Found"}', close=True)

    async def main() -> None:
        srv = MiniServer(behave)
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=4)
        for _ in range(3):
            status, raw, conn = await exchange(pool, request_bytes(srv.port))
            assert (status, raw, conn.keep_alive) == (404, b'{"detail":"Not Found"}', False)
        assert srv.requests_per_conn == [1, 1, 1]
        pool.close()
        await srv.stop()

    run(main)


# -- Worker._exchange: retry once on a dropped keep-alive connection ---------------------
def _worker(port: int, timeout_s: float = 5.0) -> Worker:
    """A worker whose exchange runs without its run(): call from inside the event loop."""
    worker = Worker(WorkerConfig(
        worker_id=0, url=f"http://127.0.0.1:{port}", body=BodySettings(model=MODEL), seed=0,
        timeout_s=timeout_s, max_connections=4, prewarm_connections=0, spin_ns=200_000, spin_share=0.1,
        requests_addr="ipc:///nonexistent/requests", results_addr="ipc:///nonexistent/results",
    ))  # fmt: skip
    worker.timer = FireTimer(asyncio.get_running_loop())
    return worker


async def worker_exchange(worker: Worker, index: int) -> ipc.RequestResult:
    spec = ipc.RequestSpec(index, f"t_c-{index}", 8, 2)
    body = worker.builder.body(spec.request_id, 8, 2, None)
    data = (worker._head % (spec.request_id, len(body))).encode() + body
    return await worker._exchange(spec, data, SSEReader(), None)


def test_request_on_a_connection_the_server_dropped_is_retried_once_and_succeeds() -> None:
    # The race a keep-alive client must survive: the server closes a connection just as a
    # request is written to it. Here the second request on every connection is dropped.
    def behave(srv: MiniServer, conn: int, req: int, data: bytes) -> bytes | None:
        return None if req == 1 else sse_response()

    async def main() -> None:
        srv = MiniServer(behave)
        await srv.start()
        worker = _worker(srv.port)
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
        worker = _worker(srv.port)
        assert (await worker_exchange(worker, 0)).status == "ok"
        r = await worker_exchange(worker, 1)
        assert (r.status, r.error, r.http_status, r.t_first_token_ns) == (
            "error", "ConnectionClosed: connection closed by server", 0, None
        )  # fmt: skip
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
            return plain_response("503 Service Unavailable",
                                  b'{"error":{"message":"overloaded","type":"x","code":503}}', chunked=chunked)
        if req == 1:
            return plain_response("404 Not Found", b'{"detail":"Not Found"}', chunked=chunked)
        return sse_response()

    async def main() -> None:
        srv = MiniServer(behave)
        await srv.start()
        worker = _worker(srv.port)
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
    stalled = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n%s\r\n" % (len(first_event), first_event))  # fmt: skip

    async def main() -> None:
        srv = MiniServer(lambda *a: stalled)
        await srv.start()
        worker = _worker(srv.port, timeout_s=0.2)
        spec = ipc.RequestSpec(0, "t_c-0", 8, 2)
        body = worker.builder.body(spec.request_id, 8, 2, None)
        data = (worker._head % (spec.request_id, len(body))).encode() + body
        task = asyncio.get_running_loop().create_task(worker._exchange(spec, data, SSEReader(), None))
        worker._tasks[0] = task  # as _fire registers it, so the timeout can find it
        r = await task
        elapsed_ns = time.monotonic_ns() - r.t_send_ns
        assert (r.status, r.error, r.http_status, r.chunks) == ("timeout", "timeout after 0.2 s", 200, 1)
        assert r.t_first_token_ns == r.t_last_token_ns
        assert 0.19e9 <= elapsed_ns < 1e9  # libuv timers have 1 ms granularity
        await asyncio.sleep(0.05)
        assert srv.open_now == 0  # the timed-out connection was aborted, not pooled
        worker.pool.close()
        await srv.stop()

    run(main)


# -- against ctax sim -------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    with running_sim(tmp_path_factory.mktemp("http-sim"), connector="plain") as s:
        yield s


def test_keep_alive_against_the_sim(sim) -> None:
    async def main() -> None:
        pool = ConnectionPool("127.0.0.1", sim.port, max_connections=4)
        worker = _worker(sim.port)
        conns = set()
        for i in range(15):
            body = worker.builder.body(f"http_keepalive-{i}", 16, 3, None)
            data = (worker._head % (f"http_keepalive-{i}", len(body))).encode() + body
            conn = await pool.acquire()
            response = conn.send(data)
            assert await response.wait_headers() == 200
            reader = SSEReader()
            async for batch in response.iter_chunks():
                for t_ns, chunk in batch:
                    reader.feed(t_ns, chunk)
            reader.finish()
            pool.release(conn)
            conns.add(id(conn))
            # The sim, like vLLM, may put two tokens in one chunk when its stream lags (a loaded
            # machine): usage says 3, the chunks 2 or 3.
            assert (reader.done, reader.error) == (True, None) and 2 <= reader.chunks <= 3
            assert reader.usage == {"prompt_tokens": 16, "total_tokens": 19, "completion_tokens": 3}
        assert len(conns) == 1
        assert conn.used == 15
        # A 400 from the sim is read to its end and the connection stays in use.
        conn = await pool.acquire()
        response = conn.send(request_bytes(sim.port, b'{"model":"nope","prompt":[1,2]}'))
        assert await response.wait_headers() == 404
        error = json.loads(await response.read_all())["error"]
        assert error["code"] == 404 and "nope" in error["message"]
        pool.release(conn)
        assert (await pool.acquire()) is conn
        assert conn.used == 16
        pool.close()

    run(main)


def test_pool_bound_against_the_sim(sim) -> None:
    import psutil

    async def main() -> None:
        pool = ConnectionPool("127.0.0.1", sim.port, max_connections=2)
        worker = _worker(sim.port)

        async def one(i: int) -> tuple[int, bytes, Any]:
            rid = f"http_bound-{i}"
            body = worker.builder.body(rid, 16, 4, None)
            return await exchange(pool, (worker._head % (rid, len(body))).encode() + body)

        results = await asyncio.gather(*(one(i) for i in range(8)))
        assert [s for s, _, _ in results] == [200] * 8
        assert len({id(c) for _, _, c in results}) == 2
        # The kernel's socket table agrees: two connections to the sim, no more.
        mine = [c for c in psutil.Process().net_connections("tcp")
                if c.raddr and c.raddr.port == sim.port and c.status == psutil.CONN_ESTABLISHED]  # fmt: skip
        assert len(mine) == 2
        pool.close()

    run(main)


def test_one_read_is_one_body_entry_however_many_http_chunks_it_holds() -> None:
    async def main() -> list[tuple[int, bytes]]:
        conn = HttpConnection(lambda c: None)
        conn.response = Response()
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        events = [b"data: {\"n\":%d}\n\n" % i for i in range(3)]
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
        conn.data_received(head + chunked)  # headers and three HTTP chunks in one read
        conn.data_received(b"%x\r\n%s\r\n0\r\n\r\n" % (len(events[0]), events[0]))
        assert conn.response.complete
        return conn.response.chunks

    entries = asyncio.run(main())
    assert [body for _, body in entries] == [b"".join(b"data: {\"n\":%d}\n\n" % i for i in range(3)),
                                             b"data: {\"n\":0}\n\n"]  # fmt: skip
    assert entries[0][0] < entries[1][0]  # each stamped when its read arrived


def test_spare_connections_are_restocked_in_the_background_within_the_bound() -> None:
    async def main() -> None:
        srv = MiniServer()
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=5, spare=2)
        await pool.prewarm(2)
        held = [pool.try_acquire(), pool.try_acquire()]
        assert all(held) and pool.try_acquire() is None  # the stock is gone for now...
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(pool._idle) == 2:
                break
        assert len(pool._idle) == 2  # ...and back without anyone waiting for a handshake
        taken = [pool.try_acquire(), pool.try_acquire()]
        await asyncio.sleep(0.2)
        assert len(pool._idle) == 1  # the bound: 4 held + 1 idle = max_connections
        assert len({id(c) for c in held + taken}) == 4 and srv.max_open == 5
        pool.close()
        await srv.stop()

    run(main)
