"""The simulated server's HTTP API: a plain ASGI app in front of the engine runner.

Routes: GET /health, /v1/models, /metrics, /version; POST /v1/completions and
/v1/chat/completions (streamed as SSE or not). Tokens reach a request's stream from the
engine thread through `publish`, which hops onto the event loop; a handler writes what has
arrived as one chunk, as vLLM's output collector merges what is pending. The server's own
first- and last-token times are taken just before the chunk carrying them is written.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import IO, Any

from prometheus_client import CONTENT_TYPE_LATEST

from connector_tax.sim.engine import SimRequest, StepResult
from connector_tax.sim.faults import FaultDice
from connector_tax.sim.metrics import SimMetrics
from connector_tax.sim.protocol import ENGINE_DEAD, ApiError, GenerationRequest, parse_generation
from connector_tax.sim.responses import (
    SSE_DONE,
    ResponseIds,
    full_response,
    models_body,
    role_chunk,
    text_chunk,
    usage,
    usage_chunk,
)
from connector_tax.sim.tokens import detokenize, natural_length

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = b"application/json"


class RequestStream:
    """Tokens published for one request and not yet written to its client."""

    __slots__ = ("pending", "finished", "event", "disconnected")

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.finished = False
        self.disconnected = False
        self.event = asyncio.Event()

    def push(self, token_ids: list[int], finished: bool) -> None:
        self.pending.extend(token_ids)
        self.finished = self.finished or finished
        self.event.set()

    async def take(self) -> list[int]:
        await self.event.wait()
        self.event.clear()
        tokens, self.pending = self.pending, []
        return tokens


@dataclass
class RequestTiming:
    request_id: str
    t_arrival_ns: int
    t_first_token_ns: int | None = None
    t_last_token_ns: int | None = None
    token_times_ns: list[int] = field(default_factory=list)


class SimApp:
    def __init__(
        self,
        model: str,
        max_model_len: int,
        vllm_version: str,
        submit: Callable[[SimRequest], None],
        abort: Callable[[SimRequest], None],
        metrics: SimMetrics,
        dice: FaultDice,
        request_log: IO[str] | None,
        on_accept: Callable[[int], None],
    ) -> None:
        self.model = model
        self.max_model_len = max_model_len
        self.vllm_version = vllm_version
        self._submit = submit
        self._abort = abort
        self.metrics = metrics
        self.dice = dice
        self._request_log = request_log
        self._on_accept = on_accept
        self.fingerprint = f"vllm-{vllm_version}-{uuid.uuid4().hex[:8]}"
        self.permission_id = f"modelperm-{uuid.uuid4().hex[:16]}"
        self.engine_dead = False
        self.accepted = 0
        self._streams: dict[str, RequestStream] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- engine side ------------------------------------------------------------------
    def publish(self, result: StepResult, t_ns: int) -> None:
        """Called on the engine thread after a step's modelled end."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._deliver, result)

    def _deliver(self, result: StepResult) -> None:
        for out in result.outputs:
            stream = self._streams.get(out.request.request_id)
            if stream is not None:
                stream.push(out.new_token_ids, out.finished)

    def mark_engine_dead(self) -> None:
        self.engine_dead = True
        for stream in self._streams.values():
            stream.event.set()

    # -- ASGI -------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        method, path = scope["method"], scope["path"]
        routes: dict[str, tuple[str, Callable[..., Awaitable[None]]]] = {
            "/health": ("GET", self._health),
            "/v1/models": ("GET", self._models),
            "/metrics": ("GET", self._metrics),
            "/version": ("GET", self._version),
            "/v1/completions": ("POST", self._completions),
            "/v1/chat/completions": ("POST", self._chat_completions),
        }
        route = routes.get(path)
        if route is None:
            await _respond(send, HTTPStatus.NOT_FOUND, b'{"detail":"Not Found"}', JSON)
        elif route[0] != method:
            await _respond(send, HTTPStatus.METHOD_NOT_ALLOWED, b'{"detail":"Method Not Allowed"}', JSON, route[0])
        else:
            await route[1](scope, receive, send)

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = HTTPStatus.SERVICE_UNAVAILABLE if self.engine_dead else HTTPStatus.OK
        await _respond(send, status, b"", None)

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = models_body(self.model, self.model, self.max_model_len, self.permission_id)
        await _respond(send, HTTPStatus.OK, body, JSON)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.dice.settings.metrics_delay_s:
            await asyncio.sleep(self.dice.settings.metrics_delay_s)
        await _respond(send, HTTPStatus.OK, self.metrics.exposition(), CONTENT_TYPE_LATEST.encode())

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _respond(send, HTTPStatus.OK, json.dumps({"version": self.vllm_version}).encode(), JSON)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(scope, receive, send, chat=False)

    async def _chat_completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._generate(scope, receive, send, chat=True)

    async def _generate(self, scope: Scope, receive: Receive, send: Send, chat: bool) -> None:
        t_arrival = time.monotonic_ns()
        self.dice.begin_request()
        raw = await _read_body(receive)
        try:
            gen = parse_generation(raw, _header(scope, b"content-type"), chat, self.model, self.max_model_len)
            if self.engine_dead:
                raise ENGINE_DEAD
            if self.dice.http_500():
                raise ApiError("simulated internal error", HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")
        except ApiError as err:
            await _respond(send, err.status, err.body(), JSON)
            return
        self.accepted += 1
        self._on_accept(self.accepted)

        # As vLLM: a client's X-Request-Id becomes the response id (not echoed as a header).
        client_id = _header(scope, b"x-request-id")
        request_id = client_id if client_id and client_id not in self._streams else uuid.uuid4().hex[:16]
        prefix = "chatcmpl-" if chat else "cmpl-"
        ids = ResponseIds(f"{prefix}{request_id}", int(time.time()), self.model, chat, self.fingerprint)
        target = gen.max_tokens if gen.ignore_eos else natural_length(gen.prompt_token_ids, gen.max_tokens)
        request = SimRequest(request_id, gen.prompt_token_ids, gen.max_tokens, target)
        stream = RequestStream()
        timing = RequestTiming(request_id, t_arrival)
        self._streams[request_id] = stream
        watcher = asyncio.ensure_future(_watch_disconnect(receive, stream))
        self._submit(request)
        status = "ok"
        try:
            if gen.stream:
                await self._stream(send, gen, ids, request, stream, timing)
            else:
                await self._whole(send, ids, request, stream, timing)
            if stream.disconnected:
                status = "aborted"
            elif self.engine_dead and not stream.finished:
                status = "error"
        except (OSError, asyncio.CancelledError):
            status = "aborted"
            raise
        finally:
            watcher.cancel()
            del self._streams[request_id]
            if not stream.finished:
                self._abort(request)
            self._record(request, timing, status)

    async def _stream(
        self,
        send: Send,
        gen: GenerationRequest,
        ids: ResponseIds,
        request: SimRequest,
        stream: RequestStream,
        timing: RequestTiming,
    ) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if ids.chat:
            await _body(send, role_chunk(ids, usage(request.prompt_len, 0) if gen.continuous_usage else None))
        hang_at = self.dice.hang_at()
        reset_at = request.max_tokens // 2 if self.dice.reset() else None
        sent = 0
        while not (stream.finished and not stream.pending):
            tokens = await stream.take()
            if stream.disconnected:
                return
            if self.engine_dead:
                # As vLLM: the error goes in the stream (status 200 is already sent), then DONE.
                await _body(send, b"data: " + json.dumps(json.loads(ENGINE_DEAD.body())).encode() + b"\n\n")
                await _body(send, SSE_DONE, more=False)
                return
            if hang_at is not None and sent + len(tokens) >= hang_at:
                tokens = tokens[: hang_at - sent]
                stream.pending = []
                stream.finished = False
                hung = True
            else:
                hung = False
            if not tokens:
                continue
            sent += len(tokens)
            finished = stream.finished and not stream.pending
            reason = request.finish_reason if finished else None
            chunk_usage = usage(request.prompt_len, sent) if gen.continuous_usage else None
            text = "".join(detokenize(t) for t in tokens)
            chunk = text_chunk(ids, text, reason, chunk_usage, usage_follows=gen.include_usage)
            if self.dice.malformed_chunk():
                chunk = chunk[: len(chunk) // 2] + b"\n\n"
            _stamp(timing, len(tokens))
            await _body(send, chunk)
            if reset_at is not None and sent >= reset_at:
                # the server drops the connection mid-stream (uvicorn closes it on the error)
                raise ConnectionResetError("simulated connection reset")
            if hung:
                await _until_disconnected(stream)
                return
        if gen.include_usage:
            await _body(send, usage_chunk(ids, usage(request.prompt_len, sent)))
        await _body(send, SSE_DONE, more=False)

    async def _whole(
        self,
        send: Send,
        ids: ResponseIds,
        request: SimRequest,
        stream: RequestStream,
        timing: RequestTiming,
    ) -> None:
        tokens: list[int] = []
        while not (stream.finished and not stream.pending):
            new = await stream.take()
            if stream.disconnected:
                return
            if self.engine_dead:
                await _respond(send, ENGINE_DEAD.status, ENGINE_DEAD.body(), JSON)
                return
            if new and timing.t_first_token_ns is None:
                timing.t_first_token_ns = time.monotonic_ns()
            tokens += new
        text = "".join(detokenize(t) for t in tokens)
        body = full_response(ids, text, request.finish_reason or "length", usage(request.prompt_len, len(tokens)))
        timing.t_last_token_ns = time.monotonic_ns()
        await _respond(send, HTTPStatus.OK, body, JSON)

    def _record(self, request: SimRequest, timing: RequestTiming, status: str) -> None:
        t_first, t_last = timing.t_first_token_ns, timing.t_last_token_ns
        now = time.monotonic_ns()
        if status == "aborted":
            self.metrics.on_abort()
        if status == "ok":
            gaps = [(b - a) / 1e9 for a, b in zip(timing.token_times_ns, timing.token_times_ns[1:])]
            ttft = None if t_first is None else (t_first - timing.t_arrival_ns) / 1e9
            self.metrics.on_finish(request.finish_reason or "length", ttft, (now - timing.t_arrival_ns) / 1e9, gaps)
        if self._request_log is None:
            return
        record = {
            "request_id": timing.request_id,
            "t_arrival_ns": timing.t_arrival_ns,
            "t_first_token_ns": t_first,
            "t_last_token_ns": t_last,
            "prompt_tokens": request.prompt_len,
            "completion_tokens": len(request.output_token_ids),
            "cached_tokens": request.num_cached_tokens,
            "finish_reason": request.finish_reason,
            "status": status,
        }
        self._request_log.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._request_log.flush()


def _stamp(timing: RequestTiming, n_tokens: int) -> None:
    now = time.monotonic_ns()
    if timing.t_first_token_ns is None:
        timing.t_first_token_ns = now
    timing.t_last_token_ns = now
    timing.token_times_ns.append(now)


async def _watch_disconnect(receive: Receive, stream: RequestStream) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            stream.disconnected = True
            stream.event.set()
            return


async def _until_disconnected(stream: RequestStream) -> None:
    while not stream.disconnected:
        stream.event.clear()
        await stream.event.wait()


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def _body(send: Send, data: bytes, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def _respond(
    send: Send, status: HTTPStatus | int, body: bytes, content_type: bytes | None, allow: str | None = None
) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if content_type is not None:
        headers.append((b"content-type", content_type))
    if allow is not None:
        headers.append((b"allow", allow.encode()))
    await send({"type": "http.response.start", "status": int(status), "headers": headers})
    await send({"type": "http.response.body", "body": body})
