"""The rehearsal of an 8-GPU host, here, without a GPU (marker `rehearsal`; tests/rehearsal.py).

The command `ctax plan --gpus 8` prints runs a scaled-down H20 study (backend vllm, the real
launch path; `vllm serve` a stand-in serving with `ctax sim`) through `snakemake` on a fake GPU
host: eight phase jobs side by side, each on its own GPU with CPUs of that GPU's NUMA node, the
GPU a foreign process holds never used, one server killed mid-phase and relaunched only once
its GPU's memory was given back, and every cell complete. The plan's wall time against the
measured one: benchmarks/gpu_rehearsal.py (docs/gpu-host.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rehearsal import BUSY_GPU, CRASHED, at, rehearse

from connector_tax.config import load_study
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import read_index

pytestmark = pytest.mark.rehearsal


def test_eight_configurations_side_by_side_on_a_fake_8_gpu_host(tmp_path: Path) -> None:
    seen = rehearse(tmp_path)
    host, rows, first = seen["host"], seen["rows"], seen["first"]
    if os.environ.get("CTAX_REHEARSAL_JSON"):  # what it saw, for docs/gpu-host.md (benchmarks/gpu_rehearsal.py's table)
        kept = {k: v for k, v in seen.items() if k not in ("host", "stdout", "stderr", "config")}
        Path(os.environ["CTAX_REHEARSAL_JSON"]).write_text(json.dumps(kept, default=str, indent=1))
    assert seen["command"].startswith("snakemake all --cores 48 --resources gpu=8 --configfile ")

    # Results complete (after the re-run the fault calls for): every planned cell sealed complete.
    study = load_study(seen["config"])
    layout = StudyLayout(tmp_path / "results" / study.study)
    for name in study.names:
        for phase in ("phase_a", "phase_b"):
            index = read_index(layout.index(name, phase))
            assert index is not None and index.status == "ok", (name, phase, index and index.reason)
    assert (layout.root / "analysis" / "report.md").is_file()

    # Eight Phase A jobs at once, each on a GPU of its own, never the busy one, with CPUs of its
    # GPU's NUMA node.
    phase_a = [r for r in first if r["job"].startswith("phase_a")]
    assert len(phase_a) == 8 and len({r["gpu"] for r in phase_a}) == 8
    assert all(r["gpu"] != BUSY_GPU for r in first + rows)
    assert not any(launch["gpu"] == BUSY_GPU for launch in host.state().get("launches", []))
    spans = [(at(r["started"]), at(r["finished"])) for r in phase_a]
    assert max(sum(a <= t < b for a, b in spans) for t, _ in spans) == 8
    for r in first + [r for r in rows if r["gpu"] is not None]:  # (a re-run's reusing jobs launch nothing)
        assert r["numa_node"] == host.node_of(r["gpu"]) and r["cpus_numa_node"] == r["numa_node"], r

    # The server killed mid-phase was relaunched once, after its GPU's memory came back: the
    # stand-in refuses a start below gpu_memory_utilization x total free, and none was refused.
    assert len(seen["killed"]) == 1
    crashed = next(r for r in first if r["job"] == f"phase_a_{CRASHED}")
    assert len(crashed["restarts"]) == 1 and crashed["restarts"][0]["gpu_released_after_s"] >= 1.0, crashed
    assert host.state().get("refused", []) == []
