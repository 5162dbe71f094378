"""The Mooncake CPU guard (patches/cpu_guard.py): vLLM's MooncakeConnectorWorker asks
torch.accelerator.current_device_index(), which raises on a host without an accelerator. The guard
answers 0 there, only inside that constructor, only when torch says no accelerator is available,
and only for variants that declare it (the intervention `mooncake_cpu_guard`, which the config
check requires for a Mooncake connector on CPU). It must never act where an accelerator exists."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from typed import study_of, typed

from connector_tax.config import find_variant, load_config
from connector_tax.config.interventions import EVIDENCE_ENV, INTERVENTIONS_ENV, REGISTRY
from connector_tax.launch.evidence import seen
from connector_tax.launch.vllm import vllm_env, workarounds
from patches import cpu_guard

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "configs" / "vllm-cpu-tiny.yaml"
GPU = REPO / "configs" / "h20-qwen3-coder.yaml"


def fake_torch(available: bool) -> types.SimpleNamespace:
    def current_device_index() -> int:
        if not available:
            raise RuntimeError("Cannot access accelerator device when none is available.")
        return 3

    return types.SimpleNamespace(
        accelerator=types.SimpleNamespace(is_available=lambda: available, current_device_index=current_device_index)
    )


def worker_class(torch: types.SimpleNamespace) -> type:
    class MooncakeConnectorWorker:  # what vLLM 0.32's constructor does first
        def __init__(self, vllm_config: object, engine_id: str, kv_cache_config: object) -> None:
            self.device_id = torch.accelerator.current_device_index()

    return MooncakeConnectorWorker


def test_without_an_accelerator_the_constructor_sees_0_and_nothing_else_does():
    torch = fake_torch(available=False)
    cls = worker_class(torch)
    with pytest.raises(RuntimeError, match="Cannot access accelerator"):
        cls(None, "e", None)
    fired = []
    assert cpu_guard.guard_worker_class(cls, torch, lambda: fired.append(1))
    assert cls(None, "e", None).device_id == 0 and fired == [1]
    with pytest.raises(RuntimeError, match="Cannot access accelerator"):  # restored after the constructor
        torch.accelerator.current_device_index()
    assert not cpu_guard.guard_worker_class(cls, torch)  # idempotent


def test_with_an_accelerator_the_guard_never_acts():
    torch = fake_torch(available=True)
    cls = worker_class(torch)
    fired = []
    cpu_guard.guard_worker_class(cls, torch, lambda: fired.append(1))
    assert cls(None, "e", None).device_id == 3 and fired == []
    # a torch that cannot answer counts as having one: never guard blind
    broken = types.SimpleNamespace(accelerator=types.SimpleNamespace(is_available=lambda: 1 / 0))
    assert cpu_guard.accelerator_available(broken) and cpu_guard.accelerator_available(types.SimpleNamespace())


def test_the_launch_asks_for_it_only_for_the_variants_that_declare_it():
    cpu = load_config(CPU)
    for name in ("mooncake_producer", "mooncake_consumer", "mooncake_both", "multi_mooncake_lmcache"):
        assert find_variant(cpu, name)["interventions"] == [cpu_guard.NAME]  # the CPU study declares it
        env = vllm_env(*typed(cpu, name), 8000)
        assert env[INTERVENTIONS_ENV] == cpu_guard.NAME and str(REPO / "patches" / "site") in env["PYTHONPATH"]
        assert workarounds(typed(cpu, name)[1]) == [cpu_guard.DISCLOSURE]
    for name in ("plain", "noop_connector", "nixl_both", "lmcache_only"):
        assert INTERVENTIONS_ENV not in vllm_env(*typed(cpu, name), 8000)
        assert workarounds(typed(cpu, name)[1]) == []
    gpu = load_config(GPU)  # a GPU study declares none: never, Mooncake or not
    for variant in study_of(gpu).variants:
        assert INTERVENTIONS_ENV not in vllm_env(study_of(gpu), variant, 8000) and workarounds(variant) == []
    # the site hook is on the path for the guard even when step timing is off
    quiet = copy.deepcopy(cpu)
    quiet["vllm"]["step_timing"] = False
    assert str(REPO / "patches" / "site") in vllm_env(*typed(quiet, "mooncake_both"), 8000)["PYTHONPATH"]
    assert str(REPO / "patches" / "site") not in vllm_env(*typed(quiet, "plain"), 8000)["PYTHONPATH"]


def test_the_disclosure_is_the_same_on_both_sides():
    assert cpu_guard.DISCLOSURE == REGISTRY[cpu_guard.NAME].disclosure
    assert cpu_guard.DISCLOSURE == "MooncakeConnector on CPU: torch.accelerator.current_device_index() returns 0"


FAKE_VLLM_MODULE = textwrap.dedent(
    """
    import torch


    class MooncakeConnectorWorker:
        def __init__(self, vllm_config, engine_id, kv_cache_config):
            self.device_id = torch.accelerator.current_device_index()
    """
)
FAKE_TORCH = textwrap.dedent(
    """
    import os, types


    def _index():
        if os.environ["FAKE_ACCELERATOR"] == "0":
            raise RuntimeError("Cannot access accelerator device when none is available.")
        return 5


    accelerator = types.SimpleNamespace(
        is_available=lambda: os.environ["FAKE_ACCELERATOR"] == "1", current_device_index=_index
    )
    """
)


@pytest.mark.parametrize(
    "switch, accelerator, expected",
    [
        ("mooncake_cpu_guard", "0", "0"),  # declared, no accelerator: the guard answers
        ("mooncake_cpu_guard", "1", "5"),  # declared, an accelerator: untouched
        ("nixl_progress_off", "0", "RuntimeError"),  # another intervention declared: not this one
        ("", "0", "RuntimeError"),  # none declared: vLLM's own failure
        (None, "0", "RuntimeError"),
    ],
)
def test_through_the_site_hook_in_a_fresh_process(tmp_path, switch, accelerator, expected):
    """As a vLLM worker process gets it: sitecustomize from patches/site on PYTHONPATH."""
    module = tmp_path / "vllm" / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "mooncake"
    module.mkdir(parents=True)
    (module / "mooncake_connector.py").write_text(FAKE_VLLM_MODULE)
    for folder in [module, *module.parents]:
        if folder == tmp_path:
            break
        (folder / "__init__.py").touch()
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    folder = tmp_path / "evidence"
    env = {k: v for k, v in os.environ.items() if k not in (INTERVENTIONS_ENV, EVIDENCE_ENV)}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "patches" / "site"), str(tmp_path)]),
        FAKE_ACCELERATOR=accelerator,
    )
    if switch is not None:
        env[INTERVENTIONS_ENV] = switch
        env[EVIDENCE_ENV] = str(folder)
    code = (
        "from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as m\n"
        "try:\n    print(m.MooncakeConnectorWorker(None, 'e', None).device_id)\n"
        "except RuntimeError:\n    print('RuntimeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == expected, done.stderr
    fired = expected == "0"
    assert (cpu_guard.DISCLOSURE in done.stderr) == fired
    records = [json.loads(p.read_text()) for p in folder.glob(f"{cpu_guard.NAME}.*.json")]
    assert len(records) == (switch == cpu_guard.NAME)
    if records:  # installed and hooked the worker class; the call counted only where it answered 0
        assert records[0]["installed"] and records[0]["changed"] == [cpu_guard.CHANGES]
        assert records[0]["calls"] == int(fired)
        verdict = seen(folder, [cpu_guard.NAME])[cpu_guard.NAME]
        assert verdict["seen"] is fired
        assert verdict["says"].endswith("" if fired else "but no call went through it in 1 process(es)")
