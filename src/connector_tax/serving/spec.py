"""What it takes to start one server: an argv list (never a shell string) and its environment,
and the sidecars it needs beside it (processes started before it and stopped after it)."""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from connector_tax.config.interventions import EVIDENCE_ENV, INTERVENTIONS_ENV
from connector_tax.contract.records import STEP_LOG_ENV

# What Snakemake exports to every job's shell: the job's granted threads (1 under `--cores 1`, 6 for
# a GPU phase job under `--cores 48`). A server that inherited them would serve with a thread
# count that depends on the command line: vLLM leaves torch's threads at an OMP_NUM_THREADS it
# finds set (and warns above 1: spin-waiting OpenMP workers steal the step's cycles), and sets its
# own (1 for serving) when there is none. A launch drops them, as `vllm serve` typed in a shell
# would run; a study that wants one sets it in vllm.env or a variant's env, where it is recorded.
SCHEDULER_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


# connector-tax's own instrumentation (patches/): which interventions load, where the step log and
# the interventions' evidence go. The launch sets them from the study (a variant's `interventions`,
# vllm.step_timing) or they are absent: one exported in the caller's shell would load an
# intervention, or write records, that no output of the study discloses.
INSTRUMENTATION_VARS = (INTERVENTIONS_ENV, STEP_LOG_ENV, EVIDENCE_ENV)
# What every launch removes from the caller's environment unless it sets the variable itself.
CALLERS_DROPPED = SCHEDULER_THREAD_VARS + INSTRUMENTATION_VARS


def launch_environ(env: dict[str, str], unset: tuple[str, ...] = CALLERS_DROPPED) -> dict[str, str]:
    """A launched process's whole environment: the caller's less `unset`, then what the launch sets."""
    return {**{k: v for k, v in os.environ.items() if k not in unset}, **env}


@dataclass(frozen=True)
class SidecarSpec:
    """A process a variant's server needs beside it: an LMCache multi-process server (what
    `lmcache_mp` connects to), a Mooncake master, a bootstrap registry. Declared by the launch
    code (launch/), started and watched by serving/sidecar.py."""

    name: str  # one word, unique in a launch: its logs are sidecar_<name>_std{out,err}.log
    what: str  # in words, for every output: "LMCache MP server"
    argv: list[str]
    env: dict[str, str]
    port: int  # the first of the ports it binds, reserved with serving.server_process.free_port
    # "http://host:port/path" (ready when it answers 200) or "tcp://host:port" (when it accepts)
    ready: str
    ready_timeout_s: float
    version: str | None = None  # "lmcache 0.5.6", from the Python that runs it
    # An HTTP URL answering JSON in which one of `registered_keys` lists the server's workers once
    # they have connected (LMCache's /status): the launch checks its connector registered.
    registered: str | None = None
    registered_keys: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """ "LMCache MP server (lmcache 0.5.6)": what it is, with its version where known."""
        return f"{self.what} ({self.version})" if self.version else self.what

    def record(self) -> dict[str, Any]:
        """What run.json and the manifest say of it."""
        out = {**asdict(self), "label": self.label}
        out["registered_keys"] = list(self.registered_keys)
        return out


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    # Only the variables the launch sets or overrides; the caller's environment is inherited.
    env: dict[str, str] = field(default_factory=dict)
    # External servers (backend openai) are not launched: url says where they are.
    url: str | None = None
    # Started in this order before the server, each ready before the next; stopped after it.
    sidecars: tuple[SidecarSpec, ...] = ()
    # Removed from the caller's environment unless `env` sets them (launch.sh unsets them).
    unset: tuple[str, ...] = CALLERS_DROPPED

    def environ(self) -> dict[str, str]:
        """The launched process's whole environment."""
        return launch_environ(self.env, self.unset)

    def unset_line(self) -> list[str]:
        """launch.sh's `unset` of what the launch removes from the caller's environment (no line: nothing)."""
        dropped = [name for name in self.unset if name not in self.env]
        if not dropped:
            return []
        return [f"unset {' '.join(dropped)}  # the caller's: the launch sets these, or the server runs without"]

    def script(self) -> str:
        """A runnable launch.sh that reproduces this launch, every value shlex-quoted."""
        if not self.argv:
            return f"#!/usr/bin/env bash\nset -euo pipefail\n# external server, not launched: {self.url}\n"
        needs = []
        for s in self.sidecars:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(s.env.items()))
            needs += [f"# needs sidecar {s.name} ({s.label}) running first, ready at {s.ready}:"]
            needs += [f"#   {env + ' ' if env else ''}{shlex.join(s.argv)}"]
        lines = ["#!/usr/bin/env bash", "set -euo pipefail", *needs, *self.unset_line()]
        lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(self.env.items())]
        lines.append("exec " + " ".join(shlex.quote(a) for a in self.argv))
        return "\n".join(lines) + "\n"
