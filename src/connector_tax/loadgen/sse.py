"""Incremental SSE reading of an OpenAI-style stream, without decoding every chunk.

Events are split on blank lines across arbitrary read boundaries (CRLF or LF); each `data:`
payload is classified by cheap byte checks, and JSON is decoded only where a value is needed
(the usage chunk, an error). A content chunk counts as a token arrival unless its text is
empty (chat's role chunk, an empty final delta).
"""

from __future__ import annotations

import json
from array import array


# Payloads that are not token arrivals (or may not be). Each holds a quote or a bracket pair that
# a JSON string value cannot hold unescaped, so finding one inside a token's text is impossible
# for all but [DONE], which then only sends the rest of the read down the per-event path.
_NOT_PLAIN = (b'"text":""', b'"content":""', b'"choices":[]', b'{"error"', b"[DONE]")


def _plain_prefix(events: bytes) -> int:
    """Length of the longest prefix of `events` (whole events, each ending in a blank line) that
    is made only of plain token events: one `data: {…}` line each, none of _NOT_PLAIN. Checked
    with a few counts over the whole read instead of a split and five searches per event: a
    burst of 64 events cost ~100 µs of the worker's loop that way, time in which no due request
    could be fired.
    """
    cut = len(events)
    for marker in _NOT_PLAIN:
        i = events.find(marker, 0, cut)
        if i >= 0:
            cut = i
    cut = events.rfind(b"\n\n", 0, cut) + 2
    if cut < 2 or not events.startswith(b"data: {"):
        return 0
    n = events.count(b"\n\n", 0, cut)
    # Raw newlines cannot occur inside JSON, so "\n\ndata: {" and "}\n\n" only occur at event
    # boundaries: every event starts with `data: {`, ends with `}`, and is one line.
    if (
        events.count(b"\n", 0, cut) == 2 * n
        and events.count(b"\n\ndata: {", 0, cut) == n - 1
        and events.count(b"}\n\n", 0, cut) == n
    ):
        return cut
    return 0


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
        buf = self._buf + data if self._buf else data
        held = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # its \n may come with the next read
                buf, held = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n")
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf + held
            return
        complete, self._buf = buf[: end + 2], buf[end + 2 :] + held
        cut = _plain_prefix(complete)
        tokens = complete.count(b"\n\n", 0, cut)
        for event in complete[cut:-2].split(b"\n\n") if cut < len(complete) else ():
            if event.startswith(b"data:") and b"\n" not in event:
                tokens += self._data(event[5:].strip())  # the usual event: one data line
            else:
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        tokens += self._data(line[5:].strip())
        if tokens:
            self._arrived(t_ns, tokens)

    def _data(self, payload: bytes) -> bool:
        """True for a token arrival; anything else is handled here."""
        if payload == b"[DONE]":
            self.done = True
            return False
        if not (payload.startswith(b"{") and payload.endswith(b"}")):
            self.error = self.error or f"malformed SSE data: {payload[:80]!r}"
            return False
        if payload.startswith(b'{"error"'):
            try:
                self.error = json.loads(payload)["error"].get("message", "error event")
            except (ValueError, AttributeError, KeyError):
                self.error = f"malformed error event: {payload[:80]!r}"
            return False
        if b'"choices":[]' in payload:
            try:
                self.usage = json.loads(payload).get("usage")
            except ValueError:
                self.error = self.error or f"malformed usage chunk: {payload[:80]!r}"
            return False
        return not (b'"text":""' in payload or b'"content":""' in payload)

    def _arrived(self, t_ns: int, tokens: int) -> None:
        """`tokens` content chunks arrived in one read at t_ns: the gaps between them are 0."""
        if self.t_first is None:
            self.t_first = t_ns
        else:
            self.gaps_us.append(min((t_ns - self.t_last) // 1000, 0xFFFFFFFF))  # type: ignore[operator]
        if tokens > 1:
            self.gaps_us.frombytes(bytes(self.gaps_us.itemsize * (tokens - 1)))
        self.chunks += tokens
        self.t_last = t_ns
        if self.times is not None:
            self.times.extend([t_ns] * tokens)

    def finish(self) -> None:
        if not self.done and self.error is None:
            self.error = "stream ended without data: [DONE]"
