"""The cell summary: the completion window (shifted by the median E2E, safe without token
times), and send lateness judged by its effect (against the mean gap and TTFT p90)."""

from __future__ import annotations

from pathlib import Path

import pytest

from connector_tax.config import Validity, default_validity, load_config
from connector_tax.contract.summary import to_builtins
from connector_tax.loadgen.stats.request_file import RequestRecord
from connector_tax.loadgen.stats.summarize import RequestStats, summarize
from connector_tax.loadgen.stats.usage import ShapeRule

MS = 1_000_000


def _ok(i: int, t_send: int, e2e: int | None) -> RequestRecord:
    last = t_send + e2e if e2e is not None else None
    first = t_send + 1 * MS if e2e is not None else None
    return RequestRecord(f"r-{i}", t_send, t_send, first, last, 8, 4, 0, False, "ok", None, 8, 4)


def _summary(records: list[RequestRecord]) -> dict:
    return to_builtins(summarize({"cell": "c"}, records, [], 0, 1000 * MS, {}, default_validity()))


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


def _late(rate: float, late_us: float, ttft_ms: float, n: int = 200) -> dict:
    """n requests at `rate`, each sent `late_us` after its time, first token `ttft_ms` after the send."""
    gap = int(1e9 / rate)
    records = []
    for i in range(n):
        sched = i * gap
        send = sched + int(late_us * 1e3)
        first = send + int(ttft_ms * MS)
        records.append(RequestRecord(f"r-{i}", sched, send, first, first + MS, 8, 4, 0, False, "ok", None, 8, 4))
    return to_builtins(summarize({"cell": "c", "rate": rate}, records, [], 0, n * gap, {}, default_validity()))


def _check(summary: dict, name: str) -> dict:
    return next(c for c in summary["validity"]["checks"] if c["name"] == name)


def test_five_ms_late_at_16_rps_is_valid_when_ttft_is_long() -> None:
    # 62.5 ms between arrivals, 5 ms late: 8 % of a gap; TTFT p90 400 ms: lateness 1.25 % of it.
    summary = _late(16, 5000, 400)
    assert summary["validity"]["valid"], summary["validity"]["reasons"]
    assert _check(summary, "lateness_gap_frac")["value"] == pytest.approx(0.08)


def test_one_ms_late_at_1000_rps_distorts_the_arrivals() -> None:
    summary = _late(1000, 1000, 400, n=2000)
    assert not summary["validity"]["valid"]
    assert any(r.startswith("lateness_gap_frac 1.0 > 0.1") for r in summary["validity"]["reasons"])


def test_lateness_against_a_short_ttft_is_a_bias_of_what_is_measured() -> None:
    # 1 ms late against a 10 ms TTFT p90 at 4 req/s: the arrival process is fine (0.4 % of a
    # 250 ms gap), but TTFT p90 may be off by ~10 %.
    summary = _late(4, 1000, 10)
    assert _check(summary, "lateness_gap_frac")["passed"]
    assert not _check(summary, "lateness_ttft_frac")["passed"]
    assert not summary["validity"]["valid"]


def test_no_absolute_lateness_bound_unless_configured() -> None:
    summary = _late(16, 2000, 400)
    assert "lateness_p99_us" not in {c["name"] for c in summary["validity"]["checks"]}
    strict = default_validity().replace(max_lateness_p99_us=1000.0)
    gap = int(1e9 / 16)
    records = [
        RequestRecord(
            f"r-{i}",
            i * gap,
            i * gap + 2 * MS,
            i * gap + 400 * MS,
            i * gap + 401 * MS,
            8,
            4,
            0,
            False,
            "ok",
            None,
            8,
            4,
        )
        for i in range(100)
    ]
    judged = to_builtins(summarize({"cell": "c", "rate": 16}, records, [], 0, 100 * gap, {}, strict))
    assert not _check(judged, "lateness_p99_us")["passed"]


def test_validity_defaults_are_the_schemas_and_a_misspelt_bound_is_an_error() -> None:
    v = default_validity()
    assert (v.max_lateness_gap_frac, v.max_lateness_ttft_frac, v.max_lateness_p99_us, v.attempts) == (
        0.1,
        0.02,
        None,
        3,
    )
    with pytest.raises(ValueError, match="validity.max_lateness_p99: unknown key"):
        v.replace(max_lateness_p99=1.0)
    assert isinstance(v, Validity)


