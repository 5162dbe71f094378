"""The preflight through stand-in vLLM launches (`ctax pipeline preflight check`): a missing connector
library is vLLM's own error, found without a launch; a library that is there gets the real launch.
The stand-in and the cases without a launch: tests/unit/test_preflight_probe.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_preflight_probe import lines, preflight, study

REPO = Path(__file__).resolve().parents[2]


CPU = REPO / "configs" / "vllm-cpu-tiny.yaml"


V1 = "vllm/distributed/kv_transfer/kv_connector/v1"


# Each probe of vLLM's code imports one of these modules: it leaves a line in $FAKE_VLLM_PROBES.
_COUNT = 'import os\nopen(os.environ["FAKE_VLLM_PROBES"], "a").write(__name__ + "\\n")\n'


@pytest.mark.e2e  # stand-in vLLM launches through the preflight: seconds each
def test_a_missing_library_is_vllms_own_error_without_a_launch(tmp_path):
    study(tmp_path)
    expected = {
        "mooncake_both": ("Mooncake is not available", "mooncake_connector.MooncakeConnectorWorker"),
        "mooncake_producer": ("Mooncake is not available", "mooncake_connector.MooncakeConnectorWorker"),
        "multi_mooncake_lmcache": ("Mooncake is not available", "mooncake_connector.MooncakeConnectorWorker"),
        "nixl_both": ("NIXL is not available", "nixl.worker.NixlConnectorWorker"),
        "lmcache_in_process": ("No module named 'lmcache'", "import lmcache.integration.vllm.vllm_v1_adapter"),
        # LMCache's MP mode: vLLM's module fails to import, before any LMCache server is started
        "lmcache_only": ("No module named 'lmcache'", f"import {V1.replace('/', '.')}.lmcache_mp_connector"),
    }
    for name, (error, raised_by) in expected.items():
        status = preflight(tmp_path, name)
        assert status["status"] == "skip" and status["reason"].startswith(f"{error} (vLLM's own error, from "), status
        assert raised_by in status["probe"]["raised_by"] and "without a launch" in status["reason"]
        assert "gate" not in status  # multi's verify script did not run: its launch could only fail
    assert lines(tmp_path / "launches") == []
    # vLLM's code was asked once, for every library: the other configurations reuse its answers
    assert lines(tmp_path / "probes") == [f"{V1}/mooncake/mooncake_connector".replace("/", ".")]
    kept = json.loads((tmp_path / "results" / "probe-test" / "preflight" / "connector_probe.json").read_text())
    assert set(kept["libraries"]) == {"mooncake", "nixl", "lmcache", "lmcache_mp"}
    assert not list((tmp_path / "results" / "probe-test" / "preflight").glob("*/sidecar_*"))  # no LMCache server


@pytest.mark.e2e  # stand-in vLLM launches through the preflight: seconds each
def test_a_library_that_is_there_gets_the_real_launch(tmp_path):
    study(tmp_path)
    assert preflight(tmp_path, "mooncake_both")["status"] == "skip"  # absent: probed, not launched
    assert lines(tmp_path / "launches") == []
    installed = tmp_path / "installed"
    (installed / "mooncake").mkdir(parents=True)
    (installed / "mooncake" / "__init__.py").touch()
    (installed / "mooncake" / "engine.py").write_text("class TransferEngine:\n    pass\n")
    for name in ("mooncake_both", "mooncake_producer"):
        status = preflight(tmp_path, name, pythonpath=str(installed))
        # the kept answer says "not available", but the library is there now: launched, and its start decides
        assert status["status"] == "skip" and "probe" not in status, status
        assert status["reason"] == "server exited with code 1: RuntimeError: this stand-in vLLM serves nothing"
    assert [line.split()[0] for line in lines(tmp_path / "launches")] == ["serve", "serve"]
    assert len(lines(tmp_path / "probes")) == 1  # the first run's; none with the library present
