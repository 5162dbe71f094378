"""The cell summary's completion window: shifted by the median E2E, and safe without token times."""

from __future__ import annotations

from connector_tax.loadgen.records import RequestRecord
from connector_tax.loadgen.stats import ValidityThresholds, summarize

MS = 1_000_000


def _ok(i: int, t_send: int, e2e: int | None) -> RequestRecord:
    last = t_send + e2e if e2e is not None else None
    first = t_send + 1 * MS if e2e is not None else None
    return RequestRecord(f"r-{i}", t_send, t_send, first, last, 8, 4, 0, False, "ok", None, 8, 4)


def _summary(records: list[RequestRecord]) -> dict:
    return summarize({"cell": "c"}, records, [], 0, 1000 * MS, {}, ValidityThresholds())


def test_completions_counted_over_the_window_shifted_by_the_median_e2e() -> None:
    # One request every 100 ms over the 1 s window, each taking 300 ms: the last three finish
    # after the window ends, and the shifted window still counts all ten.
    summary = _summary([_ok(i, i * 100 * MS, 300 * MS) for i in range(10)])
    assert summary["rates"]["completion_window_shift_ms"] == 300.0
    assert summary["rates"]["effective_throughput_rps"] == 10.0


def test_ok_requests_without_token_times_leave_the_window_unshifted() -> None:
    # A stream that ended with [DONE] but no content chunk (every text empty) is ok with no
    # token times: there is no E2E to take a median of.
    summary = _summary([_ok(i, i * 100 * MS, None) for i in range(3)])
    assert summary["rates"]["completion_window_shift_ms"] == 0.0
    assert summary["counts"]["ok"] == 3
