"""`ctax compare A B`: two studies (or two variants of one) cell by cell, through the command."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from synthetic_study import SyntheticSpec, write_study

from connector_tax.analysis.compare import call_of, log_difference
from connector_tax.analysis.compare_report import CSV_COLUMNS
from connector_tax.analysis.compare_sides import parse_side
from connector_tax.analysis.launch_intervals import LaunchVariance, pooled
from connector_tax.cli import main

KW = dict(
    variants=["plain", "noop_connector", "nixl_both"],
    rates=[4.0, 8.0],
    shapes=[(512, 64)],
    phase_b_prime=False,
    knee={},
    n_requests=300,
    n_steps=100,
)


@pytest.fixture(scope="module")
def studies(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    a = write_study(root / "a", SyntheticSpec(study="a", **KW))
    spec = SyntheticSpec(study="b", seed=2, **KW)
    spec.tpot_tax = dict(spec.tpot_tax, nixl_both=0.8)  # the injected difference: NIXL's TPOT tax 0.2 -> 0.8
    b = write_study(root / "b", spec)
    return {"a": a, "b": b, "root": root}


def _rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "compare.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_two_studies_give_a_row_per_variant_phase_cell_metric_with_its_call(studies, capsys):
    out = studies["root"] / "out"
    assert main(["compare", str(studies["a"]), str(studies["b"]), "-o", str(out)]) == 0
    assert "comparisons" in capsys.readouterr().out
    rows = _rows(out)
    assert list(rows[0]) == CSV_COLUMNS
    keys = {(r["variant"], r["phase"], r["cell"], r["metric"]) for r in rows}
    assert len(keys) == len(rows)  # one row per variant x phase x cell x metric
    # three cells (r4, r8, 512x64): p90s of three variants, taxes of the two with a connector
    assert len(rows) == 3 * (3 * 2 + 2 * 2)
    for r in rows:
        if r["variant"] == "nixl_both" and r["metric"] in ("tpot_p90", "tax_tpot_p90"):
            assert r["call"] == "changed", r  # (1.8 / 1.2) - 1 = +50 %
            assert 0.35 < float(r["change"]) < 0.65 and float(r["ci_lo"]) > 0
            assert float(r["ci_lo"]) <= float(r["change"]) <= float(r["ci_hi"])
        elif r["metric"].startswith("tax_"):
            assert r["call"] in ("no change resolved", "below resolution", "changed"), r
    plain = [r for r in rows if r["variant"] == "plain"]
    assert sum(r["call"] == "changed" for r in plain) <= 1  # nothing injected there
    md = (out / "compare.md").read_text()
    for needle in ("# What changed: B against A (SIMULATED)", "## Changed", "## Settings and versions that differ"):
        assert needle in md
    assert "`seed: 1 -> 2`" in md  # the study config's difference
    assert "one launch per variant" in md  # the intervals say what they leave out
    assert (out / "compare.png").is_file() and (out / "compare.pdf").is_file()
    assert "![the changes with their intervals](compare.png)" in md


def test_a_tax_on_the_same_traffic_is_compared_request_by_request(studies, capsys, tmp_path):
    # B: A's own cells (the same seed: the same traffic for every variant and the baseline). Every
    # tax changed by exactly 0; independent terms called such changes "below resolution".
    import shutil

    same = tmp_path / "a_again"
    shutil.copytree(studies["a"], same)
    out = tmp_path / "out"
    assert main(["compare", str(studies["a"]), str(same), "-o", str(out)]) == 0
    capsys.readouterr()
    taxes = [r for r in _rows(out) if r["metric"].startswith("tax_")]
    assert taxes and all(r["call"] == "no change resolved" and r["paired"] == "True" for r in taxes), taxes
    assert all(float(r["ci_lo"]) == float(r["ci_hi"]) == 0.0 for r in taxes)


def test_two_variants_of_one_study_are_its_paired_comparison(studies, capsys):
    a = studies["a"]
    assert main(["compare", f"{a}:noop_connector", f"{a}:nixl_both"]) == 0
    md = capsys.readouterr().out
    assert "`noop_connector -> nixl_both`" in md
    assert "tax_" not in md.split("## Method")[0]  # one baseline: the taxes' change is the p90s'
    assert md.count("| **changed** |") >= 3  # NIXL's taxes are +38 % TTFT and +20 % TPOT above noop's


def test_cells_of_another_shape_or_model_are_listed_not_compared(studies, tmp_path, capsys):
    other = write_study(tmp_path / "c", SyntheticSpec(study="c", **{**KW, "phase_a_shape": (1024, 256)}))
    assert main(["compare", str(studies["a"]), str(other), "-o", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "## Not compared" in md and "phase_a r4: shape 4096x256 vs 1024x256" in md
    assert not any(r["phase"] == "phase_a" for r in _rows(tmp_path / "out"))
    # plain saturates at 8 req/s in this one: ref_safe 4, so its Phase B ran at another rate
    slower = write_study(tmp_path / "d", SyntheticSpec(study="d", **{**KW, "knee": {"plain": 8.0}}))
    capsys.readouterr()
    assert main(["compare", str(studies["a"]), str(slower)]) == 0
    md = capsys.readouterr().out
    assert "phase_b 512x64: rate 8 vs 4 req/s" in md
    assert "| phase_a | r4 |" in md.split("## Not compared")[0]  # the cells that agree are compared


@pytest.mark.parametrize(
    "argv, says",
    [
        (["{a}", "{root}/nowhere"], "nowhere: no such study folder"),
        (["{a}:nope", "{b}"], "no variant 'nope' in study a"),
        (["{a}:plain", "{b}"], "name a variant on both sides"),
        (["{a}", "{a}"], "are one study: name two variants"),
        (["{a}", "{b}", "--margin", "0"], "--margin: 0.0 is not a positive fraction"),
        (["{a}", "{root}"], "refused"),
    ],
)
def test_bad_arguments_get_one_line(studies, capsys, argv, says):
    args = [x.format(**{k: str(v) for k, v in studies.items()}) for x in argv]
    assert main(["compare", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and err.startswith("ctax compare: ")


def test_the_call_rule():
    assert call_of([0.01, 0.2], 0.1) == "changed"
    assert call_of([-0.3, -0.01], 0.1) == "changed"
    assert call_of([-0.05, 0.08], 0.1) == "no change resolved"
    assert call_of([-0.0909, 0.1], 0.1) == "no change resolved"  # ±10 % on the log scale
    assert call_of([-0.2, 0.05], 0.1) == "below resolution"
    assert call_of(None, 0.1) == "no interval" and call_of([None, 0.1], 0.1) == "no interval"


def test_a_difference_of_two_log_estimates_adds_their_variances():
    a = {"mean": math.log(1.2), "variance": 0.01, "df": 10, "launch_share": 0.5}
    b = {"mean": math.log(1.5), "variance": 0.01, "df": 10, "launch_share": 1.0}
    d = log_difference(a, b)
    assert d["value"] == pytest.approx(0.25)
    assert d["df"] == 20  # Satterthwaite with equal terms
    half = math.log((1 + d["ci"][1]) / (1 + d["value"]))
    assert half == pytest.approx(2.086 * math.sqrt(0.02), rel=1e-3)
    assert d["launch_share"] == pytest.approx(0.75)


def test_launch_variances_pool_by_their_degrees_of_freedom():
    p = pooled(LaunchVariance(0.01, 3, ["x"]), LaunchVariance(0.04, 1, ["y"]))
    assert p.variance == pytest.approx(0.0175) and p.df == 4
    assert pooled(LaunchVariance(None, 0), LaunchVariance(0.02, 2)).variance == 0.02
    assert pooled(LaunchVariance(None, 0), LaunchVariance(None, 0)).variance is None


def test_a_side_is_a_folder_or_a_folder_and_variant(tmp_path):
    assert parse_side("results/x") == (Path("results/x"), None)
    assert parse_side("results/x:nixl_both") == (Path("results/x"), "nixl_both")
    odd = tmp_path / "a:b"
    odd.mkdir()
    assert parse_side(str(odd)) == (odd, None)  # a folder that exists is a folder, colon or not
