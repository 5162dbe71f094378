"""The Mooncake CPU guard: lets vLLM's MooncakeConnector start on a host without an accelerator.

vLLM 0.32/0.33's `MooncakeConnectorWorker.__init__` asks `torch.accelerator.current_device_index()`
for the device its transfer threads bind to, and on a CPU-only host torch raises ("Cannot access
accelerator device when none is available") before the transfer engine is even created. The
index is only handed to `current_platform.set_device`, which on vLLM's CPU platform is
`torch.cpu.set_device` (a no-op). So on such a host the guard makes that one call return 0, for
the duration of that constructor only; nothing else in the process sees a changed torch.

It is the declared intervention `mooncake_cpu_guard` (patches/interventions/), active only when
both hold:
* the variant declares it (`interventions: [mooncake_cpu_guard]`; the config check requires it
  for a Mooncake connector on a CPU host), so the launch names it in
  $CONNECTOR_TAX_INTERVENTIONS and the site hook calls install();
* torch says, at the moment the worker is built, that no accelerator is available
  (`torch.accelerator.is_available()` is False). With an accelerator the constructor runs
  untouched, whatever the variant declares.

Each time it acts it writes one line to stderr (the server log) and counts the call in its
evidence (patches/interventions: `<$CONNECTOR_TAX_EVIDENCE>/mooncake_cpu_guard.<pid>.json`, which
the phase job reads). Every output of the study discloses it with DISCLOSURE
(connector_tax.config.interventions keeps an equal copy; a test checks). Imports nothing from
connector_tax, and vLLM only through the post-import hook.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from patches.import_hook import PostImportFinder
from patches.interventions import evidence

NAME = "mooncake_cpu_guard"
MOONCAKE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"
WORKER_CLASS = "MooncakeConnectorWorker"
DISCLOSURE = "MooncakeConnector on CPU: torch.accelerator.current_device_index() returns 0"
DISCLOSURES = {NAME: DISCLOSURE}
WAITS_FOR = (MOONCAKE_MODULE,)
CHANGES = f"{MOONCAKE_MODULE}.{WORKER_CLASS}.__init__: torch.accelerator.current_device_index() returns 0 while it runs"

_FINDER: PostImportFinder | None = None


def accelerator_available(torch: Any) -> bool:
    """torch's own answer; an answer it cannot give counts as "available" (never guard blind)."""
    accelerator = getattr(torch, "accelerator", None)
    try:
        return bool(accelerator.is_available()) if accelerator is not None else True
    except Exception:  # noqa: BLE001
        return True


def _zero_index(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _fired() -> None:
    evidence(NAME).fired(f"{DISCLOSURE} (no accelerator: torch.accelerator.is_available() is False)")


def guard_worker_class(cls: type, torch: Any, on_fire: Callable[[], None] = lambda: None) -> bool:
    """Wrap `cls.__init__` (MooncakeConnectorWorker) so that, without an accelerator,
    torch.accelerator.current_device_index() returns 0 while it runs. Idempotent; returns
    whether it wrapped."""
    original = cls.__init__
    if getattr(original, "__connector_tax_guard__", False):
        return False

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if accelerator_available(torch):
            original(self, *args, **kwargs)
            return
        accelerator = torch.accelerator
        real = accelerator.current_device_index
        accelerator.current_device_index = _zero_index
        on_fire()
        try:
            original(self, *args, **kwargs)
        finally:
            accelerator.current_device_index = real

    __init__.__connector_tax_guard__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return True


def _hook(module: Any) -> None:
    """Never raises into the import of vLLM's module: a guard that cannot apply says so."""
    cls = getattr(module, WORKER_CLASS, None)
    if cls is None:
        evidence(NAME).failed(f"{MOONCAKE_MODULE} has no {WORKER_CLASS}; not applied")
        return
    try:
        import torch

        guard_worker_class(cls, torch, _fired)
        evidence(NAME).changed(CHANGES)
    except Exception as exc:  # noqa: BLE001
        evidence(NAME).failed(f"not applied: {exc!r}")


def install(name: str = NAME) -> bool:
    """Put the post-import hook in place (the site hook calls it for a variant that declares the
    guard). Idempotent."""
    global _FINDER
    if name != NAME:
        raise ValueError(f"not the Mooncake CPU guard: {name!r}")
    if _FINDER is not None:
        return True
    if MOONCAKE_MODULE in sys.modules:
        _hook(sys.modules[MOONCAKE_MODULE])
    _FINDER = PostImportFinder({MOONCAKE_MODULE: _hook})
    sys.meta_path.insert(0, _FINDER)
    return True


def uninstall() -> None:
    """Remove the import hook (tests). A class already wrapped stays wrapped."""
    global _FINDER
    if _FINDER is not None and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    _FINDER = None
