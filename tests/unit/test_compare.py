"""`ctax compare A B`: two studies (or two variants of one) cell by cell, through the command."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import yaml
from synthetic_study import SyntheticSpec, study_config, write_study

from connector_tax.analysis.compare import call_of, compare, log_difference
from connector_tax.analysis.compare_report import CSV_COLUMNS, render
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


def _unmeasured(folder: Path, study: str) -> Path:
    """A study folder with its config and no measured cell (a study that never ran)."""
    folder.mkdir(parents=True)
    config = study_config(SyntheticSpec(study=study, **KW))
    (folder / "study_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def test_nothing_compared_is_exit_2_with_why_and_never_nothing_changed(studies, tmp_path, capsys):
    e1, e2 = _unmeasured(tmp_path / "e1", "e1"), _unmeasured(tmp_path / "e2", "e2")
    other = write_study(tmp_path / "c", SyntheticSpec(study="c", **{**KW, "phase_a_shape": (1024, 256)}))
    other_shapes = SyntheticSpec(study="d", **{**KW, "phase_a_shape": (1024, 256), "shapes": [(1024, 64)]})
    disjoint = write_study(tmp_path / "d", other_shapes)
    apart = write_study(
        tmp_path / "f", SyntheticSpec(study="f", **{**KW, "rates": [16.0, 32.0], "shapes": [(1024, 64)]})
    )
    cases = [
        ([str(e1), str(e2)], f"no measured cells in A ({e1}) or B ({e2})"),
        ([str(studies["a"]), str(e2)], f"no measured cells in B ({e2})"),
        ([f"{e1}:plain", f"{studies['a']}:plain"], f"no measured cells in A ({e1}:plain)"),
        (
            [str(studies["a"]), str(disjoint)],
            "none of the cells measured on both sides is the same cell "
            "(`plain` phase_a r4: shape 4096x256 vs 1024x256, and 5 more)",
        ),
        ([str(studies["a"]), str(apart)], "no cell was measured on both sides"),
    ]
    for argv, why in cases:
        out = tmp_path / "out"
        assert main(["compare", *argv, "-o", str(out)]) == 2, argv
        err = capsys.readouterr().err
        assert err == f"ctax compare: nothing compared: {why}\n", err
        assert not (out / "compare.md").exists()  # a failed comparison writes nothing
    assert main(["compare", str(studies["a"]), str(other)]) == 0  # Phase B's cells still compare
    capsys.readouterr()
    doc = compare(str(e1), str(e2))
    assert doc["rows"] == [] and doc["nothing_compared"]
    md = render(doc)
    assert "Nothing was compared" in md and "Nothing changed" not in md and "0 comparisons" not in md


@pytest.mark.parametrize(
    "argv, says",
    [
        (["{a}", "{root}/nowhere"], "nowhere: no such study folder"),
        (["{a}:nope", "{b}"], "no variant 'nope' in study a"),
        (["{a}:plain", "{b}"], "name a variant on both sides"),
        (["{a}", "{a}"], "are one study: name two variants"),
        (["{a}", "{b}", "--margin", "0"], "argument --margin: 0 must be > 0"),
        (["{a}", "{b}", "--margin", "nan"], "argument --margin: nan is not a finite number"),
        (["{a}", "{root}"], "refused"),
        # an output that cannot be written: one line before the work, not a traceback after it
        (
            ["{a}", "{b}", "-o", "{a}/study_config.yaml/out"],
            "-o {a}/study_config.yaml/out: {a}/study_config.yaml is not a folder",
        ),
        (["{a}", "{b}", "-o", "{a}/study_config.yaml"], "-o {a}/study_config.yaml: not a folder"),
    ],
)
def test_bad_arguments_get_one_line(studies, capsys, argv, says):
    names = {k: str(v) for k, v in studies.items()}
    args = [x.format(**names) for x in argv]
    try:
        code = main(["compare", *args])
    except SystemExit as exc:  # argparse's own errors (a number that is none)
        code = exc.code
    assert code == 2
    says = says.format(**names)
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


@pytest.fixture(scope="module")
def replicated(tmp_path_factory) -> Path:
    """A study of two launches per variant, each launch 5 % faster or slower (sd of its log
    speed): the intervals carry a launch variance."""
    spec = SyntheticSpec(study="rep", replicates=2, launch_sd=0.05, **KW)
    return write_study(tmp_path_factory.mktemp("replicated") / "rep", spec)


def test_a_replicated_study_compared_with_itself_is_zero_with_a_zero_width_interval(replicated, tmp_path, capsys):
    # Both sides are the same measurements: every launch's bias is on both sides and cancels. The
    # launch term of two (or four) independent launches made these [-14.5, +17.0] % before.
    import shutil

    again = tmp_path / "again"
    shutil.copytree(replicated, again)
    for argv in ([str(replicated), str(again)], [f"{replicated}:nixl_both", f"{replicated}:nixl_both"]):
        out = tmp_path / "out" / str(len(argv[0]))
        assert main(["compare", *argv, "-o", str(out)]) == 0
        capsys.readouterr()
        rows = _rows(out)
        assert rows and all(r["replicates"] == "2" for r in rows), rows
        assert {r["metric"] for r in rows} >= {"ttft_p90", "tpot_p90"}
        for r in rows:
            assert float(r["change"]) == float(r["ci_lo"]) == float(r["ci_hi"]) == 0.0, r
            assert r["call"] == "no change resolved", r
    taxes = [r for r in _rows(tmp_path / "out" / str(len(str(replicated)))) if r["metric"].startswith("tax_")]
    assert taxes  # the four-launch tax rows too


def test_a_replicated_study_against_other_launches_keeps_the_launch_term(replicated, tmp_path, capsys):
    # Other launches (another study, its own speed factors): the launches' variance stays in
    # every interval, so none is a point.
    other = write_study(tmp_path / "other", SyntheticSpec(study="other", replicates=2, launch_sd=0.05, seed=3, **KW))
    out = tmp_path / "out"
    assert main(["compare", str(replicated), str(other), "-o", str(out)]) == 0
    capsys.readouterr()
    rows = [r for r in _rows(out) if r["ci_lo"]]
    assert rows and all(float(r["ci_lo"]) < float(r["ci_hi"]) for r in rows), rows
    assert all(float(r["launch_share"]) > 0 for r in rows), rows
