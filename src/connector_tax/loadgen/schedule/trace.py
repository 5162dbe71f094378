"""Replay of a Mooncake-format JSONL trace (kvcache-ai/Mooncake FAST'25 release).

Each line: {"timestamp": ms from the start, "input_length", "output_length", "hash_ids"}, one
hash id per 512-token block of the prompt; equal ids across requests are a shared prefix block.
That prefix sharing is what the KV connector is for, so the replay must keep it exact: the
loader rejects a line whose hash_ids do not cover its input_length block for block, rather than
replaying a trace whose reuse pattern silently differs from the one it claims.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

from connector_tax.config.cells import TraceRequest

BLOCK_TOKENS = 512


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_line(text: str, where: str) -> TraceRequest:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise ValueError(f"{where}: missing field {key!r}")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise ValueError(f"{where}: timestamp must be a non-negative number of ms, got {ts!r}")
    n_in, n_out = obj["input_length"], obj["output_length"]
    # A zero-length prompt or completion is not a request a server accepts, so 0 is as bad as -1.
    if not _is_int(n_in) or n_in < 1:
        raise ValueError(f"{where}: input_length must be a positive integer, got {n_in!r}")
    if not _is_int(n_out) or n_out < 1:
        raise ValueError(f"{where}: output_length must be a positive integer, got {n_out!r}")
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(_is_int(h) for h in ids):
        raise ValueError(f"{where}: hash_ids must be a list of integers")
    want = -(-n_in // BLOCK_TOKENS)
    if len(ids) != want:
        raise ValueError(
            f"{where}: {len(ids)} hash_ids for input_length {n_in}; "
            f"expected {want} (one per {BLOCK_TOKENS}-token block)"
        )
    return TraceRequest(float(ts), n_in, n_out, tuple(ids))


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Read and validate a trace; errors are one line, "FILE:LINE: what is wrong".

    limit keeps the first `limit` requests. Blank lines are skipped. Timestamps must not go
    backwards: the order of lines is the order of turns, so sorting would be a silent rewrite.
    """
    if limit is not None and (not _is_int(limit) or limit < 1):
        raise ValueError(f"limit: must be a positive integer, got {limit!r}")
    path = Path(path)
    out: list[TraceRequest] = []
    prev_ts = -math.inf
    with path.open(encoding="utf-8") as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            where = f"{path}:{lineno}"
            req = _parse_line(text, where)
            if req.timestamp_ms < prev_ts:
                raise ValueError(
                    f"{where}: timestamp {req.timestamp_ms:g} is before the previous request's {prev_ts:g}"
                )
            prev_ts = req.timestamp_ms
            out.append(req)
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise ValueError(f"{path}: no requests in trace")
    return out


def trace_arrivals(trace: list[TraceRequest], time_scale: float = 1.0) -> Iterator[int]:
    """Send offsets in ns from the first request's timestamp; time_scale 2 replays twice as fast."""
    if (
        isinstance(time_scale, bool)
        or not isinstance(time_scale, (int, float))
        or not (math.isfinite(time_scale) and time_scale > 0)
    ):
        raise ValueError(f"time_scale: must be a positive number, got {time_scale!r}")
    if not trace:
        return iter(())
    t0 = trace[0].timestamp_ms
    factor = 1e6 / time_scale
    # Each offset from the first timestamp directly: no accumulated rounding over the replay.
    return (round((r.timestamp_ms - t0) * factor) for r in trace)


def prefix_blocks(req: TraceRequest) -> list[tuple[int, int]]:
    """(hash_id, n_tokens) per block: BLOCK_TOKENS each, the last holding the remainder."""
    n = len(req.hash_ids)
    last = req.input_length - BLOCK_TOKENS * (n - 1)
    return [(h, BLOCK_TOKENS) for h in req.hash_ids[:-1]] + [(req.hash_ids[-1], last)]
