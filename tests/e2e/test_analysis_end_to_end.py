"""Synthetic raw data with KNOWN injected taxes and knees -> analyze() recovers them, reaches
the expected verdicts, and writes stable outputs (exact column sets) and figures."""

from __future__ import annotations

import csv
import json

import pytest
from synthetic_study import SyntheticSpec, write_study

from connector_tax.analysis import analyze
from connector_tax.plots import make_figures

pytestmark = pytest.mark.e2e  # a whole (synthetic) study analysed, figures and report: a minute of CPU

EXPECTED_COLUMNS = [
    "variant",
    "phase",
    "cell",
    "replicate",
    "rate",
    "input_len",
    "output_len",
    "backend",
    "simulated",
    "run_status",
    "valid",
    "validity_reasons",
    "complete",
    "fingerprint",
    "n_records",
    "n_warmup",
    "n_post_warmup",
    "n_ok",
    "n_error",
    "n_dropped",
    "n_timeout",
    "requested_rps",
    "offered_rps",
    "achieved_dispatch_rps",
    "effective_rps",
    "throughput_ratio",
    "throughput_ratio_requested",
    "rates_source",
    "ttft_ms_n",
    "ttft_ms_p50",
    "ttft_ms_p90",
    "ttft_ms_p99",
    "ttft_ms_p90_ci_lo",
    "ttft_ms_p90_ci_hi",
    "ttft_sched_ms_n",
    "ttft_sched_ms_p50",
    "ttft_sched_ms_p90",
    "ttft_sched_ms_p99",
    "ttft_sched_ms_p90_ci_lo",
    "ttft_sched_ms_p90_ci_hi",
    "tpot_ms_n",
    "tpot_ms_p50",
    "tpot_ms_p90",
    "tpot_ms_p99",
    "tpot_ms_p90_ci_lo",
    "tpot_ms_p90_ci_hi",
    "e2e_ms_n",
    "e2e_ms_p50",
    "e2e_ms_p90",
    "e2e_ms_p99",
    "e2e_ms_p90_ci_lo",
    "e2e_ms_p90_ci_hi",
    "itl_ms_n",
    "itl_ms_p50",
    "itl_ms_p90",
    "itl_ms_p99",
    "metrics_n",
    "waiting_p50",
    "running_p50",
    "kv_cache_usage_p50",
    "step_timing_available",
    "steps_n",
    "step_duration_us_p50",
    "step_duration_us_p90",
    "step_duration_us_p50_ci_lo",
    "step_duration_us_p50_ci_hi",
    "step_other_us_p50",
    "step_other_us_p90",
    "step_other_us_p50_ci_lo",
    "step_other_us_p50_ci_hi",
    "build_meta_us_p50",
    "build_meta_us_p90",
    "build_meta_us_p50_ci_lo",
    "build_meta_us_p50_ci_hi",
    "get_finished_us_p50",
    "get_finished_us_p90",
    "get_finished_us_p50_ci_lo",
    "get_finished_us_p50_ci_hi",
    "start_load_kv_us_p50",
    "start_load_kv_us_p90",
    "start_load_kv_us_p50_ci_lo",
    "start_load_kv_us_p50_ci_hi",
    "connector_total_us_p50",
    "connector_total_us_p90",
    "connector_total_us_p50_ci_lo",
    "connector_total_us_p50_ci_hi",
    "engine_step_us_p50",
    "engine_step_us_p90",
    "engine_step_us_p50_ci_lo",
    "engine_step_us_p50_ci_hi",
    "saturated",
    "saturation_criteria",
    "crit_throughput",
    "crit_waiting",
    "crit_ttft_growth",
    "ttft_growth_ratio",
    "ttft_growth_vs_rate",
    "host_measured",
    "host_busy",
    "host_others_cpu_frac",
    "host_others_cores_max",
    "host_steal_frac",
    "host_run_queue_mean",
    "attempts",
    "window_note",
    # stream coalescing: can the cell's client-side TPOT/ITL be trusted (analysis/streams.py)
    "chunks_per_token_p50",
    "coalesced_share",
    "burst_share",
    "client_tpot_trusted",
    "stream_note",
]
AGGREGATE_KEYS = [
    "schema_version",
    "study",
    "results_dir",
    "backend",
    "simulated",
    "served_by",
    "variants",
    "baseline",
    "baseline_requested",
    "connector_study",
    "variant_status",
    "ignored",
    "like_for_like",
    "connector_packages",
    "workarounds",
    "interventions",
    "interventions_seen",
    "lmcache_modes",
    "sidecars",
    "threads",
    "code",
    "replicates",
    "aa_controls",
    "ci_method",
    "saturation",
    "columns",
    "rows",
    "reference",
    "taxes",
    "intervention_effects",
    "step_cdf",
    "artifacts",
    "runtime",
    "contention",
    "analysis_seconds",
]
FIGURES = [
    "fig1_ttft_p90_vs_rate",
    "fig2_tpot_p90_vs_rate",
    "fig3_throughput_vs_requested",
    "fig4_tax_bars_ref_safe_ref_load",
    "fig4b_tax_shapes_phase_b_prime",
    "fig5_tax_shape_heatmaps",
    "fig6_step_latency_cdf",
    "fig7_tax_decomposition",
    "fig8_h4_additivity",
]

