"""A minimal HTTP/1.1 client on asyncio.Protocol with httptools parsing and keep-alive pooling.

Arrival times come from the kernel: a plain-TCP connection reads with recvmsg and takes each
read's time from its SO_TIMESTAMPNS stamp, the moment the read's last segment reached this
host's TCP stack (StampedTransport). So a first token's time does not include how late the
worker got to its socket — the client's own scheduling, the one error a load generator adds to
what it measures, is out of TTFT and ITL, on a busy host as on a quiet one. Where the kernel
gives no stamp (TLS, which uvloop's SSL transport reads; a platform without SO_TIMESTAMPNS),
data_received stamps the read itself, before any parsing. The body bytes of one read are joined into
one (arrival_ns, bytes) entry, however many HTTP chunks they held, so the SSE reader handles a
read's events in one pass (a 64-event read parsed chunk by chunk cost ~150 µs of the worker's
loop, time in which a due request could not be fired). The request's task drains everything
buffered each time it wakes (a buffer drain), so one wake-up handles as many
reads as arrived meanwhile.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol, cast

import httptools

from connector_tax.loadgen.worker.stamped import StampedTransport


class ConnectionClosed(Exception):
    pass


class StreamSink(Protocol):
    """Where a streamed body goes, read by read, as it arrives (sse.SSEReader)."""

    fatal: bool

    def feed(self, t_ns: int, data: bytes) -> None: ...

    def finish(self, t_ns: int | None = None) -> None: ...


class Response:
    """One response's state, filled by the connection's parser callbacks.

    With a `sink`, a 200 event-stream body is handed to it inside data_received, read by read
    with the read's arrival time, and the waiting task is woken once, when the response is
    complete: no task step per read (that was half the worker's time at 1,000 req/s). Any
    other body (an error) is kept, at most `body_limit` bytes; past that the connection is
    dropped and the body marked `cut`. Without a sink every read is buffered and the task
    woken for it (`iter_chunks`).
    """

    __slots__ = (
        "status",
        "chunks",
        "complete",
        "error",
        "_event",
        "headers_done",
        "content_type",
        "sink",
        "streaming",
        "body_limit",
        "size",
        "cut",
        "finished",
    )

    def __init__(self, sink: StreamSink | None = None, body_limit: int = 1 << 20) -> None:
        self.status = 0
        self.content_type: bytes | None = None
        self.chunks: list[tuple[int, bytes]] = []
        self.complete = False
        self.headers_done = False
        self.error: BaseException | None = None
        self._event = asyncio.Event()
        self.sink = sink
        self.streaming = False  # a sink takes the body
        self.body_limit = body_limit
        self.size = 0
        self.cut = False
        self.finished = False  # with a sink: finish() called, the task woken

    def wake(self) -> None:
        self._event.set()

    async def wait_complete(self) -> None:
        """Until the response is complete (or cut); ConnectionClosed if it failed before."""
        while not self.complete:
            await self._wait()

    async def wait_headers(self) -> int:
        while not self.headers_done:
            await self._wait()
        return self.status

    async def _wait(self) -> None:
        if self.error is not None:
            raise self.error
        await self._event.wait()
        self._event.clear()
        if self.error is not None and not self.chunks and not self.complete:
            raise self.error

    async def iter_chunks(self) -> AsyncIterator[list[tuple[int, bytes]]]:
        """Yield every buffered (arrival_ns, bytes) at once; suspend only when none is left."""
        while True:
            if self.chunks:
                batch, self.chunks = self.chunks, []
                yield batch
            if self.complete:
                return
            await self._wait()

    async def read_all(self, limit: int = 1 << 20) -> bytes:
        return (await self.read_bounded(limit))[0]

    async def read_bounded(self, limit: int) -> tuple[bytes, bool]:
        """The body, up to `limit` bytes; True as well when there was more (then the caller
        must not reuse the connection: the rest is left unread)."""
        parts: list[bytes] = []
        size = 0
        async for batch in self.iter_chunks():
            for _, data in batch:
                parts.append(data)
                size += len(data)
            if size > limit:
                return b"".join(parts)[:limit], True
        return b"".join(parts), False


class HttpConnection(asyncio.Protocol):
    def __init__(
        self, on_lost: Callable[[HttpConnection], None], before_read: Callable[[], None] | None = None
    ) -> None:
        self._before_read = before_read  # e.g. the fire timer's run_due: a due send goes first
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.keep_alive = True
        self.used = 0
        self._on_lost = on_lost
        self._parts: list[bytes] = []  # body bytes of the read being parsed

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The pool makes every connection over a StampedTransport (_connect), never asyncio's own.
        self.transport = cast(StampedTransport, transport)

    def data_received(self, data: bytes) -> None:
        self.stamped_data_received(time.monotonic_ns(), data)

    def stamped_data_received(self, now: int, data: bytes) -> None:
        """A read that arrived at `now` (CLOCK_MONOTONIC ns): the kernel's stamp, or data_received's."""
        if self._before_read is not None:
            self._before_read()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionClosed(f"bad HTTP response: {exc}"))
        finally:
            self._flush(now)

    def _flush(self, now: int) -> None:
        resp = self.response
        if self._parts:
            body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            self._parts.clear()
            if resp is None:
                pass
            elif resp.streaming and (sink := resp.sink) is not None:  # a streaming response has its sink
                sink.feed(now, body)
                if sink.fatal:
                    resp.complete = True  # past the sink's bound: stop reading this stream
                    self.abort()
                    resp.wake()
                    return
            else:
                resp.chunks.append((now, body))
                resp.size += len(body)
                if resp.sink is not None and resp.size > resp.body_limit and not resp.complete:
                    resp.cut = resp.complete = True  # the rest is not read: the connection goes
                    self.abort()
                    resp.wake()
                    return
                if resp.sink is None:
                    resp.wake()
        if resp is not None and resp.complete and resp.sink is not None and not resp.finished:
            resp.finished = True
            if resp.streaming:
                resp.sink.finish(now)
            resp.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionClosed(str(exc) if exc else "connection closed by server"))
        self._on_lost(self)

    # httptools callbacks
    def on_message_begin(self) -> None:
        pass

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None and name.lower() == b"content-type":
            self.response.content_type = value

    def on_headers_complete(self) -> None:
        resp = self.response
        if resp is not None:
            resp.status = self.parser.get_status_code()
            resp.headers_done = True
            self.keep_alive = self.parser.should_keep_alive()
            ctype = resp.content_type
            resp.streaming = (
                resp.sink is not None
                and resp.status == 200
                and (ctype is None or ctype.lower().startswith(b"text/event-stream"))
            )
            if resp.sink is None:
                resp.wake()

    def on_body(self, body: bytes) -> None:
        self._parts.append(body)

    def on_message_complete(self) -> None:
        resp = self.response
        if resp is not None:
            resp.complete = True
            if resp.sink is None:
                resp.wake()  # with a sink: after the last bytes are fed (_flush)

    # client side
    def send(self, data: bytes, sink: StreamSink | None = None, body_limit: int = 1 << 20) -> Response:
        assert self.transport is not None
        self.response = Response(sink, body_limit)
        self.used += 1
        self.transport.write(data)
        return self.response

    def _fail(self, exc: BaseException) -> None:
        resp = self.response
        if resp is not None and not resp.complete:
            resp.error = exc
            resp.wake()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self.closed = True

    @property
    def reusable(self) -> bool:
        return not self.closed and self.keep_alive and self.response is not None and self.response.complete


class ConnectionPool:
    """Keep-alive connections to one server: a LIFO stack of idle ones, bounded in total.

    With `spare` > 0 the pool keeps that many idle connections in stock, opening new ones in
    the background as requests take them: when a server falls behind, every new request needs
    a connection of its own, and opening it on the request's path put the handshake (ms, from
    a busy server) into its send time.
    """

    def __init__(
        self, host: str, port: int, max_connections: int, spare: int = 0, tls: ssl.SSLContext | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls  # https: the context; SNI and certificate checks use self.host
        self.before_read: Callable[[], None] | None = None  # given to every connection
        self._addrs: list[tuple[int, str]] = []  # resolved once: (family, address)
        self.max_connections = max_connections
        self.spare = spare
        self._idle: list[HttpConnection] = []
        self._live: set[HttpConnection] = set()  # every open connection, idle or not: close() ends them all
        self._open = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._connecting = 0
        self._restock_due = False
        self._stocking: set[asyncio.Task[None]] = set()

    def try_acquire(self) -> HttpConnection | None:
        """An idle connection without suspending, if there is one (the hot path)."""
        conn = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed:
                conn = candidate
                break
        if len(self._idle) + self._connecting < self.spare and not self._restock_due:
            # After this callback, not in it: the caller is about to stamp and send.
            self._restock_due = True
            asyncio.get_running_loop().call_soon(self._restock)
        return conn

    def _restock(self) -> None:
        self._restock_due = False
        want = min(self.spare - len(self._idle) - self._connecting, self.max_connections - self._open)
        loop = asyncio.get_running_loop()
        for _ in range(want):
            self._connecting += 1
            task = loop.create_task(self._stock_one())
            self._stocking.add(task)
            task.add_done_callback(self._stocking.discard)

    async def _stock_one(self) -> None:
        try:
            conn = await self._connect()
        except OSError:
            return  # the server is gone or refusing: requests will say so themselves
        finally:
            self._connecting -= 1
        self._idle.append(conn)
        self._wake_one()

    async def acquire(self) -> HttpConnection:
        while True:
            conn = self.try_acquire()
            if conn is not None:
                return conn
            if self._open < self.max_connections:
                return await self._connect()
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    async def _resolve(self) -> list[tuple[int, str]]:  # (address family, address)
        """The host's addresses, looked up once per pool (as curl does per run), in the
        resolver's order: `localhost` may give ::1 before 127.0.0.1, and each is tried."""
        if not self._addrs:
            infos = await asyncio.get_running_loop().getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            self._addrs = list(dict.fromkeys((int(family), str(sockaddr[0])) for family, _, _, _, sockaddr in infos))
        return self._addrs

    async def _connect(self) -> HttpConnection:
        self._open += 1
        loop = asyncio.get_running_loop()
        try:
            error: OSError | None = None
            for family, addr in await self._resolve():
                try:
                    if self.tls is not None:  # uvloop's SSL transport: data_received stamps each read
                        _, conn = await loop.create_connection(
                            lambda: HttpConnection(self._lost, self.before_read),
                            addr,
                            self.port,
                            ssl=self.tls,
                            server_hostname=self.host,
                        )
                    else:
                        conn = await StampedTransport.connect(
                            loop, family, addr, self.port, HttpConnection(self._lost, self.before_read)
                        )
                    self._live.add(conn)
                    return conn
                except OSError as exc:
                    error = exc
            raise error or OSError(f"{self.host}: no address")
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    def release(self, conn: HttpConnection) -> None:
        if conn.reusable:
            self._idle.append(conn)
            self._wake_one()
        else:
            conn.abort()  # _lost() does the accounting

    def _lost(self, conn: HttpConnection) -> None:
        self._open -= 1
        self._live.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    async def prewarm(self, n: int) -> None:
        conns = [await self._connect() for _ in range(min(n, self.max_connections - self._open))]
        self._idle.extend(conns)

    def close(self) -> None:
        for task in self._stocking:
            task.cancel()
        for conn in list(self._live):
            conn.abort()
        self._idle.clear()
