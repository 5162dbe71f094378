"""SSEReader against any valid formatting: property tests over server styles, and fuzzing.

One logical stream (tokens, a role chunk, an empty finish chunk, usage in its own chunk or in
the last content chunk, keep-alives, [DONE]) is rendered the way vLLM, SGLang, TGI, llama.cpp
and OpenAI write it, then perturbed in every way the JSON and event-stream grammars allow:
whitespace, key order, escapes, unicode, LF / CRLF / CR line endings, comments, `event:` and
`id:` fields, data split over several `data:` lines, no space after the colon, a final event
without its blank line, and cut into reads at arbitrary places. The reader must report what
an independent reference (the spec's line rules and the standard library's json, written
here) reports, and what the logical stream says. The fuzz tests feed arbitrary bytes: the
reader may call them errors, but must not raise, hang or buffer past its bound.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector_tax.loadgen.worker.sse import MAX_EVENT_BYTES, SSEReader

STYLES = ("vllm", "sglang", "tgi", "llamacpp", "openai")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the reference: the spec, literally ----------------------------------------------------------
def reference(stream: bytes) -> tuple[int, dict | None, bool, bool]:
    """(content chunks, usage, done, error?) by the event-stream rules and json.loads."""
    text = stream.decode("utf-8", "surrogateescape")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = re.split(r"\r\n|\r|\n", text)
    tokens, usage, done, error = 0, None, False, False
    data: list[str] = []
    event = ""
    payloads: list[tuple[str, str]] = []
    for line in lines[:-1] + ([lines[-1]] if lines[-1] else []) + [""]:  # the end dispatches
        if line == "":
            if data:
                payloads.append((event, "\n".join(data)))
            data, event = [], ""
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    for event, payload in payloads:
        if done:
            break
        if event == "error":
            error = True
            continue
        if payload.strip() == "[DONE]":
            done = True
            continue
        try:
            obj = json.loads(payload.encode("utf-8", "surrogateescape"))
        except ValueError:
            error = True
            continue
        if not _shape_ok(obj):
            error = True
            continue
        if obj.get("usage") is not None:
            usage = {
                k: v for k, v in obj["usage"].items() if k in ("prompt_tokens", "completion_tokens", "total_tokens")
            }
        if any(_has_text(c) for c in obj.get("choices") or []):
            tokens += 1
        elif obj.get("error") is not None or obj.get("object") == "error":
            error = True
    return tokens, usage, done, error or not done


def _has_text(choice: dict) -> bool:
    delta = choice.get("delta") or {}
    return bool(
        choice.get("text") or any(delta.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls"))
    )


def _is_count(v: object) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def _shape_ok(obj: object) -> bool:
    if not isinstance(obj, dict):
        return False
    choices = obj.get("choices")
    if choices is not None:
        if not isinstance(choices, list):
            return False
        for c in choices:
            if not isinstance(c, dict) or not isinstance(c.get("text"), (str, type(None))):
                return False
            d = c.get("delta")
            if d is not None and (
                not isinstance(d, dict)
                or not all(
                    isinstance(d.get(k), (str, type(None))) for k in ("content", "reasoning_content", "reasoning")
                )
                or not isinstance(d.get("tool_calls"), (list, type(None)))
            ):
                return False
    usage = obj.get("usage")
    if usage is not None and (
        not isinstance(usage, dict)
        or not all(_is_count(usage.get(k)) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    ):
        return False
    return isinstance(obj.get("object"), (str, type(None)))


def outcome(reader: SSEReader) -> tuple[int, dict | None, bool, bool]:
    return reader.chunks, reader.usage, reader.done, reader.error is not None


def read(pieces: list[bytes]) -> SSEReader:
    reader = SSEReader(keep_times=True)
    for k, piece in enumerate(pieces):
        reader.feed(1_000 * (k + 1), piece)
    reader.finish(1_000 * (len(pieces) + 1))
    return reader


# -- logical streams and their renderings -------------------------------------------------------
token_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)


@st.composite
def logical(draw: st.DrawFn) -> dict:
    return {
        "chat": draw(st.booleans()),
        "reasoning": draw(st.lists(token_text, max_size=3)),
        "tokens": draw(st.lists(token_text, max_size=12)),
        "usage_in_last": draw(st.booleans()),
        "usage": draw(st.booleans()),
        "keepalives": draw(st.lists(st.integers(0, 20), max_size=3)),
    }


def chunks_of(s: dict, style: str) -> list[dict]:
    """The JSON objects a server of `style` sends for the logical stream."""
    n = len(s["tokens"]) + len(s["reasoning"])
    usage = {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}
    base = {
        "id": "cmpl-1",
        "object": "chat.completion.chunk" if s["chat"] else "text_completion",
        "created": 1,
        "model": "m",
    }
    if style == "tgi":
        base["system_fingerprint"] = "3.0.0-native"
    if style == "llamacpp":
        base["timings"] = {"prompt_n": 16, "predicted_ms": 1.5}

    def choice(text: str | None, reasoning: bool = False, finish: str | None = None, role: bool = False) -> dict:
        if s["chat"]:
            delta: dict = {"role": "assistant"} if role else {}
            if text is not None:
                delta["reasoning_content" if reasoning else "content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish, "stop_reason": None}

    out: list[dict] = []
    if s["chat"]:
        out.append({**base, "choices": [choice(None if style != "vllm" else "", role=True)]})
    texts = [(t, True) for t in (s["reasoning"] if s["chat"] else [])] + [(t, False) for t in s["tokens"]]
    if not s["chat"]:
        texts += [(t, False) for t in s["reasoning"]]
    for t, reasoning in texts:
        out.append({**base, "choices": [choice(t, reasoning)], "usage": None})
    last = {**base, "choices": [choice("" if not s["chat"] else None, finish="length")]}
    if s["usage"] and s["usage_in_last"]:
        last["usage"] = usage
    out.append(last)
    if s["usage"] and not s["usage_in_last"]:
        out.append({**base, "choices": [], "usage": usage})
    return out


def expected(s: dict) -> tuple[int, dict | None, bool, bool]:
    n = len(s["tokens"]) + len(s["reasoning"])
    usage = {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n} if s["usage"] else None
    return n, usage, True, False


@st.composite
def rendering(draw: st.DrawFn, s: dict) -> bytes:
    style = draw(st.sampled_from(STYLES))
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    space = draw(st.sampled_from(["", " "])) if style == "tgi" else " "
    events: list[str] = []
    for obj in chunks_of(s, style):
        if draw(st.booleans()):
            obj = dict(sorted(obj.items(), key=lambda kv: draw(st.integers(0, 9))))
        seps = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,  ", " :\t"), (",", ": ")]))
        if style == "vllm":
            seps = (",", ":")
        elif style == "sglang":
            seps = (", ", ": ")
        text = json.dumps(obj, separators=seps, ensure_ascii=draw(st.booleans()))
        fields = []
        if draw(st.integers(0, 4)) == 0:
            fields.append(f"id: {draw(st.integers(0, 99))}")
        if draw(st.integers(0, 4)) == 0:
            fields.append("event: message")
        if draw(st.integers(0, 5)) == 0:  # a pretty-printed payload: one data line per JSON line
            fields += [f"data:{space}{line}" for line in json.dumps(obj, indent=1).split("\n")]
        else:
            fields.append(
                f"data:{space}{draw(st.sampled_from(['', ' ', chr(9)]))}{text}{draw(st.sampled_from(['', ' ']))}"
            )
        events.append(eol.join(fields) + eol + eol)
    for pos in s["keepalives"]:
        events.insert(min(pos, len(events)), f": keep-alive{eol}{eol}")
    done = f"data:{space}[DONE]"
    tail = draw(st.sampled_from([eol + eol, eol, ""]))  # a final event without its blank line
    return ("".join(events) + done + tail).encode()


@st.composite
def case(draw: st.DrawFn) -> tuple[dict, bytes, list[bytes]]:
    s = draw(logical())
    stream = draw(rendering(s))
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(stream) - 1)), max_size=12, unique=True)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)]) if b > a]
    return s, stream, pieces


@SETTINGS
@given(case())
def test_every_formatting_gives_the_logical_stream(c: tuple[dict, bytes, list[bytes]]) -> None:
    s, stream, pieces = c
    want = expected(s)
    assert reference(stream) == want  # the rendering is what it claims to be
    assert outcome(read([stream])) == want
    reader = read(pieces)
    assert outcome(reader) == want
    # Token times come from the reads, in order, one per content chunk.
    assert reader.times == sorted(reader.times) and len(reader.times) == want[0]
    assert reader.gaps_us.tolist() == [(b - a) // 1000 for a, b in zip(reader.times, reader.times[1:])]


@SETTINGS
@given(case())
def test_byte_by_byte_equals_one_read(c: tuple[dict, bytes, list[bytes]]) -> None:
    _, stream, _ = c
    assert outcome(read([stream[i : i + 1] for i in range(len(stream))])) == outcome(read([stream]))


def test_one_event_per_read_times_each_token() -> None:
    s = {
        "chat": True,
        "reasoning": ["r"],
        "tokens": ["a", "b"],
        "usage_in_last": False,
        "usage": True,
        "keepalives": [],
    }
    events = [f"data: {json.dumps(o)}\n\n".encode() for o in chunks_of(s, "sglang")] + [b"data: [DONE]\n\n"]
    reader = read(events)
    assert outcome(reader) == expected(s)
    # role chunk at read 1, then reasoning, a, b at reads 2, 3, 4
    assert reader.times == [2_000, 3_000, 4_000]


# -- per-request errors, never tokens ------------------------------------------------------------
BAD = {
    b"not json": "not JSON",
    b'{"choices": [{"text": 5}]}': "not a completion chunk",
    b'{"choices": {"text": "a"}}': "not a completion chunk",
    b'{"choices": [], "usage": {"completion_tokens": "64"}}': "not a completion chunk",
    b'{"choices": [], "usage": {"completion_tokens": -1}}': "not a completion chunk",
    b'{"choices": [], "usage": {"completion_tokens": 6.5}}': "not a completion chunk",
    b'{"choices": [], "usage": {"completion_tokens": true}}': "not a completion chunk",
    b"[1, 2]": "not a completion chunk",
    b'{"choices": [{"text": "a"}]} trailing': "not JSON",
    b'{"choices": [{"text": "\xff"}]}': "not JSON",
}


def test_malformed_payloads_are_errors_with_their_reason_and_not_tokens() -> None:
    for payload, reason in BAD.items():
        good = b'data: {"choices": [{"text": "x"}]}\n\n'
        reader = read([good + b"data: " + payload + b"\n\n" + good + b"data: [DONE]\n\n"])
        assert reader.chunks == 2, payload  # the bad one is not a token; the good ones still are
        assert reader.error is not None and reader.error.startswith("malformed SSE data: "), payload
        assert f"({reason}" in reader.error, (payload, reader.error)


def test_error_events_in_every_known_shape() -> None:
    for payload, message in [
        (b'{"error": {"message": "boom", "code": 500}}', "boom"),
        (b'{"object": "error", "message": "bad request", "code": 400}', "bad request"),
        (b'{"error": "Input validation error", "error_type": "validation"}', "Input validation error"),
    ]:
        reader = read([b"data: " + payload + b"\n\ndata: [DONE]\n\n"])
        assert (reader.chunks, reader.error) == (0, message)
    reader = read([b"event: error\ndata: overloaded\n\n"])
    assert reader.error == "error event: overloaded"


def test_oversize_line_and_event_are_fatal_errors_and_bounded() -> None:
    reader = SSEReader()
    piece = b"x" * 65536
    for _ in range(MAX_EVENT_BYTES // len(piece) + 2):
        reader.feed(1, piece)  # one line that never ends
    assert reader.fatal and reader.error == f"SSE line over {MAX_EVENT_BYTES} bytes"
    reader = SSEReader()
    line = b"data: " + b"y" * 1000 + b"\n"
    for _ in range(MAX_EVENT_BYTES // 1000 + 2):
        reader.feed(1, line)  # many data lines, no blank line: one event growing
    assert reader.fatal and reader.error == f"SSE event over {MAX_EVENT_BYTES} bytes"
    reader.feed(2, b"\n\ndata: [DONE]\n\n")  # ignored once fatal
    assert not reader.done


def _cpu_s(fn: Callable[[], object]) -> float:
    """This thread's CPU seconds for fn, the best of three: CPU time, not wall time, so that a
    busy host's waits for a core do not count."""
    best = float("inf")
    for _ in range(3):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best


