"""Imported at start-up by every Python process of a traced study (as `sitecustomize`, from a
scratch folder on PYTHONPATH); it acts only in the load generator's worker process, once its
module is imported, by wrapping five methods to log what the worker's loop did around each send:

- `s` a pass of the send timer's spin, `w` a timer wake-up (armed for, woke, the thread's
  run_delay), `b` / `f` a send's last busy-wait begun / the request written (with its target and
  run_delay), `R` / `Z` a response read / a hand-over from the main process (start, end).

The log goes to $CTAX_WORKER_TRACE_DIR/<pid>.jsonl, one line per cell (written when the next cell
is set, so never while a cell runs) and one at exit. The run_delay is the time the thread spent
runnable but not running (the guest scheduler's queue: /proc/thread-self/schedstat).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from typing import Any

TARGET = "connector_tax.loadgen.worker.process"
_log: list[tuple[Any, ...]] = []
_now = time.monotonic_ns


def _run_delay() -> int:
    with open("/proc/thread-self/schedstat", "rb") as f:
        return int(f.read().split()[1])


def _dump() -> None:
    if not _log:
        return
    path = os.path.join(os.environ["CTAX_WORKER_TRACE_DIR"], f"{os.getpid()}.jsonl")
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(_log) + "\n")
    _log.clear()


def _patch() -> None:
    from connector_tax.loadgen.worker import firetimer, process, stamped

    timer, worker, transport = firetimer.FireTimer, process.Worker, stamped.StampedTransport
    on_timer, spin, fire_top = timer._on_timer, timer._spin, timer._fire_top
    on_read, on_fire_msg, set_log = transport._on_readable, worker._on_readable, worker._set_chunk_log

    def _on_timer(self: Any) -> None:
        if self._armed_ns >= 0:
            _log.append(("w", self._armed_ns, _now(), _run_delay()))
        on_timer(self)

    def _spin(self: Any) -> None:
        _log.append(("s", _now()))
        spin(self)

    def _fire_top(self: Any) -> None:
        target = self._heap[0][0]
        _log.append(("b", _now(), target))
        fire_top(self)
        _log.append(("f", _now(), target, _run_delay()))

    def _timed(kind: str, method: Any) -> Any:
        def wrapped(self: Any) -> None:
            t0 = _now()
            method(self)
            _log.append((kind, t0, _now()))

        return wrapped

    def _set_chunk_log(self: Any, path: str | None) -> None:
        _dump()
        set_log(self, path)

    timer._on_timer, timer._spin, timer._fire_top = _on_timer, _spin, _fire_top
    transport._on_readable = _timed("R", on_read)
    worker._on_readable = _timed("Z", on_fire_msg)
    worker._set_chunk_log = _set_chunk_log
    atexit.register(_dump)


class _Finder(importlib.abc.MetaPathFinder):
    """Patch the worker once its module has run (the worker process imports it; no other does)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def run(module: Any) -> None:
            exec_module(module)
            _patch()

        spec.loader.exec_module = run  # type: ignore[method-assign]
        return spec


if os.environ.get("CTAX_WORKER_TRACE_DIR"):
    sys.meta_path.insert(0, _Finder())