SPEC = SyntheticSpec(sigma=0.04, n_requests=1000, n_steps=1500, step_sigma=0.02, seed=11)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = write_study(tmp_path_factory.mktemp("e2e") / "synthetic", SPEC)
    out = analyze(root, make_figures)
    agg = json.loads((root / "analysis" / "aggregate.json").read_text())
    hyp = json.loads((root / "analysis" / "hypotheses.json").read_text())
    return root, out, agg, hyp


def test_reference_rates_exact(study):
    _, _, agg, _ = study
    ref = agg["reference"]
    assert (ref["ref_safe"], ref["ref_load"]) == (4.0, 8.0)
    assert ref["per_variant"]["mooncake_both"]["saturation_rate"] == 8.0
    assert ref["per_variant"]["plain"]["saturation_rate"] == 16.0
    rows = {(r["variant"], r["phase"], r["cell"]): r for r in agg["rows"]}
    assert rows[("mooncake_both", "phase_a", "r8")]["saturated"] is True
    assert rows[("mooncake_both", "phase_a", "r8")]["saturation_criteria"] == "throughput;waiting;ttft_growth"
    assert rows[("mooncake_both", "phase_a", "r4")]["saturated"] is False


@pytest.mark.parametrize(
    "config", ["noop_connector", "mooncake_both", "nixl_both", "lmcache_only", "multi_mooncake_lmcache"]
)
def test_injected_taxes_recovered(study, config):
    _, _, agg, _ = study
    t = agg["taxes"]["phase_a"]["ref_safe"]["variants"][config]
    assert t["ttft_p90"]["value"] == pytest.approx(SPEC.ttft_tax[config], abs=0.03)
    assert t["tpot_p90"]["value"] == pytest.approx(SPEC.tpot_tax[config], abs=0.03)
    ci = t["ttft_p90"]["ci"]
    assert ci[0] < t["ttft_p90"]["value"] < ci[1]
    assert t["step_p50_us"]["value"] == pytest.approx(SPEC.step_tax_us[config], abs=20)
    assert t["callback_p50_us"]["value"] == pytest.approx(SPEC.callback_us[config], rel=0.05)
    # The synthetic build_meta is a third of the callbacks; only it runs inside the step.
    assert t["build_meta_p50_us"]["value"] == pytest.approx(SPEC.callback_us[config] / 3, rel=0.05)
    assert t["unattributed_p50_us"]["value"] == pytest.approx(
        SPEC.step_tax_us[config] - SPEC.callback_us[config] / 3, abs=25
    )


def test_shape_taxes_recovered(study):
    _, _, agg, _ = study
    cells = agg["taxes"]["phase_b"]["cells"]
    assert agg["taxes"]["phase_b"]["rates"] == [4.0]
    mb = cells["4096x64"]["variants"]["mooncake_both"]["ttft_p90"]["value"]
    assert mb == pytest.approx(0.45 * (4096 / 512) ** 0.25, abs=0.04)
    tp = cells["512x256"]["variants"]["mooncake_both"]["tpot_p90"]["value"]
    assert tp == pytest.approx(0.25 * (256 / 64) ** 0.25, abs=0.03)
    prime = agg["taxes"]["phase_b_prime"]
    assert prime["rates"] == [8.0] and set(prime["cells"]) == {"512x256", "4096x256"}


def test_expected_verdicts(study):
    _, out, _, hyp = study
    verdicts = {h["id"]: h for h in hyp["hypotheses"]}
    for hid in ("H1", "H2", "H3", "H4", "H5", "H6"):
        assert verdicts[hid]["verdict"] == "supported", (hid, verdicts[hid]["reason"])
        assert verdicts[hid]["numbers"], hid
        assert verdicts[hid]["ci_overlaps_threshold"] is False, hid
    assert verdicts["H2"]["numbers"]["gap_pp"]["value"] == pytest.approx(7.0, abs=1.5)
    sc = {s["id"]: s for s in hyp["success_criteria"]}
    assert sc["SC1"]["outcome"] == "accept prior"
    assert sc["SC2"]["outcome"] == "agrees with trace replay"
    assert sc["SC3"]["outcome"] == "implementation-cost-dominated"
    assert sc["SC4"]["outcome"] == "linear"
    assert sc["SC5"]["status"] == "met"
    assert sc["SC6"]["status"] == "met", sc["SC6"]["reason"]
    assert sc["SC7"]["status"] == "met"
    assert out["verdicts"]["H1"] == "supported"


