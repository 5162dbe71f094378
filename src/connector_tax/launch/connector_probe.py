"""Which connector libraries a vLLM configuration needs, and whether vLLM's Python has them.

A configuration whose connector library (Mooncake, NIXL, LMCache) is not importable in the
Python that runs `vllm serve` can only fail to start, 60-100 s into a launch on a small CPU host,
with vLLM's own error ("Mooncake is not available"). tools/connector_probe.py, run by that Python
with the launch's environment, says so without a launch: a package check (a fraction of a
second), and for an absent library vLLM's own code's error (its connector modules imported, tens
of seconds). A library that is there but cannot serve vLLM here is found the same way: Mooncake's
engine module failing to import (a missing system library, which vLLM reports only as "Mooncake is
not available"), and LMCache's own check of its worker-side connector for this host's device
(`--works`; LMCache 0.5.6 has none for CPU and vLLM would run it degraded). The pipeline's
preflight (pipeline/preflight.py) uses it; a library that is present and not known to be unusable,
or a probe that cannot tell, always means the real launch.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from connector_tax.config import Variant
from connector_tax.launch.paths import tools_dir

# Connector types named after their library (lmcache_mp: LMCache's multi-process mode, the same package).
LIBRARIES = ("mooncake", "nixl", "lmcache", "lmcache_mp")


def libraries(variant: Variant) -> list[str]:
    """The libraries a variant's connector loads, in vLLM's order (a MultiConnector's children)."""
    connector = variant.connector or {}
    found = [connector.get("type")] + [child.get("type") for child in connector.get("children") or []]
    return list(dict.fromkeys(lib for lib in found if lib in LIBRARIES))


def probe(
    python: str, env: dict[str, str], libs: list[str], errors: bool, timeout_s: float = 300, works: bool = False
) -> dict[str, dict[str, Any]]:
    """tools/connector_probe.py's answer per library; a probe that fails answers `present: None`.
    works: also ask a present library whether it can serve vLLM here (LMCache's own device check)."""
    flags = (["--errors"] if errors else []) + (["--works"] if works else [])
    argv = [python, str(tools_dir() / "connector_probe.py"), *flags, *libs]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **env}, cwd=tools_dir().parent
        )
        lines = done.stdout.strip().splitlines()
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        answer, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:200]}"
    if not isinstance(answer, dict):
        return {lib: {"present": None, "why": f"the probe failed ({why})"} for lib in libs}
    return {lib: answer.get(lib) or {"present": None, "why": "no answer"} for lib in libs}
