"""A worker process: receives request specs over ZMQ, runs them over HTTP, returns results.

Hot path: the ZMQ socket is drained synchronously on readability; each FIRE's
body is built on arrival (ahead of its time), and when the timer fires and an idle
keep-alive connection exists it is written right there in the callback, t_send stamped just
before the write — the effect of asyncio's eager task factory,
which Python 3.11 lacks (it arrived in 3.12; where present it is set as well). Only then is a
task created, and it suspends only when no response bytes are buffered.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import json
import os
import signal
import ssl
import time
from dataclasses import dataclass
from typing import IO

import uvloop
import zmq

from connector_tax.contract.summary import Priority
from connector_tax.loadgen import ipc
from connector_tax.loadgen.host.affinity import apply_affinity, pin_helper_threads
from connector_tax.loadgen.host.priority import set_fifo
from connector_tax.loadgen.worker.firetimer import FireTimer
from connector_tax.loadgen.worker.http import ConnectionClosed, ConnectionPool, HttpConnection, Response
from connector_tax.loadgen.worker.prompts import BodyBuilder, BodySettings
from connector_tax.loadgen.worker.sse import SSEReader
from connector_tax.loadgen.worker.urls import parse_url

PR_SET_PDEATHSIG = 1
MAX_ERROR_BODY = 64 * 1024  # of a non-200 or non-SSE body, kept for the message; the rest is not read


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: int
    url: str
    body: BodySettings
    seed: int
    timeout_s: float
    max_connections: int
    prewarm_connections: int  # opened at start and kept in stock as requests take them
    spin_ns: int
    spin_share: float
    requests_addr: str
    results_addr: str
    cpus: tuple[int, ...] | None = None
    helper_cpus: tuple[int, ...] | None = None  # for ZMQ's I/O thread: off this worker's core
    api_key_env: str | None = None  # read here, sent as "Authorization: Bearer"
    tls_verify: bool = True
    tls_ca_file: str | None = None
    rt_priority: int | None = None  # SCHED_FIFO for the whole worker (priority.py)
    # The generator's pid, taken before the spawn: a worker reading os.getppid() once its parent
    # is already dead would read its reaper's, and watch the wrong process for ever.
    parent_pid: int | None = None
    target: int = 0  # which of the generator's targets `url` is: named back in every result


def tls_context(verify: bool, ca_file: str | None) -> ssl.SSLContext:
    """The standard library's client defaults; `verify` False is curl's --insecure."""
    ctx = ssl.create_default_context(cafile=ca_file)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def worker_main(cfg: WorkerConfig) -> None:
    """Process entry point (multiprocessing spawn target)."""
    _die_with_parent()
    if cfg.parent_pid is not None and os.getppid() != cfg.parent_pid:
        return  # the parent died before the death signal was armed (killed during our start)
    # Ctrl-C reaches the whole process group; the main process decides how to wind down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cfg.cpus:
        apply_affinity(cfg.cpus)
    # Before the loop and ZMQ's I/O thread exist, so that they inherit it.
    priority = set_fifo(cfg.rt_priority, inherit=True)
    uvloop.run(Worker(cfg, priority.describe()).run())


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the parent-pid watchdog below still ends an orphan


class Worker:
    def __init__(self, cfg: WorkerConfig, priority: Priority | None = None) -> None:
        self.cfg = cfg
        self.priority = priority
        target = parse_url(cfg.url, cfg.body.endpoint)
        self.host, self.port, self.path = target.host, target.port, target.path
        self.builder = BodyBuilder(cfg.body, cfg.seed)
        tls = tls_context(cfg.tls_verify, cfg.tls_ca_file) if target.tls else None
        self.pool = ConnectionPool(self.host, self.port, cfg.max_connections, spare=cfg.prewarm_connections, tls=tls)
        auth = ""
        if cfg.api_key_env:
            auth = f"Authorization: Bearer {os.environ.get(cfg.api_key_env, '')}\r\n".replace("%", "%%")
        self._head = (
            f"POST {self.path.replace('%', '%%')} HTTP/1.1\r\nHost: {target.host_header}\r\n{auth}"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            "X-Request-Id: %s\r\nContent-Length: %d\r\n\r\n"
        )
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._chunk_log: IO[str] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._ppid = os.getppid() if cfg.parent_pid is None else cfg.parent_pid

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        if hasattr(asyncio, "eager_task_factory"):  # Python >= 3.12
            loop.set_task_factory(asyncio.eager_task_factory)
        self._stopped = loop.create_future()
        ctx = zmq.Context()
        self.requests = ctx.socket(zmq.PULL)
        self.requests.connect(self.cfg.requests_addr)
        self._fd = int(self.requests.getsockopt(zmq.FD))  # the socket's fd: an int on Linux
        self.results = ctx.socket(zmq.PUSH)
        self.results.setsockopt(zmq.SNDHWM, 0)
        self.results.setsockopt(zmq.LINGER, 2000)
        self.results.connect(self.cfg.results_addr)
        if self.cfg.helper_cpus:
            pin_helper_threads(self.cfg.helper_cpus)  # ZMQ's I/O thread exists now
        self.timer = FireTimer(loop, self.cfg.spin_ns, self.cfg.spin_share)
        self.pool.before_read = self.timer.run_due  # a send due now goes before a response's parsing
        try:
            await self.pool.prewarm(self.cfg.prewarm_connections)
        except OSError:
            pass  # the server may not be up yet; connections open on demand
        # Everything so far (modules, the token pool) lives as long as the worker: out of the
        # collector's sight, a full collection no longer stops the loop for ~16 ms (measured
        # at 64 req/s against a saturated server, with ~100 requests in flight).
        gc.freeze()
        self.results.send(ipc.pack(ipc.Ready(self.cfg.worker_id, os.getpid(), self.priority)))
        loop.add_reader(self._fd, self._on_readable)
        loop.call_later(1.0, self._watchdog)
        self._on_readable()  # messages may have queued before the reader was added
        try:
            await self._stopped
        finally:
            loop.remove_reader(self._fd)
            self.timer.close()
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel("worker stopped")
            # Let them finish (each sends its result) before the sockets close under them.
            await asyncio.gather(*tasks, return_exceptions=True)
            self.pool.close()
            if self._chunk_log is not None:
                self._chunk_log.close()
            self.results.send(ipc.pack(ipc.Bye(self.cfg.worker_id)))
            self.requests.close(linger=0)
            self.results.close()
            ctx.term()

    def _watchdog(self) -> None:
        if os.getppid() != self._ppid:
            self._stop()
            return
        asyncio.get_running_loop().call_later(1.0, self._watchdog)

    def _stop(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    def _on_readable(self) -> None:
        # The ZMQ fd is edge-triggered: drain everything now, or a message can sit unseen. ZMQ's
        # EVENTS says when nothing is left; ending on zmq.Again built an exception per drain.
        requests = self.requests
        while int(requests.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                message = ipc.to_worker(requests.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            if type(message) is ipc.Fire:
                # The body is built now, while the request waits for its time: on the hot path
                # after the timer, building it cost ~30 µs (cold caches after a sleep).
                spec = message.spec
                self.timer.at(message.t_scheduled_ns, functools.partial(self._fire, spec, self._request_bytes(spec)))
            elif type(message) is ipc.CancelAll:
                for unsent in self.timer.cancel_all():
                    # Every callable the timer holds is the partial of _fire made above; its
                    # first argument is the request (the timer's type says only "a callable").
                    spec = unsent.args[0]  # type: ignore[attr-defined]
                    reason = f"{message.reason} (never sent)"
                    result = self._result(spec, None, SSEReader(), 0, "timeout", reason)
                    self.results.send(ipc.pack(ipc.Result(result)), zmq.NOBLOCK)
                for task in list(self._tasks.values()):
                    task.cancel(message.reason)
            elif type(message) is ipc.SetCell:
                self._set_chunk_log(message.chunk_log)
            elif type(message) is ipc.Stop:
                self._stop()
                return

    def _set_chunk_log(self, path: str | None) -> None:
        if self._chunk_log is not None:
            self._chunk_log.close()
        self._chunk_log = open(path, "a", encoding="utf-8") if path else None
        self.results.send(ipc.pack(ipc.CellSet(self.cfg.worker_id)))

    def _request_bytes(self, spec: ipc.RequestSpec) -> bytes:
        body = self.builder.body(spec.prompt_key or spec.request_id, spec.input_len, spec.output_len, spec.blocks)
        return (self._head % (spec.request_id, len(body))).encode() + body

    def _fire(self, spec: ipc.RequestSpec, data: bytes) -> None:
        sent: tuple[HttpConnection, Response, int] | None = None
        reader = SSEReader(keep_times=self._chunk_log is not None)
        conn = self.pool.try_acquire()
        if conn is not None:
            t_send = time.monotonic_ns()
            sent = (conn, conn.send(data, reader, MAX_ERROR_BODY), t_send)
        task = asyncio.get_running_loop().create_task(self._run(spec, data, reader, sent))
        if not task.done():
            self._tasks[spec.index] = task

    async def _run(
        self, spec: ipc.RequestSpec, data: bytes, reader: SSEReader, sent: tuple[HttpConnection, Response, int] | None
    ) -> None:
        result = await self._exchange(spec, data, reader, sent)
        self._tasks.pop(spec.index, None)
        self.results.send(ipc.pack(ipc.Result(result)), zmq.NOBLOCK)
        if self._chunk_log is not None and reader.times is not None:
            self._chunk_log.write(json.dumps({"request_id": spec.request_id, "t_ns": reader.times}) + "\n")

    async def _exchange(
        self,
        spec: ipc.RequestSpec,
        data: bytes,
        reader: SSEReader,
        sent: tuple[HttpConnection, Response, int] | None,
    ) -> ipc.RequestResult:
        t_send: int | None = None
        status_code = 0
        conn: HttpConnection | None = None
        response: Response | None = None
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.cfg.timeout_s, self._timeout, spec.index)
        try:
            for attempt in (0, 1):
                if sent is not None:
                    (conn, response, t_send), sent = sent, None
                else:
                    conn = self.pool.try_acquire() or await self.pool.acquire()
                    t_send = time.monotonic_ns()
                    response = conn.send(data, reader, MAX_ERROR_BODY)
                try:
                    # The body goes to the reader inside the connection's callbacks, read by
                    # read: this task wakes once, when the response is complete.
                    await response.wait_complete()
                    break
                except ConnectionClosed:
                    # A keep-alive connection the server closed while idle: retry once, fresh.
                    if attempt == 1 or conn.used == 1 or response.headers_done:
                        raise
                    self.pool.release(conn)
                    conn = None
            assert conn is not None and response is not None  # the loop breaks with both, or raises
            status_code = response.status
            if not response.streaming:
                raw = b"".join(chunk for _, chunk in response.chunks)[:MAX_ERROR_BODY]
                text = _error_text(status_code, raw, response.cut)
                if status_code == 200:
                    ctype = (response.content_type or b"").decode("latin-1")
                    text = f"not an event stream (content-type {ctype!r}): {text}"
                return self._result(spec, t_send, reader, status_code, "error", text)
            status = "error" if reader.error else "ok"
            return self._result(spec, t_send, reader, status_code, status, reader.error)
        except asyncio.CancelledError as exc:
            if conn is not None:
                conn.abort()
            reason = str(exc.args[0]) if exc.args else "cancelled"
            status = "timeout" if reason.startswith("timeout") or reason.startswith("drain") else "error"
            return self._result(spec, t_send, reader, response.status if response else 0, status, reason)
        except (ConnectionClosed, OSError) as exc:
            code = response.status if response else 0
            return self._result(spec, t_send, reader, code, "error", f"{type(exc).__name__}: {exc}")
        finally:
            timer.cancel()
            if conn is not None:
                self.pool.release(conn)

    def _timeout(self, index: int) -> None:
        task = self._tasks.get(index)
        if task is not None:
            task.cancel(f"timeout after {self.cfg.timeout_s:g} s")

    def _result(
        self,
        spec: ipc.RequestSpec,
        t_send: int | None,
        reader: SSEReader,
        status_code: int,
        status: str,
        error: str | None,
    ) -> ipc.RequestResult:
        usage = reader.usage or {}
        usage_tokens = usage.get("completion_tokens")
        return ipc.RequestResult(
            index=spec.index,
            worker=self.cfg.worker_id,
            t_send_ns=t_send,
            t_first_token_ns=reader.t_first,
            t_last_token_ns=reader.t_last,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage_tokens if usage_tokens is not None else (reader.chunks or None),
            chunks=reader.chunks,
            http_status=status_code,
            status=status,
            error=error,
            itl_us=reader.gaps_us.tobytes(),
            cell=spec.cell,
            request_id=spec.request_id,
            usage_completion_tokens=usage_tokens,
            target=self.cfg.target,
        )


def _error_text(status_code: int, raw: bytes, cut: bool = False) -> str:
    message = None
    if not cut:
        try:
            obj = json.loads(raw)
            err = obj.get("error") if isinstance(obj, dict) else None
            message = (
                err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else obj.get("message")
            )
        except (ValueError, AttributeError):
            pass
    if not isinstance(message, str) or not message:
        message = raw[:200].decode("utf-8", "replace")
    if cut:
        message += f" (body over {MAX_ERROR_BODY} bytes, not read further)"
    return f"HTTP {status_code}: {message}"
