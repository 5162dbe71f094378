"""Every command the README shows, typed as a user types it, from the top of a fresh clone.

A clone is the checkout's tracked files copied into an empty folder (no results/, no .snakemake/,
no venv). Quick start 1 runs verbatim (it makes the clone's own venv and runs the default study);
the other front-door commands run in that venv, from the clone's top, with the arguments the
README gives. Commands that need what this host lacks (a GPU, vLLM's CPU environment for a
25-minute study) are listed with the test or CI stage that runs them instead; a README command
that is in neither list fails the fast tier (tests/unit/test_frontdoor_readme.py), so the README
cannot grow a command nobody runs.

The HTML of `snakemake --report` is opened in headless Chromium (the system's package, driven by
Playwright) and every figure is shown: each one's image decoded with a non-zero size, and a
screenshot of it that is not blank. Marker `frontdoor`: `pytest -m frontdoor` (.ci/run's stage).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

# README commands this tier runs (the test that runs each is named).
RUN_HERE = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && snakemake --cores 1 all": "quick start 1",
    "ctax plan --config configs/h20-qwen3-coder.yaml --gpus 8 --predict": "the GPU plan",
    "snakemake --cores 1 phase_a": "one stage",
    "snakemake --cores 1 phase_a_mooncake_both": "one stage",
    "snakemake --cores 1 figures --forcerun figures --allowed-rules figures": "figures again",
    "snakemake -n --cores 1 all --configfile FILE": "config checks",
    "ctax config check FILE": "config checks",
    "ctax config check configs/h20-qwen3-coder.yaml": "config checks (a refusal here: the model is not downloaded)",
    "snakemake --report report.html": "the HTML report",
}


# --------------------------------------------------------------------------- a clone


def _copy_tracked(dest: Path) -> Path:
    """The checkout's tracked files as they are now (what a clone of this commit would hold)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no clone to make")
    for name in listed.stdout.decode().split("\0"):
        src = REPO / name
        if name and (src.is_file() or src.is_symlink()):
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                target.symlink_to(os.readlink(src))
            else:
                shutil.copy2(src, target)
    return dest


def _env(venv: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "CONNECTOR_TAX_ROOT")}
    path = env.get("PATH", "")
    if venv is not None:  # as after `. .venv/bin/activate`
        env["VIRTUAL_ENV"] = str(venv)
        path = f"{venv / 'bin'}:{path}"
    else:  # `python3` as a user's shell finds it: this interpreter's, not a venv's own pip
        path = f"{Path(sys.executable).parent}:{path}"
    env["PATH"] = path
    return env


