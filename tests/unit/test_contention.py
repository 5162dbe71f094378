"""Honest numbers on a busy host (docs/contention.md), below the end-to-end tier:

- the gate (measure/gate.py): host contention makes a cell invalid, lateness and host checks
  are perturbations that are measured again, the server's own errors are not;
- the measuring loop (measure/loop.py) with a scripted runner: bounded attempts, the least
  perturbed stands, the others under superseded/ with their reasons; criterion 3 alone is
  measured once more; a cell that stands perturbed is measured again by the next run;
- the analysis: a perturbed cell is never a knee or a reference rate, criterion 3 compares
  intervals, a call resting on a perturbed cell is never confident, the report says how busy
  the host was.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
from study_runner import TINY, write_config
from synthetic_study import SyntheticSpec, write_study

from connector_tax.analysis import build
from connector_tax.analysis.contention import PERTURBED
from connector_tax.analysis.reference_rates import reference_rates
from connector_tax.analysis.saturation import cell_criteria
from connector_tax.config import PHASE_A, default_saturation, default_validity, load_study
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import PhaseIndex, read_summary, verify_cell
from connector_tax.contract.summary import SELF_STARVED, CellSummary, HostReport, Verdict, to_builtins, write_summary
from connector_tax.measure.cellplan import launch_plan
from connector_tax.measure.gate import judge, perturbation, remeasure_reason
from connector_tax.measure.loop import Policies, measure
from connector_tax.measure.resume import decide
from connector_tax.metrics.host import not_measured
from connector_tax.pipeline.jobs import retry_token

V = default_validity()


def _check(name: str, value: float, threshold: float) -> dict[str, Any]:
    return {"name": name, "value": value, "threshold": threshold, "passed": value <= threshold}


def _summary(
    *checks: dict[str, Any], others: float | None = 0.01, peak: float | None = None, study_cores: float = 1.4
) -> CellSummary:
    failed = [c for c in checks if not c["passed"]]
    summary: dict[str, Any] = {
        "validity": {
            "valid": not failed,
            "reasons": [f"{c['name']} {c['value']} > {c['threshold']}" for c in failed],
            "checks": list(checks),
        },
        "counts": {"post_warmup": 20, "ok": 20},
        "complete": True,
    }
    if others is None:
        summary["host"] = msgspec.to_builtins(not_measured("virtual time"))
    else:
        busy = others > V.max_others_cpu_frac
        summary["host"] = {
            "measured": True,
            "others_cpu_frac": others,
            "busy": busy,
            "others_cores_max": peak if peak is not None else others * 2,
            "cpus": 2,
            "host_busy_cores": study_cores + others * 2,
            "checks": [_check("others_cpu_frac", others, V.max_others_cpu_frac), _check("steal_frac", 0.0, 0.05)],
            "reasons": [f"host busy: others_cpu_frac {others} > 0.1"] if busy else [],
        }
    return msgspec.convert(summary, CellSummary)


# --------------------------------------------------------------------------- the gate


def test_a_busy_host_makes_a_punctual_cell_invalid_and_is_a_perturbation() -> None:
    s = _summary(_check("lateness_gap_frac", 0.01, 0.1), others=0.45)
    v = judge(s, V)
    assert v.instrument_valid is True and v.host_busy is True and v.valid is False
    assert v.reasons == ["host busy: others_cpu_frac 0.45 > 0.1"]
    assert v.perturbation == pytest.approx(4.5)
    assert remeasure_reason(s).startswith("perturbed: host busy")


def test_a_quiet_host_and_a_punctual_instrument_pass() -> None:
    s = _summary(_check("lateness_gap_frac", 0.01, 0.1), _check("lateness_ttft_frac", 0.003, 0.02))
    v = judge(s, V)
    assert v.valid and v.host_busy is False and v.perturbation == 0.0
    assert remeasure_reason(s) is None


def test_virtual_time_has_no_host_and_no_fake_number() -> None:
    s = _summary(_check("lateness_gap_frac", 0.0, 0.1), others=None)
    v = judge(s, V)
    assert v.valid and v.host_busy is None
    assert not any(c.name.startswith("host_") for c in v.checks)
    assert s.host == HostReport(measured=False, why="virtual time", busy=None, reasons=[], checks=[])


def test_the_servers_own_errors_are_not_measured_again() -> None:
    s = _summary(_check("error_frac", 0.3, 0.01))
    judge(s, V)
    assert s.validity.valid is False and remeasure_reason(s) is None
    # ...and a cell that is late as well as erroring is not either: the errors would stay
    s = _summary(_check("error_frac", 0.3, 0.01), _check("lateness_gap_frac", 0.5, 0.1))
    judge(s, V)
    assert remeasure_reason(s) is None


def test_an_instrument_late_on_an_otherwise_quiet_host_is_not_measured_again() -> None:
    # the study's own server starved the load generator (the CPU study at 8 req/s): invalid, with
    # the reason, and neither another attempt nor the next run would find anything else
    s = _summary(_check("lateness_gap_frac", 2.5, 0.1), _check("lateness_ttft_frac", 1.0, 0.02), others=0.02)
    v = judge(s, V)
    assert v.valid is False and v.host_busy is False and v.perturbation > 1
    assert v.reasons[-1] == SELF_STARVED and remeasure_reason(s) is None
    assert judge(s, V).reasons.count(SELF_STARVED) == 1  # judged again: said once
    # the same lateness on a busy host, beside a burst the cell's average hides, or where no host
    # was measured, is measured again
    assert remeasure_reason(_judged(_check("lateness_gap_frac", 2.5, 0.1), others=0.5)).startswith("perturbed")
    burst = _judged(_check("lateness_gap_frac", 2.5, 0.1), others=0.04, peak=0.9)
    assert burst.validity.host_busy is False and remeasure_reason(burst).startswith("perturbed")
    unmeasured = _summary(_check("lateness_gap_frac", 2.5, 0.1))
    unmeasured.host = None
    judge(unmeasured, V)
    assert remeasure_reason(unmeasured).startswith("perturbed: lateness_gap_frac")


def test_an_instrument_late_on_a_host_with_cpu_to_spare_is_measured_again() -> None:
    # the default study's simulated server keeps ~0.3 of 2 cores busy: it cannot have starved the
    # load generator, whose late sends there mark a stall the guest cannot see (docs/contention.md)
    late = (_check("lateness_gap_frac", 0.05, 0.1), _check("lateness_ttft_frac", 0.03, 0.02))
    s = _judged(*late, others=0.005, study_cores=0.34)
    assert s.validity.valid is False and SELF_STARVED not in s.validity.reasons
    assert remeasure_reason(s) == "perturbed: lateness_ttft_frac 0.03 > 0.02"
    # at half the host busy with the study's own work, the study starved it: not measured again
    assert remeasure_reason(_judged(*late, others=0.005, study_cores=0.99)) is None
    # no count of the host's CPUs or of its busy cores: nothing says the study filled it
    s = _summary(*late, others=0.005)
    assert s.host is not None
    s.host.cpus = None
    judge(s, V)
    assert remeasure_reason(s) is not None


def _judged(
    *checks: dict[str, Any], others: float | None = 0.01, peak: float | None = None, study_cores: float = 1.4
) -> CellSummary:
    s = _summary(*checks, others=others, peak=peak, study_cores=study_cores)
    judge(s, V)
    return s


def test_perturbation_is_the_worst_multiple_of_a_bound() -> None:
    v = msgspec.convert(
        {
            "checks": [
                _check("lateness_ttft_frac", 0.1, 0.02),  # 5x
                _check("host_others_cpu_frac", 0.3, 0.1),  # 3x
                _check("unissued", 2, 0),  # 1 + 2
                _check("error_frac", 0.5, 0.01),  # not a perturbation
            ]
        },
        Verdict,
    )
    assert perturbation(v) == pytest.approx(5.0)


# --------------------------------------------------------------------------- the measuring loop


class ScriptedRunner:
    """A runner whose cells come out as scripted: per cell label, one summary per attempt."""

    def __init__(self, script: dict[str, list[CellSummary]]) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.runs: list[str] = []
        self.attempts: list[int] = []

    def __enter__(self) -> ScriptedRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @contextmanager
    def launch(self, index, save):  # noqa: ANN001
        index.launch_command = ["scripted"]
        yield self

    def run(self, cell, staging, t0_ns, precision, give_up, waiting):  # noqa: ANN001
        self.runs.append(cell.label)
        self.attempts.append(cell.attempt)
        summary = msgspec.convert(msgspec.to_builtins(self.script[cell.label].pop(0)), CellSummary)  # a copy
        staging.requests.write_text('{"request_id": "x"}\n')
        write_summary(staging.summary, summary)
        staging.host.write_text('{"t_ns": 1}\n')
        return summary, None


@pytest.fixture()
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    config = write_config(tmp_path, {**TINY, "validity": {"attempts": 3}})
    monkeypatch.chdir(tmp_path)
    study = load_study(config)
    plan = launch_plan(str(config), study, "plain", PHASE_A, None)
    layout = StudyLayout.of(study.study)
    index = PhaseIndex(study.study, "plain", PHASE_A, "sim", plan.launch, plan.code, [], launch_id="L1")
    index.cells, index.superseded = decide(layout, plan)
    return study, plan, layout, index


def _run(tiny, script, suspect=lambda planned, files: None) -> ScriptedRunner:
    study, plan, layout, index = tiny
    runner = ScriptedRunner(script)
    measure(
        runner, layout, index, plan.cells, lambda: None, Policies(study.saturation, study.validity, suspect=suspect)
    )
    return runner


def test_a_perturbed_cell_is_measured_again_and_the_least_perturbed_attempt_stands(tiny) -> None:
    study, plan, layout, index = tiny
    busy = lambda x: _summary(_check("lateness_gap_frac", 0.01, 0.1), others=x)  # noqa: E731
    quiet = _summary(_check("lateness_gap_frac", 0.01, 0.1))
    runner = _run(tiny, {"r4": [busy(0.5), busy(0.2), busy(0.9)], "r8": [busy(0.4), quiet]})
    assert runner.runs == ["r4", "r4", "r4", "r8", "r8"]
    folder = layout.phase("plain", PHASE_A)
    r4 = to_builtins(read_summary(folder.cell("r4")))
    assert r4["validity"]["valid"] is False and r4["host"]["others_cpu_frac"] == 0.2  # attempt 2 stands
    assert [a["attempt"] for a in r4["attempts"]] == [1, 2, 3]
    assert r4["attempts"][0]["measured_again_because"].startswith("perturbed: host busy")
    assert verify_cell(folder.cell("r4"))[0] and folder.cell("r4").host.exists()
    r8 = to_builtins(read_summary(folder.cell("r8")))
    assert r8["validity"]["valid"] is True and len(r8["attempts"]) == 2
    aside = sorted(p.name for p in folder.superseded_root.iterdir())
    assert [n.split(".")[1] for n in aside] == ["perturbed-1", "perturbed-3", "perturbed-1"]
    why = [json.loads((folder.superseded_root / n / "why.json").read_text()) for n in aside]
    assert [w["stands"] for w in why] == [2, 2, 2]
    assert "attempt 2 stands (less perturbed)" in why[1]["reason"]
    assert all((folder.superseded_root / n / "summary_phase_a_r4.json").exists() for n in aside[:2])
    assert not folder.staging_root.exists()
    assert {e["cell"] for e in index.superseded} == {"phase_a/r4", "phase_a/r8"}


def test_attempts_are_bounded_by_the_config(tiny, tmp_path: Path) -> None:
    study, plan, layout, index = tiny
    one = study.validity.replace(attempts=1)
    runner = ScriptedRunner({"r4": [_summary(others=0.9)], "r8": [_summary(others=0.9)]})
    measure(runner, layout, index, plan.cells, lambda: None, Policies(study.saturation, one))
    assert runner.runs == ["r4", "r8"]


def test_criterion_3_alone_is_measured_once_more(tiny) -> None:
    quiet = _summary(_check("lateness_gap_frac", 0.01, 0.1))
    calls = []

    def suspect(planned, files):  # noqa: ANN001
        calls.append(planned.cell.label)
        return (
            "tripped only saturation criterion 3 (TTFT p90 growth 2.4 vs 2): measured again before it may become a knee"
        )

    runner = _run(tiny, {"r4": [quiet, quiet], "r8": [quiet, quiet]}, suspect)
    assert runner.runs == ["r4", "r4", "r8", "r8"] and calls == ["r4", "r8"]  # once per cell, not again
    assert runner.attempts == [1, 2, 1, 2]  # the runner is told which: a later attempt's prompts are fresh
    _, _, layout, _ = tiny
    aside = sorted(p.name for p in layout.phase("plain", PHASE_A).superseded_root.iterdir())
    assert all(".ttft-growth-1." in n for n in aside)


def test_a_cell_that_stands_perturbed_is_measured_again_by_the_next_run(tiny) -> None:
    study, plan, layout, index = tiny
    busy = _summary(others=0.9)
    _run(tiny, {"r4": [busy, busy, busy], "r8": [_summary()]})
    index.status = "ok"
    index.write(layout.index("plain", PHASE_A))
    assert retry_token(layout, "plain", PHASE_A).endswith("1 cells stand perturbed")
    entries, moved = decide(layout, plan)
    assert [e.reused for e in entries] == [False, True]
    assert moved[0]["reason"].startswith("stands perturbed: host busy") and ".perturbed." in moved[0]["to"]


# --------------------------------------------------------------------------- the analysis


def _row(p90: float, lo: float | None, hi: float | None, rate: float, **kw: Any) -> dict[str, Any]:
    return {
        "phase": PHASE_A,
        "rate": rate,
        "ttft_ms_p90": p90,
        "ttft_ms_p90_ci_lo": lo,
        "ttft_ms_p90_ci_hi": hi,
        "ttft_ms_n": 400,
        "n_post_warmup": 400,
        "throughput_ratio": 1.0,
        "waiting_p50": 0.0,
        "metrics_n": 10,
        **kw,
    }


SAT = default_saturation()  # ttft_p90_ratio_max 1.5


def test_criterion_3_compares_intervals_not_point_estimates() -> None:
    lower = _row(100, 90, 110, 8)
    clear = cell_criteria(_row(200, 180, 220, 16), SAT, lower=lower)["criteria"]["ttft_growth"]
    assert clear["fired"] is True and clear["basis"] == "intervals" and clear["ci"][0] > 1.5
    noisy = cell_criteria(_row(200, 120, 280, 16), SAT, lower=lower)
    assert noisy["criteria"]["ttft_growth"]["fired"] is None and noisy["criteria"]["ttft_growth"]["undecided"]
    assert noisy["saturated"] is None and noisy["undecided"] == ["ttft_growth"]  # no knee, no reference rate
    flat = cell_criteria(_row(110, 100, 120, 16), SAT, lower=lower)
    assert flat["saturated"] is False
    no_ci = cell_criteria(_row(200, None, None, 16), SAT, lower=lower)["criteria"]["ttft_growth"]
    assert no_ci["fired"] is True and no_ci["basis"].startswith("point estimates")


def test_a_perturbed_cell_is_never_saturated_or_unsaturated() -> None:
    verdict = cell_criteria(_row(100, 90, 110, 16, valid=False, validity_reasons="host busy"), SAT)
    assert verdict["saturated"] is None and verdict["perturbed"] == "host busy"


def _study(tmp_path: Path, **kw: Any) -> tuple[SyntheticSpec, Path]:
    spec = SyntheticSpec(
        **{"n_requests": 200, "n_steps": 50, "step_logs": False, "phase_b": False, "phase_b_prime": False, **kw}
    )
    return spec, write_study(tmp_path / spec.study, spec)


def test_a_perturbed_cell_is_no_reference_rate_and_the_rate_says_so(tmp_path: Path) -> None:
    _, root = _study(
        tmp_path,
        variants=["plain", "mooncake_both"],
        perturbed=("mooncake_both/phase_a/r4",),
        write_reference=False,
    )
    ref = reference_rates(root)
    assert ref["ref_safe"] == 2.0  # 4 would be the answer, but mooncake_both's r4 was perturbed
    assert ref["ref_safe_perturbed"] == ["mooncake_both/r4"]
    assert ref["per_variant"]["mooncake_both"]["perturbed_rates"] == [4.0]
    assert ref["per_variant"]["mooncake_both"]["saturation_rate"] == 8.0


def test_a_perturbed_knee_is_no_knee(tmp_path: Path) -> None:
    _, root = _study(
        tmp_path, variants=["plain", "mooncake_both"], perturbed=("mooncake_both/phase_a/r8",), write_reference=False
    )
    ref = reference_rates(root)
    assert ref["per_variant"]["mooncake_both"]["saturation_rate"] == 16.0
    assert ref["ref_safe"] == 4.0 and ref["ref_safe_perturbed"] == ["mooncake_both/r8"]


def test_calls_on_perturbed_cells_are_not_confident_and_the_report_says_why(tmp_path: Path) -> None:
    _, clean_root = _study(tmp_path / "clean", phase_b=True, step_logs=True)
    before = {h["id"]: h for h in build(clean_root)["hypotheses"]["hypotheses"]}
    _, root = _study(tmp_path / "busy", phase_b=True, step_logs=True, perturbed=("mooncake_both/phase_b/4096x64",))
    built = build(root)
    hyp = {h["id"]: h for h in built["hypotheses"]["hypotheses"]}
    assert all(before[h]["confidence"] == "confident" for h in ("H1", "H5", "H6"))
    for h in ("H5", "H6"):  # both trends run through that shape
        assert hyp[h]["confidence"] == PERTURBED and hyp[h]["verdict"] == before[h]["verdict"]
        assert hyp[h]["interval_confidence"] == "confident"
        assert "mooncake_both/phase_b/4096x64" in hyp[h]["rests_on_perturbed"]["cells"]
        assert any("measured while perturbed: mooncake_both/phase_b/4096x64 (host busy" in c for c in hyp[h]["caveats"])
    assert hyp["H1"]["confidence"] == "confident" and hyp["H1"]["rests_on_perturbed"] is None
    assert built["hypotheses"]["perturbed_calls"] == ["H5", "H6"]
    c = built["aggregate"]["contention"]
    assert (c["invalid"], c["host_busy"], c["measured_again"]) == (1, 1, 1)
    from connector_tax.analysis.report import render_report

    report = render_report(built["aggregate"], built["hypotheses"], {}, {}, figures_made=False)
    assert "**Measured under contention.** 1 of" in report and "the calls on H5, H6 rest on them" in report
    assert "- Host contention: 1 of" in report and "max 48.0 %" in report
    assert f"| H5 | **{hyp['H5']['verdict']}** | {PERTURBED} |" in report


def test_a_reference_rate_chosen_with_perturbed_cells_touches_every_call(tmp_path: Path) -> None:
    # nixl_both's r4 (ref_safe on clean cells) stands perturbed: r4 is no reference rate now, and
    # every call at the lower ref_safe says what it rests on.
    _, root = _study(tmp_path, phase_b=True, step_logs=True, perturbed=("nixl_both/phase_a/r4",))
    built = build(root)
    hyp = built["hypotheses"]
    assert hyp["reference"]["ref_safe"] == 2.0 and hyp["reference"]["ref_safe_perturbed"] == ["nixl_both/r4"]
    for h in hyp["hypotheses"]:
        assert h["confidence"] == PERTURBED, h["id"]
        assert h["rests_on_perturbed"]["ref_safe_chosen_with"] == ["nixl_both/r4"]
    from connector_tax.analysis.report import render_report

    report = render_report(built["aggregate"], hyp, {}, {}, figures_made=False)
    assert "- ref_safe was chosen with perturbed Phase A cells: nixl_both/r4" in report


def test_virtual_time_reports_no_host() -> None:
    from connector_tax.analysis.contention import header_lines, study_contention

    rows = [{"host_measured": False, "valid": True, "attempts": 1} for _ in range(4)]
    lines = header_lines(study_contention(rows), [])
    assert lines == [
        "- Host contention: none possible: all 4 cells were computed in virtual time, on no host "
        "(no number is given for a host that did not run them)."
    ]


def test_the_banner_says_whether_a_quieter_host_would_help() -> None:
    from connector_tax.analysis.contention import header_lines, study_contention

    def rows(*cells: tuple[bool, bool], reasons: list[str] | None = None) -> list[dict]:  # (host busy, valid)
        return [
            {"variant": "plain", "phase": PHASE_A, "cell": f"r{i}", "host_measured": True, "host_busy": busy}
            | {"valid": valid, "attempts": 1, "validity_reasons": "" if valid else "; ".join(reasons or [])}
            for i, (busy, valid) in enumerate(cells)
        ]

    late = ["lateness_ttft_frac 0.03 > 0.02"]
    starved = header_lines(study_contention(rows((False, False), (False, True), reasons=[*late, SELF_STARVED])), ["H1"])
    assert "the server under test took the CPUs it needed" in starved[0] and "Run the study again" not in starved[0]
    # late with CPU to spare and no busy host: a stall the host does not show; another run may not have it
    unseen = header_lines(study_contention(rows((False, False), (False, True), reasons=late)), ["H1"])[0]
    assert "a stall the host does not show" in unseen and "Run the study again: `snakemake" in unseen
    assert "took the CPUs" not in unseen
    busy = header_lines(study_contention(rows((True, False), (False, True), reasons=late)), ["H1"])[0]
    assert "Run the study again on a quiet host" in busy


@pytest.mark.parametrize(
    ("growth", "again"),
    [
        ({"fired": True, "value": 2.6, "ci": [2.2, 3.1], "threshold": 2.0}, True),
        ({"fired": None, "undecided": True, "value": 1.9, "ci": [1.2, 2.9], "threshold": 2.0}, False),
        ({"fired": False, "value": 1.1, "ci": [0.9, 1.3], "threshold": 2.0}, False),
    ],
    ids=["fired", "straddles", "clean"],
)
def test_only_a_criterion_3_that_fires_alone_is_measured_again(tiny, monkeypatch, growth, again) -> None:
    """A straddling interval is no knee, and a second cell of the same size (which replaces the
    first) straddles as often: only a criterion 3 that fires with throughput and queue clean is
    measured once more (measure.prune.ttft_growth_only)."""
    from connector_tax.measure import prune

    study, plan, layout, _ = tiny
    r4, r8 = plan.cells
    clean = {"fired": False}
    verdict = {"criteria": {prune.CRIT_THROUGHPUT: clean, prune.CRIT_WAITING: clean, prune.CRIT_TTFT: growth}}
    monkeypatch.setattr(prune, "_row", lambda *a, **k: {})
    monkeypatch.setattr(prune, "cell_criteria", lambda *a, **k: verdict)
    why = prune.ttft_growth_only(layout, study, "plain", r8, None, [r4])  # type: ignore[arg-type]
    assert (why is not None) is again, why
    if again:
        assert why.startswith("tripped only saturation criterion 3 (TTFT p90 growth 2.6 [2.2, 3.1] vs 2")
