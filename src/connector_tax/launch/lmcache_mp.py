"""LMCache in its multi-process mode: connector type `lmcache_mp` and the LMCache server beside vLLM.

vLLM 0.32/0.33's `LMCacheMPConnector` (with lmcache installed, lmcache.integration.vllm.
lmcache_mp_connector) keeps no cache of its own: it talks over ZMQ to a separate LMCache server
process (`lmcache server`), which holds the KV chunks in its CPU memory tier. That server is a
sidecar of the launch (serving/spec.py SidecarSpec): started before vLLM on its own ports, ready
when its HTTP frontend's /healthcheck answers, stopped after vLLM; a connector whose server is
absent would wait `lmcache.mp.mq_timeout` (300 s) instead of failing.

Facts of LMCache 0.5.6 this relies on (reproduced on a 2-core CPU host, docs/connectors-cpu.md):

* `lmcache server --host H --port P` binds its ZMQ request server at P and an HTTP frontend at
  `--http-host`/`--http-port` (8080 unless told; here P+1): /healthcheck, /status (which names the
  registered workers: `registered_non_cuda_instance_ids`, `registered_gpu_ids`) and /metrics
  (`lmcache_mp_l1_write_chunks_total`, `..._read_chunks_total`, lookup hits);
* `--l1-size-gb` needs `--eviction-policy`; the chunk size must be a multiple of vLLM's block size
  (config/vllm_rules.py checks it at load); start-up imports opentelemetry's Prometheus exporter;
* a device without an LMCache-driven path (CPU) needs `engine_driven` transfer on both sides:
  the server's `--supported-transfer-mode` and the connector's `lmcache.mp.mp_transfer_mode`;
  `NO_GPU_EXT=1` keeps the server from loading CUDA extensions. Elsewhere LMCache's defaults stand;
* `LMCACHE_TRACK_USAGE=false` turns its usage reporting off (it would phone home from the study).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from connector_tax.config import StudyConfig, Variant
from connector_tax.config.vllm_rules import check_lmcache_server, connector_types
from connector_tax.serving.spec import SidecarSpec

KIND = "lmcache_mp"
CONNECTOR_CLASS = "LMCacheMPConnector"
SIDECAR = "lmcache_server"
PORTS = 2  # the server's ZMQ port P and its HTTP frontend at P+1
# The port a launch plans with when none is reserved (fingerprints, printed commands): LMCache's own default.
PLANNED_PORT = 5555


def uses(variant: Variant) -> bool:
    return KIND in connector_types(variant.connector)


def transfer_mode(study: StudyConfig) -> str | None:
    """The transfer mode both sides are told, or None for LMCache's own default (a GPU host)."""
    mode = study.lmcache_server.transfer_mode
    if mode == "auto":
        return "engine_driven" if study.device == "cpu" else None
    return mode


def connector(study: StudyConfig, host: str, port: int) -> dict[str, Any]:
    """The kv_connector_extra_config of an lmcache_mp connector whose server listens at host:port."""
    extra: dict[str, Any] = {"lmcache.mp.host": f"tcp://{host}", "lmcache.mp.port": port}
    if (mode := transfer_mode(study)) is not None:
        extra["lmcache.mp.mp_transfer_mode"] = mode
    return extra


def mode(study: StudyConfig, variant: Variant) -> str | None:
    """Which LMCache mode a variant runs, in the words every output uses; None without LMCache."""
    kinds = connector_types(variant.connector)
    if KIND in kinds:
        how = transfer_mode(study) or "LMCache's default transfer"
        return f"multi-process (LMCacheMPConnector + lmcache server, {how})"
    if "lmcache" in kinds:
        return "in-process (LMCacheConnectorV1)"
    return None


def executable(study: StudyConfig) -> str:
    """vllm.lmcache_mp.executable, else the `lmcache` script beside vllm.executable, else on PATH."""
    settings = study.lmcache_server
    if settings.executable:
        return settings.executable
    vllm = study.vllm_executable
    found = shutil.which(vllm) if os.sep not in vllm else vllm
    beside = Path(found).parent / "lmcache" if found else None
    return str(beside) if beside is not None and beside.is_file() else "lmcache"


@functools.lru_cache(maxsize=8)
def version(script: str) -> str | None:
    """LMCache's version in the Python the `lmcache` script runs (metadata only, no import)."""
    path = shutil.which(script) if os.sep not in script else script
    try:
        with open(path or script, "rb") as fh:
            shebang = fh.readline().decode("utf-8", "replace")[2:].split()
        code = "import importlib.metadata as m, json; print(json.dumps(m.version('lmcache')))"
        done = subprocess.run([shebang[-1], "-c", code], capture_output=True, text=True, timeout=60)
        found: str | None = json.loads(done.stdout.strip().splitlines()[-1])
        return found
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def server(study: StudyConfig, host: str, port: int) -> SidecarSpec:
    """The LMCache MP server of a launch, on `port` (its ZMQ requests) and port+1 (HTTP)."""
    settings = study.lmcache_server
    check_lmcache_server(study.raw)  # checked at load too; again for a config edited since
    script = executable(study)
    argv = [script, "server", "--host", host, "--port", str(port), "--http-host", host]
    argv += ["--http-port", str(port + 1), "--chunk-size", str(settings.chunk_size)]
    argv += ["--l1-size-gb", f"{settings.l1_size_gb:g}", "--eviction-policy", settings.eviction_policy]
    if (mode := transfer_mode(study)) is not None:
        argv += ["--supported-transfer-mode", mode]
    argv += list(settings.extra_args)
    env = {"LMCACHE_DISABLE_BANNER": "1", "LMCACHE_TRACK_USAGE": "false"}
    if study.device == "cpu":
        env["NO_GPU_EXT"] = "1"
    env.update(settings.env)
    found = version(script)
    http = f"http://{host}:{port + 1}"
    return SidecarSpec(
        name=SIDECAR,
        what="LMCache MP server",
        argv=argv,
        env=env,
        port=port,
        ready=f"{http}/healthcheck",
        ready_timeout_s=settings.ready_timeout_s,
        version=f"lmcache {found}" if found else None,
        registered=f"{http}/status",
        registered_keys=("registered_non_cuda_instance_ids", "registered_gpu_ids"),
    )
