"""The truth oracle's p90s are a property of the model, not of the draw: two oracles of a small study
on independent seeds agree within 1 % (virtual time, many seeds: the end-to-end tier)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_oracle_truth import _small

from connector_tax.analysis import constants as K
from connector_tax.config import StudyConfig, load_config
from connector_tax.oracle.truth import TruthSettings, truth

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config() -> dict:
    return load_config(REPO / "configs" / "default.yaml")


@pytest.mark.e2e  # two oracles of a study, many seeds each
def test_true_p90_is_stable_across_oracle_seeds(config):
    """Two oracles on independent seeds agree on every p90 to < 1%: the truth is a property of
    the model, not of the draw."""
    small = StudyConfig.from_mapping(_small(config))
    ts = TruthSettings(requests=2000, warmup=200, precision=0.005, min_replications=4, max_replications=4, jobs=2)
    docs = [
        truth(
            small, {"ref_safe": 16.0, "ref_load": 16.0}, [K.MOONCAKE_BOTH], ts.__class__(**{**ts.__dict__, "seed": s})
        )
        for s in (0, 1)
    ]
    for a, b in zip(docs[0]["cells"], docs[1]["cells"]):
        assert (a["variant"], a["cell"]) == (b["variant"], b["cell"])
        for m in ("ttft_ms_p90", "tpot_ms_p90"):
            assert abs(a[m] - b[m]) / a[m] < 0.01, (a, b)
