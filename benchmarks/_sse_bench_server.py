"""An ordinary OpenAI-compatible SSE server for benchmarking load generators (not the null server).

    python benchmarks/_sse_bench_server.py --port 0 [--token-interval-ms 1] [--log FILE]
        [--cpu N ...] [--tls-cert PEM --tls-key PEM] [--api-key KEY]

Plain asyncio on uvloop with httptools for request parsing; every chunk is written with
`json.dumps` defaults (", " and ": " separators: what Python servers such as SGLang write),
one token per chunk, `--token-interval-ms` apart (the first one interval after the request
arrives), then an empty finish chunk, a usage chunk (`"choices": []`) and `data: [DONE]`.
All streams share one ticker (one timer per interval, not one per stream), which writes each
due stream's next token. Its own truth goes to `--log` (JSONL, one line per request when it
ends, flushed every second and at exit): request id, path, whether the Authorization header
matched, receive time, the monotonic time just before the first and the last token's write,
tokens written. The receive time is the kernel's (SO_TIMESTAMPNS, through the load generator's own
StampedTransport): the moment the request's last bytes reached this host's TCP stack, not when
this busy loop got to them — at 33,000 writes/s one tick of the ticker takes milliseconds, and
a user-space stamp then put the server's own lag into every client's "TTFT excess". Over TLS the
read is stamped when it runs. Prints `ready http(s)://127.0.0.1:PORT` when listening. POST `/…/completions`
and `/…/chat/completions`; `GET /health`; anything else 404; a bad key 401.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
import sys
import time
from typing import IO

import httptools
import uvloop

from connector_tax.loadgen.worker.stamped import StampedTransport


class Stream:
    __slots__ = (
        "transport",
        "rid",
        "path",
        "auth_ok",
        "t_recv",
        "token",
        "left",
        "due",
        "t_first",
        "t_last",
        "n",
        "chat",
        "model",
        "prompt_tokens",
    )

    def __init__(
        self, transport: asyncio.Transport, rid: str, path: str, auth_ok: bool, body: dict, now: int, interval_ns: int
    ) -> None:
        self.transport = transport
        self.rid, self.path, self.auth_ok, self.t_recv = rid, path, auth_ok, now
        self.chat = path.endswith("/chat/completions")
        self.model = body.get("model", "m")
        self.left = int(body.get("max_tokens") or 16)
        prompt = body.get("prompt") if not self.chat else body.get("messages")
        self.prompt_tokens = len(prompt) if isinstance(prompt, list) and not self.chat else len(str(prompt).split())
        self.token = _event(self._chunk("tok", None))
        self.due = now + interval_ns
        self.t_first = self.t_last = 0
        self.n = 0

    def _chunk(self, text: str | None, finish: str | None) -> dict:
        base = {
            "id": f"cmpl-{self.rid}",
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
        }
        if self.chat:
            delta = {"content": text} if text is not None else {}
            return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return {
            **base,
            "choices": [
                {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish, "stop_reason": None}
            ],
        }

    def tail(self) -> bytes:
        usage = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.n,
            "completion_tokens": self.n,
        }
        return (
            _event(self._chunk(None if self.chat else "", "length"))
            + _event(
                {
                    "id": f"cmpl-{self.rid}",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": self.model,
                    "choices": [],
                    "usage": usage,
                }
            )
            + b"data: [DONE]\n\n"
        )


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Server:
    def __init__(self, interval_ns: int, log: IO[str] | None, api_key: str | None) -> None:
        self.interval_ns = interval_ns
        self.log = log
        self.api_key = api_key
        self.streams: list[Stream] = []
        self.loop = asyncio.get_running_loop()
        self._ticking = False
        self.requests = 0  # streams ended (whole or cut short)
        self.chunks = 0  # token chunks written, over every stream

    def start(self, stream: Stream) -> None:
        self.streams.append(stream)
        if not self._ticking:
            self._ticking = True
            self.loop.call_at(self.loop.time() + (stream.due - time.monotonic_ns()) / 1e9, self.tick)

    def tick(self) -> None:
        now = time.monotonic_ns()
        keep: list[Stream] = []
        for s in self.streams:
            if s.transport.is_closing():
                self._done(s)
                continue
            if s.due > now:
                keep.append(s)
                continue
            t = time.monotonic_ns()
            if not s.n:
                s.t_first = t
            s.t_last = t
            s.n += 1
            s.left -= 1
            self.chunks += 1
            if s.left > 0:
                s.transport.write(_chunked(s.token))
                s.due += self.interval_ns
                keep.append(s)
            else:
                s.transport.write(_chunked(s.token + s.tail()) + b"0\r\n\r\n")
                self._done(s)
        self.streams = keep
        if keep:
            nxt = min(s.due for s in keep)
            self.loop.call_at(self.loop.time() + max(0, nxt - time.monotonic_ns()) / 1e9, self.tick)
        else:
            self._ticking = False

    def _done(self, s: Stream) -> None:
        self.requests += 1
        if self.log is not None:
            self.log.write(
                json.dumps(
                    {
                        "rid": s.rid,
                        "path": s.path,
                        "auth_ok": s.auth_ok,
                        "t_recv_ns": s.t_recv,
                        "t_first_write_ns": s.t_first,
                        "t_last_write_ns": s.t_last,
                        "tokens": s.n,
                    }
                )
                + "\n"
            )


class Protocol(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._t_read = 0  # the time of the read being parsed: the kernel's, where it gives one
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:  # TLS: uvloop's transport, stamped here
        self.stamped_data_received(time.monotonic_ns(), data)

    def stamped_data_received(self, t_ns: int, data: bytes) -> None:
        self._t_read = t_ns
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._reply(400, b'{"error": {"message": "bad request"}}', close=True)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        now = self._t_read  # the request's arrival: when its last bytes reached the host
        path = self.url.decode("latin-1").split("?")[0]
        method = self.parser.get_method()
        headers, body = self.headers, b"".join(self.body)
        self._reset()
        if method == b"GET" and path in ("/health", "/stats"):
            srv = self.server
            self._reply(
                200, b'{"requests": %d, "active": %d, "chunks": %d}' % (srv.requests, len(srv.streams), srv.chunks)
            )
            return
        if method != b"POST" or not path.endswith("/completions"):
            self._reply(404, b'{"error": {"message": "not found"}}')
            return
        srv = self.server
        auth_ok = srv.api_key is None or headers.get(b"authorization") == f"Bearer {srv.api_key}".encode()
        if not auth_ok:
            self._reply(401, b'{"error": {"message": "bad api key"}}')
            return
        try:
            req = json.loads(body)
        except ValueError:
            self._reply(400, b'{"error": {"message": "body is not JSON"}}')
            return
        rid = headers.get(b"x-request-id", b"").decode("latin-1") or f"r{srv.requests}"
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        stream = Stream(self.transport, rid, path, auth_ok, req, now, srv.interval_ns)
        if stream.chat:
            role = stream._chunk(None, None)
            role["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            self.transport.write(_chunked(_event(role)))
        srv.start(stream)

    def _reply(self, status: int, body: bytes, close: bool = False) -> None:
        assert self.transport is not None
        reason = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found"}[status]
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, reason, len(body), body)
        )
        if close:
            self.transport.close()


async def serve(args: argparse.Namespace) -> None:
    log = open(args.log, "a", encoding="utf-8", buffering=1 << 16) if args.log else None
    server = Server(int(args.token_interval_ms * 1e6), log, args.api_key)
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    loop = asyncio.get_running_loop()
    if tls is not None:
        srv = await loop.create_server(lambda: Protocol(server), args.host, args.port, ssl=tls, backlog=4096)
        port = srv.sockets[0].getsockname()[1]
    else:
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        listener = socket.create_server((args.host, args.port), family=family, backlog=4096)
        listener.setblocking(False)
        port = listener.getsockname()[1]

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    return
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                StampedTransport(loop, conn, Protocol(server))

        loop.add_reader(listener.fileno(), accept)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"ready {'https' if tls else 'http'}://{host}:{port}", flush=True)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))

    async def flusher() -> None:
        while True:
            await asyncio.sleep(1.0)
            if log is not None:
                log.flush()

    task = loop.create_task(flusher())
    await stop
    task.cancel()
    if tls is not None:
        srv.close()
    else:
        loop.remove_reader(listener.fileno())
        listener.close()
    if log is not None:
        log.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token-interval-ms", type=float, default=1.0)
    p.add_argument("--log", help="the server's own per-request write times (JSONL)")
    p.add_argument("--cpu", type=int, action="append", help="pin to this CPU (repeatable)")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--api-key", help="answer 401 unless 'Authorization: Bearer KEY' is sent")
    args = p.parse_args()
    if args.cpu:
        os.sched_setaffinity(0, set(args.cpu))
    uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
