"""What a reviewer needs to reproduce a run: environment, versions, GPU, git SHA."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("vllm", "mooncake-transfer-engine", "nixl", "lmcache", "torch", "connector-tax")


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def git_sha() -> str | None:
    return _run(["git", "-C", str(REPO), "rev-parse", "HEAD"])


def gpu_ids(backend: str) -> str:
    if backend == "sim":
        return "simulated"
    if shutil.which("nvidia-smi") is None:
        return "unknown (no nvidia-smi)"
    return _run(["nvidia-smi", "-L"]) or "unknown (nvidia-smi failed)"


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def freeze() -> str:
    """pip freeze's content, read from package metadata (a pip subprocess costs seconds)."""
    dists = {(d.metadata["Name"] or "?"): d.version for d in metadata.distributions()}
    return "\n".join(f"{name}=={version}" for name, version in sorted(dists.items(), key=lambda kv: kv[0].lower()))


def env_text(backend: str) -> str:
    lines = [
        f"python: {sys.version.split()[0]}",
        f"connector-tax git SHA: {git_sha() or 'unknown'}",
        *(f"{name}: {version or 'not installed'}" for name, version in versions().items()),
        f"GPU: {gpu_ids(backend)}",
        "",
        "# installed packages (pip freeze)",
        freeze(),
    ]
    return "\n".join(lines) + "\n"
