"""Declared interventions, inside vLLM's processes: the site hook (patches/site/sitecustomize.py)
calls install() at every Python start-up; it loads exactly the interventions named in
$CONNECTOR_TAX_INTERVENTIONS, which the launch sets only for a variant that declares them
(config key `interventions`), and nothing otherwise.

The registry with its disclosures is connector_tax.config.interventions; MODULES and each
module's DISCLOSURES are equal copies (code here imports nothing of the package; a test checks).
Each module has `install(name) -> bool` (a post-import hook on the library it changes: nothing is
imported ahead of vLLM) and `DISCLOSURES`. When an intervention acts it writes one line to stderr
(the server log) and, with a step log, `<base>.intervention.<name>.<pid>.json` (the evidence the
tests and the report read).
"""

from __future__ import annotations

import importlib
import json
import os
import sys

INTERVENTIONS_ENV = "CONNECTOR_TAX_INTERVENTIONS"
_STEP_LOG_ENV = "CONNECTOR_TAX_STEP_LOG"  # = patches.targets.STEP_LOG_ENV
MODULES = {
    "mooncake_cpu_guard": "patches.cpu_guard",
    "nixl_progress_off": "patches.interventions.nixl_progress",
    "nixl_progress_delay_1ms": "patches.interventions.nixl_progress",
    "nixl_kv_core_off_compute": "patches.interventions.nixl_reservation",
    "nixl_agent_off_compute": "patches.interventions.nixl_reservation",
}


def declared(environ: dict[str, str] | None = None) -> list[str]:
    text = (os.environ if environ is None else environ).get(INTERVENTIONS_ENV) or ""
    return [name for name in text.split(",") if name]


def install(environ: dict[str, str] | None = None) -> list[str]:
    """Install every declared intervention; returns the names installed. An unknown name or one
    that cannot install says so on stderr and never stops vLLM from starting."""
    done = []
    for name in declared(environ):
        if name not in MODULES:
            sys.stderr.write(f"connector-tax: unknown intervention {name!r}; not installed\n")
            continue
        try:
            if importlib.import_module(MODULES[name]).install(name):
                done.append(name)
        except Exception as exc:  # noqa: BLE001
            sys.stderr.write(f"connector-tax: intervention {name} not installed: {exc!r}\n")
    return done


def record(name: str, disclosure: str, detail: dict | None = None) -> None:
    """The evidence that `name` acted in this process: a stderr line and, with a step log, a file."""
    sys.stderr.write(f"connector-tax: intervention {name}: {disclosure}\n")
    step_log = os.environ.get(_STEP_LOG_ENV)
    if not step_log:
        return
    base = step_log[: -len(".jsonl")] if step_log.endswith(".jsonl") else step_log
    doc = {"intervention": name, "disclosure": disclosure, "pid": os.getpid(), **(detail or {})}
    try:
        os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
        with open(f"{base}.intervention.{name}.{os.getpid()}.json", "w", encoding="utf-8") as out:
            json.dump(doc, out)
    except OSError as exc:
        sys.stderr.write(f"connector-tax: cannot write intervention {name}'s record: {exc!r}\n")
