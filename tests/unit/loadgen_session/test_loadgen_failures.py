"""LoadGenerator under failure, against misbehaving `ctax sim` servers: the in-flight cap, timeouts,
the drain, HTTP 500, malformed SSE, validity flags, a worker crash mid-cell, a message the receiver
cannot handle."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
from loadgen_common import assert_one_record_each, by_index, options, run
from sim_server import poll

from connector_tax.config import default_validity
from connector_tax.loadgen.schedule.session import LoadGenerator


# -- drops, timeouts, drain, errors -------------------------------------------------------
def test_inflight_cap_drops_and_counts(sims, out: Path) -> None:
    with LoadGenerator(options(sims["plain"].url, inflight_cap=2)) as g:
        summary, records = run(
            g, out, "cap", arrival="fixed", rate=100.0, duration_s=0.3, shape={"input": 64, "output": 16}
        )
        progress_dropped = g.progress.dropped
    records = by_index(records)
    assert len(records) == 30
    assert_one_record_each(records, "s_cap")
    # Side files only when asked for.
    assert not list(out.glob("chunks_s_cap_*")) and not (out / "events_s_cap.jsonl").exists()
    ts = [r["t_scheduled_ns"] for r in records]
    assert [b - a for a, b in zip(ts, ts[1:])] == [10_000_000] * 29
    dropped = [r for r in records if r["status"] == "dropped"]
    sent = [r for r in records if r["status"] != "dropped"]
    assert len(dropped) >= 15 and len(sent) >= 2
    for r in dropped:
        assert (r["t_send_ns"], r["t_first_token_ns"], r["t_last_token_ns"], r["worker"]) == (None, None, None, None)
        assert (r["inflight_at_send"], r["error"], r["http_status"], r["chunks"]) == (2, "in-flight cap reached", 0, 0)
        assert r["t_scheduled_ns"] > 0
    assert all(r["status"] == "ok" and r["inflight_at_send"] <= 1 for r in sent)
    assert summary["counts"]["dropped"] == len(dropped) == progress_dropped
    assert summary["counts"]["ok"] == len(sent)
    checks = {c["name"]: c for c in summary["validity"]["checks"]}
    assert checks["dropped_frac"]["value"] == round(len(dropped) / 30, 4)
    assert summary["lateness_us"]["n"] == len(sent)  # lateness only over what was sent


@pytest.fixture(scope="module")
def hung(sims, out: Path) -> tuple[dict, list[dict]]:
    # Requests at 0, 1 and 2 s; the sim stalls every stream after 2 tokens. The first two hit
    # the 0.7 s request timeout (at ~0.7 and ~1.7 s) before the drain that follows the last issue
    # (~2.0 s) runs out at ~2.2 s; the third would time out at ~2.7 s, so the drain cancels it.
    # Each outcome has half a second to spare: a loaded host's timers fire late.
    with LoadGenerator(options(sims["hang"].url, timeout_s=0.7, drain_timeout_s=0.2, drain_s_per_token=0.0)) as g:
        summary, records = run(g, out, "hang", arrival="fixed", rate=1.0, duration_s=2.2)
    return summary, by_index(records)


def test_request_timeout(hung: tuple[dict, list[dict]]) -> None:
    summary, records = hung
    assert len(records) == 3
    assert_one_record_each(records, "s_hang")
    for r in records[:2]:
        assert (r["status"], r["error"], r["http_status"]) == ("timeout", "timeout after 0.7 s", 200)
        assert r["t_first_token_ns"] is not None and 1 <= r["chunks"] <= 2
        assert r["completion_tokens"] == r["chunks"]  # no usage chunk came: counted chunks
    assert summary["counts"]["timeout"] == 3


def test_drain_cancels_and_records_hung_requests(hung: tuple[dict, list[dict]]) -> None:
    summary, records = hung
    last = records[2]
    assert (last["status"], last["error"], last["http_status"]) == ("timeout", "drain timeout after 0.2 s", 200)
    assert last["t_send_ns"] is not None and last["t_first_token_ns"] is not None
    # The last issue is at ~2.0 s; the drain, cancellation included, ends after its 0.2 s and
    # before the third request's own timeout (~2.7 s) would have.
    assert 2.1 <= summary["wall_s"] < 2.7
    assert summary["drain_budget_s"] == 0.2
    assert summary["validity"]["valid"] is False
    assert "error_frac 1.0 > 0.01" in summary["validity"]["reasons"]


def test_http_500_is_an_error_with_its_message(sims, out: Path) -> None:
    with LoadGenerator(options(sims["err500"].url)) as g:
        summary, records = run(g, out, "e500", arrival="fixed", rate=20.0, duration_s=0.25)
    assert len(records) == 5
    for r in records:
        assert (r["status"], r["error"], r["http_status"]) == ("error", "HTTP 500: simulated internal error", 500)
        assert r["t_send_ns"] is not None
        assert (r["t_first_token_ns"], r["t_last_token_ns"]) == (None, None)
        assert (r["completion_tokens"], r["chunks"]) == (None, 0)
    assert summary["counts"]["error"] == 5 and summary["counts"]["ok"] == 0
    assert "error_frac 1.0 > 0.01" in summary["validity"]["reasons"]


def test_malformed_sse_is_an_error(sims, out: Path) -> None:
    with LoadGenerator(options(sims["malformed"].url)) as g:
        summary, records = run(g, out, "malformed", arrival="fixed", rate=20.0, duration_s=0.25)
    assert len(records) == 5
    for r in records:
        assert (r["status"], r["http_status"], r["chunks"], r["t_first_token_ns"]) == ("error", 200, 0, None)
        assert r["error"].startswith('malformed SSE data: b\'{"id":"cmpl-s_malformed-'), r["error"]
        assert r["completion_tokens"] == 8  # the usage chunk itself was intact
    assert summary["counts"]["error"] == 5


# -- validity, crash, shutdown ------------------------------------------------------------
def _gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_validity_flags_name_the_failed_check(sims, out: Path) -> None:
    with LoadGenerator(options(sims["plain"].url, validity=default_validity().replace(max_lateness_p99_us=0))) as g:
        pids = g.pool.pids()
        assert len(pids) == 1 and not _gone(pids)
        summary, records = run(g, out, "validity", arrival="fixed", rate=20.0, duration_s=0.3)
    assert all(r["status"] == "ok" for r in records)
    validity = summary["validity"]
    checks = {c["name"]: c for c in validity["checks"]}
    # lateness judged by its effect (against the mean gap and the TTFT p90), then the worst send,
    # then the absolute p99 bound this test sets
    assert list(checks) == [
        "dispatch_rate_error",
        "lateness_gap_frac",
        "lateness_ttft_frac",
        "lateness_max_us",
        "lateness_p99_us",
        "error_frac",
        "dropped_frac",
        "unissued",
        "issue_overrun_ms",
        "unmatched_results",
        "cpu_frac_main",
        "cpu_frac_worker0",
        "prompt_tokens_off",
        "completion_tokens_off",
        "measured_requests_missing",
    ]
    assert [c["threshold"] for c in checks.values()] == [
        0.05,
        0.1,
        0.02,
        100_000.0,
        0,
        0.01,
        1.0,
        0,
        100.0,
        0,
        0.95,
        0.95,
        0,
        0,
        0,
    ]
    assert validity["valid"] is False
    assert checks["lateness_p99_us"]["passed"] is False
    assert f"lateness_p99_us {summary['lateness_us']['p99']} > 0" in validity["reasons"]
    assert checks["error_frac"]["passed"] is True and checks["dropped_frac"]["passed"] is True
    assert len(validity["reasons"]) == sum(not c["passed"] for c in checks.values())
    # No orphan: the worker is gone once the generator's context has exited.
    assert poll(lambda: _gone(pids), timeout=30.0)  # a bail-out: exits are slow on a loaded host


def test_worker_crash_mid_cell(sims, out: Path) -> None:
    with LoadGenerator(options(sims["plain"].url, workers=2)) as g:
        pids = g.pool.pids()
        assert len(pids) == 2

        killed_at: list[int] = []  # requests issued when the worker died: a loaded host's killer is late

        def killer() -> None:
            while g.progress.issued < 9:
                time.sleep(0.002)
            killed_at.append(g.progress.issued)
            os.kill(pids[1], signal.SIGKILL)

        threading.Thread(target=killer, daemon=True).start()
        # 24 requests at 20/s, each streaming 32 tokens (~150 ms): worker 1 dies with some in flight.
        summary, records = run(
            g, out, "crash", arrival="fixed", rate=20.0, duration_s=1.2, shape={"input": 64, "output": 32}
        )
        assert not psutil.pid_exists(pids[1]) or psutil.Process(pids[1]).status() == psutil.STATUS_ZOMBIE
    assert len(records) == 24
    assert_one_record_each(records, "s_crash")
    records = by_index(records)
    assert all(r["status"] == "ok" for r in records[0::2])  # worker 0 carried on
    errors = [r for r in records if r["status"] == "error"]
    # everything worker 1 (the odd indices) had from the kill on, and what it had in flight
    assert killed_at and killed_at[0] < 24, killed_at  # the kill came mid-cell
    assert len(errors) >= len(range(killed_at[0] | 1, 24, 2)) >= 1, (killed_at, len(errors))
    for r in errors:
        assert (r["worker"], r["error"]) == (1, "load generator worker died (worker 1)")
        assert r["t_first_token_ns"] is None
    assert [r["status"] for r in records[1::2]] == sorted((r["status"] for r in records[1::2]), key=lambda s: s != "ok")
    assert summary["complete"] is True
    assert summary["counts"]["error"] == len(errors)
    assert summary["validity"]["valid"] is False
    assert "load generator worker died" in summary["validity"]["reasons"]
    assert poll(lambda: _gone(pids), timeout=30.0)  # a bail-out: exits are slow on a loaded host


def test_a_result_the_receiver_cannot_handle_does_not_stop_the_drain(
    gen: LoadGenerator, out: Path, monkeypatch
) -> None:
    """One bad message costs its own request (recorded as an error), not the rest of the cell, and
    the cell says so (the receiver's fd is edge-triggered: a drain that stopped would read no more)."""
    from connector_tax.loadgen.stats import collect as collector_module

    real = collector_module.Collector.on_result
    seen = {"n": 0}

    def flaky(self, result):
        seen["n"] += 1
        if seen["n"] == 3:
            raise ValueError("a result this version cannot read")
        return real(self, result)

    monkeypatch.setattr(collector_module.Collector, "on_result", flaky)
    summary, records = run(gen, out, "badmsg", arrival="fixed", rate=40.0, duration_s=0.5)
    assert len(records) >= 15
    errors = [r for r in records if r["status"] != "ok"]
    assert [e["error"] for e in errors] == [f"no result from worker (worker {errors[0]['worker']})"]
    assert not summary["validity"]["valid"]
    assert any(
        "1 worker messages could not be handled (first: ValueError: a result this version cannot read)" in r
        for r in summary["validity"]["reasons"]
    )
