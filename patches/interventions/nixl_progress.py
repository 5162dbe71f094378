"""NIXL's UCX progress thread, set as a NIXL user could set it if vLLM exposed the setting.

What it changes (nixl 1.5.1, read in the installed `nixl_cu12/_api.py`): `nixl_agent.__init__`
builds the C++ agent's config with `useProgThread = nixl_conf.enable_pthread` and a hard-coded
`pthrDelay = 0`; `nixl_agent_config(enable_prog_thread=True, ...)` has no delay parameter. In
NIXL's UCX backend the shared progress thread polls its workers' event fds with a timeout of
`ceil(pthrDelay us to ms)`: 0 is `poll(..., 0)`, a busy loop; any delay of 1 us or more is at least
a 1 ms poll (src/plugins/ucx/ucx_backend.cpp, nixlUcxSharedThread). vLLM 0.32's NIXL worker builds
`nixl_agent_config(backends=..., capture_telemetry=True)` or `nixl_agent_config(num_threads=...,
capture_telemetry=True)`: no setting of vLLM's reaches either knob.

* `nixl_progress_off`: every `nixl_agent_config` is built with `enable_prog_thread=False`; UCX is
  then progressed by the agent's own calls (transfers, notifications);
* `nixl_progress_delay_1ms`: every agent's C++ config gets `pthrDelay = 1000` (us) before the agent
  is made, the thread kept.

Both hook the NIXL build's own module (`nixl_cu12._api`, or the CUDA 13 / ROCm one) right after it
is imported, and act on every agent the process makes (vLLM makes one per worker). Imports
nothing from connector_tax, and NIXL only through the post-import hook.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from patches.import_hook import PostImportFinder
from patches.interventions import evidence

OFF = "nixl_progress_off"
DELAY = "nixl_progress_delay_1ms"
DELAY_US = 1000
DISCLOSURES = {
    OFF: "NIXL agent without its progress thread (nixl_agent_config(enable_prog_thread=False)): UCX is "
    "progressed by the agent's own calls",
    DELAY: "NIXL agent's progress thread polls with a 1 ms timeout (nixlAgentConfig.pthrDelay = 1000 us, not "
    "the Python agent's 0)",
}
NIXL_MODULES = ("nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")
WAITS_FOR = NIXL_MODULES
CHANGES = {  # what each wraps in a NIXL API module, for its evidence
    OFF: "{module}.nixl_agent_config.__init__: enable_prog_thread=False (the agent's UCX progress thread)",
    DELAY: "{module}.nixlBind.nixlAgent: the agent's config gets pthrDelay = 1000 us (its UCX progress thread)",
}

_FINDERS: dict[str, PostImportFinder] = {}


def progress_off(api: Any, on_fire: Any = lambda: None) -> bool:
    """Wrap api.nixl_agent_config.__init__ so that the progress thread is off, whatever the
    caller passed. Idempotent; returns whether it wrapped."""
    cls = api.nixl_agent_config
    original = cls.__init__
    if getattr(original, "__connector_tax_intervention__", None) == OFF:
        return False

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if args:  # enable_prog_thread is the first parameter
            args = (False, *args[1:])
        else:
            kwargs["enable_prog_thread"] = False
        original(self, *args, **kwargs)
        on_fire()

    __init__.__connector_tax_intervention__ = OFF  # type: ignore[attr-defined]
    cls.__init__ = __init__
    return True


class _Bindings:
    """api.nixlBind as nixl_agent.__init__ sees it: the real bindings, but an agent is made with
    the progress delay set on its config first."""

    __connector_tax_intervention__ = DELAY

    def __init__(self, real: Any, delay_us: int, on_fire: Any) -> None:
        self._real, self._delay_us, self._on_fire = real, delay_us, on_fire

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # noqa: N802 (nixl's name)
        config.pthrDelay = self._delay_us
        self._on_fire()
        return self._real.nixlAgent(name, config)


def progress_delay(api: Any, delay_us: int = DELAY_US, on_fire: Any = lambda: None) -> bool:
    """Make every agent of `api` with pthrDelay = delay_us. Idempotent; returns whether it acted."""
    if getattr(api.nixlBind, "__connector_tax_intervention__", None) == DELAY:
        return False
    api.nixlBind = _Bindings(api.nixlBind, delay_us, on_fire)
    return True


def _hook(name: str) -> Any:
    def hook(module: Any) -> None:
        """Never raises into the import of NIXL: an intervention that cannot apply says so in its evidence."""
        try:

            def fire() -> None:  # looked up at each call: a forked child keeps evidence of its own
                evidence(name).fired(DISCLOSURES[name])

            if name == OFF:
                progress_off(module, fire)
            else:
                progress_delay(module, DELAY_US, fire)
            evidence(name).changed(CHANGES[name].format(module=module.__name__))
        except Exception as exc:  # noqa: BLE001
            evidence(name).failed(f"not applied to {module.__name__}: {exc!r}")

    return hook


def install(name: str) -> bool:
    """Hook NIXL's API module(s) for intervention `name` (OFF or DELAY). Idempotent."""
    if name not in DISCLOSURES:
        raise ValueError(f"not a NIXL progress intervention: {name!r}")
    if name in _FINDERS:
        return True
    hook = _hook(name)
    for module in NIXL_MODULES:
        if module in sys.modules:
            hook(sys.modules[module])
    _FINDERS[name] = PostImportFinder(dict.fromkeys(NIXL_MODULES, hook))
    sys.meta_path.insert(0, _FINDERS[name])
    return True


def uninstall() -> None:
    """Remove the import hooks (tests). What is already wrapped stays wrapped."""
    for finder in _FINDERS.values():
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
    _FINDERS.clear()
