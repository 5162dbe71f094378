"""`ctax plan --predict`'s resolution: where the prediction computed every variant's Phase B (cells
that stop on their taxes), each Phase B tax is the analysis's own, paired with the baseline's
cell; only a shape computed for the baseline alone falls back to its zero tax. Cells too short for
an interval are named with their own variant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from connector_tax.contract import StudyLayout
from connector_tax.planning import resolution as module
from connector_tax.planning.resolution import ZERO, render, resolution, unbounded_cells


def _row(variant: str, phase: str, cell: str, n: int, p90: float, half: float) -> dict[str, Any]:
    row: dict[str, Any] = {"variant": variant, "phase": phase, "cell": cell}
    if "x" in cell:
        row["input_len"], row["output_len"] = map(int, cell.split("x"))
    for metric in ("ttft_ms", "tpot_ms"):
        row[f"{metric}_n"] = n
        row[f"{metric}_p90"] = p90
        row[f"{metric}_p90_ci_lo"], row[f"{metric}_p90_ci_hi"] = (None, None) if n < 64 else (p90 - half, p90 + half)
    return row


def _tax(value: float, ci: list[float] | None) -> dict[str, Any]:
    return {"ttft_p90": {"value": value, "ci": ci}, "tpot_p90": {"value": value, "ci": ci}}


@pytest.fixture
def aggregate(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    rows = [
        _row("plain", "phase_a", "r1", 100, 10.0, 1.0),
        _row("a", "phase_a", "r1", 100, 11.0, 1.0),
        # Phase B 64x8: every variant computed; the baseline's own interval is wide (±50 %)
        _row("plain", "phase_b", "64x8", 80, 10.0, 5.0),
        _row("a", "phase_b", "64x8", 90, 12.0, 5.0),
        _row("b", "phase_b", "64x8", 50, 13.0, 5.0),
        # 512x8: the baseline's alone
        _row("plain", "phase_b", "512x8", 100, 20.0, 2.0),
    ]
    taxes = {
        "phase_a": {"ref_safe": {"cell": "r1", "variants": {"a": _tax(0.1, [0.05, 0.15])}}},
        "phase_b": {
            "cells": {
                "64x8": {"variants": {"a": _tax(0.2, [0.18, 0.22]), "b": _tax(0.3, None)}},
                "512x8": {"variants": {}},
            }
        },
    }
    agg = {"baseline": "plain", "rows": rows, "taxes": taxes}
    monkeypatch.setattr(module, "build", lambda root: {"aggregate": agg})
    return agg


def test_every_variants_phase_b_tax_is_its_paired_one(aggregate: dict[str, Any], tmp_path: Path) -> None:
    entries = resolution(tmp_path)
    at = {(e.at, e.variant): e for e in entries}
    assert set(at) == {
        ("phase_a ref_safe (r1)", "a"),
        ("phase_b 64x8", "a"),
        ("phase_b 64x8", "b"),
        ("phase_b 512x8", ZERO),
    }
    # shapes by input length (64 before 512), not by their labels' text
    assert [e.at for e in entries][1:] == ["phase_b 64x8", "phase_b 64x8", "phase_b 512x8"]
    a = at[("phase_b 64x8", "a")].ttft_p90
    # the paired tax's ±2 pp, not the ±100 pp of the baseline's cell against itself
    assert a.tax == pytest.approx(0.2) and a.half_width == pytest.approx(0.02) and a.requests == 80
    b = at[("phase_b 64x8", "b")]
    assert b.ttft_p90.half_width is None and b.ttft_p90.requests == 50 and b.cell_of == "b"
    zero = at[("phase_b 512x8", ZERO)]
    assert zero.cell_of == "plain" and zero.ttft_p90.tax is None
    assert (zero.ttft_p90.half_width or 0) > 0.1  # its ±10 % cell against itself, both sides free

    text = render(entries)
    (line,) = [x for x in text.splitlines() if "phase_b 64x8" in x]
    assert "2 variants, paired with the baseline" in line
    assert "ttft_p90 ±2.0 to ±2.0 pp (a), 1 with no interval (50 requests; needs 64)" in line
    assert any("phase_b 512x8" in x and ZERO in x for x in text.splitlines())

    # the short cell is b's own, and the plan names it with b
    summary = StudyLayout(tmp_path).phase("b", "phase_b").cell("64x8").summary
    summary.parent.mkdir(parents=True)
    stop = "ended at its floor: saturated at this rate (waiting p50 9 > 1); left out of H5/H6"
    summary.write_text(json.dumps({"rate": 0.5, "duration_s": 100, "stop_reason": stop}))
    (short,) = unbounded_cells(tmp_path, entries)
    assert short.startswith(f"phase_b 64x8 b: 50 requests ({stop}); to bound it: workload.duration_s: 160")