def typed(command: str, cwd: Path, venv: Path | None, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """The command as a user types it into bash, at the clone's top."""
    result = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=_env(venv), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (
        f"`{command}` exited {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    )
    return result


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone that ran quick start 1 verbatim: its own venv, the default study."""
    top = _copy_tracked(tmp_path_factory.mktemp("frontdoor") / "connector-tax")
    command = next(c for c, why in RUN_HERE.items() if why == "quick start 1")
    typed(command, top, venv=None, timeout=3600)
    return top


@pytest.mark.frontdoor
def test_quick_start_1_leaves_the_study_the_readme_names(clone):
    results = clone / "results" / "default"
    report = (results / "analysis" / "report.md").read_text()
    assert "simulated" in report.lower()
    figures = sorted(p.name for p in (results / "analysis" / "figures").glob("*.png"))
    assert len(figures) >= 8, figures
    for name in ("aggregate.parquet", "taxes.parquet", "aggregate.csv", "taxes.csv"):
        assert (results / "analysis" / name).stat().st_size > 0, name
    assert "simulated" in (results / "MANIFEST.md").read_text().lower()


@pytest.mark.frontdoor
def test_the_plan_foretold_the_default_study(clone, tmp_path):
    """`ctax plan` of the default config where no study ran yet (no measured cell to lean on)
    against what quick start 1's preflights and phase jobs took (Snakemake's benchmark records):
    within 20 % (8.1 min planned against about 5 min before the simulator had its own overheads)."""
    plan = typed(f"ctax plan --config {clone / 'configs' / 'default.yaml'}", tmp_path, clone / ".venv")
    stages = dict(
        re.findall(r"(\w+) ([\d.]+) min", plan.stdout.split("per stage, one job at a time: ")[1].split("\n")[0])
    )
    planned = 60 * sum(float(stages[s]) for s in ("preflight", "phase_a", "phase_b"))
    benchmarks = (clone / "results" / "default" / "logs" / "benchmarks").glob("*.tsv")
    took = sum(float(p.read_text().splitlines()[1].split("\t")[0]) for p in benchmarks)
    assert abs(planned / took - 1) <= 0.20, f"planned {planned:.0f} s, the jobs took {took:.0f} s\n{plan.stdout}"


@pytest.mark.frontdoor
def test_figures_again_launch_nothing(clone):
    figures = clone / "results" / "default" / "analysis" / "figures"
    before = {p.name: p.stat().st_mtime_ns for p in figures.glob("*.png")}
    result = typed("snakemake --cores 1 figures --forcerun figures --allowed-rules figures", clone, clone / ".venv")
    ran = set(re.findall(r"^(?:rule|localrule|checkpoint) (\w+):", result.stdout + result.stderr, flags=re.M))
    assert ran == {"figures"}, ran
    after = {p.name: p.stat().st_mtime_ns for p in figures.glob("*.png")}
    assert after.keys() == before.keys() and all(after[k] > before[k] for k in before)


@pytest.mark.frontdoor
def test_config_checks(clone):
    for config in sorted((clone / "configs").glob("*.yaml")):
        rel = config.relative_to(clone)
        out = subprocess.run(
            ["bash", "-c", f"ctax config check {rel}"],
            cwd=clone,
            env=_env(clone / ".venv"),
            capture_output=True,
            text=True,
        )
        if out.returncode == 2:  # a GPU study on a host without its model: refused in one line, naming it
            assert out.stderr.strip().count("\n") == 0 and "model.name" in out.stderr, (rel, out.stderr)
        else:
            assert out.returncode == 0 and out.stdout.strip(), (rel, out.stdout, out.stderr)
    # What a config change will re-measure: the default study with longer cells names every launch.
    config = yaml.safe_load((clone / "configs" / "default.yaml").read_text())
    config["workload"]["duration_s"] += 1.0
    (clone / "longer.yaml").write_text(yaml.safe_dump(config))
    dry = typed("snakemake -n --cores 1 all --configfile longer.yaml", clone, clone / ".venv")
    pending = re.findall(
        r"^connector-tax: (\S+)/phase_a: (\d+) of (\d+) cells to measure", dry.stdout + dry.stderr, flags=re.M
    )
    assert {name for name, _, _ in pending} == {v["name"] for v in config["variants"]}, dry.stdout[-3000:]
    assert all(n == total for _, n, total in pending)
    assert not (clone / "results" / "default" / ".staging").exists()  # a dry run measures nothing


@pytest.mark.frontdoor
def test_the_gpu_plan(clone):
    """Quick start 3's plan and argv, and a dry run of its snakemake command (no GPU here)."""
    plan = typed("ctax plan --config configs/h20-qwen3-coder.yaml --gpus 8 --predict", clone, clone / ".venv")
    assert "GPU" in plan.stdout
    # every configuration's Phase B computed, so each shape's resolution is its variants' paired taxes
    assert "Phase A and Phase B computed in the simulator's virtual time" in plan.stdout
    assert "phase_b 512x64               9 variants, paired with the baseline" in plan.stdout
    assert "(any, at the baseline's cell length)" not in plan.stdout
    argv = typed(
        "ctax launch-command --config configs/h20-qwen3-coder.yaml --variant mooncake_both", clone, clone / ".venv"
    )
    assert "MooncakeConnector" in argv.stdout
    typed(
        "snakemake -n all --cores 48 --resources gpu=8 --configfile configs/h20-qwen3-coder.yaml",
        clone,
        clone / ".venv",
    )


@pytest.mark.frontdoor
def test_one_stage_from_empty(clone, tmp_path):
    """In a second fresh clone (quick start 1's venv): one variant's phase, then the stage."""
    other = _copy_tracked(tmp_path / "connector-tax")
    venv = clone / ".venv"
    typed("snakemake --cores 1 phase_a_mooncake_both", other, venv)
    results = other / "results" / "default"
    measured = sorted(p.parent.parent.name for p in results.glob("*/phase_a/run.json"))
    assert measured == ["mooncake_both"], measured
    typed("snakemake --cores 1 phase_a", other, venv)
    measured = {p.parent.parent.name for p in results.glob("*/phase_a/run.json")}
    config = yaml.safe_load((other / "configs" / "default.yaml").read_text())
    assert measured == {v["name"] for v in config["variants"]}, measured
    assert not list(results.glob("*/phase_b/run.json"))  # the stage, not the study


# --------------------------------------------------------------------------- the HTML report


def _browser():
    playwright = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (pip install -e '.[browser]')"
    )
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CTAX_REQUIRE_BROWSER") == "1":
            pytest.fail("CTAX_REQUIRE_BROWSER=1 and no chromium on PATH (apt-get install chromium)")
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    return playwright, chromium


# Chromium as root, offline: no sandbox, no network services (their connections are refused here).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.mark.frontdoor
def test_the_html_report_shows_every_figure(clone, tmp_path):
    typed("snakemake --report report.html", clone, clone / ".venv")
    html = clone / "report.html"
    assert html.stat().st_size > 100_000
    playwright, chromium = _browser()
    from connector_tax.contract.layout import FIGURES

    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(html.as_uri())
            page.get_by_text("Figures", exact=True).click()
            for name in FIGURES:
                page.locator("tr", has_text=f"{name}.png").locator("a[iconname=eye]").click()
                image = page.locator(f"img[src*='filename={name}.png']")
                image.wait_for(state="visible", timeout=15_000)
                width = image.evaluate("img => img.complete ? img.naturalWidth : 0")
                assert width > 200, f"{name}: its image did not decode (width {width})"
                shot = tmp_path / f"{name}.png"
                image.screenshot(path=str(shot))
                assert _not_blank(shot), f"{name}: the figure shown is blank"
        finally:
            browser.close()


def _not_blank(png: Path) -> bool:
    """More than a few distinct colours: a drawn figure, not an empty frame."""
    from matplotlib.image import imread

    pixels = imread(str(png))
    flat = pixels.reshape(-1, pixels.shape[-1])
    return len({tuple(v) for v in flat[:: max(1, len(flat) // 20000)].round(2).tolist()}) > 20
