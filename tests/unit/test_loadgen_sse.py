"""SSEReader: OpenAI/vLLM streams cut at arbitrary read boundaries.

Every test states the exact chunk count, usage, done flag, error text and timestamps the reader
must report. The streams here use vLLM's compact JSON; other servers' formattings, an
independent reference parser and the fuzz tests are in test_loadgen_sse_formats.py. The
random-cut tests feed the same stream in many different cuttings and demand the result of a
single read.
"""

from __future__ import annotations

import json
import random

import pytest

from connector_tax.loadgen.worker.sse import SSEReader

USAGE = {"prompt_tokens": 5, "total_tokens": 9, "completion_tokens": 4}


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def completion_chunk(text: str, finish: str | None = None) -> str:
    return _compact(
        {
            "id": "cmpl-t-0",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}],
            "usage": None,
        }
    )


def chat_chunk(delta: dict, finish: str | None = None) -> str:
    return _compact(
        {
            "id": "chatcmpl-t-0",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
    )


def usage_chunk(usage: dict = USAGE) -> str:
    return _compact(
        {"id": "cmpl-t-0", "object": "text_completion", "created": 1, "model": "m", "choices": [], "usage": usage}
    )


def sse(*payloads: str, eol: str = "\n") -> bytes:
    return "".join(f"data: {p}{eol}{eol}" for p in payloads).encode()


# Four tokens, an empty final delta, the usage chunk, [DONE].
COMPLETION = sse(
    completion_chunk(" alpha"),
    completion_chunk(" beta"),
    completion_chunk(" gamma"),
    completion_chunk(" delta", None),
    completion_chunk("", "length"),
    usage_chunk(),
    "[DONE]",
)
CONTENT_EVENTS = 4


def _event_ends(stream: bytes, sep: bytes = b"\n\n") -> list[int]:
    """Offset of the last byte of each event's terminating blank line."""
    ends, pos = [], 0
    while (i := stream.find(sep, pos)) >= 0:
        ends.append(i + len(sep) - 1)
        pos = i + len(sep)
    return ends


def read(pieces: list[bytes], times: list[int] | None = None, keep_times: bool = False) -> SSEReader:
    reader = SSEReader(keep_times=keep_times)
    for k, piece in enumerate(pieces):
        reader.feed(times[k] if times else 1_000 * (k + 1), piece)
    reader.finish()
    return reader


def outcome(reader: SSEReader) -> tuple:
    return reader.chunks, reader.usage, reader.done, reader.error


def random_cut(stream: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, min(40, len(stream) - 1))))
    return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]


# -- one read ---------------------------------------------------------------------------
def test_single_read_counts_tokens_usage_and_done() -> None:
    reader = read([COMPLETION], [7_000])
    assert outcome(reader) == (4, USAGE, True, None)
    assert (reader.t_first, reader.t_last) == (7_000, 7_000)
    assert reader.gaps_us.tolist() == [0, 0, 0]
    assert reader.times is None


def test_empty_text_chunks_are_not_tokens() -> None:
    stream = sse(completion_chunk(""), completion_chunk(" a"), completion_chunk("", "length"), "[DONE]")
    reader = read([stream])
    assert outcome(reader) == (1, None, True, None)


