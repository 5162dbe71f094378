"""Every cell of every shipped config keeps the settings behind its fingerprint across a refactor.

tests/data/fingerprint_settings.json holds, per config and variant, the hash of the launch
settings (without the argv and the server's versions, facts of the host), the launch argv with
host paths replaced, and the hash of each planned cell's settings (Phase B at fixed reference
rates). A change of what a cell measures must show here, and be made on purpose: regenerate with
`python tests/unit/test_fingerprint_settings.py > tests/data/fingerprint_settings.json` and say why in
the commit. History: the simulator's argv changed once, `--connector` -> `--variant` (a server
variant is one word everywhere); nothing else did. The calibration added configs (h20-calibrate,
sim-vllm-cpu-tiny, vllm-cpu-tiny-heldout) and changed no entry; re-fitting a profile a config names
changes its entries (the profile file's sha256 is in the launch settings), on purpose. Common
random numbers changed every cell's entry on purpose (a cell's settings carry its
traffic_seed); no launch entry changed. The CPU study and its held-out twin then gave their load
generator a real-time class (`loadgen.rt_priority: 10`), which changed their cells on purpose; a
config without it keeps its entries (an unset rt_priority is not hashed).
The default study's `min_completed` 12 -> 64 (a cell too short to bound a p90) changed its cells,
and the CPU study's `vllm.cpu.service_cpus: "0"` (the server's non-compute threads pinned)
changed its launches, both on purpose.
Making the Mooncake CPU guard a declared intervention (`interventions: [mooncake_cpu_guard]` on
the CPU studies' four Mooncake variants) changed their launch entries on purpose, no cell's.
Moving the CPU study's (and its held-out twin's) lmcache_only and multi_mooncake_lmcache to
LMCache's multi-process mode changed their launch entries on purpose and added the H20 study's
two MP variants; `vllm.lmcache_mp` is hashed only for variants that use it.
The H20 study's cells changed on purpose (a 210 s floor that bounds its long-context cells, and
the tax-precision plan); no launch entry changed.
The CPU study, its simulated and held-out twins, went from four Phase B shapes to the three that
decide H5 and H6 (512x64 removed) and added `vllm.preflight_launch: gated`, which is not hashed
(no server starts differently for it): entries removed, none changed.
The default study's arrivals, gamma shape 4 -> 8 (docs/simulator.md), changed its cells on
purpose; no launch entry changed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from connector_tax import resources
from connector_tax.config import find_variant, load_study, planned_cells
from connector_tax.contract.fingerprint import cell_settings, launch_settings, sha
from connector_tax.measure.cellplan import launch_argv

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests" / "data" / "fingerprint_settings.json"


def settings_snapshot(root: Path) -> dict[str, Any]:
    """`root` stands for the repository in paths (a local model folder lives under it)."""
    out: dict[str, Any] = {}
    for path in sorted((REPO / "configs").glob("*.yaml")):
        study = load_study(path)
        config = study.raw
        rates = sorted(study.workload.phase_a.rates)
        reference = {"ref_safe": rates[len(rates) // 2], "ref_load": rates[-1]}
        for name in study.names:
            variant = find_variant(config, name)
            argv = [a.replace(str(root), "<repo>") for a in launch_argv(str(path), study, study.variant(name), 8000)]
            if argv and argv[0].endswith("/vllm"):
                argv[0] = "<vllm>"  # where vLLM is installed is the host's
            entry: dict[str, Any] = {"launch": sha(launch_settings(config, variant, [], {})), "argv": argv}
            for phase in ("phase_a", "phase_b"):
                for cell in planned_cells(study, name, phase, reference):
                    entry[cell.key] = sha(cell_settings(config, cell))
            out[f"{path.name}:{name}"] = entry
    return out


def _with_model_root(root: Path) -> None:
    """Local models (configs/vllm-cpu-tiny.yaml) must exist to be planned: a stand-in folder."""
    (root / "results" / "models" / "tiny-llama").mkdir(parents=True, exist_ok=True)
    (root / "results" / "models" / "tiny-llama" / "config.json").write_text("{}")


def test_every_cells_settings_are_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _with_model_root(tmp_path)
    monkeypatch.setattr(resources, "workdir", lambda: tmp_path)
    now, then = settings_snapshot(tmp_path), json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert sorted(now) == sorted(then), "configs or variants were added or removed: regenerate on purpose"
    changed = [
        f"{key}: {field}"
        for key in then
        for field in set(then[key]) | set(now[key])
        if then[key].get(field) != now[key].get(field)
    ]
    assert not changed, f"{len(changed)} settings behind fingerprints changed, e.g. {changed[:5]}"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        _with_model_root(Path(scratch))
        resources.workdir = lambda: Path(scratch)  # type: ignore[assignment]
        json.dump(settings_snapshot(Path(scratch)), sys.stdout, indent=1, sort_keys=True)
        print()
