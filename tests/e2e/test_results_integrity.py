"""Every number belongs to the settings that made it: through `snakemake`, as a user runs it.

A changed measurement setting re-measures exactly the cells it touches and the analysis uses
only the new ones; an unchanged re-run reuses everything; a second backend is refused before any
launch; kill -9 at any moment never leaves a "complete" cell that is not;
a cell whose server died is recorded as failed, reported, and redone by the next plain run.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
from study_runner import TINY, consistent, our_processes, sealed_cells, snakemake, start_snakemake, write_config

from connector_tax.analysis.batchmeans import MIN_BATCHES, MIN_PER_BATCH
from connector_tax.contract import StudyLayout

pytestmark = pytest.mark.e2e


# Session-scoped: made at most once per process, so that in two processes (`-n 2`) the cases that
# copy it run side by side instead of in one module-long queue (tests/conftest.py).
@pytest.fixture(scope="session")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One complete tiny study (the starting point every case copies)."""
    folder = tmp_path_factory.mktemp("measured")
    result = snakemake(folder, write_config(folder, TINY), "analyze")
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def _copy(measured: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "study"
    shutil.copytree(measured, folder, symlinks=True)
    return folder


def _set(path: str, value: object):
    def edit(config: dict) -> None:
        *parents, leaf = path.split(".")
        node = config
        for key in parents:
            node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
        node[leaf] = value

    return edit


ALL_CELLS = {
    f"{c}/{cell}" for c in ("plain", "noop_connector") for cell in ("phase_a/r4", "phase_a/r8", "phase_b/128x8")
}


@pytest.mark.parametrize(
    ("edit", "remeasured"),
    [
        pytest.param(
            _set("workload.phase_a.shape.input", 160),
            {f"{c}/phase_a/{r}" for c in ("plain", "noop_connector") for r in ("r4", "r8")},
            id="shape",
        ),
        # r8 leaves the plan (an orphan), r6 joins it and becomes ref_safe, so Phase B moves to it
        pytest.param(
            _set("workload.phase_a.rates", [4, 6]),
            {f"{c}/{cell}" for c in ("plain", "noop_connector") for cell in ("phase_a/r6", "phase_b/128x8")},
            id="rate",
        ),
        pytest.param(_set("workload.warmup_s", 0.15), ALL_CELLS, id="warm-up"),
        pytest.param(
            _set("variants.1.sim", {"connector_costs": {"framework": {"build_meta": {"fixed_us": 500}}}}),
            {c for c in ALL_CELLS if c.startswith("noop_connector/")},
            id="sim-parameter",
        ),
        pytest.param(
            _set("variants.0.server", {"max_num_seqs": 64}),
            {c for c in ALL_CELLS if c.startswith("plain/")},
            id="server-flag",
        ),
        pytest.param(_set("seed", 8), ALL_CELLS, id="seed"),
    ],
)
def test_a_changed_setting_remeasures_exactly_its_cells(measured, tmp_path, edit, remeasured) -> None:
    folder = _copy(measured, tmp_path)
    before = sealed_cells(folder, TINY)
    config = copy.deepcopy(TINY)
    edit(config)
    dry = snakemake(folder, write_config(folder, config, "changed.yaml"), "analyze", "-n")
    assert dry.returncode == 0, dry.stderr[-2000:]
    announced = {
        line.split(":")[1].strip().split("/")[0]
        for line in dry.stderr.splitlines()
        if line.startswith("connector-tax: ") and "cells to measure" in line
    }
    assert announced == {c.split("/")[0] for c in remeasured if "/phase_a/" in c}

    result = snakemake(folder, folder / "changed.yaml", "analyze")
    assert result.returncode == 0, result.stderr[-3000:]
    after = sealed_cells(folder, config)
    changed = {k for k, v in after.items() if v is None or before.get(k) != v}
    assert changed == remeasured
    assert all(v is not None for v in after.values())
    assert set(after) <= set(before) | remeasured
    assert consistent(folder, config["study"]) == []
    # The analysis stands on exactly the current cells, each with the fingerprint it was sealed with.
    layout = StudyLayout(folder / "results" / config["study"])
    agg = json.loads((layout.analysis_dir / "aggregate.json").read_text())
    rows = {f"{r['variant']}/{r['phase']}/{r['cell']}": r["fingerprint"] for r in agg["rows"]}
    assert set(rows) == set(after)
    for key, fp in rows.items():
        name, phase, label = key.split("/")
        assert json.loads(layout.phase(name, phase).cell(label).summary.read_text())["fingerprint"] == fp
    # Superseded cells are kept; cells no longer planned stay where they were; the report lists both.
    moved = {p.name.split(".")[0] for p in layout.root.glob("*/*/superseded/*")}
    assert moved == {f"{k.split('/')[1]}_{k.split('/')[2]}" for k in remeasured if k in before}
    report = (layout.analysis_dir / "report.md").read_text()
    assert ("superseded (kept, not analysed)" in report) == bool(moved)
    orphans = {x["path"] for x in agg["ignored"] if "orphan" in x["why"]}
    relative = StudyLayout.of(config["study"])  # the analysis ran from the study's folder
    assert orphans == {
        str(relative.phase(c, "phase_a").folder / "*_phase_a_r8.*")
        for c in ("plain", "noop_connector")
        if "phase_a/r8" not in str(after)
    }


def test_an_unchanged_rerun_reuses_everything(measured, tmp_path) -> None:
    folder = _copy(measured, tmp_path)
    result = snakemake(folder, folder / "study.yaml", "analyze")
    assert result.returncode == 0 and "Nothing to be done" in result.stdout + result.stderr


# Facts of the launch that measured a phase's cells, which a run that launches nothing must keep.
_LAUNCH_FACTS = ("launch_command", "server_cpus", "gpu", "step_timing_available", "step_timing_reason")


def _launch_facts(folder: Path, name: str, phase: str) -> dict:
    index = json.loads(StudyLayout(folder / "results" / "integrity").index(name, phase).read_text())
    return {key: index[key] for key in _LAUNCH_FACTS}


def test_a_forced_rerun_that_reuses_every_cell_keeps_the_launch_facts(measured, tmp_path) -> None:
    """Snakemake deletes a job's outputs (run.json) before it runs it: the facts of the launch that
    measured the reused cells (step timing above all) must not go with it."""
    folder = _copy(measured, tmp_path)
    before = {(n, p): _launch_facts(folder, n, p) for n in ("plain", "noop_connector") for p in ("phase_a", "phase_b")}
    assert all(f["step_timing_available"] and f["launch_command"] for f in before.values())
    result = snakemake(folder, folder / "study.yaml", "analyze", "--forcerun", "phase_a_plain", "phase_b_plain")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert "plain phase_a: ok, 2 cells (2 reused)" in out and "plain phase_b: ok, 1 cells (1 reused)" in out
    assert {k: _launch_facts(folder, *k) for k in before} == before
    rows = json.loads((StudyLayout(folder / "results" / "integrity").analysis_dir / "aggregate.json").read_text())
    assert all(r["step_timing_available"] for r in rows["rows"]), [r["cell"] for r in rows["rows"]]


def test_a_rerun_whose_only_cell_left_is_pruned_keeps_the_launch_facts(tmp_path) -> None:
    """The knee prunes r400 again without a launch: the launch that measured r4 and r200 stands."""
    config = copy.deepcopy(TINY)
    config["variants"] = config["variants"][:1]
    config.pop("saturation")
    config["workload"]["phase_a"] = {"rates": [4, 200, 400], "shape": {"input": 512, "output": 16}}
    path = write_config(tmp_path, config)
    assert snakemake(tmp_path, path, "phase_a").returncode == 0
    before = _launch_facts(tmp_path, "plain", "phase_a")
    assert before["step_timing_available"] and before["launch_command"]
    result = snakemake(tmp_path, path, "phase_a", "--forcerun", "phase_a_plain")
    assert result.returncode == 0, result.stderr[-3000:]
    index = json.loads(StudyLayout(tmp_path / "results" / "integrity").index("plain", "phase_a").read_text())
    assert [c["status"] for c in index["cells"]] == ["complete", "complete", "pruned"]
    assert _launch_facts(tmp_path, "plain", "phase_a") == before


def test_another_backend_in_the_same_study_folder_is_refused(measured, tmp_path) -> None:
    folder = _copy(measured, tmp_path)
    config = {**copy.deepcopy(TINY), "backend": "vllm"}
    result = snakemake(folder, write_config(folder, config, "vllm.yaml"), "all", "-n")
    assert result.returncode != 0
    assert "config error: backend: results/integrity holds backend sim results and this run is backend vllm" in (
        result.stderr
    )


def test_analysis_refuses_cells_of_other_settings(measured, tmp_path) -> None:
    from connector_tax.cli import main

    folder = _copy(measured, tmp_path)
    layout = StudyLayout(folder / "results" / "integrity")
    text = layout.study_config.read_text().replace("warmup_s: 0.1", "warmup_s: 0.2")
    layout.study_config.write_text(text)  # as if the config changed and nothing was re-measured
    assert main(["analyze", str(layout.root)]) == 2


def test_kill_9_at_any_moment_never_leaves_a_false_complete(tmp_path) -> None:
    config = copy.deepcopy(TINY)
    config["variants"] = config["variants"][:1]
    config["workload"].update(duration_s=0.8, phase_a={"rates": [4, 6, 8, 10], "shape": {"input": 128, "output": 8}})
    path = write_config(tmp_path, config)
    rng = random.Random(1)
    kept: dict[Path, bytes] = {}
    for attempt in range(5):
        proc = start_snakemake(tmp_path, path, "phase_a")
        time.sleep(rng.uniform(2.0, 6.0))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 60  # a bail-out: exits are slow on a loaded host
        while our_processes(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert our_processes(tmp_path) == [], f"attempt {attempt}: processes left behind"
        assert consistent(tmp_path, config["study"]) == [], f"attempt {attempt}"
        # A cell sealed complete stays exactly as it was: reused, never re-measured or lost.
        for requests, data in kept.items():
            assert requests.read_bytes() == data, f"attempt {attempt}: {requests.name} changed"
        for summary in (tmp_path / "results" / "integrity" / "plain" / "phase_a").glob("summary_*.json"):
            if json.loads(summary.read_text()).get("complete"):
                requests = summary.with_name(summary.name.replace("summary_", "requests_").replace(".json", ".jsonl"))
                kept.setdefault(requests, requests.read_bytes())
        snakemake(tmp_path, path, "--unlock")
    result = snakemake(tmp_path, path, "phase_a")
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(sealed_cells(tmp_path, config)[f"plain/phase_a/r{r}"] for r in (4, 6, 8, 10))
    assert consistent(tmp_path, config["study"]) == []
    for requests, data in kept.items():
        assert requests.read_bytes() == data


def test_a_cell_whose_server_died_is_failed_reported_and_redone(tmp_path) -> None:
    config = copy.deepcopy(TINY)
    config["variants"] = config["variants"][:1]
    config["workload"].update(duration_s=3.0, phase_a={"rates": [4, 8], "shape": {"input": 128, "output": 8}})
    path = write_config(tmp_path, config)
    proc = start_snakemake(tmp_path, path, "all")
    layout = StudyLayout(tmp_path / "results" / "integrity")
    deadline = time.monotonic() + 300  # a bail-out: snakemake and preflight first, on a loaded host
    while not layout.phase("plain", "phase_a").staging("r4").folder.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(1.0)
    servers = [p for p in our_processes(tmp_path) if "sim" in p.info["cmdline"]]
    assert servers, "no simulated server found"
    for server in servers:
        server.send_signal(signal.SIGKILL)  # the server dies mid-cell
    assert proc.wait(600) == 0  # a recorded outcome: the study goes on and reports it
    index = json.loads(layout.index("plain", "phase_a").read_text())
    # the cell stopped at once and failed with the reason; a new server measured the next cell
    assert index["status"] == "partial" and index["cells_failed"]["phase_a/r4"].startswith("server exited with code -9")
    assert index["cells"][1]["status"] == "complete" and len(index["restarts"]) == 1
    summary = json.loads(layout.phase("plain", "phase_a").cell("r4").summary.read_text())
    assert summary["complete"] is False and summary["status"] == "failed"
    manifest, report = layout.manifest_md.read_text(), (layout.analysis_dir / "report.md").read_text()
    assert "- plain/phase_a/r4: server exited with code -9" in manifest
    assert "`plain/phase_a/r4`: failed: server exited" in report
    # what served the study, in the index, the manifest and the report (simulated, here)
    assert index["served_by"] == "simulated vLLM (ctax sim)" and index["mooncake_transport"] is None
    assert "**SIMULATED**" in manifest and "- served by: simulated vLLM (ctax sim)" in manifest
    assert "> **SIMULATED DATA.**" in report and "- Served by: simulated vLLM (ctax sim)" in report

    again = snakemake(tmp_path, path, "all")  # the same command: the failed cells are retried
    assert again.returncode == 0, again.stderr[-3000:]
    index = json.loads(layout.index("plain", "phase_a").read_text())
    assert index["status"] == "ok" and index["cells_run"] == ["phase_a/r4"] and index["cells_resumed"] == ["phase_a/r8"]
    assert any(
        p.name.startswith("phase_a_r4.failed.") for p in layout.phase("plain", "phase_a").superseded_root.iterdir()
    )
    assert consistent(tmp_path, "integrity") == []
    assert not [
        p
        for p in psutil.process_iter()
        if p.pid in {s.pid for s in servers} and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


def test_phase_a_stops_at_a_configurations_knee(tmp_path) -> None:
    config = copy.deepcopy(TINY)
    config["variants"] = config["variants"][:1]
    config.pop("saturation")  # the study's default thresholds
    config["workload"]["phase_a"] = {"rates": [400, 4, 200], "shape": {"input": 512, "output": 16}}
    path = write_config(tmp_path, config)
    result = snakemake(tmp_path, path, "phase_a")
    assert result.returncode == 0, result.stderr[-3000:]
    index = json.loads(StudyLayout(tmp_path / "results" / "integrity").index("plain", "phase_a").read_text())
    # lowest rate first; 200 req/s is far past the simulated server's knee, so 400 is not measured
    assert [c["label"] for c in index["cells"]] == ["r4", "r200", "r400"]
    assert [c["status"] for c in index["cells"]] == ["complete", "complete", "pruned"]
    assert index["cells_pruned"]["phase_a/r400"].startswith("pruned: saturated at r200 (")
    assert index["status"] == "ok" and "1 pruned past a knee" in result.stdout + result.stderr
    again = snakemake(tmp_path, path, "phase_a")  # a pruned cell is a final state: nothing to redo
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_a_cell_runs_until_its_p90s_are_precise_enough(tmp_path) -> None:
    config = copy.deepcopy(TINY)
    config["variants"] = config["variants"][:1]
    config["workload"].update(
        duration_s=0.3,
        min_completed=3,
        phase_a={"rates": [40], "shape": {"input": 64, "output": 8}},
        # the cap is a bail-out: a quiet host reaches the target in seconds; a loaded one's
        # scheduling widens the p90s' intervals, and at load 4 a 60 s cap was once not enough
        precision={"target": 0.15, "max_duration_s": 240},
    )
    result = snakemake(tmp_path, write_config(tmp_path, config), "phase_a")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(
        StudyLayout(tmp_path / "results" / "integrity").phase("plain", "phase_a").cell("r40").summary.read_text()
    )
    # far past its 0.3 s floor and 3 requests: batch means need 5 batches of 10 before any interval
    assert summary["stop_reason"] == "precision reached (target ±15%)", summary["stop_reason"]
    assert summary["counts"]["ok"] >= MIN_BATCHES * MIN_PER_BATCH and summary["extended"] is True
    assert all(w is not None and w <= 0.15 for w in summary["precision"].values())


def test_snakemake_report_holds_the_figures_the_verdicts_and_the_manifest(measured, tmp_path) -> None:
    """`snakemake --report` after a study: every figure with its caption, verdicts.tsv, MANIFEST.tsv."""
    from connector_tax.contract.layout import FIGURES

    folder = _copy(measured, tmp_path)
    assert snakemake(folder, folder / "study.yaml", "all").returncode == 0
    result = snakemake(folder, folder / "study.yaml", "--report", str(folder / "report.html"))
    assert result.returncode == 0, result.stderr[-3000:]
    added = {
        line.split()[1]
        for line in result.stdout.splitlines() + result.stderr.splitlines()
        if line.startswith("Adding ")
    }
    assert added == {f"{name}.png" for name in FIGURES} | {"verdicts.tsv", "MANIFEST.tsv"}
    assert (folder / "report.html").stat().st_size > 100_000
