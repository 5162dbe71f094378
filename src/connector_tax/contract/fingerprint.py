"""Cell fingerprints: one hash of everything that can change what a cell measures.

    fingerprint = sha256(canonical JSON of {version, launch, cell, code})

* launch — the server side, shared by every cell of a launch: backend, model, the variant
  (connector, server and simulator overrides, env), the merged `server` settings, the
  backend's own section (`sim`, `vllm` or `openai`; for `sim.profile` also the profile file's
  sha256), the exact launch argv (port and run-specific paths replaced by placeholders) and the
  server's software versions;
* cell — what the load generator is asked to do: phase, label, rate, arrival process, shape,
  warm-up, duration floor, min-completed, request settings and timeouts, the `loadgen` and
  `validity` sections, the seed and the metrics sampling interval;
* code — the source of the load generator and the metrics sampler, of the simulator (backend
  sim) or of the instrumentation loaded into vLLM (backend vllm), the Python version and the
  load generator's I/O libraries.

Numbers are canonical (8 and 8.0 hash alike); mappings are key-sorted. Analysis-only settings
(saturation thresholds, baselines) are not part of it: changing them re-analyses, never
re-measures.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import platform
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from connector_tax import resources
from connector_tax.config.cells import Cell
from connector_tax.config.merge import deep_merge, merged_server
from connector_tax.config.profile import profile_path

FINGERPRINT_VERSION = 1
SHORT = 12  # hex digits shown in folder names and messages
METRICS_INTERVAL_S = 1.0  # the /metrics sampler's period, part of every cell's settings

_PKG = Path(__file__).resolve().parents[1]
_LOADGEN_LIBRARIES = ("httptools", "uvloop", "pyzmq")
_REQUEST_KEYS = ("endpoint", "prompt", "temperature", "ignore_eos", "inflight_cap", "request_timeout_s")
# What only text prompts use (how they are sized, how close they must come): hashed only for a
# study that sends text, so a token-id study keeps the fingerprints it had before they existed.
_TEXT_REQUEST_KEYS = ("tokenizer",)
_TEXT_VALIDITY_KEYS = ("max_prompt_token_error",)


def _canon(value: Any) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot fingerprint a non-finite number {value!r}")
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    return value


def canonical(value: Any) -> str:
    return json.dumps(_canon(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()


def normalize_argv(argv: list[str], port: int | None, paths: dict[str, str]) -> list[str]:
    """The launch argv with what differs between runs of the same settings replaced: the port
    (after --port) and run-specific paths ({placeholder: path})."""
    out = []
    by_path = {str(v): k for k, v in paths.items() if v}
    for i, arg in enumerate(argv):
        if port is not None and i > 0 and argv[i - 1] == "--port" and arg == str(port):
            out.append("<port>")
        else:
            out.append(by_path.get(arg, arg))
    return out


def launch_settings(
    config: Mapping[str, Any], variant: Mapping[str, Any], argv: list[str], server_versions: dict[str, Any]
) -> dict[str, Any]:
    backend = config["backend"]
    out: dict[str, Any] = {
        "backend": backend,
        "model": config["model"],
        "variant": {k: v for k, v in variant.items() if k != "description"},
        "server": merged_server(config, variant),
        "argv": list(argv),
        "server_versions": server_versions,
    }
    if backend == "sim":
        out["sim"] = deep_merge(config.get("sim") or {}, variant.get("sim") or {})
        if out["sim"].get("profile"):
            # The file's content, not its name: a re-fitted profile re-measures its cells.
            out["sim_profile_sha256"] = _file_sha(profile_path(out["sim"]["profile"]))
    elif backend == "vllm":
        out["vllm"] = _vllm_in_use(config.get("vllm") or {}, variant)
    else:
        out["openai"] = config.get("openai") or {}
    return out


# vllm sections named after the one connector type that reads them: a variant without that type
# neither hashes nor re-measures on them (and studies from before a section existed keep their
# fingerprints).
_TYPE_SECTIONS = ("lmcache_mp",)
# vllm settings of the study's plan, not of a launch: no server starts differently for them.
_NOT_LAUNCH = ("preflight_launch",)


def _vllm_in_use(section: Mapping[str, Any], variant: Mapping[str, Any]) -> dict[str, Any]:
    connector = variant.get("connector") or {}
    types = {connector.get("type")} | {c.get("type") for c in connector.get("children") or []}
    return {k: v for k, v in section.items() if k not in _NOT_LAUNCH and (k not in _TYPE_SECTIONS or k in types)}


def _file_sha(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "absent"


# Settings that hash only when set: a study that leaves one at its default (off) keeps the
# fingerprints it had before the setting existed.
_OFF_UNLESS_SET = {"rt_priority": None}


def _settings_in_use(section: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in section.items() if not (k in _OFF_UNLESS_SET and v == _OFF_UNLESS_SET[k])}


def cell_settings(config: Mapping[str, Any], cell: Cell) -> dict[str, Any]:
    workload = config["workload"]
    text = workload.get("endpoint") == "chat" or workload.get("prompt") == "text"
    request = {k: workload[k] for k in _REQUEST_KEYS + (_TEXT_REQUEST_KEYS if text else ()) if k in workload}
    validity = dict(config.get("validity") or {})
    if not text:
        for key in _TEXT_VALIDITY_KEYS:
            validity.pop(key, None)
    return {
        **cell.settings(),
        "request": request,
        "loadgen": _settings_in_use(config.get("loadgen") or {}),
        "validity": validity,
        "seed": config["seed"],
        "metrics_interval_s": METRICS_INTERVAL_S,
    }


@functools.cache
def tree_hash(*roots: Path) -> str:
    """sha256 over the relative paths and bytes of every .py file under `roots` ("absent" if
    none exists, e.g. an installed package without the checkout's patches/)."""
    digest = hashlib.sha256()
    found = False
    for root in roots:
        files = [root] if root.is_file() else sorted(root.rglob("*.py")) if root.is_dir() else []
        for path in files:
            if "__pycache__" in path.parts:
                continue
            found = True
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest() if found else "absent"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def code_versions(backend: str) -> dict[str, Any]:
    """The code that measures (and, for the simulator, the code that is measured)."""
    out: dict[str, Any] = {
        "loadgen": tree_hash(_PKG / "loadgen")[:SHORT],
        "metrics": tree_hash(_PKG / "metrics")[:SHORT],
        "python": platform.python_version(),
        "libraries": {name: _version(name) for name in _LOADGEN_LIBRARIES},
    }
    if backend == "sim":
        out["sim"] = tree_hash(_PKG / "sim")[:SHORT]
    elif backend == "vllm":
        out["instrumentation"] = tree_hash(resources.path("patches"), resources.path("tools"))[:SHORT]
    return out


def fingerprint(launch: dict[str, Any], cell: dict[str, Any], code: dict[str, Any]) -> str:
    return sha({"version": FINGERPRINT_VERSION, "launch": launch, "cell": cell, "code": code})


def short(fp: str | None) -> str:
    return (fp or "none")[:SHORT]


def differences(old: Any, new: Any, path: str = "", limit: int = 6) -> list[str]:
    """Human lines "key.path: old -> new" for what differs between two settings trees."""
    out: list[str] = []
    a, b = _canon(old), _canon(new)
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in a:
                out.append(f"{sub}: (absent) -> {json.dumps(b[key])[:60]}")
            elif key not in b:
                out.append(f"{sub}: {json.dumps(a[key])[:60]} -> (absent)")
            else:
                out.extend(differences(a[key], b[key], sub, limit))
            if len(out) >= limit:
                break
    elif isinstance(a, list) and isinstance(b, list) and a != b:
        # Element by element from the first that differs: a long argv cut at 60 characters
        # showed two identical heads.
        unequal = [j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
        i = unequal[0] if unequal else min(len(a), len(b))
        if len(a) == len(b):
            for j in range(i, len(a)):
                out.extend(differences(a[j], b[j], f"{path}[{j}]", limit))
                if len(out) >= limit:
                    break
        else:
            out.append(f"{path}[{i}:]: {json.dumps(a[i:])[:60]} -> {json.dumps(b[i:])[:60]}")
    elif a != b:
        out.append(f"{path or '(value)'}: {json.dumps(a)[:60]} -> {json.dumps(b)[:60]}")
    return out[:limit]
