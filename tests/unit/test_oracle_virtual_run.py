"""A cell in the simulator's virtual time (oracle/virtual_run.py) follows the real cell's rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typed import typed

from connector_tax.config import Cell, validate_config
from connector_tax.contract.layout import CellFiles
from connector_tax.contract.summary import to_builtins
from connector_tax.loadgen.schedule.options import LoadgenOptions
from connector_tax.oracle.virtual_cells import run_cell
from connector_tax.oracle.virtual_run import VirtualTimeRun
from connector_tax.sim.settings import resolve

# The smallest valid simulated study: one variant, the schema's engine settings.
CONFIG = validate_config(
    {
        "study": "virtual-run",
        "backend": "sim",
        "model": {"name": "m"},
        "sim": {"hardware_profile": "tiny-fast"},
        "variants": [{"name": "plain"}],
        "workload": {
            "phase_a": {"rates": [1], "shape": {"input": 128, "output": 16}},
            "phase_b": {"inputs": [128], "outputs": [16]},
        },
    }
)
T0 = 10**12


def settings():
    return resolve(*typed(CONFIG, "plain"), {})


def run(tmp_path: Path, cell: Cell, enough=lambda: True, give_up=lambda: False, **opts):
    files = CellFiles(tmp_path / cell.label, cell.phase, cell.label)
    waiting: list[tuple[float, float]] = []
    options = LoadgenOptions(url="virtual:", model="m", seed=3, **opts)
    summary = to_builtins(VirtualTimeRun(settings(), cell, options, files, T0, enough, give_up, waiting, 1.0).run())
    records = [json.loads(line) for line in files.requests.read_text().splitlines()]
    return summary, records, files, waiting


def spec(**kw) -> Cell:
    base = dict(phase="phase_a", label="r10", rate=10.0, shape={"input": 256, "output": 16}, warmup_s=1.0)
    return Cell(**{**base, **kw})


def test_a_cell_issues_to_its_floor_flags_its_warmup_and_completes_every_request(tmp_path):
    summary, records, files, waiting = run(tmp_path, spec(duration_s=5.0, min_completed=10))
    warm_end, issue_end = T0 + 1_000_000_000, T0 + 6_000_000_000
    assert all(r["warmup"] == (r["t_scheduled_ns"] < warm_end) for r in records)
    assert max(r["t_scheduled_ns"] for r in records) < issue_end
    assert 40 <= sum(not r["warmup"] for r in records) <= 60  # ~10/s for 5 s
    assert {r["status"] for r in records} == {"ok"}
    assert all(r["completion_tokens"] == 16 and r["t_first_token_ns"] > r["t_send_ns"] for r in records)
    assert summary["clock"] == "virtual" and summary["complete"] is True and summary["extended"] is False
    assert summary["counts"]["ok"] == summary["counts"]["post_warmup"]
    assert 6.0 <= summary["wall_s"] < 6.5  # the virtual duration: floor, then the last request's drain
    steps = files.engine_step.read_text().splitlines()
    assert steps and all(json.loads(s)["step_duration_us"] is not None for s in steps[:5])
    metrics = [json.loads(line) for line in files.metrics.read_text().splitlines()]
    assert len(metrics) == len(waiting) >= 6 and "vllm:num_requests_waiting" in metrics[0]


def test_a_cell_extends_past_its_floor_to_min_completed(tmp_path):
    summary, records, _, _ = run(tmp_path, spec(duration_s=2.0, min_completed=100))
    assert summary["extended"] is True
    post = [r for r in records if not r["warmup"]]
    assert 100 <= len(post) <= 110  # stops at the first arrival after the 100th completion
    assert summary["counts"]["ok"] >= 100


def test_precision_not_reached_runs_to_the_cap_and_the_guard_ends_at_the_floor(tmp_path):
    capped, _, _, _ = run(tmp_path, spec(label="cap", duration_s=1.0, max_duration_s=3.0), enough=lambda: False)
    assert 4.0 <= capped["wall_s"] < 4.5  # warm-up 1 + cap 3
    guarded, records, _, _ = run(
        tmp_path, spec(label="guard", duration_s=1.0, min_completed=1000), give_up=lambda: True
    )
    assert max(r["t_scheduled_ns"] for r in records) < T0 + 2_000_000_000


def test_the_inflight_cap_drops_and_the_request_timeout_cancels(tmp_path):
    long = {"input": 256, "output": 2000}
    summary, records, _, _ = run(tmp_path, spec(duration_s=2.0, shape=long), inflight_cap=3, timeout_s=0.5)
    statuses = {r["status"] for r in records}
    assert {"dropped", "timeout"} <= statuses
    assert all(r["error"] == "in-flight cap reached" for r in records if r["status"] == "dropped")
    assert all(r["error"].startswith("timeout after 0.5") for r in records if r["status"] == "timeout")
    assert summary["counts"]["dropped"] > 0 and summary["validity"]["valid"] is False


def test_the_same_cell_twice_gives_the_same_records(tmp_path):
    _, first, _, _ = run(tmp_path / "a", spec(duration_s=2.0))
    _, second, _, _ = run(tmp_path / "b", spec(duration_s=2.0))
    assert first == second


def test_unloaded_latency_is_the_engine_models(tmp_path):
    """The virtual cell's TTFT and TPOT at a light load are what the virtual engine alone gives
    (oracle/virtual_cells.py, the truth oracle's cells) for the same load."""
    summary, records, _, _ = run(tmp_path, spec(rate=2.0, duration_s=30.0))
    ttft = np.array([(r["t_first_token_ns"] - r["t_send_ns"]) / 1e6 for r in records if not r["warmup"]])
    oracle = run_cell(settings(), Cell("phase_a", "r2", 2.0, {"input": 256, "output": 16}), 60, seed=1)
    assert np.median(ttft) == pytest.approx(np.median(oracle.ttft_ms), rel=0.02)
    assert summary["latency_ms"]["tpot"]["p50"] == pytest.approx(np.nanmedian(oracle.tpot_ms), rel=0.02)
