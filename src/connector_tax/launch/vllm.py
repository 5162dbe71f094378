"""The real `vllm serve` launch of one connector configuration (backend vllm, vLLM 0.33).

Everything is built as lists and dicts from the validated config; nothing passes through a
shell. `vllm_command` is what `ctax launch-command` prints and what launch.sh reproduces.

Facts of vLLM 0.33 this relies on (checked against its source by tests/unit/test_vllm_static.py):

* `--kv-transfer-config` is parsed strictly into KVTransferConfig: unknown keys are errors,
  kv_role is required whenever kv_connector is set. A MultiConnector child is a
  KVTransferConfig too (its own kv_role, and no engine_id: vLLM passes the parent's).
* kv_connector_module_path is imported as a module and kv_connector is the class name in it,
  so a `module:Class` path is split in two.
* Mooncake reads kv_connector_extra_config.mooncake_protocol ("rdma", vLLM's default, or
  "tcp") and device_name; its producer bootstrap port is $VLLM_MOONCAKE_BOOTSTRAP_PORT. The
  transport is always named in the launch (rdma only with a device_name, else an error: vLLM
  would otherwise pick devices itself), and mooncake_transport() says which, for the run record.
  NIXL's handshake port is $VLLM_NIXL_SIDE_CHANNEL_PORT. Both get a port derived from the
  launch's HTTP port, so launches on one host never collide (see side_ports).
* LMCacheConnectorV1 is configured through LMCACHE_* environment variables; LMCacheMPConnector
  (type lmcache_mp) through kv_connector_extra_config (lmcache.mp.host/port/mp_transfer_mode),
  and needs an LMCache server beside vLLM: a sidecar of the launch (lmcache_mp.py).
* A connector without SupportsHMA makes vLLM turn the hybrid KV cache manager off by itself;
  LMCacheConnectorV1 has none, so for like-for-like every launch passes
  --disable-hybrid-kv-cache-manager (vllm.hybrid_kv_cache_manager: disabled, the default).
* vllm.device: cpu launches vLLM's CPU build (vllm_cpu.py): CPU env, no GPU flags. The installed
  vLLM's version (vllm_install.py) decides which flags exist: 0.32's CLI lacks a few of 0.33's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from connector_tax import resources
from connector_tax.config import ConfigError, StudyConfig, Variant
from connector_tax.config.interventions import EVIDENCE_ENV, INTERVENTIONS_ENV, disclosures
from connector_tax.config.vllm_rules import (
    MANAGED_FLAGS,
    check_extra_args,
    check_lmcache_chunk,
    check_server,
    connector_types,
)
from connector_tax.contract.records import STEP_LOG_ENV
from connector_tax.launch import lmcache_mp, vllm_cpu
from connector_tax.launch.paths import repo_root, tools_dir
from connector_tax.launch.verify_scripts import (
    PREFLIGHT_SCRIPTS,
    preflight_check,
    preflight_plan,
    preflight_script,
)
from connector_tax.launch.vllm_install import check_flags, installed_vllm
from connector_tax.serving.spec import LaunchSpec

# re-exported: the pipeline, tools and tests ask this module for them
__all__ = [
    "PREFLIGHT_SCRIPTS",
    "STEP_LOG_ENV",
    "preflight_check",
    "preflight_plan",
    "preflight_script",
    "repo_root",
    "tools_dir",
]

# Registered names in vLLM 0.33's KVConnectorFactory.
CONNECTOR_CLASSES = {
    "mooncake": "MooncakeConnector",
    "nixl": "NixlConnector",
    "lmcache": "LMCacheConnectorV1",
    lmcache_mp.KIND: lmcache_mp.CONNECTOR_CLASS,
    "multi": "MultiConnector",
}
NOOP_MODULE_PATH = "tools.noop_connector:NoOpConnector"

# HTTP port p; p+1 Mooncake bootstrap; p+2 NIXL side channel. The pipeline spaces ports by this.
PORTS_PER_LAUNCH = 3

HMA_FLAG = "--disable-hybrid-kv-cache-manager"

# vllm.mooncake.device_name: auto hands the choice of NIC to Mooncake: vLLM passes device_name ""
# to TransferEngine.initialize, whose topology discovery (auto_discover, on in its Python
# binding) ranks every RDMA device by PCIe distance to each buffer's memory and prefers the nearest
# for each GPU. One setting for every job, wherever it lands: a per-GPU map would put the GPU in
# the launch argv, so in every cell's fingerprint.
MOONCAKE_AUTO = "auto"

_LMCACHE_DEFAULT_ENV = {
    "LMCACHE_CHUNK_SIZE": "256",
    "LMCACHE_LOCAL_CPU": "True",
    "LMCACHE_MAX_LOCAL_CPU_SIZE": "5.0",
}


# --------------------------------------------------------------------------- settings


def hma_policy(study: StudyConfig) -> str:
    """How the hybrid KV cache manager is set in every launch of this study, for the manifest:
    "disabled" (--disable-hybrid-kv-cache-manager on every launch, plain included: like for
    like) or "auto" (vLLM decides per launch: it turns HMA off for connectors without
    SupportsHMA, e.g. LMCacheConnectorV1, so configurations are NOT like for like)."""
    return str(study.vllm.get("hybrid_kv_cache_manager", "disabled"))


def step_timing_enabled(study: StudyConfig) -> bool:
    """Whether launches load patches/ (the step log is written only when a path is given)."""
    return bool(study.vllm.get("step_timing", True))


def _variant_where(study: StudyConfig, variant: Variant) -> str:
    """Where the config declares `variant`, for an error that names the key."""
    for i, v in enumerate(study.variants):
        if v.name == variant.name:
            return f"variants[{i}]"
    return f"variants[{variant.name!r}]"


def _check_port(port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise ValueError(f"--port: expected an integer, got {port!r}")
    top = 65535 - (PORTS_PER_LAUNCH - 1)
    if not 1 <= port <= top:
        raise ValueError(f"--port: {port} is out of range 1-{top} (the launch also uses port+1 and port+2)")
    return port


def side_ports(port: int) -> dict[str, int]:
    """The ports a launch on HTTP port `port` may bind besides it."""
    _check_port(port)
    return {"http": port, "mooncake_bootstrap": port + 1, "nixl_side_channel": port + 2}


# --------------------------------------------------------------------------- kv-transfer-config


def _one_connector(
    conn: Mapping[str, Any],
    settings: Mapping[str, Any],
    where: str,
    child: bool,
    lmcache: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """lmcache: the kv_connector_extra_config that points an lmcache_mp connector at its server."""
    kind = conn["type"]
    extra = dict(conn.get("extra_config") or {})
    out: dict[str, Any]
    if kind in ("noop", "custom"):
        module_path = NOOP_MODULE_PATH if kind == "noop" else conn["module_path"]
        module, _, cls = module_path.partition(":")
        out = {"kv_connector": cls, "kv_connector_module_path": module}
    elif kind == "multi":
        if child:
            raise ConfigError(f"{where}.type", "multi cannot be nested inside multi")
        if "connectors" in extra:
            raise ConfigError(f"{where}.extra_config.connectors", "is built from children; remove it")
        children = [
            _one_connector(c, settings, f"{where}.children[{j}]", child=True, lmcache=lmcache)
            for j, c in enumerate(conn["children"])
        ]
        extra = {"connectors": children, **extra}
        out = {"kv_connector": CONNECTOR_CLASSES[kind]}
    else:
        out = {"kv_connector": CONNECTOR_CLASSES[kind]}
        if kind == "mooncake":
            extra = {**_mooncake_defaults(settings), **extra}
        elif kind == lmcache_mp.KIND:
            extra = {**(lmcache or {}), **extra}
    out["kv_role"] = conn["role"]
    if extra:
        out["kv_connector_extra_config"] = extra
    return out


def _mooncake_defaults(settings: Mapping[str, Any]) -> dict[str, str]:
    """The transport every Mooncake connector of the study uses: named, never vLLM's default."""
    mooncake = settings.get("mooncake") or {}
    protocol = mooncake.get("protocol", "rdma")
    if protocol == "rdma" and not mooncake.get("device_name"):
        raise ConfigError(
            "vllm.mooncake.device_name",
            "Mooncake over rdma (vllm.mooncake.protocol, rdma by default) needs the RDMA "
            "device, e.g. mlx5_0; on a host without RDMA set vllm.mooncake.protocol: tcp",
        )
    out = {"mooncake_protocol": protocol}
    if mooncake.get("device_name") and mooncake["device_name"] != MOONCAKE_AUTO:
        out["device_name"] = mooncake["device_name"]
    return out


