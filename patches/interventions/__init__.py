"""Declared interventions, inside vLLM's processes: the site hook (patches/site/sitecustomize.py)
calls install() at every Python start-up; it loads exactly the interventions named in
$CONNECTOR_TAX_INTERVENTIONS, which the launch sets only for a variant that declares them
(config key `interventions`) and removes from every other launch's environment.

The registry with its disclosures is connector_tax.config.interventions; MODULES and each
module's DISCLOSURES are equal copies (code here imports nothing of the package; a test checks).
Each module has `install(name) -> bool` (a post-import hook on the library it changes: nothing is
imported ahead of vLLM) and `DISCLOSURES`.

What each one did in a process is its evidence (`evidence(name)`): installed or not (and why),
what it changed (the class or setting it wrapped), and how many calls it intercepted. With
$CONNECTOR_TAX_EVIDENCE (a folder the launch names among its records) it is kept in
`<folder>/<name>.<pid>.json`, rewritten whole at each change (a temporary file renamed over it:
a reader never sees half a record); the phase job reads it (connector_tax.launch.evidence). Each
intercepted call also writes one line to stderr (the server log).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
from typing import Any

INTERVENTIONS_ENV = "CONNECTOR_TAX_INTERVENTIONS"
EVIDENCE_ENV = "CONNECTOR_TAX_EVIDENCE"  # = connector_tax.config.interventions.EVIDENCE_ENV
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


def _process() -> str:
    """This process as `ps` would name it: its name and first arguments."""
    try:
        with open("/proc/self/comm", encoding="utf-8") as f:
            comm = f.read().strip()
        with open("/proc/self/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    return f"{comm}: {' '.join(a[-60:] for a in argv[:4])}"


class Evidence:
    """What intervention `name` did in this process (one per name and pid: a forked child starts its own)."""

    def __init__(self, name: str) -> None:
        self.doc: dict[str, Any] = {
            "intervention": name,
            "pid": os.getpid(),
            "process": _process(),
            "installed": False,
            "waits_for": [],  # the modules whose import it hooks
            "changed": [],  # what it wrapped, in words
            "calls": 0,  # calls it intercepted (acted on)
            "errors": [],
        }

    def installed(self, waits_for: list[str]) -> None:
        self.doc.update(installed=True, waits_for=list(waits_for))
        self._write()

    def changed(self, what: str) -> None:
        if what not in self.doc["changed"]:
            self.doc["changed"].append(what)
        self._write()

    def fired(self, disclosure: str) -> None:
        self.doc["calls"] += 1
        self.doc["last_call"] = time.time()
        sys.stderr.write(f"connector-tax: intervention {self.doc['intervention']}: {disclosure}\n")
        self._write()

    def failed(self, why: str) -> None:
        sys.stderr.write(f"connector-tax: intervention {self.doc['intervention']}: {why}\n")
        self.doc["errors"].append(why[:500])
        self._write()

    def _write(self) -> None:
        folder = os.environ.get(EVIDENCE_ENV)
        if not folder:
            return
        path = os.path.join(folder, f"{self.doc['intervention']}.{self.doc['pid']}.json")
        try:
            with _WRITING:  # two threads of a process may act at once; one temporary file
                self.doc["process"] = _process()  # vLLM renames its processes after start-up
                os.makedirs(folder, exist_ok=True)
                with open(path + ".tmp", "w", encoding="utf-8") as out:
                    json.dump(self.doc, out)
                os.replace(path + ".tmp", path)
        except OSError as exc:
            sys.stderr.write(
                f"connector-tax: cannot write intervention {self.doc['intervention']}'s evidence: {exc!r}\n"
            )


_WRITING = threading.Lock()
_EVIDENCE: dict[tuple[str, int], Evidence] = {}


def evidence(name: str) -> Evidence:
    """This process's evidence of `name` (made on first use, also in a child forked after install)."""
    key = (name, os.getpid())
    if key not in _EVIDENCE:
        _EVIDENCE[key] = Evidence(name)
    return _EVIDENCE[key]


def install(environ: dict[str, str] | None = None) -> list[str]:
    """Install every declared intervention; returns the names installed. An unknown name or one
    that cannot install is in its evidence and on stderr; it never stops vLLM from starting (the
    phase job refuses the launch when the evidence shows no intervention acted)."""
    done = []
    for name in declared(environ):
        if name not in MODULES:
            evidence(name).failed(f"unknown intervention {name!r}; not installed")
            continue
        try:
            module = importlib.import_module(MODULES[name])
            if module.install(name):
                done.append(name)
                evidence(name).installed(list(module.WAITS_FOR))
        except Exception as exc:  # noqa: BLE001
            evidence(name).failed(f"not installed: {exc!r}")
    return done