def test_no_blank_lines_is_linear_not_quadratic() -> None:
    # Data lines in as many reads with no blank line: one event (an error once over the bound),
    # handled in time proportional to the bytes: four times the lines cost about four times the
    # CPU (a quadratic join, sixteen).
    line = b'data: {"choices": [{"text": "a"}]}\n'

    def lines(n: int) -> SSEReader:
        reader = SSEReader()
        for _ in range(n):
            reader.feed(1, line)
        reader.finish(2)
        return reader

    reader = lines(20_000)
    assert reader.chunks == 0 and reader.error is not None  # the joined lines are not one JSON value
    small, large = _cpu_s(lambda: lines(5_000)), _cpu_s(lambda: lines(20_000))
    assert large < 8 * small, (small, large)

    # The same bytes with no newline at all, 1 byte at a time: the tail is joined once per line.
    def bytes_(n: int) -> SSEReader:
        reader = SSEReader()
        for _ in range(n):
            reader.feed(1, b"z")
        return reader

    assert not bytes_(200_000).fatal
    small, large = _cpu_s(lambda: bytes_(50_000)), _cpu_s(lambda: bytes_(200_000))
    assert large < 8 * small, (small, large)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=10))
def test_fuzz_arbitrary_bytes_never_raise(pieces: list[bytes]) -> None:
    reader = read(pieces)
    assert reader.done or reader.error is not None
    assert reader.chunks == len(reader.times or [])


SSE_ALPHABET = [
    b"data:",
    b"data: ",
    b"\n",
    b"\r",
    b"\r\n",
    b":",
    b"event: error",
    b"id: 1",
    b"[DONE]",
    b'{"choices": [{"text": "a"}]}',
    b'{"choices": [], "usage": {"completion_tokens": 1}}',
    b'{"error": {"message": "m"}}',
    b"{",
    b"}",
    b'"',
    b"\\",
    b"\xff",
    b" ",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(SSE_ALPHABET), max_size=60), st.lists(st.integers(1, 400), max_size=8))
def test_fuzz_sse_like_bytes_match_the_reference(parts: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(parts)
    cuts = sorted({c for c in cuts if c < len(stream)})
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)]) if b > a]
    got = read(pieces)
    assert outcome(got) == outcome(read([stream]))
    tokens, usage, done, error = reference(stream)
    assert (got.chunks, got.done) == (tokens, done), stream
    assert (got.error is not None) == error, (stream, got.error)
    if not error:
        assert got.usage == usage
