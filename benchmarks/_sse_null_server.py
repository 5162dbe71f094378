"""A near-zero-cost OpenAI-compatible streaming server, for measuring load generators.

    python benchmarks/_sse_null_server.py [--host 127.0.0.1] [--port 0] [--cpu N] [--model NAME]

It answers every POST /v1/completions and /v1/chat/completions at once with the whole
stream in one socket write: N `data: {...}` chunks in vLLM's chunk format (one token each,
N = the request's max_tokens, default 64), a usage chunk (`"choices":[]`, when the request
asks for it with stream_options.include_usage, as vLLM does), and `data: [DONE]`. Each SSE
event is its own HTTP/1.1 chunk (Transfer-Encoding: chunked, as vLLM/uvicorn send it), so a
client parses what it would parse against a real server; only the server's time is gone.
Non-streaming requests get one JSON completion. GET /v1/models, /health, and /stats (requests
and SSE events served so far: lets a benchmark check what a client says it completed).

Raw asyncio.Protocol on uvloop with httptools parsing (no framework); responses are cached by
(endpoint, model, tokens, prompt tokens, usage), so a request costs a parse, a JSON decode of
its body, a dict lookup and one write. Prints `ready http://HOST:PORT` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

import httptools
import uvloop

DEFAULT_TOKENS = 64
CREATED = int(time.time())


def _chunk(payload: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class Responses:
    """Builds (once) and caches every response the server sends."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.cache: dict[tuple, tuple[bytes, int]] = {}
        self.stats = {"requests": 0, "events": 0, "stream_requests": 0}

    def completion(self, chat: bool, body: dict) -> tuple[bytes, int]:
        model = body.get("model") or self.model
        n = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_TOKENS
        try:
            n = max(1, int(n))
        except (TypeError, ValueError):
            n = DEFAULT_TOKENS
        stream = bool(body.get("stream"))
        opts = body.get("stream_options") or {}
        usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
        if chat:
            msgs = body.get("messages") or []
            p_tokens = sum(len(str(m.get("content", "")).split()) for m in msgs if isinstance(m, dict))
        else:
            prompt = body.get("prompt", "")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
                prompt = prompt[0]  # a batch of one
            p_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        key = (chat, str(model), n, p_tokens, usage, stream)
        hit = self.cache.get(key)
        if hit is None:
            hit = self._build(chat, str(model), n, p_tokens, usage, stream)
            if len(self.cache) < 100_000:
                self.cache[key] = hit
        return hit

    def _build(self, chat: bool, model: str, n: int, p_tokens: int, usage: bool, stream: bool) -> tuple[bytes, int]:
        rid = ("chatcmpl-" if chat else "cmpl-") + "0" * 32
        obj = "chat.completion.chunk" if chat else "text_completion"
        use = {"prompt_tokens": p_tokens, "total_tokens": p_tokens + n, "completion_tokens": n}
        if not stream:
            if chat:
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": " tok" * n},
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            else:
                choice = {
                    "index": 0,
                    "text": " tok" * n,
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            body = _dumps(
                {
                    "id": rid,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": CREATED,
                    "model": model,
                    "choices": [choice],
                    "usage": use,
                }
            )
            head = (
                b"HTTP/1.1 200 OK\r\nserver: null\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n" % len(body)
            )
            return head + body, 0

        def chunk(choice: dict) -> bytes:
            return _chunk(_dumps({"id": rid, "object": obj, "created": CREATED, "model": model, "choices": [choice]}))

        parts = []
        if chat:  # vLLM's first chat chunk: the role, empty content
            parts.append(
                chunk(
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                )
            )
        for i in range(n):
            finish = "length" if i == n - 1 else None
            if chat:
                parts.append(
                    chunk({"index": 0, "delta": {"content": " tok"}, "logprobs": None, "finish_reason": finish})
                )
            else:
                parts.append(
                    chunk({"index": 0, "text": " tok", "logprobs": None, "finish_reason": finish, "stop_reason": None})
                )
        if usage:
            parts.append(
                _chunk(
                    _dumps({"id": rid, "object": obj, "created": CREATED, "model": model, "choices": [], "usage": use})
                )
            )
        parts.append(_chunk(b"[DONE]"))
        parts.append(b"0\r\n\r\n")
        head = (
            b"HTTP/1.1 200 OK\r\nserver: null\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        return head + b"".join(parts), n + int(usage) + 1 + int(chat)


def _plain(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 %s\r\nserver: null\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status.encode(),
        ctype,
        len(body),
        body,
    )


class NullProtocol(asyncio.Protocol):
    __slots__ = ("body", "keep_alive", "parser", "responses", "transport", "url")

    def __init__(self, responses: Responses) -> None:
        self.responses = responses
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._send(_plain("400 Bad Request", b'{"error":{"message":"upgrade not supported"}}'), close=True)
        except httptools.HttpParserError:
            self._send(_plain("400 Bad Request", b'{"error":{"message":"bad request"}}'), close=True)

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        method = self.parser.get_method()
        path = self.url.split(b"?", 1)[0]
        r = self.responses
        if method == b"POST" and path in (b"/v1/completions", b"/v1/chat/completions"):
            try:
                body = json.loads(b"".join(self.body))
            except ValueError as exc:
                body = f"bad JSON: {exc}"
            if not isinstance(body, dict):
                text = body if isinstance(body, str) else "the body is not a JSON object"
                msg = _dumps({"error": {"message": text, "type": "BadRequestError", "code": 400}})
                self._send(_plain("400 Bad Request", msg))
                return
            data, events = r.completion(path == b"/v1/chat/completions", body)
            r.stats["requests"] += 1
            if events:
                r.stats["stream_requests"] += 1
                r.stats["events"] += events
            self._send(data)
        elif method == b"GET" and path == b"/v1/models":
            self._send(
                _plain(
                    "200 OK",
                    _dumps(
                        {
                            "object": "list",
                            "data": [
                                {
                                    "id": r.model,
                                    "object": "model",
                                    "created": CREATED,
                                    "owned_by": "null",
                                    "root": r.model,
                                    "parent": None,
                                    "max_model_len": 131072,
                                }
                            ],
                        }
                    ),
                )
            )
        elif method == b"GET" and path in (b"/health", b"/ping"):
            self._send(_plain("200 OK", b""))
        elif method == b"GET" and path == b"/stats":
            self._send(_plain("200 OK", _dumps(r.stats)))
        else:
            self._send(_plain("404 Not Found", b'{"error":{"message":"not found","code":404}}'))

    def _send(self, data: bytes, close: bool = False) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        t.write(data)
        if close or not self.keep_alive:
            t.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(host: str, port: int, model: str) -> None:
    loop = asyncio.get_running_loop()
    responses = Responses(model)
    server = await loop.create_server(lambda: NullProtocol(responses), host, port, backlog=4096, reuse_address=True)
    bound = server.sockets[0].getsockname()
    print(f"ready http://{bound[0]}:{bound[1]}", flush=True)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    async with server:
        await stop
    print(f"served {responses.stats}", file=sys.stderr, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    p.add_argument("--model", default="null-model", help="the model /v1/models lists")
    p.add_argument("--cpu", type=int, action="append", help="pin to this CPU (repeatable)")
    args = p.parse_args()
    if args.cpu:
        os.sched_setaffinity(0, set(args.cpu))
    uvloop.run(serve(args.host, args.port, args.model))


if __name__ == "__main__":
    main()
