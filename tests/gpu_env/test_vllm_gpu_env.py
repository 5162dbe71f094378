"""tools/vllm_gpu_env.sh: vLLM 0.33.0 and the connectors' CUDA 13 builds in one command, installed into
$CONNECTOR_TAX_VLLM_GPU_VENV or a fresh folder under the test's tmp_path (several GB of downloads:
`pytest -m gpu_env`). Its fast checks: tests/unit/test_vllm_gpu_env_script.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "vllm_gpu_env.sh"


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
