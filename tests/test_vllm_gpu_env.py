"""tools/vllm_gpu_env.sh: vLLM 0.33.0 and the connectors' CUDA 13 builds in one command.

The install itself is the opt-in tier `gpu_env` (several GB of downloads: `pytest -m gpu_env`,
into $CONNECTOR_TAX_VLLM_GPU_VENV or a fresh folder under the test's tmp_path); the rest is fast.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from connector_tax.contract.records import connector_packages, connector_version

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "vllm_gpu_env.sh"


def test_the_manifest_reads_connector_versions_under_any_distribution_name() -> None:
    gpu = {"mooncake-transfer-engine-cuda13": "0.3.13.post1", "nixl": "1.5.1", "nixl-cu13": "1.5.1", "lmcache": "0.5.6"}
    cpu = {"mooncake-transfer-engine-non-cuda": "0.3.13.post1", "nixl-cu12": "1.5.1"}
    assert [connector_version(gpu, lib) for lib in ("mooncake", "nixl", "lmcache")] == [
        "0.3.13.post1",
        "1.5.1",
        "0.5.6",
    ]
    assert [connector_version(cpu, lib) for lib in ("mooncake", "nixl", "lmcache")] == ["0.3.13.post1", "1.5.1", ""]
    assert connector_packages(gpu).startswith("mooncake-transfer-engine-cuda13 0.3.13.post1, nixl 1.5.1")


def test_bad_arguments_are_one_line() -> None:
    done = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr == "vllm_gpu_env.sh: unknown argument: --bogus\n"
    done = subprocess.run(["bash", str(SCRIPT), "--python", "no-such-python"], capture_output=True, text=True)
    assert done.returncode == 2 and "--python: 'no-such-python' not found" in done.stderr


@pytest.mark.gpu_env
def test_it_installs_vllm_033_and_every_connectors_cuda13_build(tmp_path: Path) -> None:
    if shutil.disk_usage(tmp_path).free < 20 * 2**30:
        pytest.skip("fewer than 20 GB free for an 11 GB environment")
    venv = Path(os.environ.get("CONNECTOR_TAX_VLLM_GPU_VENV") or tmp_path / "vllm-gpu")
    start = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), str(venv)], capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    marker = json.loads((venv / ".connector-tax-vllm-gpu.json").read_text())
    print(f"\nvllm_gpu_env.sh: {took:.0f} s into {venv}; marker: {json.dumps(marker, sort_keys=True)}")
    assert (marker["vllm"], marker["torch"], marker["torch_cuda"].split(".")[0]) == ("0.33.0", "2.14.0", "13")
    assert marker["problems"] == []
    for dist in ("mooncake-transfer-engine-cuda13", "nixl", "nixl-cu13", "lmcache", "vllm"):
        entry = marker["connectors"][dist]
        # Imports here, or cannot load only for want of the NVIDIA driver (a host without a GPU).
        assert entry["imports"] or entry.get("unresolved") == ["libcuda.so.1"], (dist, entry)
