"""Declared interventions (config/interventions.py, patches/interventions/): a variant names them,
the launch passes exactly those names to the site hook, which loads them into vLLM's processes;
each is in the variant's fingerprint, disclosed, and never active unless declared. NIXL's two:
the progress thread off, and a 1 ms progress delay (here on a fake NIXL API module; with the real
nixl 1.5.1 and vLLM 0.32's own loader in tests/vllm_cpu/test_interventions_vllm.py)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_nixl import fake_nixl
from typed import study_of, typed

from connector_tax.config import ConfigError, find_variant, load_config, validate_config
from connector_tax.config.interventions import EVIDENCE_ENV, INTERVENTIONS_ENV, REGISTRY
from connector_tax.config.merge import deep_merge
from connector_tax.contract.fingerprint import launch_settings
from connector_tax.launch.evidence import seen
from connector_tax.launch.vllm import vllm_env, workarounds
from patches import cpu_guard, interventions
from patches.interventions import nixl_progress, nixl_reservation

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "configs" / "vllm-cpu-tiny.yaml"
OVERLAY = REPO / "configs" / "overlays" / "nixl-progress.yaml"


def test_the_registry_has_one_copy_of_each_name_and_disclosure_on_both_sides():
    assert set(interventions.MODULES) == set(REGISTRY)
    assert interventions.INTERVENTIONS_ENV == INTERVENTIONS_ENV
    shipped = {**cpu_guard.DISCLOSURES, **nixl_progress.DISCLOSURES, **nixl_reservation.DISCLOSURES}
    assert shipped == {name: i.disclosure for name, i in REGISTRY.items()}
    assert {i.overlay for i in REGISTRY.values() if i.overlay} == {
        "configs/overlays/nixl-progress.yaml",
        "configs/overlays/nixl-reservation.yaml",
    }
    assert nixl_reservation.NIXL_MODULES == nixl_progress.NIXL_MODULES
    assert all((REPO / i.overlay).is_file() for i in REGISTRY.values() if i.overlay)


def _cpu(**variant) -> dict:
    config = copy.deepcopy(load_config(CPU))
    config["variants"] = [{"name": "plain"}, {"name": "nixl_both", "connector": {"type": "nixl", "role": "kv_both"}}]
    config["variants"][1].update(variant)
    return config


@pytest.mark.parametrize(
    "variant, backend, says",
    [
        ({"interventions": ["nixl_fast"]}, "vllm", "variants[1].interventions[0]: unknown intervention 'nixl_fast'"),
        ({"interventions": ["mooncake_cpu_guard"]}, "vllm", "acts on a mooncake connector; nixl_both has none"),
        ({"interventions": ["nixl_progress_off"]}, "sim", "nixl_progress_off acts inside vLLM's processes"),
        ({"interventions": ["nixl_progress_off", "nixl_progress_off"]}, "vllm", "variants[1].interventions"),
        (
            {"name": "mooncake_both", "connector": {"type": "mooncake", "role": "kv_both"}},
            "vllm",
            "mooncake_both has a mooncake connector on a CPU host: declare mooncake_cpu_guard",
        ),
    ],
)
def test_a_bad_declaration_is_one_line_naming_the_key(variant, backend, says):
    config = _cpu(**variant)
    config["backend"] = backend
    if backend == "sim":
        config.pop("vllm")
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_only_a_declaring_variant_gets_them_and_they_are_in_its_fingerprint():
    config = validate_config(_cpu(interventions=["nixl_progress_off"]))
    study = study_of(config)
    plain, nixl = study.variant("plain"), study.variant("nixl_both")
    assert vllm_env(study, nixl, 8000)[INTERVENTIONS_ENV] == "nixl_progress_off"
    assert INTERVENTIONS_ENV not in vllm_env(study, plain, 8000)
    assert workarounds(nixl) == [REGISTRY["nixl_progress_off"].disclosure] and workarounds(plain) == []
    bare = validate_config(_cpu())
    assert INTERVENTIONS_ENV not in vllm_env(*typed(bare, "nixl_both"), 8000)
    before = launch_settings(bare, find_variant(bare, "nixl_both"), [], {})
    after = launch_settings(config, nixl.raw, [], {})
    assert before != after and after["variant"]["interventions"] == ["nixl_progress_off"]
    assert launch_settings(bare, find_variant(bare, "plain"), [], {}) == launch_settings(config, plain.raw, [], {})


def test_the_overlay_measures_nixl_beside_its_interventions_and_an_aa_twin_copies_them():
    import yaml

    overlay = yaml.safe_load(OVERLAY.read_text())
    config = validate_config(
        deep_merge(load_config(CPU), overlay)
    )  # Snakemake's merge: mappings merged, lists replaced
    declared = {v["name"]: v.get("interventions", []) for v in config["variants"]}
    assert declared["plain"] == [] and declared["nixl_both"] == []
    assert sorted(i for v in declared.values() for i in v) == ["nixl_progress_delay_1ms", "nixl_progress_off"]
    assert config["workload"]["replicates"] == 2 and config["study"] == "vllm-cpu-nixl-progress"
    assert config["workload"]["phase_b"]["shapes"] == [{"input": 512, "output": 64}]
    assert "inputs" not in config["workload"]["phase_b"]  # the overlay replaces the base's shapes
    twin = validate_config(
        {**config, "variants": [*config["variants"], {"name": "again", "aa_of": "nixl_progress_off"}]}
    )
    assert find_variant(twin, "again")["interventions"] == ["nixl_progress_off"]


@pytest.mark.parametrize(
    "declared, thread, delay",
    [
        (None, True, 0),  # nothing declared: NIXL as shipped (a 0 us delay: a busy poll)
        ("", True, 0),
        ("mooncake_cpu_guard", True, 0),  # another intervention: not this one
        ("nixl_progress_off", False, 0),
        ("nixl_progress_delay_1ms", True, 1000),
    ],
)
def test_through_the_site_hook_in_a_fresh_process(tmp_path, declared, thread, delay):
    """As a vLLM worker process gets them: sitecustomize from patches/site on PYTHONPATH, the
    NIXL build's API module hooked when vLLM's loader imports it."""
    fake_nixl(tmp_path)
    folder = tmp_path / "evidence"
    env = {k: v for k, v in os.environ.items() if k not in (INTERVENTIONS_ENV, EVIDENCE_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "patches" / "site"), str(tmp_path)])
    if declared is not None:
        env.update({INTERVENTIONS_ENV: declared, EVIDENCE_ENV: str(folder)})
    code = (
        "import importlib, json\n"
        "api = importlib.import_module('nixl_cu12._api')\n"  # as vllm.distributed.nixl_utils does
        "a = api.nixl_agent('w', api.nixl_agent_config(num_threads=4, capture_telemetry=True))\n"
        "b = api.nixl_agent('x', api.nixl_agent_config(True))\n"
        "print(json.dumps([a.agent, b.agent]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    agents = json.loads(done.stdout)
    assert all(a["useProgThread"] is thread and a["pthrDelay"] == delay for a in agents), agents
    acted = declared in nixl_progress.DISCLOSURES
    assert (nixl_progress.DISCLOSURES.get(declared, "never") in done.stderr) == acted
    # The evidence: installed in the process, what it changed there, both agents counted.
    verdicts = seen(folder, [declared] if declared else [])
    if acted:
        (record,) = [json.loads(p.read_text()) for p in folder.glob(f"{declared}.*.json")]
        assert record["installed"] is True and record["calls"] == 2 and record["pid"] > 0
        assert record["changed"] == [nixl_progress.CHANGES[declared].format(module="nixl_cu12._api")]
        assert verdicts[declared]["seen"] and verdicts[declared]["says"].startswith("declared and seen: 2 call(s)")
    elif declared:  # the guard: installed, waiting for a Mooncake worker that never comes
        assert not verdicts[declared]["seen"], verdicts
        assert "none of which imported vllm.distributed" in verdicts[declared]["says"]
    assert not folder.is_dir() or {p.name.split(".")[0] for p in folder.iterdir()} == {declared}


def test_each_is_idempotent():
    import types

    api = types.SimpleNamespace(
        nixl_agent_config=type("C", (), {"__init__": lambda self, enable_prog_thread=True: None}),
        nixlBind=types.SimpleNamespace(nixlAgent=lambda name, config: config),
    )
    assert nixl_progress.progress_off(api) and not nixl_progress.progress_off(api)
    assert nixl_progress.progress_delay(api) and not nixl_progress.progress_delay(api)
    config = types.SimpleNamespace(pthrDelay=0)
    assert api.nixlBind.nixlAgent("a", config).pthrDelay == 1000
    with pytest.raises(ValueError):
        nixl_progress.install("mooncake_cpu_guard")
