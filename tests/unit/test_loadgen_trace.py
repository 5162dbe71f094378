"""Mooncake trace replay: loading, validation, timing and prefix sharing."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from connector_tax.loadgen.schedule.trace import (
    BLOCK_TOKENS,
    TraceRequest,
    load_trace,
    prefix_blocks,
    trace_arrivals,
)

# The real trace lives in the shared folder; it must not be copied into the repository.
REAL = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
needs_real = pytest.mark.skipif(not REAL.is_file(), reason=f"{REAL} not present")


def write(tmp_path: Path, lines: list) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return p


def rec(ts=0, n_in=1000, n_out=10, ids=None) -> dict:
    return {
        "timestamp": ts,
        "input_length": n_in,
        "output_length": n_out,
        "hash_ids": ids if ids is not None else list(range(math.ceil(n_in / 512))),
    }


@needs_real
def test_real_trace() -> None:
    trace = load_trace(REAL)
    assert len(trace) == 3993
    mean_in = sum(r.input_length for r in trace) / len(trace)
    mean_out = sum(r.output_length for r in trace) / len(trace)
    assert abs(mean_in - 15325) < 1
    assert abs(mean_out - 149) < 0.5
    assert all(a.timestamp_ms <= b.timestamp_ms for a, b in zip(trace, trace[1:]))
    assert all(isinstance(r.hash_ids, tuple) for r in trace[:5])
    # Shared prefixes: some block ids occur in more than one request, as a leading prefix.
    uses = Counter(h for r in trace for h in set(r.hash_ids))
    shared = {h for h, n in uses.items() if n > 1}
    assert len(shared) > 100
    assert any(r.hash_ids[0] in shared for r in trace)
    # Arrival offsets are the timestamps, in ns, from the first one.
    offsets = list(trace_arrivals(trace))
    assert offsets[0] == 0
    assert all(o == round((r.timestamp_ms - trace[0].timestamp_ms) * 1e6) for o, r in zip(offsets, trace))
    assert load_trace(REAL, limit=10) == trace[:10]


def test_trace_arrivals_scaled(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, [rec(100), rec(100), rec(350), rec(1100.5)]))
    assert list(trace_arrivals(trace)) == [0, 0, 250_000_000, 1_000_500_000]
    assert list(trace_arrivals(trace, time_scale=2)) == [0, 0, 125_000_000, 500_250_000]
    assert list(trace_arrivals(trace, time_scale=0.5)) == [0, 0, 500_000_000, 2_001_000_000]
    assert list(trace_arrivals([])) == []
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="^time_scale:"):
            trace_arrivals(trace, time_scale=bad)


def test_prefix_blocks() -> None:
    r = TraceRequest(0.0, 1300, 5, (7, 8, 9))
    assert prefix_blocks(r) == [(7, 512), (8, 512), (9, 276)]
    assert prefix_blocks(TraceRequest(0.0, 1024, 5, (1, 2))) == [(1, 512), (2, 512)]
    assert prefix_blocks(TraceRequest(0.0, 3, 5, (4,))) == [(4, 3)]
    assert BLOCK_TOKENS == 512


def test_blank_lines_and_limit(tmp_path: Path) -> None:
    p = write(tmp_path, [rec(0), "", rec(5), "   ", rec(9)])
    assert [r.timestamp_ms for r in load_trace(p)] == [0, 5, 9]
    assert len(load_trace(p, limit=2)) == 2
    with pytest.raises(ValueError, match="^limit:"):
        load_trace(p, limit=0)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({"timestamp": 0, "input_length": 5, "output_length": 1}, "missing field 'hash_ids'"),
        (rec(n_in=-5, ids=[]), "input_length must be a positive integer"),
        (rec(n_out=-1), "output_length must be a positive integer"),
        (rec(ts=-1), "timestamp must be"),
        (rec(ts="0"), "timestamp must be"),
        (rec(n_in=1025, ids=[1, 2]), "2 hash_ids for input_length 1025; expected 3"),
        (rec(n_in=1024, ids=[1, 2, 3]), "3 hash_ids for input_length 1024; expected 2"),
        (rec(ids=[1, "x"]), "hash_ids must be a list of integers"),
        (rec(ts=1), "timestamp 1 is before the previous request's 5"),
    ],
)
def test_bad_lines(tmp_path: Path, line, words: str) -> None:
    p = write(tmp_path, [rec(ts=0), rec(ts=5), line])
    with pytest.raises(ValueError) as exc:
        load_trace(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}:3: ")
    assert words in msg
    assert "\n" not in msg


def test_empty_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no requests"):
        load_trace(write(tmp_path, []))
