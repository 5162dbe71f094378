"""Can this vLLM's Python import a KV connector's library, and if not, what does vLLM say?

Run by the vLLM environment's own interpreter, with the environment a launch of it gets:

    python tools/connector_probe.py [--errors | --works] LIBRARY...   (mooncake, nixl, lmcache, lmcache_mp)

prints one JSON object, one entry per library:

    {"present": true,  "packages": [...]}   a package vLLM imports for it is importable: launch for real
    {"present": false, "packages": [...],   none is; with --errors, vLLM's own code is run the way its
     "error": "...", "raised_by": "..."}    worker runs it, and `error` is what it raised
    {"present": false, "packages": [...],   the package is there but the module vLLM imports from it
     "error": "...", "raised_by": "import   fails (Mooncake: `mooncake.engine` needs the system library
     mooncake.engine"}                      libibverbs.so.1); vLLM hides that as "Mooncake is not available"
    {"present": null,  "why": "..."}        could not tell (another vLLM version, another outcome)

With --works, a library that is present is also asked whether it can serve vLLM's worker on this
host, by the library's own code, without a launch: LMCache 0.5.6 picks its worker-side connector
by torch's device type (`lmcache.v1.gpu_connector.CreateGPUConnector`, with the config vLLM's
adapter builds from the LMCACHE_* environment) and has none for "cpu"; vLLM's LMCacheConnectorV1
then starts anyway and runs "degraded (recompute)" (every new request waits out a lookup timeout),
so the answer is {"present": true, "works": false, "error": "No supported cpu connector found.",
"raised_by": ..., "consequence": ...}. Mooncake and NIXL have no such check here (their launch is the
test): no "works" key.

Without --errors and --works nothing of vLLM is imported (a fraction of a second; Mooncake's engine
module, a C extension, is imported). With --errors, vLLM's connector modules are imported (tens of
seconds on a small CPU host) and, for an absent library only, vLLM's worker class is called: its
constructor checks the library first (Mooncake, NIXL), before it reads its arguments, so no engine,
model or port is touched. LMCache's connector imports the library inside its constructor, after a
full config is needed, so the probe makes the same import vLLM makes there. Anything unexpected is
`present: null`, never a guess.

Standard library only (and vLLM, in --errors mode): this file is vLLM's side, like patches/.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from typing import Any

_V1 = "vllm.distributed.kv_transfer.kv_connector.v1"

# The top-level packages vLLM imports for each library (NIXL's is nixl_rocm on ROCm).
# lmcache_mp (LMCache's multi-process mode) needs the same package: vLLM's LMCacheMPConnector imports it.
PACKAGES = {
    "mooncake": ("mooncake",),
    "nixl": ("nixl", "nixl_rocm"),
    "lmcache": ("lmcache",),
    "lmcache_mp": ("lmcache",),
}
# Modules vLLM imports from a present package that can fail on their own and are quick to import:
# vLLM's `except ImportError` turns their failure into "Mooncake is not available".
IMPORTED = {"mooncake": "mooncake.engine"}


def _found(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _worker_error(module: str, sentinel_module: str, sentinel: str, worker: str) -> dict[str, Any]:
    """Call vLLM's worker class when vLLM's own sentinel says the library is absent."""
    if getattr(importlib.import_module(sentinel_module), sentinel) is not None:
        return {"present": True, "why": f"{sentinel_module}.{sentinel} is set: vLLM imported the library"}
    cls = getattr(importlib.import_module(module), worker)
    try:
        cls(None, "connector-tax-probe", None)
    except RuntimeError as exc:
        return {"present": False, "error": str(exc), "raised_by": f"{cls.__module__}.{cls.__qualname__}"}
    except Exception as exc:  # noqa: BLE001 - not the check we expected: let a launch tell
        return {"present": None, "why": f"{cls.__qualname__} raised {type(exc).__name__}: {exc}"}
    return {"present": None, "why": f"{cls.__qualname__} did not refuse to start"}


def _lmcache_error() -> dict[str, Any]:
    importlib.import_module(f"{_V1}.lmcache_connector")  # the connector vLLM would load
    target = "lmcache.integration.vllm.vllm_v1_adapter"  # what LMCacheConnectorV1.__init__ imports
    try:
        importlib.import_module(target)
    except ImportError as exc:
        return {"present": False, "error": str(exc), "raised_by": f"import {target} ({_V1}.lmcache_connector)"}
    return {"present": True, "why": f"{target} imports"}


def _lmcache_mp_error() -> dict[str, Any]:
    """vLLM's LMCacheMPConnector module imports lmcache as it loads: its error is vLLM's."""
    target = f"{_V1}.lmcache_mp_connector"
    try:
        importlib.import_module(target)
    except ImportError as exc:
        return {"present": False, "error": str(exc), "raised_by": f"import {target}"}
    return {"present": True, "why": f"{target} imports"}


def _errors(library: str) -> dict[str, Any]:
    if library == "mooncake":
        module = f"{_V1}.mooncake.mooncake_connector"
        return _worker_error(module, module, "TransferEngine", "MooncakeConnectorWorker")
    if library == "nixl":
        return _worker_error(f"{_V1}.nixl.worker", "vllm.distributed.nixl_utils", "NixlWrapper", "NixlConnectorWorker")
    if library == "lmcache_mp":
        return _lmcache_mp_error()
    return _lmcache_error()


def _lmcache_works() -> dict[str, Any]:
    """LMCache's own choice of its worker-side connector for this host's torch device."""
    import types
    from importlib import metadata

    import lmcache
    from lmcache.integration.vllm.utils import lmcache_get_or_create_config
    from lmcache.utils import EngineType
    from lmcache.v1.gpu_connector import CreateGPUConnector

    device = getattr(lmcache, "torch_device_type", "?")
    by = f"lmcache.v1.gpu_connector.CreateGPUConnector (LMCache {metadata.version('lmcache')}, torch device {device!r})"
    try:
        # vLLM's worker passes the engine's metadata; only local_worker_id is read before the
        # device type decides (a device with a connector would need the rest: then the launch decides).
        CreateGPUConnector(lmcache_get_or_create_config(), types.SimpleNamespace(local_worker_id=0), EngineType.VLLM)
    except RuntimeError as exc:
        return {
            "works": False,
            "error": str(exc),
            "raised_by": by,
            "consequence": "vLLM's LMCacheConnectorV1 starts without it and runs degraded (recompute): "
            "LMCache's 'System will operate in degraded mode (recompute)'",
        }
    except Exception as exc:  # noqa: BLE001 - a connector exists for this device and wants real metadata
        return {"works": None, "why": f"CreateGPUConnector got past the device check ({type(exc).__name__})"}
    return {"works": True}


def probe(library: str, errors: bool, works: bool = False) -> dict[str, Any]:
    packages = PACKAGES[library]
    if any(_found(p) for p in packages):
        module = IMPORTED.get(library)
        if module is not None:
            try:
                importlib.import_module(module)
            except ImportError as exc:  # e.g. libibverbs.so.1 missing: the true reason vLLM hides
                return {
                    "present": False,
                    "packages": list(packages),
                    "error": str(exc),
                    "raised_by": f"import {module}",
                }
        out: dict[str, Any] = {"present": True, "packages": list(packages)}
        if works and library == "lmcache":
            try:
                out.update(_lmcache_works())
            except Exception as exc:  # noqa: BLE001 - another LMCache layout: the launch decides
                out.update(works=None, why=f"{type(exc).__name__}: {exc}")
        return out
    out = {"present": False, "packages": list(packages)}
    if errors:
        try:
            out.update(_errors(library))
        except Exception as exc:  # noqa: BLE001 - e.g. another vLLM's module layout
            out.update(present=None, why=f"{type(exc).__name__}: {exc}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="connector_probe.py")
    parser.add_argument("--errors", action="store_true", help="ask vLLM's own code for its error")
    parser.add_argument("--works", action="store_true", help="ask a present library whether it can serve here")
    parser.add_argument("libraries", nargs="+", choices=sorted(PACKAGES))
    args = parser.parse_args(argv)
    # vLLM logs to stdout: its lines go to stderr, and stdout carries the one JSON line alone.
    out, sys.stdout = sys.stdout, sys.stderr
    try:
        result = {lib: probe(lib, args.errors, args.works) for lib in args.libraries}
    finally:
        sys.stdout = out
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
