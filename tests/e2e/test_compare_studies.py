"""`ctax compare` on two replicated studies run through `snakemake` in virtual time: B's config
cuts Mooncake's connector costs to a fifth; both studies draw the same traffic (one seed), every
launch its own speed factor (launch bias on). The cross-study p90s pair by request, over both
launches, with the launch variance in the interval; a variant the change did not touch is the
same measurement in both studies (one seed, the same launch draws): 0 [0, 0]."""

from __future__ import annotations

import copy
import csv

import pytest
from study_runner import LENIENT_VALIDITY, REPO, snakemake, write_config

from connector_tax.cli import main
from connector_tax.config import load_config
from connector_tax.oracle.compare_coverage import inject

pytestmark = pytest.mark.e2e  # two small studies through snakemake


def _study(name: str, scale: float) -> dict:
    config = copy.deepcopy(load_config(REPO / "configs" / "default.yaml"))
    config["study"] = name
    config["variants"] = [v for v in config["variants"] if v["name"] in ("plain", "noop_connector", "mooncake_both")]
    config["sim"].update(clock="virtual", launch_bias_sd=0.05)
    config["workload"].update(replicates=2, min_completed=200, duration_s=1.0, warmup_s=0.5)
    config["workload"]["phase_a"]["rates"] = [16]
    config["workload"]["phase_b"] = {"shapes": [{"input": 64, "output": 8}]}
    config["workload"].pop("phase_b_prime", None)
    config["saturation"] = {"throughput_ratio_min": 0.01, "waiting_p50_max": 1000, "ttft_p90_ratio_max": 1000}
    config["validity"] = LENIENT_VALIDITY
    return inject(config, "mooncake", scale) if scale != 1 else config


def test_compare_two_replicated_studies(tmp_path):
    for name, scale in (("before", 1.0), ("after", 0.2)):
        run = snakemake(tmp_path, write_config(tmp_path, _study(name, scale), f"{name}.yaml"), "phase_b")
        assert run.returncode == 0, run.stderr[-3000:]
    results = tmp_path / "results"
    out = tmp_path / "compare"
    assert main(["compare", str(results / "before"), str(results / "after"), "-o", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "compare.csv")))
    assert {r["cell"] for r in rows} == {"r16", "64x8"}
    assert all(r["replicates"] == "2" for r in rows), rows  # both launches of each side
    assert all(r["paired"] == "True" for r in rows if not r["metric"].startswith("tax_"))  # one seed: paired
    # One seed draws the same launches too (the simulator's launch seed is the study seed's): a
    # variant the change did not touch is the same measurement in both, 0 [0, 0]; Mooncake's rows
    # compare other launches, with the launch variance estimated and in the interval.
    for r in rows:
        if r["variant"] == "mooncake_both":
            assert r["launch_share"] and float(r["launch_share"]) > 0, r
        else:
            assert float(r["change"]) == float(r["ci_lo"]) == float(r["ci_hi"]) == 0.0, r
    moon = {(r["cell"], r["metric"]): r for r in rows if r["variant"] == "mooncake_both"}
    assert moon[("r16", "ttft_p90")]["call"] == "changed" and float(moon[("r16", "ttft_p90")]["change"]) < -0.1
    md = (out / "compare.md").read_text()
    assert "sim.connector_costs.mooncake" in md  # what differs, from the study configs
