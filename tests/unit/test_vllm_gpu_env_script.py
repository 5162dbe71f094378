"""tools/vllm_gpu_env.sh without an install: its manifest reads the connectors' versions under any
distribution name, and bad arguments are one line. The install itself:
tests/gpu_env/test_vllm_gpu_env.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from connector_tax.contract.records import connector_packages, connector_version

REPO = Path(__file__).resolve().parents[2]


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
