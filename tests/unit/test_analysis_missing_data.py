"""Missing-data paths: no step logs, a skipped config, no Phase B', truncated JSONL lines, an
inconclusive verdict, and a study that is not the connector study (an admission A/B)."""

from __future__ import annotations

import json

import pytest
from synthetic_study import SyntheticSpec, write_study

from connector_tax.analysis import analyze, build
from connector_tax.plots import make_figures
from connector_tax.plots.style import notice as build_notice

SMALL = dict(n_requests=250, n_steps=300, shapes=[(512, 64), (4096, 64)], rates=[1.0, 2.0, 4.0, 8.0, 16.0])


@pytest.fixture(scope="module")
def degraded(tmp_path_factory):
    """No step timing, mooncake_consumer skipped at preflight, no Phase B'."""
    spec = SyntheticSpec(
        variants=["plain", "noop_connector", "mooncake_consumer", "mooncake_both"],
        step_logs=False,
        step_timing_reason="patch did not apply: vLLM 9.9 renamed schedule()",
        skipped={"mooncake_consumer": "kv_consumer would not start with the dummy bootstrap"},
        phase_b_prime=False,
        **SMALL,
    )
    root = write_study(tmp_path_factory.mktemp("degraded") / "synthetic", spec)
    out = analyze(root, make_figures)
    return root, out


def test_missing_step_logs_skip_figs_6_and_7_with_reason(degraded):
    root, out = degraded
    skipped = json.loads((root / "analysis" / "figures" / "skipped.json").read_text())
    assert skipped == out["skipped_figures"]
    assert "vLLM 9.9 renamed schedule()" in skipped["fig6_step_latency_cdf"]
    assert "step" in skipped["fig7_tax_decomposition"]
    for name in ("fig6_step_latency_cdf", "fig7_tax_decomposition"):
        # the file exists (the workflow declares every figure) and is a notice, not a chart
        assert name not in out["figures"] and (root / "analysis" / "figures" / f"{name}.png").is_file()
        notice = build_notice(name, skipped[name], simulated=True)
        assert [t.get_text() for t in notice.texts][0] == f"{name}: not drawn" and not notice.axes
    for name in ("fig1_ttft_p90_vs_rate", "fig4_tax_bars_ref_safe_ref_load", "fig5_tax_shape_heatmaps"):
        assert (root / "analysis" / "figures" / f"{name}.png").stat().st_size > 10_000
    report = (root / "analysis" / "report.md").read_text()
    assert "fig6_step_latency_cdf**: " in report and "never drawn empty" in report


def test_no_phase_b_prime_recorded(degraded):
    root, out = degraded
    assert "Phase B' did not run" in out["skipped_figures"]["fig4b_tax_shapes_phase_b_prime"]
    agg = json.loads((root / "analysis" / "aggregate.json").read_text())
    assert agg["taxes"]["phase_b_prime"]["cells"] == {}


def test_missing_mooncake_pieces_skip_fig8_and_h4(degraded):
    root, out = degraded
    assert "lmcache_only" in out["skipped_figures"]["fig8_h4_additivity"]
    hyp = json.loads((root / "analysis" / "hypotheses.json").read_text())
    h = {x["id"]: x for x in hyp["hypotheses"]}
    assert h["H4"]["verdict"] == "not_applicable" and "lmcache_only" in h["H4"]["reason"]
    assert h["H2"]["verdict"] == "not_applicable"
    assert h["H1"]["verdict"] == "supported"


def test_skipped_config_reported_not_analysed(degraded):
    root, _ = degraded
    agg = json.loads((root / "analysis" / "aggregate.json").read_text())
    st = agg["variant_status"]["mooncake_consumer"]
    assert st["preflight"] == "skip" and "dummy bootstrap" in st["preflight_reason"]
    assert st["phases"]["phase_a"]["status"] == "skipped"
    assert not [r for r in agg["rows"] if r["variant"] == "mooncake_consumer"]
    assert "mooncake_consumer" not in agg["taxes"]["phase_a"]["ref_safe"]["variants"]
    assert "mooncake_consumer" in agg["reference"]["variants_excluded"]
    sc6 = next(
        s
        for s in json.loads((root / "analysis" / "hypotheses.json").read_text())["success_criteria"]
        if s["id"] == "SC6"
    )
    assert sc6["status"] == "met", sc6["reason"]  # the SKIP has its reason; no step log needed without timing


