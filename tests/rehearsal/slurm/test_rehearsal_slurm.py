"""The rehearsal of an 8-GPU host (tests/rehearsal/test_rehearsal.py) through Snakemake's SLURM
executor with GPU gres, on the local SLURM (tests/slurm/test_slurm.py's environment): markers
`rehearsal` and `slurm`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rehearsal import CRASHED, rehearse


@pytest.mark.slurm
def test_the_same_through_slurm_with_gpu_gres(tmp_path: Path) -> None:
    """Through Snakemake's SLURM executor on the local SLURM (two GPUs as gres): SLURM places each
    job on a GPU (CUDA_VISIBLE_DEVICES) and the job runs there, in PCI order, with the GPU's NUMA
    node recorded; the killed server's relaunch still waits for its memory; every cell complete."""
    from test_slurm import _slurm_env

    slurm_env, why = _slurm_env()
    if slurm_env is None:
        pytest.skip(why)
    names = ["plain", "noop_connector", "mooncake_both", "nixl_both"]
    seen = rehearse(tmp_path, gpus=2, busy=None, variants=names, slurm_env=slurm_env)
    host, rows, first = seen["host"], seen["rows"], seen["first"]
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows), rows
    for r in first + [r for r in rows if r["gpu"] is not None]:
        assert r["gpu"] in ("0", "1") and r["numa_node"] == host.node_of(r["gpu"]), r
    placements = [json.loads(p.read_text())["placement"] for p in (tmp_path / "results").glob("*/*/phase_*/run.json")]
    assert {p["scheduler"] for p in placements} == {"slurm"}
    assert len(seen["killed"]) == 1
    crashed = next(r for r in first if r["job"] == f"phase_a_{CRASHED}")
    assert len(crashed["restarts"]) == 1 and crashed["restarts"][0]["gpu_released_after_s"] >= 1.0, crashed
    assert host.state().get("refused", []) == []
