"""`ctax plan --predict --launch-sd`: each predicted tax's half-width at k launches per variant, as the
analysis's launch-aware interval computes it (analysis/launch_intervals.py), by hand; bad input is
one line."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from connector_tax.analysis.batchmeans import t975
from connector_tax.planning.resolution import LAUNCHES, Resolved, TaxResolution, render, with_launches


def test_half_widths_at_k_launches_by_hand():
    entries = [
        TaxResolution("phase_a ref_safe (r8)", "x", "x", Resolved(0.1, 0.2, 100), Resolved(0.0, None, 10)),
    ]
    with_launches(entries, {"ttft_p90": 0.1, "tpot_p90": 0.05}, variants=7)
    got = entries[0].ttft_p90.launches
    assert got is not None
    assert list(got) == [str(k) for k in LAUNCHES]
    within = (math.log(1.2) / 1.96) ** 2
    for k in LAUNCHES:
        want = math.expm1(t975(6 * (k - 1)) * math.sqrt((within + 2 * 0.01) / k))
        assert got[str(k)] == pytest.approx(want)
    assert got["2"] > got["4"] > got["8"]  # more launches, narrower
    assert entries[0].tpot_p90.launches is None  # no interval: nothing to widen
    assert "with launches: k=2 ±" in render(entries)


def test_launch_sd_needs_predict_and_two_numbers():
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "connector_tax.cli", "plan", *args], capture_output=True, text=True
        )

    res = run("--launch-sd", "0.1,0.05")
    assert res.returncode == 2 and res.stderr.startswith("ctax plan: --launch-sd: only with --predict"), res.stderr
    res = run("--predict", "--launch-sd", "0.1")
    assert (
        res.returncode == 2
        and res.stderr.startswith("ctax plan: argument --launch-sd: '0.1' is not TTFT,TPOT")
        and res.stderr.count("\n") == 1
    ), res.stderr
