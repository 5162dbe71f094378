"""The default study through `snakemake` beside a CPU hog: right, or plainly not
confident where the hog touched it, and never a wrong confident call.

Three runs of configs/default.yaml, each from empty results:

- a busy process pinned to the study's CPUs for the whole run;
- the same process started once the study has sealed its first cells (mid-study);
- no hog: on a quiet host the study stays within 5 minutes, every cell passes the gate and
  the six calls are the oracle's, confident or within noise (none rests on a perturbed cell).

The oracle's answer is tests/e2e/test_oracle_truth_default.py's (the simulator's own truth at the
reference rates the study finds on clean cells). The host these tests run on may be busy with
other work: that is contention too, the study measures it, and the hog tests hold whatever the
background. The quiet-host bars of the third test are asserted only when the study's own host
reports say the host was quiet; otherwise the test says what it measured and skips those bars
(the honest properties are asserted either way).

Each run takes 5-30 minutes, so all three carry the `contention` marker (`pytest -m contention`,
one process: the run with no hog needs the host to itself to be quiet; beside a second test
process its cells are rightly measured as perturbed and measured again, 23.5 min in one such
run). `.ci/run` runs them only with CTAX_CI_CONTENTION=1: more than CI's 90 minutes leave beside
the other tiers (docs/testing.md has their measured times).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from study_runner import REPO, SNAKEMAKE

pytestmark = pytest.mark.e2e

EXPECTED = {"H1": "supported", "H2": "refuted", "H3": "supported", "H4": "refuted", "H5": "refuted", "H6": "supported"}
HOG_NAME = "ctax-hog"
# A busy loop that names itself (PR_SET_NAME), so the cells' host reports can be searched for it.
HOG = f"import ctypes\nctypes.CDLL(None).prctl(15, {HOG_NAME.encode()!r}, 0, 0, 0)\nwhile True:\n    pass\n"


def _config(folder: Path, attempts: int) -> Path:
    config = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    config["validity"] = {"attempts": attempts}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _start_hog() -> subprocess.Popen[bytes]:
    """One busy process on the CPUs the study runs on (this process's, which the study inherits)."""
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    os.sched_setaffinity(hog.pid, os.sched_getaffinity(0))
    return hog


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def _study(folder: Path) -> Path:
    return folder / "results" / "default"


def _sealed(folder: Path) -> list[dict[str, Any]]:
    """Every sealed cell summary of the study, with its path."""
    out = []
    for path in sorted(_study(folder).glob("*/phase_*/summary_*.json")):
        doc = json.loads(path.read_text())
        doc["_path"] = str(path)
        out.append(doc)
    return out


def _snakemake(folder: Path, config: Path, timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    argv = [*SNAKEMAKE, "--cores", "1", "all", "--configfile", str(config), "--directory", str(folder)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - t0


def _verdicts(folder: Path) -> dict[str, Any]:
    return json.loads((_study(folder) / "analysis" / "hypotheses.json").read_text())


def _assert_honest(folder: Path) -> dict[str, Any]:
    """Never a wrong confident call; a call that is not the oracle's says it rests on perturbed
    cells or is within noise; the report shows the contention when any call rests on it."""
    hyp = _verdicts(folder)
    report = (_study(folder) / "analysis" / "report.md").read_text()
    calls = {h["id"]: h for h in hyp["hypotheses"]}
    for name, truth in EXPECTED.items():
        h = calls[name]
        if h["confidence"] == "confident":
            assert h["verdict"] == truth, f"{name}: a wrong confident call: {h['verdict']} ({h['reason']})"
    if hyp["perturbed_calls"]:
        assert "**Measured under contention.**" in report
        for name in hyp["perturbed_calls"]:
            assert calls[name]["rests_on_perturbed"], name
    assert "- Host contention: " in report
    for summary in _sealed(folder):
        assert summary["host"]["measured"] is True, summary["_path"]
        assert summary["validity"]["host_busy"] is not None
    return hyp


def _hog_seen(summary: dict[str, Any], path: Path) -> bool:
    """The hog by name in the cell's host report or in its host samples."""
    if any(o["name"] == HOG_NAME for o in summary["host"].get("top_others") or []):
        return True
    host = path.with_name(path.name.replace("summary_", "host_").replace(".json", ".jsonl"))
    return host.exists() and HOG_NAME in host.read_text()


@pytest.mark.contention
def test_a_hog_for_the_whole_run_is_measured_and_no_call_it_touched_is_confident(tmp_path: Path) -> None:
    config = _config(tmp_path, attempts=2)
    hog = _start_hog()
    try:
        done, seconds = _snakemake(tmp_path, config, timeout=3600)
    finally:
        _stop(hog)
    assert done.returncode == 0, done.stderr[-3000:]
    hyp = _assert_honest(tmp_path)
    sealed = _sealed(tmp_path)
    # The hog shares the study's CPUs all along: every cell was measured beside it, and says so.
    assert sealed and all(s["validity"]["host_busy"] for s in sealed)
    assert all(s["validity"]["valid"] is False for s in sealed)
    assert all(len(s["attempts"]) == 2 for s in sealed)
    # ...and by name where it was among the busiest (on a host busy with other work too, the hog
    # is one runnable task of many and need not be in every cell's top five).
    assert any(_hog_seen(s, Path(s["_path"])) for s in sealed)
    assert set(hyp["perturbed_calls"]) == {h["id"] for h in hyp["hypotheses"] if h["verdict"] != "not_applicable"}
    superseded = list(_study(tmp_path).glob("*/phase_*/superseded/*/why.json"))
    assert len(superseded) >= len(sealed)
    print(
        f"hog for the whole run: {seconds:.0f} s; calls "
        + ", ".join(f"{h['id']} {h['verdict']} ({h['confidence']})" for h in hyp["hypotheses"])
    )


@pytest.mark.contention
def test_a_hog_starting_mid_study_touches_only_what_it_overlapped(tmp_path: Path) -> None:
    config = _config(tmp_path, attempts=2)
    argv = [*SNAKEMAKE, "--cores", "1", "all", "--configfile", str(config), "--directory", str(tmp_path)]
    study = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hog = None
    try:
        deadline = time.monotonic() + 1800
        while len(_sealed(tmp_path)) < 6 and study.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        started = time.time()
        hog = _start_hog()
        study.wait(timeout=3600)
    finally:
        _stop(hog)
        if study.poll() is None:
            study.kill()
            study.wait()
    assert study.returncode == 0
    _assert_honest(tmp_path)
    # Every cell sealed once the hog had run for longer than a cell (~4 s) was measured beside it,
    # and says the host was busy.
    after = [s for s in _sealed(tmp_path) if os.stat(s["_path"]).st_mtime > started + 10.0]
    assert after, "the study ended before the hog started"
    assert all(s["validity"]["host_busy"] for s in after), [s["_path"] for s in after if not s["validity"]["host_busy"]]
    assert any(_hog_seen(s, Path(s["_path"])) for s in after)


@pytest.mark.contention
def test_no_hog_the_default_study_is_clean_right_and_within_five_minutes(tmp_path: Path) -> None:
    config = _config(tmp_path, attempts=3)
    done, seconds = _snakemake(tmp_path, config, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    hyp = _assert_honest(tmp_path)
    sealed = _sealed(tmp_path)
    attempts = [a for s in sealed for a in s["attempts"]]
    busy = [a for a in attempts if a["host_busy"]]
    if busy:
        others = sorted(a["others_cpu_frac"] for a in busy)
        pytest.skip(
            f"the host was busy beside the study ({len(busy)} of {len(attempts)} attempts, others' CPU "
            f"{others[0]:.0%}-{others[-1]:.0%} of the host; {seconds:.0f} s): the honest properties hold; the "
            "quiet-host bars (clean, right, <= 5 min) need a quiet host"
        )
    assert seconds <= 300, f"{seconds:.0f} s"
    invalid = {s["_path"]: s["validity"]["reasons"] for s in sealed if not s["validity"]["valid"]}
    assert not invalid, invalid
    calls = {h["id"]: h for h in hyp["hypotheses"]}
    assert {k: calls[k]["verdict"] for k in EXPECTED} == EXPECTED
    # Right, and resting on no perturbed cell: each call is confident, or "within noise" where its
    # interval reaches the threshold (H5's on the default study, measured quiet on 2026-11-25): an
    # honest call, which the quiet-host bar (clean and right) allows.
    confidence = {k: calls[k]["confidence"] for k in EXPECTED}
    assert set(confidence.values()) <= {"confident", "within noise"}, confidence