def mooncake_transport(study: StudyConfig, variant: Variant) -> str | None:
    """How this variant's Mooncake connector moves KV, for the run record: "tcp", "rdma
    (mlx5_0)", or None when it has no Mooncake connector."""
    conn = variant.connector
    if conn is None or "mooncake" not in connector_types(conn):
        return None
    defaults = _mooncake_defaults(study.vllm)
    for c in [conn, *conn.get("children", [])]:
        if c["type"] == "mooncake":
            defaults.update(
                {k: v for k, v in (c.get("extra_config") or {}).items() if k in ("mooncake_protocol", "device_name")}
            )
    device = defaults.get("device_name")
    if defaults["mooncake_protocol"] == "rdma" and not device:
        device = "auto: Mooncake's topology discovery, the NIC nearest each GPU"
    return defaults["mooncake_protocol"] + (f" ({device})" if device else "")


def workarounds(variant: Variant) -> list[str]:
    """What the launch of `variant` changes in vLLM's behaviour (its declared interventions, in
    the words every output shows)."""
    return disclosures(variant.raw)


def _connect_host(host: str) -> str:
    """Where vLLM reaches a sidecar bound to `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "*") else host


def kv_transfer_config(
    study: StudyConfig, variant: Variant, lmcache_port: int = lmcache_mp.PLANNED_PORT
) -> dict[str, Any] | None:
    """The --kv-transfer-config object of a variant; None for plain vLLM (no connector).
    lmcache_port: where its LMCache MP server listens (lmcache_mp connectors)."""
    connector = variant.connector
    if not connector:
        return None
    where = f"{_variant_where(study, variant)}.connector"
    host = _connect_host(str(study.server_of(variant)["host"]))
    lmcache = lmcache_mp.connector(study, host, lmcache_port) if lmcache_mp.uses(variant) else None
    return _one_connector(connector, study.vllm, where, child=False, lmcache=lmcache)


def sidecar_ports(variant: Variant, reserved: dict[str, int] | None) -> dict[str, int]:
    """{sidecar name: its first port}: those reserved for this launch, else the planned ones."""
    needs = [lmcache_mp.SIDECAR] if lmcache_mp.uses(variant) else []
    return {name: (reserved or {}).get(name, lmcache_mp.PLANNED_PORT) for name in needs}


# --------------------------------------------------------------------------- argv and env


def vllm_argv(study: StudyConfig, variant: Variant, port: int, sidecars: dict[str, int] | None = None) -> list[str]:
    """The exact `vllm serve` command line of a variant on `port` (its sidecars on `sidecars`:
    {name: port}, the planned ports where not given)."""
    _check_port(port)
    server = study.server_of(variant)
    where = _variant_where(study, variant)
    check_extra_args(list(study.server.get("extra_args") or []), "server.extra_args")
    check_extra_args(list(variant.server.get("extra_args") or []), f"{where}.server.extra_args")
    executable = study.vllm_executable
    on_cpu = study.device == "cpu"
    if on_cpu:
        check_server(server, "server")
    if lmcache_mp.uses(variant):
        check_lmcache_chunk(study.raw, server, "server")
    model = study.model
    argv = [
        executable,
        "serve",
        model_path(study),
        "--host",
        str(server["host"]),
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(server["tensor_parallel_size"]),
        "--max-model-len",
        str(server["max_model_len"]),
        "--enable-prefix-caching" if server["enable_prefix_caching"] else "--no-enable-prefix-caching",
        "--enable-chunked-prefill" if server["enable_chunked_prefill"] else "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(server["max_num_batched_tokens"]),
        "--max-num-seqs",
        str(server["max_num_seqs"]),
    ]
    if not on_cpu:  # the CPU build sizes its KV cache by VLLM_CPU_KVCACHE_SPACE instead
        argv += ["--gpu-memory-utilization", str(server["gpu_memory_utilization"])]
    if server.get("block_size") is not None:
        argv += ["--block-size", str(server["block_size"])]
    if server.get("enforce_eager") and "--enforce-eager" not in server["extra_args"]:
        argv.append("--enforce-eager")  # a flag without a value: a repeat would be harmless
    if model.load_format:
        argv += ["--load-format", model.load_format]
    if model.served_name:
        argv += ["--served-model-name", model.served_name]
    if hma_policy(study) == "disabled":
        argv.append(HMA_FLAG)
    ktc = kv_transfer_config(study, variant, sidecar_ports(variant, sidecars).get(lmcache_mp.SIDECAR, 0))
    if ktc is not None:
        argv += ["--kv-transfer-config", json.dumps(ktc, separators=(",", ":"), sort_keys=True)]
    argv += server["extra_args"]
    try:
        installed = installed_vllm(executable)
    except ValueError:
        installed = None  # not installed here: the argv is for another host (vllm_version)
    if installed is not None:
        check_flags(argv, installed, dict(MANAGED_FLAGS))
    return argv


def model_path(study: StudyConfig) -> str:
    """model.name as `vllm serve` gets it: a hub id as written; with model.local a folder,
    relative to the repository root unless absolute, that must exist (checked here, before any
    launch: a missing dummy-weight model is a one-line error, not a server that dies)."""
    model = study.model
    if not model.local:
        return model.name
    path = Path(model.name)
    if not path.is_absolute():
        path = resources.workdir() / path
    if not (path / "config.json").is_file():
        raise ConfigError(
            "model.name",
            f"{path}: no model folder (config.json) there; make the tiny one with "
            f"`python tools/tiny_model.py {model.name}` (in the vLLM CPU environment)",
        )
    return str(path)


def vllm_env(
    study: StudyConfig, variant: Variant, port: int, step_log: str | None = None, evidence: str | None = None
) -> dict[str, str]:
    """The environment a launch sets (on top of the caller's, less what LaunchSpec.unset removes:
    the instrumentation's variables reach the server only from here). evidence: the folder where
    a declaring variant's interventions write what they did (none: stderr only)."""
    ports = side_ports(port)
    settings = study.vllm
    root = repo_root()
    paths = [str(root)]
    kinds = connector_types(variant.connector)
    interventions = list(variant.interventions)
    if step_timing_enabled(study) or interventions:  # the site hook loads both
        paths.append(str(root / "patches" / "site"))
    # Prepended, not replacing: what the caller's environment needs on the path stays there
    # (after ours, so our sitecustomize is the one Python imports; it runs the shadowed one).
    caller = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    env = {"PYTHONPATH": os.pathsep.join(paths + caller)}
    if study.device == "cpu":
        env.update(vllm_cpu.cpu_env(study, resources.workdir()))
    if interventions:  # never set otherwise: the site hook loads nothing a variant did not declare
        env[INTERVENTIONS_ENV] = ",".join(interventions)
        if evidence:
            env[EVIDENCE_ENV] = os.path.abspath(evidence)
    if "mooncake" in kinds:
        env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(ports["mooncake_bootstrap"])
    if "nixl" in kinds:
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ports["nixl_side_channel"])
    if "lmcache" in kinds:
        env.update((settings.get("lmcache") or {}).get("env", _LMCACHE_DEFAULT_ENV))
    if step_log and step_timing_enabled(study):
        env[STEP_LOG_ENV] = os.path.abspath(step_log)
    env.update(settings.get("env") or {})
    env.update(variant.env)
    return env


def vllm_command(
    study: StudyConfig,
    variant: Variant,
    port: int,
    step_log: str | None = None,
    sidecars: dict[str, int] | None = None,
    evidence: str | None = None,
) -> LaunchSpec:
    """The launch of one variant: `vllm serve` argv, its environment and its sidecars (an LMCache
    MP server for lmcache_mp) on the ports `sidecars` reserved for them (raises ConfigError or
    ValueError, one line naming the key or argument, on bad input). evidence: where its declared
    interventions write what they did."""
    ports = sidecar_ports(variant, sidecars)
    argv = vllm_argv(study, variant, port, ports)
    host = str(study.server_of(variant)["host"])
    specs = tuple(lmcache_mp.server(study, host, p) for name, p in ports.items() if name == lmcache_mp.SIDECAR)
    return LaunchSpec(argv=argv, env=vllm_env(study, variant, port, step_log, evidence), sidecars=specs)