def test_default_study_fills_the_validity_section() -> None:
    config = load_config(Path(__file__).resolve().parents[2] / "configs" / "default.yaml")
    assert Validity.from_mapping(config["validity"]) == default_validity()


def test_a_cell_with_no_measured_request_is_never_valid() -> None:
    # Every request in the warm-up (a 1 s cell at 1 req/s behind a 10 s warm-up): nothing failed,
    # nothing was measured.
    warm = RequestRecord("r-0", 0, 0, MS, 2 * MS, 8, 4, 0, True, "ok", None, 8, 4)
    summary = _summary([warm])
    assert summary["counts"]["ok"] == 0
    assert summary["validity"]["valid"] is False
    assert summary["validity"]["reasons"] == ["no request measured: none ended ok after the warm-up"]
    assert _check(summary, "measured_requests_missing")["passed"] is False
    assert _check(_summary([_ok(0, 0, MS)]), "measured_requests_missing")["passed"] is True


def _counted(i: int, prompt: int | None, completion: int | None, asked: tuple[int, int] = (256, 32)) -> RequestRecord:
    t = i * MS
    return RequestRecord(
        f"r-{i}",
        t,
        t,
        t + MS,
        t + 2 * MS,
        prompt or asked[0],
        completion or 4,
        0,
        False,
        "ok",
        None,
        *asked,
        usage_completion_tokens=completion,
        usage_prompt_tokens=prompt,
    )


def _usage_summary(records: list[RequestRecord], rule: ShapeRule) -> dict:
    stats = RequestStats(0, rule=rule)
    for r in records:
        stats.add(r)
    return to_builtins(stats.summary({"cell": "c"}, 0, 1000 * MS, {}, default_validity()))  # as its file has it


def test_the_servers_counts_are_in_every_summary_and_checked_against_the_cell() -> None:
    exact = ShapeRule(0.0, exact_output=True)
    good = _usage_summary([_counted(i, 256, 32) for i in range(5)], exact)
    assert good["validity"]["valid"] is True
    assert good["usage"]["status"] == "checked"
    assert good["usage"]["prompt_tokens"]["server"] == {"median": 256.0, "min": 256.0, "max": 256.0}
    assert good["usage"]["completion_tokens"]["requested"] == {"median": 32.0, "min": 32.0, "max": 32.0}
    # Token ids: one token off is off. A server that stopped early (EOS) under ignore_eos is off too.
    bad = _usage_summary([_counted(0, 256, 32), _counted(1, 1232, 32), _counted(2, 256, 31)], exact)
    assert bad["validity"]["valid"] is False
    assert bad["validity"]["reasons"] == [
        "prompt tokens not the cell's: 1 of 3 requests off (exact; server counted 256 median, 256-1232, "
        "for 256 requested)",
        "completion tokens not the cell's: 1 of 3 requests off (exact (ignore_eos); server counted 32 median, "
        "31-32, for 32 requested)",
    ]
    # Text prompts: within 2 % (5 tokens of 256); outputs without ignore_eos: at most what was asked.
    text = ShapeRule(0.02, exact_output=False)
    assert _usage_summary([_counted(0, 261, 20), _counted(1, 251, 32)], text)["validity"]["valid"] is True
    off = _usage_summary([_counted(0, 262, 20), _counted(1, 256, 33)], text)
    assert [c["name"] for c in off["validity"]["checks"] if not c["passed"]] == [
        "prompt_tokens_off",
        "completion_tokens_off",
    ]


def test_a_server_without_usage_leaves_the_cell_unchecked_not_passed() -> None:
    summary = _usage_summary([_counted(i, None, None) for i in range(3)], ShapeRule())
    assert summary["usage"]["status"] == "unchecked"
    assert summary["usage"]["unchecked"] == "the server reported no prompt and no completion token counts (usage)"
    assert not [c for c in summary["validity"]["checks"] if c["name"].endswith("_tokens_off")]
    assert summary["validity"]["valid"] is True  # nothing wrong was seen; nothing was checked either