def test_chat_role_chunk_is_not_a_token() -> None:
    stream = sse(
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": " one"}),
        chat_chunk({"content": " two"}),
        chat_chunk({"content": ""}, "length"),
        usage_chunk({"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}),
        "[DONE]",
    )
    ends = _event_ends(stream)
    reader = read([stream[i : i + 1] for i in range(len(stream))], [1_000 * i for i in range(len(stream))])
    assert outcome(reader) == (2, {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}, True, None)
    # The role chunk completes first but is not the first token: the second event is.
    assert reader.t_first == 1_000 * ends[1]
    assert reader.t_last == 1_000 * ends[2]


def test_keepalive_comments_and_non_data_fields_are_ignored() -> None:
    stream = (
        b": ping\n\n"
        + sse(completion_chunk(" a"))
        + b": keep-alive\n\nevent: message\nid: 7\n\nretry: 100\n\n"
        + sse(completion_chunk(" b"), "[DONE]")
    )
    assert outcome(read([stream])) == (2, None, True, None)


def test_data_without_space_after_colon() -> None:
    stream = ("data:" + completion_chunk(" a") + "\n\ndata:[DONE]\n\n").encode()
    assert outcome(read([stream])) == (1, None, True, None)


def test_missing_done_is_an_error() -> None:
    reader = read([sse(completion_chunk(" a"), completion_chunk(" b"))])
    assert outcome(reader) == (2, None, False, "stream ended without data: [DONE]")


def test_final_event_without_blank_line_counts_when_the_response_ends() -> None:
    # The last events lack their blank line (and the very last its newline): the response's
    # end completes them, at the time of its last read.
    stream = sse(completion_chunk(" a")) + ("data: " + completion_chunk(" b") + "\n").encode()
    reader = SSEReader()
    reader.feed(1_000, stream)
    assert reader.chunks == 1
    reader.finish(2_000)
    assert outcome(reader) == (2, None, False, "stream ended without data: [DONE]")
    assert reader.t_last == 2_000
    done = sse(completion_chunk(" a")) + b"data: [DONE]"
    assert outcome(read([done])) == (1, None, True, None)


# -- errors -----------------------------------------------------------------------------
def test_error_event_message() -> None:
    err = _compact(
        {
            "error": {
                "message": "EngineCore encountered an issue.",
                "type": "InternalServerError",
                "param": None,
                "code": 500,
            }
        }
    )
    reader = read([sse(completion_chunk(" a"), err, "[DONE]")])
    assert outcome(reader) == (1, None, True, "EngineCore encountered an issue.")


def test_error_event_with_spaced_json_as_the_sim_sends_it() -> None:
    # The sim (like vLLM) re-serializes the in-stream error with json.dumps' default spacing.
    err = json.dumps({"error": {"message": "engine dead", "type": "x", "param": None, "code": 500}})
    reader = read([sse(err, "[DONE]")])
    assert outcome(reader) == (0, None, True, "engine dead")


def test_error_event_without_message_and_undecodable() -> None:
    assert read([sse('{"error":{"code":500}}', "[DONE]")]).error == "error event"
    assert read([sse('{"error":oops}', "[DONE]")]).error.startswith("malformed SSE data: b'{\"error\":oops}' (not JSON")


def test_malformed_data_is_an_error_and_the_first_error_is_kept() -> None:
    cut = completion_chunk(" a")[:30]
    stream = sse(cut, completion_chunk(" b"), "not json", "[DONE]")
    reader = read([stream])
    assert reader.error.startswith(f"malformed SSE data: {cut.encode()!r} (not JSON: ")
    # Later well-formed chunks still count; [DONE] does not clear the error.
    assert (reader.chunks, reader.done) == (1, True)


def test_malformed_data_is_truncated_to_80_bytes() -> None:
    junk = "x" * 200
    assert read([sse(junk, "[DONE]")]).error.startswith(f"malformed SSE data: {(b'x' * 80)!r} (not JSON")


def test_malformed_usage_chunk() -> None:
    bad = '{"choices":[],"usage":{"prompt_tokens":}'
    reader = read([sse(completion_chunk(" a"), bad, "[DONE]")])
    assert outcome(reader)[:3] == (1, None, True)
    assert reader.error.startswith(f"malformed SSE data: {bad.encode()!r} (not JSON")


# -- timestamps -------------------------------------------------------------------------
def test_gaps_and_times_are_per_completing_read() -> None:
    events = [sse(completion_chunk(t)) for t in (" a", " b", " c")] + [sse(usage_chunk(), "[DONE]")]
    times = [1_000_000, 1_250_000, 4_000_000, 4_100_000]
    reader = read(events, times, keep_times=True)
    assert (reader.t_first, reader.t_last) == (1_000_000, 4_000_000)
    assert reader.gaps_us.tolist() == [250, 2_750]
    assert reader.times == [1_000_000, 1_250_000, 4_000_000]


def test_gap_saturates_at_uint32() -> None:
    events = [sse(completion_chunk(" a")), sse(completion_chunk(" b"), "[DONE]")]
    reader = read(events, [0, 10**16])
    assert reader.gaps_us.tolist() == [0xFFFFFFFF]


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
def test_t_first_is_the_read_that_completed_the_first_event(eol: str) -> None:
    stream = COMPLETION if eol == "\n" else COMPLETION.replace(b"\n", b"\r\n")
    ends = _event_ends(stream, eol.encode() * 2)
    first_end, last_end = ends[0], ends[CONTENT_EVENTS - 1]
    for split in range(1, len(stream)):
        reader = read([stream[:split], stream[split:]], [111, 222])
        assert outcome(reader) == (4, USAGE, True, None), split
        assert reader.t_first == (111 if split > first_end else 222), split
        assert reader.t_last == (111 if split > last_end else 222), split


# -- arbitrary boundaries ---------------------------------------------------------------
@pytest.mark.parametrize("eol", ["\n", "\r\n"])
def test_byte_by_byte_equals_one_read(eol: str) -> None:
    stream = COMPLETION if eol == "\n" else COMPLETION.replace(b"\n", b"\r\n")
    ends = _event_ends(stream, eol.encode() * 2)
    pieces = [stream[i : i + 1] for i in range(len(stream))]
    reader = read(pieces, [1_000 * i for i in range(len(stream))], keep_times=True)
    assert outcome(reader) == (4, USAGE, True, None)
    # Byte i arrives at i µs: each token's time is the arrival of its event's final newline.
    assert reader.times == [1_000 * e for e in ends[:CONTENT_EVENTS]]
    assert reader.gaps_us.tolist() == [b - a for a, b in zip(ends[: CONTENT_EVENTS - 1], ends[1:CONTENT_EVENTS])]


def test_split_between_cr_and_lf() -> None:
    stream = COMPLETION.replace(b"\n", b"\r\n")
    crs = [i for i in range(len(stream)) if stream[i : i + 1] == b"\r"]
    assert len(crs) == 14
    for i in crs:  # every piece boundary falls right after a \r
        reader = read([stream[: i + 1], stream[i + 1 :]])
        assert outcome(reader) == (4, USAGE, True, None), i
    # All the cuts at once: every read but the last ends in \r.
    bounds = [0, *(i + 1 for i in crs), len(stream)]
    reader = read([stream[a:b] for a, b in zip(bounds, bounds[1:]) if b > a])
    assert outcome(reader) == (4, USAGE, True, None)


def test_split_mid_data_prefix_and_mid_line() -> None:
    stream = COMPLETION
    second = stream.index(b"data:", 1)
    for cut in (second + 1, second + 3, second + 5, second + 6, second + 40, len(stream) - 3):
        assert outcome(read([stream[:cut], stream[cut:]])) == (4, USAGE, True, None), cut


def test_several_events_per_read_in_mixed_groupings() -> None:
    ends = _event_ends(COMPLETION)
    # Reads holding 3, 1 and the remaining 3 events.
    a, b = ends[2] + 1, ends[3] + 1
    reader = read([COMPLETION[:a], COMPLETION[a:b], COMPLETION[b:]], [10_000, 20_000, 30_000], keep_times=True)
    assert outcome(reader) == (4, USAGE, True, None)
    assert reader.times == [10_000, 10_000, 10_000, 20_000]
    assert reader.gaps_us.tolist() == [0, 0, 10]


def _random_stream(rng: random.Random) -> tuple[bytes, int]:
    """A random vLLM-like stream: (bytes, number of content tokens)."""
    eol = rng.choice(["\n", "\r\n"])
    chat = rng.random() < 0.5
    n = rng.randint(0, 12)
    parts: list[bytes] = []
    if chat:
        parts.append(sse(chat_chunk({"role": "assistant", "content": ""}), eol=eol))
    for _ in range(n):
        if rng.random() < 0.2:
            parts.append(f": ping{eol}{eol}".encode())
        text = " " + "".join(rng.choice('abcxyz"\\é') for _ in range(rng.randint(1, 6)))
        parts.append(sse(chat_chunk({"content": text}) if chat else completion_chunk(text), eol=eol))
    last = chat_chunk({"content": ""}, "length") if chat else completion_chunk("", "length")
    usage = {"prompt_tokens": 11, "total_tokens": 11 + n, "completion_tokens": n}
    parts.append(sse(last, usage_chunk(usage), "[DONE]", eol=eol))
    return b"".join(parts), n


def test_random_splits_equal_one_read() -> None:
    rng = random.Random(20260526)
    for trial in range(300):
        stream, n = _random_stream(rng)
        whole = read([stream])
        assert outcome(whole) == (n, {"prompt_tokens": 11, "total_tokens": 11 + n, "completion_tokens": n}, True, None)
        pieces = random_cut(stream, rng)
        times = sorted(rng.sample(range(10**6), len(pieces)))
        reader = read(pieces, times, keep_times=True)
        assert outcome(reader) == outcome(whole), trial
        # Each token's time is that of the piece holding its event's last byte.
        sep = b"\r\n\r\n" if b"\r\n" in stream else b"\n\n"
        starts = [0]
        for p in pieces:
            starts.append(starts[-1] + len(p))
        piece_of = lambda off, pieces=pieces, starts=starts: next(  # noqa: E731
            k for k in range(len(pieces)) if starts[k] <= off < starts[k + 1]
        )
        content_ends = [
            e
            for e, ev in zip(_event_ends(stream, sep), stream.split(sep))
            if ev.startswith(b"data: {")
            and b'"content":""' not in ev
            and b'"text":""' not in ev
            and b'"choices":[]' not in ev
        ]
        assert reader.times == [times[piece_of(e)] for e in content_ends], trial
        assert reader.t_first == (reader.times[0] if n else None)
        assert reader.t_last == (reader.times[-1] if n else None)


def test_byte_by_byte_random_streams() -> None:
    rng = random.Random(7)
    for _ in range(20):
        stream, n = _random_stream(rng)
        reader = read([stream[i : i + 1] for i in range(len(stream))])
        assert (
            outcome(reader)
            == outcome(read([stream]))
            == (n, {"prompt_tokens": 11, "total_tokens": 11 + n, "completion_tokens": n}, True, None)
        )


def test_empty_reads_change_nothing() -> None:
    stream = COMPLETION.replace(b"\n", b"\r\n")
    pieces: list[bytes] = []
    for i in range(0, len(stream), 50):
        pieces += [stream[i : i + 50], b""]
    assert outcome(read(pieces)) == (4, USAGE, True, None)


# -- a read holding many plain token events (the split path; formats: test_loadgen_sse_formats.py)
def test_bulk_reads_keep_gaps_between_reads() -> None:
    first = sse(*(completion_chunk(" a") for _ in range(3)))
    second = sse(*(completion_chunk(" b") for _ in range(2)), usage_chunk(), "[DONE]")
    reader = read([first, second], [1_000_000, 4_000_000], keep_times=True)
    assert reader.chunks == 5 and reader.done and reader.error is None
    assert list(reader.gaps_us) == [0, 0, 3000, 0]
    assert reader.times == [1_000_000] * 3 + [4_000_000] * 2


# -- one whole event per read (the fast path: decoded and counted in place) ------------------
ONE_EVENT_READS = [
    completion_chunk(" a"),
    chat_chunk({"role": "assistant", "content": ""}),  # not a token
    chat_chunk({"content": " b"}),
    completion_chunk(" c").replace('"usage":null', '"usage":{"prompt_tokens":3,"completion_tokens":2}'),
    _compact({"error": {"message": "boom"}}),  # an error, not a token
    "not json",
    _compact({"choices": "wrong shape"}),
    completion_chunk("", "length"),
    usage_chunk(),
    "[DONE]",
    completion_chunk(" after done"),  # ignored
]


@pytest.mark.parametrize("cut", range(len(ONE_EVENT_READS) + 1))
def test_one_whole_event_per_read_is_handled_as_the_general_path_handles_it(cut: int) -> None:
    # Every prefix of the list, each event its own read, against the same reads through the
    # general path: the same tokens, usage, done flag, error and token times.
    payloads = ONE_EVENT_READS[:cut]
    apart = read([sse(p) for p in payloads], [1_000 * (k + 1) for k in range(cut)], keep_times=True)
    together = SSEReader(keep_times=True)
    for k, p in enumerate(payloads):  # a comment after each event: the general path, same times
        together.feed(1_000 * (k + 1), sse(p) + b": comment\n\n")
    together.finish()
    assert outcome(apart) == outcome(together)
    assert apart.times == together.times and apart.gaps_us.tolist() == together.gaps_us.tolist()