def test_csv_and_json_schemas_stable(study):
    root, out, agg, hyp = study
    with open(root / "analysis" / "aggregate.csv", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        body = list(reader)
    assert header == EXPECTED_COLUMNS
    assert agg["columns"] == EXPECTED_COLUMNS
    assert list(agg) == AGGREGATE_KEYS
    n_rows = 8 * (5 + 4) + 4 * 2
    assert len(body) == len(agg["rows"]) == n_rows
    assert all(list(r) == EXPECTED_COLUMNS for r in agg["rows"])
    assert list(hyp) == [
        "schema_version",
        "simulated",
        "baseline",
        "reference",
        "ci_method",
        "verdict_rule",
        "hypotheses",
        "perturbed_calls",
        "success_criteria",
    ]
    assert [h["id"] for h in hyp["hypotheses"]] == ["H1", "H2", "H3", "H4", "H5", "H6"]
    assert [s["id"] for s in hyp["success_criteria"]] == [f"SC{i}" for i in range(1, 8)]
    for h in hyp["hypotheses"]:
        assert {"id", "title", "verdict", "reason", "numbers", "ci_overlaps_threshold", "caveats"} <= set(h)
    assert sorted(out["files"])[:4] == [
        "aggregate.csv",
        "aggregate.json",
        "aggregate.parquet",
        "figures/fig1_ttft_p90_vs_rate.pdf",
    ]
    assert {"taxes.csv", "taxes.parquet"} <= set(out["files"])


def test_tidy_tables_hold_what_the_json_holds(study):
    """aggregate.parquet is the per-cell rows; taxes.parquet one row per (phase, point, config, metric)."""
    import pandas as pd

    root, _, agg, _ = study
    cells = pd.read_parquet(root / "analysis" / "aggregate.parquet")
    assert list(cells.columns) == EXPECTED_COLUMNS and len(cells) == len(agg["rows"])
    assert cells["ttft_ms_p90"].tolist() == pytest.approx([r["ttft_ms_p90"] for r in agg["rows"]])
    taxes = pd.read_parquet(root / "analysis" / "taxes.parquet")
    safe = agg["taxes"]["phase_a"]["ref_safe"]
    for name, metrics in safe["variants"].items():
        row = taxes[
            (taxes.phase == "phase_a")
            & (taxes.point == "ref_safe")
            & (taxes.variant == name)
            & (taxes.metric == "ttft_p90")
        ]
        assert len(row) == 1 and row["value"].iloc[0] == pytest.approx(metrics["ttft_p90"]["value"])
        assert row["rate"].iloc[0] == safe["rate"]
    # every row says its unit: relative taxes and microsecond differences share the value column
    assert set(taxes.query("metric == 'ttft_p90'")["unit"]) == {"relative"}
    assert set(taxes.query("metric == 'step_p50_us'")["unit"]) <= {"us"} and taxes["unit"].notna().all()
    shapes = taxes.query("phase == 'phase_b'")
    assert set(shapes["point"]) == set(agg["taxes"]["phase_b"]["cells"])
    assert (shapes["input_len"].notna() & shapes["output_len"].notna()).all()
    # read on its own, each table says what served the study
    assert (taxes["simulated"] == agg["simulated"]).all() and (taxes["backend"] == agg["backend"]).all()
    assert (cells["simulated"] == agg["simulated"]).all()
    by_config = taxes.query("metric == 'ttft_p90'").groupby("variant")["value"].count()
    assert set(by_config.index) == set(safe["variants"])  # a group-by away from any question


def test_per_cell_stats(study):
    _, _, agg, _ = study
    r = next(x for x in agg["rows"] if x["variant"] == "plain" and x["cell"] == "r4")
    assert r["n_ok"] == 1000 and r["n_warmup"] == 100 and r["ttft_ms_n"] == 1000
    assert r["ttft_ms_p90_ci_lo"] < r["ttft_ms_p90"] < r["ttft_ms_p90_ci_hi"]
    assert r["ttft_sched_ms_p50"] > r["ttft_ms_p50"]  # includes the 50 us send lateness
    assert r["waiting_p50"] == 0.0 and r["simulated"] is True and r["valid"] is True
    assert r["steps_n"] == 1500  # warm-up steps excluded by the window
    assert r["connector_total_us_p50"] is None  # plain has no callbacks
    assert r["itl_ms_p90"] is not None and r["throughput_ratio"] == pytest.approx(1.0)


def test_figures_and_report(study):
    root, out, _, _ = study
    figs = root / "analysis" / "figures"
    assert json.loads((figs / "skipped.json").read_text()) == {}
    assert sorted(out["figures"]) == sorted(FIGURES)
    for name in FIGURES:
        assert (figs / f"{name}.png").stat().st_size > 20_000, name
        assert (figs / f"{name}.pdf").stat().st_size > 5_000, name
    report = (root / "analysis" / "report.md").read_text()
    assert "SIMULATED DATA" in report
    assert "(figures/fig1_ttft_p90_vs_rate.png)" in report
    assert "ref_safe = **4 req/s**" in report
    assert "| H1 | **supported** |" in report
