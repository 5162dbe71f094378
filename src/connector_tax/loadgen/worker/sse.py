"""A streamed completion's SSE events: framing by the event-stream rules, every data payload
decoded as JSON (msgspec, typed to the few fields a record needs), token arrivals timed.

Framing follows the WHATWG event-stream rules for any server: lines end in LF, CRLF or CR (a
CR at the end of one read may pair with an LF at the start of the next); a blank line ends an
event; `:` lines are comments (keep-alives); `data:` lines of one event are joined by LF;
`event:`, `id:`, `retry:` and unknown fields are read and ignored (except `event: error`,
whose data is the error); one space after the colon is dropped. A final event that the stream
ends without a blank line still counts (`finish`).

Every payload other than `[DONE]` must be JSON of the chunk shape below; anything else — not
JSON, wrong types, a negative token count — is the request's error, with the reason, never a
token. A payload is a token arrival when one of its choices carries text (`text`, or a chat
`delta`'s `content`, `reasoning_content`, `reasoning` or `tool_calls`); a role-only delta, an
empty `finish_reason` chunk and a usage-only chunk are not. `usage` is taken from whichever
chunk carries it (its own chunk or the last content chunk; the last one wins).

Bounds: an incomplete line or an event's data may hold at most MAX_EVENT_BYTES; past that the
stream is an error (`fatal`: the caller stops reading it). Only the incomplete tail of a read is
kept between reads, and it is joined once, when its line ends, so a stream with no blank lines
costs linear time, not quadratic.

Speed: a read whose events are all single `data:` lines (what every server known here writes)
is framed with one split and two counts instead of a loop over lines — the split is exact for
that case, and any read that is not exactly that takes the line loop (property tests hold the
two equal) — and its payloads are decoded with one `map` over msgspec's decoder.
"""

from __future__ import annotations

from array import array
from typing import Annotated, Any

import msgspec

MAX_EVENT_BYTES = 1 << 20  # one line, or one event's data: a stated bound on what is buffered
_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] | None = None


class Choice(msgspec.Struct):
    text: str | None = None
    delta: Delta | None = None


class Usage(msgspec.Struct):
    prompt_tokens: _NonNegative | None = None
    completion_tokens: _NonNegative | None = None
    total_tokens: _NonNegative | None = None


class Chunk(msgspec.Struct):
    choices: list[Choice] | None = None
    usage: Usage | None = None
    error: Any = None  # {"message": ...} (vLLM, OpenAI) or a string (TGI)
    object: str | None = None  # "error": an error object at the top level
    message: Any = None


_decode = msgspec.json.Decoder(Chunk).decode
_EMPTY: list[bytes] = []


def _has_text(chunk: Chunk) -> bool:
    for choice in chunk.choices or ():
        if choice.text:
            return True
        d = choice.delta
        if d is not None and (d.content or d.reasoning_content or d.reasoning or d.tool_calls):
            return True
    return False


def _error_text(chunk: Chunk) -> str | None:
    err = chunk.error
    if err is None:
        if chunk.object == "error":
            return chunk.message if isinstance(chunk.message, str) and chunk.message else "error event"
        return None
    if isinstance(err, dict):
        message = err.get("message")
        return message if isinstance(message, str) and message else "error event"
    return err if isinstance(err, str) and err else "error event"


def _payload_reason(payload: bytes) -> str:
    """Why a payload that failed to decode is not a chunk: not JSON, or the wrong shape."""
    try:
        msgspec.json.decode(payload)
    except ValueError as exc:  # msgspec's DecodeError, or bad UTF-8 in a string
        return f"not JSON: {exc}"
    try:
        _decode(payload)
    except ValueError as exc:  # ValidationError is a DecodeError, both ValueErrors
        return f"not a completion chunk: {exc}"
    return "undecodable"


