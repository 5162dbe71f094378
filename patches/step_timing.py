"""Step-timing instrumentation that runs inside vLLM processes (API server, engine core, workers).

Loaded by patches/site/sitecustomize.py when $CONNECTOR_TAX_STEP_LOG is set; leaves the
installed vLLM untouched. install() puts a post-import hook in place (import_hook.py): when
vLLM imports `vllm.v1.engine.core` or the KV connector factory, their classes are wrapped
(never their source files), and from then on

* every engine step (EngineCore.step_fn: `step` or `step_with_batch_queue`) writes one engine
  record: `step_duration_us` = Scheduler.schedule() entry to exit (the study's definition),
  `build_meta_us` = build_connector_meta inside it, `engine_step_us` = the whole step_fn call,
  the prefill/decode split of what schedule() returned and the request counts as /metrics
  defines them (engine_hooks.py);
* every worker-connector step (bind_connector_metadata .. clear_connector_metadata) writes one
  worker record with start_load_kv, wait_for_layer_load, save_kv_layer, wait_for_save and
  get_finished times, in the process that holds the worker connector (connector_hooks.py).

Files, for CONNECTOR_TAX_STEP_LOG=<base>.jsonl (one set per process, never shared; recorder.py):
  <base>.engine.<pid>.jsonl    engine records
  <base>.worker.<pid>.jsonl    worker records
  <base>.targets.<pid>.json    which targets this process wrapped (availability)

Nothing here imports connector_tax or (at import time) vLLM. Every failure is recorded in the
targets file and never raised into vLLM: a target that cannot be wrapped stays unwrapped and
the manifest reports step_timing_available=false. This module is the public face: the names
below are what sitecustomize, the tests and the benchmark use.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from patches.connector_hooks import hook_factory_class, wrap_connector
from patches.engine_hooks import hook_engine_core_class, hook_engine_instance, request_counts
from patches.import_hook import PostImportFinder
from patches.recorder import StepRecorder, records_path, targets_path
from patches.targets import (
    ENGINE_FIELDS,
    ENGINE_INSTANCES,
    ENGINE_MODULE,
    FACTORY_MODULE,
    RECORD_FIELDS,
    SCHEDULER_CONNECTOR_INSTANCES,
    SCHEMA_VERSION,
    STEP_LOG_ENV,
    TARGETS,
    WORKER_CONNECTOR_INSTANCES,
    WORKER_FIELDS,
    WORKER_HOOKS,
)

__all__ = [
    "ENGINE_FIELDS",
    "ENGINE_INSTANCES",
    "ENGINE_MODULE",
    "FACTORY_MODULE",
    "RECORD_FIELDS",
    "SCHEDULER_CONNECTOR_INSTANCES",
    "SCHEMA_VERSION",
    "STEP_LOG_ENV",
    "TARGETS",
    "WORKER_CONNECTOR_INSTANCES",
    "WORKER_FIELDS",
    "WORKER_HOOKS",
    "StepRecorder",
    "hook_engine_core_class",
    "hook_engine_instance",
    "hook_factory_class",
    "install",
    "records_path",
    "request_counts",
    "targets_path",
    "uninstall",
    "wrap_connector",
]

_RECORDER: StepRecorder | None = None
_FINDER: PostImportFinder | None = None


def _guarded(name: str, fn: Callable[[Any], None], rec: StepRecorder) -> Callable[[Any], None]:
    def hook(module: Any) -> None:
        try:
            fn(module)
        except Exception as exc:  # noqa: BLE001
            rec.note_error(f"hook for {name} failed: {exc!r}")

    return hook


def install(step_log: str | None = None) -> StepRecorder | None:
    """Install the hooks in this process; a no-op without a step log path. Idempotent."""
    global _RECORDER, _FINDER
    path = step_log or os.environ.get(STEP_LOG_ENV)
    if not path:
        return None
    if _RECORDER is not None:
        return _RECORDER
    rec = _RECORDER = StepRecorder(path)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=rec.after_fork)

    def engine_hook(module: Any) -> None:
        cls = getattr(module, "EngineCore", None)
        if cls is None:
            rec.note_target(f"{ENGINE_MODULE}:EngineCore.__init__", "absent: no EngineCore")
        else:
            hook_engine_core_class(cls, rec, wrap_connector)

    def factory_hook(module: Any) -> None:
        cls = getattr(module, "KVConnectorFactory", None)
        if cls is None:
            rec.note_target(
                f"{FACTORY_MODULE}:KVConnectorFactory.create_connector",
                "absent: no KVConnectorFactory",
            )
        else:
            hook_factory_class(cls, rec)

    hooks = {
        ENGINE_MODULE: _guarded(ENGINE_MODULE, engine_hook, rec),
        FACTORY_MODULE: _guarded(FACTORY_MODULE, factory_hook, rec),
    }
    # Modules imported before install (tests, or a late install) are hooked at once.
    for name, hook in list(hooks.items()):
        if name in sys.modules:
            hook(sys.modules[name])
    _FINDER = PostImportFinder(hooks)
    sys.meta_path.insert(0, _FINDER)
    return rec


def uninstall() -> None:
    """Remove the import hook (tests). Classes already wrapped stay wrapped."""
    global _RECORDER, _FINDER
    if _FINDER is not None and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    if _RECORDER is not None:
        _RECORDER.close()
    _RECORDER = None
    _FINDER = None
