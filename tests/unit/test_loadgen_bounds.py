"""Bounded memory and bounded time: the summary's state does not grow with a cell's length,
percentiles past the exact cap stay within their stated error, a cell whose rate the
generator cannot issue ends on the wall clock with the shortfall in its validity gate, and
a result that matches no request of the cell is an error record, never attached to another."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from connector_tax.config import Cell, default_validity
from connector_tax.contract.summary import to_builtins
from connector_tax.loadgen import ipc
from connector_tax.loadgen.schedule.session import LoadGenerator, LoadgenOptions
from connector_tax.loadgen.stats.collect import Collector, Progress
from connector_tax.loadgen.stats.request_file import RecordWriter, RequestRecord, read_records
from connector_tax.loadgen.stats.sketch import PENDING, REL_ERR, Quantiles
from connector_tax.loadgen.stats.summarize import RequestStats

MS = 1_000_000


def test_quantiles_exact_under_the_cap_and_within_the_stated_error_past_it() -> None:
    rng = np.random.default_rng(1)
    values = rng.lognormal(0, 1.5, 300_000)
    small = Quantiles(exact_cap=400_000)
    small.extend(values)
    assert small.exact
    assert small.percentiles([50, 90, 99]) == pytest.approx(np.percentile(values, [50, 90, 99]), rel=1e-12)
    capped = Quantiles(exact_cap=10_000)
    for block in np.array_split(values, 97):
        capped.extend(block)
    for v in values[:1000]:
        capped.add(float(v))
    every = np.concatenate([values, values[:1000]])
    assert not capped.exact and capped.count == len(every)
    assert capped.total == pytest.approx(every.sum()) and capped.max == every.max()
    exact = np.sort(every)
    for q, got in zip([1, 50, 90, 99, 99.9], capped.percentiles([1, 50, 90, 99, 99.9])):
        rank = max(0, int(np.ceil(q / 100 * len(exact))) - 1)
        assert abs(got - exact[rank]) <= REL_ERR * exact[rank] * 1.0001, q
    assert capped.nbytes() < 600_000  # the 10k buffer + buckets, whatever the count


@pytest.mark.parametrize("n", [1, PENDING - 1, PENDING, 3 * PENDING + 5])
def test_values_added_one_at_a_time_count_as_soon_as_they_are_added(n: int) -> None:
    # add() holds values before they reach the numpy state; every reading must see them.
    values = np.random.default_rng(n).exponential(3.0, n)
    q = Quantiles(exact_cap=2 * PENDING)  # past the cap for the largest n: the histogram too
    for v in values:
        q.add(float(v))
    assert q.count == n and q.total == pytest.approx(values.sum())
    assert q.min == values.min() and q.max == values.max()
    assert q.exact == (n <= 2 * PENDING)
    got = q.percentiles([50, 99])
    want = np.percentile(values, [50, 99])
    assert got == pytest.approx(want, rel=1e-12 if q.exact else 2 * REL_ERR)
    other = Quantiles(exact_cap=2 * PENDING)
    other.add(1e6)  # held in `other`, not yet in its numpy state
    q.merge(other)
    assert q.count == n + 1 and q.max == 1e6


def test_merge_adds_counts() -> None:
    a, b = Quantiles(1000), Quantiles(1000)
    a.extend(np.arange(1, 3001, dtype=float))
    b.extend(np.arange(3001, 6001, dtype=float))
    a.merge(b)
    assert a.count == 6000 and a.percentiles([50])[0] == pytest.approx(3000, rel=REL_ERR)


def test_cell_state_is_flat_in_the_number_of_requests() -> None:
    """The same 60 s of traffic at 100 and at 2,000 req/s: the same state size."""
    sizes = []
    for rate in (100, 2000):
        stats = RequestStats(0, exact_cap=5_000)
        gaps = np.full(63, 1000, dtype=np.uint32).tobytes()
        n = rate * 60
        for i in range(n):
            t = i * (60_000 * MS // n)
            stats.add(
                RequestRecord(f"r-{i}", t, t + 1000, t + 5 * MS, t + 70 * MS, 16, 64, 3, False, "ok", None, 16, 64, 64),
                gaps,
            )
        assert stats.itl.count == n * 63 and not stats.itl.exact
        sizes.append(stats.nbytes())
    assert sizes[1] <= sizes[0] * 1.1, sizes
    summary = to_builtins(stats.summary({"cell": "c"}, 0, 60_000 * MS, {}, default_validity()))
    assert summary["latency_ms"]["itl"]["p50"] == pytest.approx(1.0, rel=REL_ERR)
    assert summary["latency_ms"]["itl"]["approx_rel_err"] == REL_ERR
    assert summary["latency_ms"]["ttft"]["p99"] == pytest.approx(5.0 - 0.001, rel=REL_ERR)


def _result(cell: str, index: int, rid: str) -> ipc.RequestResult:
    return ipc.RequestResult(index, 0, 10, 20, 30, 8, 2, 2, 200, "ok", None, b"\x00" * 4, cell, rid, 2)


def test_results_are_matched_by_cell_and_request_id(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    stats = RequestStats(0)
    col = Collector("s_c#2", RecordWriter(path), stats, Progress())
    spec = ipc.RequestSpec(0, "s_c-0", 8, 2, None, "s_c#2")
    assert col.issue(5, spec, 0, False, lambda n: n < 10) == 0
    col.on_result(_result("s_c#1", 0, "s_c-0"))  # the same index from the cell run before
    col.on_result(_result("s_c#2", 0, "s_c-9"))  # right cell and index, another request's id
    assert 0 in col.pending and stats.unmatched == 2
    col.on_result(_result("s_c#2", 0, "s_c-0"))
    assert not col.pending and stats.counts["ok"] == 1
    col.writer.close()
    records = read_records(path)
    assert [r.status for r in records] == ["error", "error", "ok"]
    assert records[0].error == "unmatched result from cell 's_c#1' index 0: another cell run"
    assert records[1].error.startswith("unmatched result from cell 's_c#2' index 0: no request")
    assert records[2].cell == "s_c#2" and records[2].t_scheduled_ns == 5
    summary = to_builtins(stats.summary({"cell": "c"}, 0, 100, {}, default_validity()))
    assert summary["counts"]["unmatched"] == 2 and summary["counts"]["ok"] == 1
    assert "unmatched_results 2.0 > 0" in summary["validity"]["reasons"]


def test_a_rate_the_generator_cannot_issue_ends_on_the_wall_clock(tmp_path: Path) -> None:
    # Nothing listens on the port: every request fails fast. At 2 M req/s for 0.3 s the
    # session thread falls behind at once; the cell still ends on time and says why.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = LoadgenOptions(
        url=f"http://127.0.0.1:{port}",
        model="m",
        affinity=False,
        cpu_latency_us=None,
        timeout_s=2.0,
        drain_timeout_s=1.0,
        inflight_cap=64,
    )
    with LoadGenerator(opts) as gen:
        t = time.monotonic()
        summary = gen.run_cell(
            Cell(
                phase="b",
                label="fast",
                arrival="fixed",
                rate=2e6,
                warmup_s=0.0,
                duration_s=0.3,
                shape={"input": 8, "output": 2},
            ),
            tmp_path,
        )
        took = time.monotonic() - t
    summary = to_builtins(summary)
    # planned end + drain timeout, + 5 s for a loaded host's set-up and scheduling: issuing all
    # 600,000 requests instead would take tens of seconds
    assert took < 0.3 + 1.0 + 5.0, took
    assert summary["counts"]["unissued"] > 0
    reasons = summary["validity"]["reasons"]
    assert any(r.startswith("unissued ") for r in reasons), reasons
    records = read_records(tmp_path / "requests_b_fast.jsonl")
    assert (
        len(records) == summary["counts"]["scheduled"]
        and summary["counts"]["scheduled"] + summary["counts"]["unissued"] == 600_000
    )
    assert json.loads((tmp_path / "summary_b_fast.json").read_text())["cell_id"].startswith("b_fast#")
