"""`ctax analyze` as the console script wires it: add_arguments(parser), its Args, main(args)."""

from __future__ import annotations

import argparse
import json

from synthetic_study import SyntheticSpec, write_study

from connector_tax.commands import analyze as cli
from connector_tax.commands.namespace import args_of


def _parse(argv):
    parser = argparse.ArgumentParser(prog="ctax analyze")
    cli.add_arguments(parser)
    return args_of(cli.Args, parser.parse_args(argv))


def test_cli_writes_outputs(tmp_path, capsys):
    spec = SyntheticSpec(
        variants=["plain", "mooncake_both"],
        phase_b=False,
        phase_b_prime=False,
        n_requests=120,
        n_steps=60,
        step_logs=False,
        seed=4,
    )
    root = write_study(tmp_path / "s", spec)
    assert cli.main(_parse([str(root)])) == 0
    out = capsys.readouterr().out
    assert "H1=" in out and "analysis written to" in out
    for name in ("aggregate.json", "aggregate.csv", "hypotheses.json", "report.md"):
        assert (root / "analysis" / name).is_file()
    assert json.loads((root / "analysis" / "aggregate.json").read_text())["baseline"] == "plain"
    other = tmp_path / "elsewhere"
    assert (
        cli.main(
            _parse(
                [
                    str(root),
                    "--out",
                    str(other),
                    "--baseline",
                    "mooncake_both",
                    "--quiet",
                    "--throughput-basis",
                    "requested",
                ]
            )
        )
        == 0
    )
    agg = json.loads((other / "aggregate.json").read_text())
    assert agg["baseline"] == "mooncake_both" and agg["saturation"]["throughput_basis"] == "requested"


def test_cli_missing_dir(tmp_path, capsys):
    assert cli.main(_parse([str(tmp_path / "nope")])) == 2
    assert "no such directory" in capsys.readouterr().err


def test_cli_figures_only_redraws_from_existing_analysis(tmp_path, capsys):
    spec = SyntheticSpec(
        variants=["plain", "mooncake_both"],
        phase_b=False,
        phase_b_prime=False,
        n_requests=100,
        n_steps=60,
        step_logs=False,
        seed=4,
    )
    root = write_study(tmp_path / "s", spec)
    assert cli.main(_parse([str(root), "--figures-only"])) == 2  # nothing to redraw yet
    assert cli.main(_parse([str(root), "--quiet"])) == 0
    assert cli.main(_parse([str(root), "--figures-only"])) == 0
    figs = root / "analysis" / "figures"
    assert (figs / "fig1_ttft_p90_vs_rate.png").is_file()
    skipped = json.loads((figs / "skipped.json").read_text())
    assert "fig6_step_latency_cdf" in skipped
    assert cli.main(_parse([str(root), "--report-only"])) == 0  # the report names what was skipped
    assert "fig6_step_latency_cdf" in (root / "analysis" / "report.md").read_text()
