"""The suite's tiers by folder (tests/conftest.py applies them; docs/testing.md): each tier's marker,
how to run it, and the tiers a test file's folders name."""

from __future__ import annotations

from pathlib import Path

import pytest

# The tiers a plain `pytest` leaves out, and how to run each.
TIERS = {
    "e2e": "the end-to-end tier: pytest -m e2e (with -n 2 in two processes)",
    "vllm_cpu": "real vLLM on this host's CPU: CONNECTOR_TAX_VLLM_PYTHON=... pytest -m vllm_cpu",
    "contention": "the default study beside a CPU hog: pytest -m contention",
    "slurm": "the study on a local SLURM: bash tools/slurm_local.sh start --gpus 2, then pytest -m slurm",
    "rehearsal": "an 8-GPU host rehearsed without a GPU: pytest -m rehearsal",
    "gpu_env": "the GPU environment installed into a fresh venv (several GB): pytest -m gpu_env",
    "frontdoor": "the README's commands from a fresh clone: pytest -m frontdoor (pip install -e '.[browser]' and chromium)",
}
TESTS = Path(__file__).resolve().parent
FAST = "unit"  # the fast tier's folder: no marker, what a plain `pytest` runs


def folder_tiers(path: Path) -> list[str]:
    """The tiers a test file's folders name (tests/e2e/contention/x.py: e2e, contention); a test
    file outside tests/unit and every tier folder is an error (its tier would be a guess)."""
    folders = Path(path).resolve().relative_to(TESTS).parts[:-1]
    if not folders or folders[0] not in (FAST, *TIERS):
        raise pytest.UsageError(f"{path}: a test lives in tests/{FAST}/ or a tier's folder ({', '.join(TIERS)})")
    return [folder for folder in folders if folder in TIERS]


def tier_from_folder(item: pytest.Item) -> None:
    """Mark the test with its folders' tiers; a tier marker its folder does not name is an error."""
    tiers = folder_tiers(item.path)
    stray = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS} - set(tiers))
    if stray:
        where = "/".join(["tests", *Path(item.path).resolve().relative_to(TESTS).parts[:-1]])
        raise pytest.UsageError(f"{item.nodeid}: marked {', '.join(stray)} but lives in {where}/ (move it)")
    for tier in tiers:
        item.add_marker(tier)
