"""Incremental SSE reading of an OpenAI-style stream, without decoding every chunk.

Events are split on blank lines across arbitrary read boundaries (CRLF or LF); each `data:`
payload is classified by cheap byte checks, and JSON is decoded only where a value is needed
(the usage chunk, an error). A content chunk counts as a token arrival unless its text is
empty (chat's role chunk, an empty final delta).
"""

from __future__ import annotations

import json
from array import array


class SSEReader:
    __slots__ = ("_buf", "t_first", "t_last", "chunks", "gaps_us", "times", "usage", "done", "error")

    def __init__(self, keep_times: bool = False) -> None:
        self._buf = b""
        self.t_first: int | None = None
        self.t_last: int | None = None
        self.chunks = 0
        self.gaps_us = array("I")
        self.times: list[int] | None = [] if keep_times else None
        self.usage: dict[str, int] | None = None
        self.done = False
        self.error: str | None = None

    def feed(self, t_ns: int, data: bytes) -> None:
        """Bytes that arrived at t_ns; every complete event in the buffer is handled now."""
        buf = self._buf + data
        held = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # its \n may come with the next read
                buf, held = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n")
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            self._event(t_ns, buf[start:end])
            start = end + 2
        self._buf = buf[start:] + held

    def _event(self, t_ns: int, event: bytes) -> None:
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                self._data(t_ns, line[5:].strip())

    def _data(self, t_ns: int, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        if not (payload.startswith(b"{") and payload.endswith(b"}")):
            self.error = self.error or f"malformed SSE data: {payload[:80]!r}"
            return
        if payload.startswith(b'{"error"'):
            try:
                self.error = json.loads(payload)["error"].get("message", "error event")
            except (ValueError, AttributeError, KeyError):
                self.error = f"malformed error event: {payload[:80]!r}"
            return
        if b'"choices":[]' in payload:
            try:
                self.usage = json.loads(payload).get("usage")
            except ValueError:
                self.error = self.error or f"malformed usage chunk: {payload[:80]!r}"
            return
        if b'"text":""' in payload or b'"content":""' in payload:
            return
        self.chunks += 1
        if self.t_first is None:
            self.t_first = t_ns
        else:
            self.gaps_us.append(min((t_ns - self.t_last) // 1000, 0xFFFFFFFF))  # type: ignore[operator]
        self.t_last = t_ns
        if self.times is not None:
            self.times.append(t_ns)

    def finish(self) -> None:
        if not self.done and self.error is None:
            self.error = "stream ended without data: [DONE]"