def _bulk(block: bytes) -> list[bytes] | None:
    """The payloads of `block` (complete lines, ending in a blank line) when every event in it
    is exactly one `data:` line; None otherwise (the line loop handles it)."""
    events = block[:-2].split(b"\n\n")
    # No event may hold a newline of its own: the separators account for every one of them.
    if block.count(b"\n") != 2 * len(events):
        return None
    for e in events:
        if not e.startswith(b"data:"):
            return None
    return [e[6:] if e[5:6] == b" " else e[5:] for e in events]


class SSEReader:
    __slots__ = (
        "_tail",
        "_tail_len",
        "_cr",
        "_data",
        "_data_len",
        "_event",
        "t_first",
        "t_last",
        "chunks",
        "gaps_us",
        "times",
        "usage",
        "done",
        "error",
        "fatal",
    )

    def __init__(self, keep_times: bool = False) -> None:
        self._tail: list[bytes] = []  # the incomplete last line, in pieces
        self._tail_len = 0
        self._cr = False  # the last read ended in CR: its LF may open the next one
        self._data: list[bytes] = []  # data lines of the event being read
        self._data_len = 0
        self._event = b""
        self.t_first: int | None = None
        self.t_last: int | None = None
        self.chunks = 0
        self.gaps_us = array("I")
        self.times: list[int] | None = [] if keep_times else None
        self.usage: dict[str, int] | None = None
        self.done = False
        self.error: str | None = None
        self.fatal = False  # a bound was exceeded: stop reading this stream

    # -- framing --------------------------------------------------------------------------
    def feed(self, t_ns: int, data: bytes) -> None:
        """Bytes that arrived at t_ns; every event completed by them is handled now."""
        if self.fatal or not data:
            return
        # The most common read under load: exactly one whole `data:` event and nothing pending.
        # It is what the general path below makes of it (one line, one blank line).
        if (
            not self._tail
            and not self._data
            and not self._event
            and not self._cr
            and data.startswith(b"data:")
            and data.endswith(b"\n\n")
            and data.count(b"\n") == 2
            and b"\r" not in data
        ):
            payload = data[6:-2] if data[5:6] == b" " else data[5:-2]
            # Inline, one frame: one plain text chunk, the reading of nearly every token.
            if not self.done:
                try:
                    chunk = _decode(payload)
                except ValueError:  # not a chunk, or [DONE]: the general handling says which
                    chunk = None
                if chunk is not None and chunk.usage is None and chunk.error is None and _has_text(chunk):
                    self._arrived(t_ns, 1)
                    return
            self._handle(t_ns, [payload])
            return
        if self._cr or b"\r" in data:
            data = self._normalize(data)
        end = data.rfind(b"\n")
        if end < 0:
            self._tail.append(data)
            self._tail_len += len(data)
            if self._tail_len > MAX_EVENT_BYTES:
                self._overflow("line")
            return
        if self._tail:
            block = b"".join(self._tail) + data[: end + 1]
            self._tail.clear()
        else:
            block = data[: end + 1] if end + 1 < len(data) else data
        rest = data[end + 1 :]
        self._tail_len = len(rest)
        if rest:
            self._tail.append(rest)
        payloads = None
        if not self._data and not self._event and block.endswith(b"\n\n"):
            payloads = _bulk(block)
        if payloads is None:
            payloads = self._lines(block)
        if payloads:
            self._handle(t_ns, payloads)

    def _normalize(self, data: bytes) -> bytes:
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if data.endswith(b"\r"):  # its LF may come with the next read
            data = data[:-1]
            self._cr = True
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _lines(self, block: bytes) -> list[bytes]:
        """The event-stream rules, line by line; the payloads of the events completed."""
        out: list[bytes] = []
        for line in block.split(b"\n")[:-1]:
            if not line:
                self._dispatch(out)
            elif line[0] == 58:  # ':' a comment
                continue
            else:
                name, colon, value = line.partition(b":")
                if colon and value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    self._data.append(value)
                    self._data_len += len(value) + 1
                    if self._data_len > MAX_EVENT_BYTES:
                        self._overflow("event")
                        return out
                elif name == b"event":
                    self._event = value
        return out

    def _dispatch(self, out: list[bytes]) -> None:
        data, event = self._data, self._event
        self._data, self._data_len, self._event = [], 0, b""
        if not data:
            return  # an event with no data is not dispatched
        payload = data[0] if len(data) == 1 else b"\n".join(data)
        if event == b"error":
            self._set_error(f"error event: {payload[:200].decode('utf-8', 'replace')}")
        else:
            out.append(payload)

    def _overflow(self, what: str) -> None:
        self._set_error(f"SSE {what} over {MAX_EVENT_BYTES} bytes")
        self.fatal = True
        self._tail, self._data = [], []

    # -- payloads -------------------------------------------------------------------------
    def _handle(self, t_ns: int, payloads: list[bytes]) -> None:
        if self.done:
            return
        last = payloads[-1]
        if last == b"[DONE]" or last.strip() == b"[DONE]":
            payloads = payloads[:-1]
            self.done = True
        try:
            chunks = list(map(_decode, payloads))
        except ValueError:  # msgspec's DecodeError / ValidationError, or bad UTF-8
            self._handle_slow(t_ns, payloads)
            return
        tokens = sum(map(self._chunk, chunks))
        if tokens:
            self._arrived(t_ns, tokens)

    def _chunk(self, chunk: Chunk) -> bool:
        """Take one decoded chunk's usage or error; True when it is a token arrival."""
        if chunk.usage is not None:
            self._take_usage(chunk.usage)
        if _has_text(chunk):
            return True
        if chunk.error is not None or chunk.object == "error":
            self._set_error(_error_text(chunk))
        return False

    def _handle_slow(self, t_ns: int, payloads: list[bytes]) -> None:
        """One payload at a time: [DONE] anywhere, and the reason of each bad one."""
        tokens = 0
        for payload in payloads:
            if payload.strip() == b"[DONE]":
                self.done = True
                break
            try:
                chunk = _decode(payload)
            except ValueError:
                self._set_error(f"malformed SSE data: {payload[:80]!r} ({_payload_reason(payload)})")
                continue
            tokens += self._chunk(chunk)
        if tokens:
            self._arrived(t_ns, tokens)

    def _take_usage(self, usage: Usage) -> None:
        self.usage = {k: getattr(usage, k) for k in usage.__struct_fields__ if getattr(usage, k) is not None}

    def _set_error(self, text: str | None) -> None:
        if self.error is None:
            self.error = text or "error event"

    def _arrived(self, t_ns: int, tokens: int) -> None:
        """`tokens` content chunks arrived in one read at t_ns: the gaps between them are 0."""
        if self.t_first is None:
            self.t_first = t_ns
        else:
            # t_last is set with t_first (below): checking one, on this per-read path, is enough.
            self.gaps_us.append(min((t_ns - self.t_last) // 1000, 0xFFFFFFFF))  # type: ignore[operator]
        if tokens > 1:
            self.gaps_us.frombytes(bytes(self.gaps_us.itemsize * (tokens - 1)))
        self.chunks += tokens
        self.t_last = t_ns
        if self.times is not None:
            self.times.extend([t_ns] * tokens)

    def finish(self, t_ns: int | None = None) -> None:
        """The response ended: a last event without its blank line still counts."""
        if not self.fatal:
            if self._cr:
                self._cr = False
                self.feed(t_ns or 0, b"\n")
            if self._tail:
                self.feed(t_ns or 0, b"\n")
            payloads: list[bytes] = []
            self._dispatch(payloads)
            if payloads:
                self._handle(t_ns if t_ns is not None else (self.t_last or 0), payloads)
        if not self.done and self.error is None:
            self.error = "stream ended without data: [DONE]"
