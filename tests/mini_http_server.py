"""A tiny asyncio HTTP/1.1 server for the load generator's client tests: it counts connections and
requests per connection and can misbehave on cue (close an idle keep-alive connection, drop a
request on a reused connection, answer non-200 with bodies framed either way)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).parent))
from sim_server import MODEL  # noqa: E402

from connector_tax.loadgen import ipc  # noqa: E402
from connector_tax.loadgen.worker.firetimer import FireTimer  # noqa: E402
from connector_tax.loadgen.worker.http import ConnectionPool  # noqa: E402
from connector_tax.loadgen.worker.process import Worker, WorkerConfig  # noqa: E402
from connector_tax.loadgen.worker.prompts import BodySettings  # noqa: E402
from connector_tax.loadgen.worker.sse import SSEReader  # noqa: E402

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

    def __init__(
        self, behave: Callable[..., bytes | None] | None = None, idle_close_s: float | None = None, delay_s: float = 0.0
    ) -> None:
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
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunks
        + b"0\r\n\r\n"
    )


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
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"X-Request-Id: {rid}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def exchange(pool: ConnectionPool, data: bytes) -> tuple[int, bytes, Any]:
    conn = await pool.acquire()
    response = conn.send(data)
    status = await response.wait_headers()
    raw = await response.read_all()
    pool.release(conn)
    return status, raw, conn


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return uvloop.run(coro_fn())


def make_worker(port: int, timeout_s: float = 5.0) -> Worker:
    """A worker whose exchange runs without its run(): call from inside the event loop."""
    worker = Worker(
        WorkerConfig(
            worker_id=0,
            url=f"http://127.0.0.1:{port}",
            body=BodySettings(model=MODEL),
            seed=0,
            timeout_s=timeout_s,
            max_connections=4,
            prewarm_connections=0,
            spin_ns=200_000,
            spin_share=0.1,
            requests_addr="ipc:///nonexistent/requests",
            results_addr="ipc:///nonexistent/results",
        )
    )
    worker.timer = FireTimer(asyncio.get_running_loop())
    return worker


async def worker_exchange(worker: Worker, index: int) -> ipc.RequestResult:
    spec = ipc.RequestSpec(index, f"t_c-{index}", 8, 2)
    body = worker.builder.body(spec.request_id, 8, 2, None)
    data = (worker._head % (spec.request_id, len(body))).encode() + body
    return await worker._exchange(spec, data, SSEReader(), None)