def test_a_cell_whose_files_changed_after_its_seal_is_reported_not_used(tmp_path):
    # The reader tolerates a truncated last line (tests/unit/test_analysis_jsonl.py); a sealed cell
    # whose file grew since its summary vouched for it is another matter: it is incomplete.
    spec = SyntheticSpec(
        variants=["plain", "mooncake_both"], phase_b=False, phase_b_prime=False, n_requests=200, n_steps=200, seed=3
    )
    root = write_study(tmp_path / "s", spec)
    before = {(r["variant"], r["cell"]) for r in build(root)["aggregate"]["rows"]}
    assert ("mooncake_both", "r4") in before
    with open(root / "mooncake_both" / "phase_a" / "engine_step_phase_a_r4.jsonl", "a") as fh:
        fh.write('{"t_ns":1,"step_id":9,"step_dur')
    agg = build(root)["aggregate"]
    assert {(r["variant"], r["cell"]) for r in agg["rows"]} == before - {("mooncake_both", "r4")}
    why = agg["variant_status"]["mooncake_both"]["phases"]["phase_a"]["not_analysed"]["r4"]
    assert why.startswith("incomplete: engine_step_phase_a_r4.jsonl has") and "its summary says" in why


def test_the_study_calls_the_point_and_says_when_the_interval_straddles(tmp_path):
    spec = SyntheticSpec(
        variants=["plain", "mooncake_both", "nixl_both"],
        ttft_tax={"mooncake_both": 0.10, "nixl_both": 0.05},
        sigma=0.3,
        n_requests=200,
        n_steps=100,
        phase_b=False,
        phase_b_prime=False,
        step_logs=False,
        seed=5,
    )
    hyp = build(write_study(tmp_path / "s", spec))["hypotheses"]
    h1 = next(h for h in hyp["hypotheses"] if h["id"] == "H1")
    value = h1["numbers"]["tax_ttft_p90_mooncake_both"]["value"]
    lo, hi = h1["numbers"]["tax_ttft_p90_mooncake_both"]["ci"]
    assert lo < 0.10 < hi
    # the verdict is the study's call on the point estimate; the interval's view stands beside it
    assert h1["verdict"] == ("supported" if value >= 0.10 else "refuted")
    assert h1["confidence"] == "within noise" and h1["ci_overlaps_threshold"] is True
    assert "(within noise)" in h1["reason"]
    h5 = next(h for h in hyp["hypotheses"] if h["id"] == "H5")
    assert h5["verdict"] == "not_applicable"


def test_refuted_when_the_ci_is_clearly_below(tmp_path):
    spec = SyntheticSpec(
        variants=["plain", "mooncake_both"],
        ttft_tax={"mooncake_both": 0.01},
        sigma=0.03,
        n_requests=400,
        n_steps=100,
        phase_b=False,
        phase_b_prime=False,
        step_logs=False,
        seed=6,
    )
    hyp = build(write_study(tmp_path / "s", spec))["hypotheses"]
    h1 = next(h for h in hyp["hypotheses"] if h["id"] == "H1")
    assert h1["verdict"] == "refuted" and h1["ci_overlaps_threshold"] is False and h1["confidence"] == "confident"
    sc1 = next(s for s in hyp["success_criteria"] if s["id"] == "SC1")
    assert sc1["outcome"] == "revise prior (below)"


def test_ab_study_gets_generic_parts_only(tmp_path):
    spec = SyntheticSpec(
        study="admission-ab",
        variants=["fifo", "pack"],
        knee={"fifo": 8.0, "pack": 16.0},
        ttft_tax={"pack": -0.2},
        phase_b=False,
        phase_b_prime=False,
        n_requests=150,
        n_steps=100,
        seed=8,
    )
    root = write_study(tmp_path / "admission-ab", spec)
    built = build(root)
    agg, hyp = built["aggregate"], built["hypotheses"]
    assert agg["baseline"] is None and agg["taxes"] is None and agg["connector_study"] is False
    assert agg["reference"]["ref_load"] == 4.0 and agg["reference"]["baseline"] == "fifo"
    assert all(h["verdict"] == "not_applicable" for h in hyp["hypotheses"])
    assert {s["id"] for s in hyp["success_criteria"] if s["status"] != "not_applicable"} == {"SC6", "SC7"}
    # with an explicit baseline the A/B compares against its first config
    ab = build(root, baseline="first")["aggregate"]
    assert ab["baseline"] == "fifo"
    assert ab["taxes"]["phase_a"]["ref_safe"]["variants"]["pack"]["ttft_p90"]["value"] == pytest.approx(-0.2, abs=0.05)


def test_ab_report_says_not_applicable(tmp_path):
    spec = SyntheticSpec(
        study="ab",
        variants=["fifo", "pack"],
        knee={},
        phase_b=False,
        phase_b_prime=False,
        n_requests=100,
        n_steps=50,
        step_logs=False,
        simulated=False,
        seed=9,
    )
    root = write_study(tmp_path / "ab", spec)
    out = analyze(root)
    report = (root / "analysis" / "report.md").read_text()
    assert "**not applicable**" in report and "SIMULATED" not in report
    assert not (root / "analysis" / "figures").exists()
    assert out["figures"] == {}
