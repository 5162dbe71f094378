"""Stream coalescing (analysis/streams.py): a cell whose requests got their tokens in bursts, or
several tokens per SSE chunk, has client-side TPOT/ITL that cannot be trusted, and says why."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from connector_tax.analysis.streams import render, stream_stats


def _cell(tmp_path: Path, records: list[dict]) -> SimpleNamespace:
    path = tmp_path / "requests_phase_a_r2.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return SimpleNamespace(has=lambda kind: True, path=lambda kind: path)


def _request(i: int, tokens: int, chunks: int, per_token_us: float, warmup: bool = False) -> dict:
    first = 1_000_000_000 + i * 100_000_000
    return {
        "status": "ok",
        "warmup": warmup,
        "chunks": chunks,
        "completion_tokens": tokens,
        "t_first_token_ns": first,
        "t_last_token_ns": first + int(per_token_us * 1000 * (tokens - 1)),
    }


def test_tokens_paced_by_the_engine_are_trusted(tmp_path):
    cell = _cell(tmp_path, [_request(i, 32, 32, 2500) for i in range(20)])
    out = stream_stats(cell, {"engine_step_us_p50": 2300.0, "itl_ms_p50": 2.4})
    assert out["client_tpot_trusted"] is True and out["burst_share"] == 0 and out["chunks_per_token_p50"] == 1
    assert out["stream_note"] is None


def test_bursts_and_merged_chunks_are_not(tmp_path):
    records = [_request(i, 32, 32, 2500) for i in range(16)]
    records += [_request(16 + i, 32, 32, 20) for i in range(3)]  # 3 of 19 in a burst: 20 µs a token
    records += [_request(19, 32, 4, 2500)]  # several tokens in one chunk
    records += [_request(20, 32, 1, 0, warmup=True)]  # warm-up requests are not judged
    cell = _cell(tmp_path, records)
    row = {"engine_step_us_p50": 2300.0, "itl_ms_p50": 2.4, "variant": "plain", "phase": "phase_a", "cell": "r2"}
    row.update(stream_stats(cell, row))
    assert row["client_tpot_trusted"] is False
    assert row["burst_share"] == 3 / 20 and row["coalesced_share"] == 1 / 20
    assert "15% of requests received their tokens faster than 0.25× the engine step" in row["stream_note"]
    text = "\n".join(render([row]))
    assert "where client-side TPOT and ITL cannot be trusted" in text and "0 of 1 cells trusted" in text
    assert "| `plain` | phase_a/r2 |" in text


def test_an_itl_near_zero_is_not_trusted_even_without_per_request_bursts(tmp_path):
    cell = _cell(tmp_path, [_request(i, 32, 32, 2500) for i in range(20)])
    out = stream_stats(cell, {"engine_step_us_p50": 2300.0, "itl_ms_p50": 0.05})
    assert out["client_tpot_trusted"] is False and out["stream_note"].startswith("ITL p50 50 µs")


def test_without_step_records_only_the_chunk_check_applies(tmp_path):
    cell = _cell(tmp_path, [_request(i, 32, 32, 2500) for i in range(20)])
    out = stream_stats(cell, {"engine_step_us_p50": None})
    assert out["burst_share"] is None and out["client_tpot_trusted"] is True
    assert out["stream_note"] == "no engine-step records: only the chunk check applies"
