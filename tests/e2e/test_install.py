"""A built package works without its checkout: `pip install .` (not editable) finds the schema,
the default config, the workflow and tools/ and patches/ in the wheel's bundle
(connector_tax/resources.py), and runs `ctax config check`, `ctax sim` and `ctax analyze` of an
existing results folder from a folder that is not the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest
from synthetic_study import SyntheticSpec, write_study

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding the project's wheel; its dependencies come from the test
    environment's site-packages (a plain path: the checkout's editable hook there is not run)."""
    tmp = tmp_path_factory.mktemp("install")
    # Built from a copy of what git tracks: a build in the checkout would leave build/ behind.
    source = tmp / "source"
    tracked = _run(["git", "ls-files", "-z"], REPO).stdout.split("\0")
    for name in filter(None, tracked):
        if (REPO / name).is_file() and not (REPO / name).is_symlink():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    wheels = tmp / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)], tmp, 600)
    assert built.returncode == 0, built.stderr[-3000:]
    venv = tmp / "venv"
    assert _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp).returncode == 0
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("connector_tax-*.whl"))
    done = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        tmp,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def test_the_package_is_the_wheels_not_the_checkouts(installed: Path, tmp_path: Path) -> None:
    probe = _run(
        [
            str(installed / "bin" / "python"),
            "-c",
            "import connector_tax, connector_tax.resources as r; print(connector_tax.__file__); print(r.root())",
        ],
        tmp_path,
    )
    assert probe.returncode == 0, probe.stderr
    package, root = probe.stdout.split()
    assert str(installed) in package and str(REPO) not in package
    assert root.endswith("connector_tax/_bundle") and str(installed) in root


def test_config_check_from_elsewhere(installed: Path, tmp_path: Path) -> None:
    shutil.copy(REPO / "configs" / "test-tiny.yaml", tmp_path / "study.yaml")
    done = _run([str(installed / "bin" / "ctax"), "config", "check", "study.yaml"], tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("ok: study.yaml"), done.stdout + done.stderr
    (tmp_path / "bad.yaml").write_text("study: x\n")
    bad = _run([str(installed / "bin" / "ctax"), "config", "check", "bad.yaml"], tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_sim_serves_the_default_study_from_the_bundle(installed: Path, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    server = subprocess.Popen(
        [str(installed / "bin" / "ctax"), "sim", "--variant", "plain", "--port", "0", "--ready-file", str(ready)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120  # a bail-out: start-up takes seconds on a loaded host
        while not ready.is_file() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.is_file(), server.stderr.read() if server.poll() is not None else "not ready in 120 s"
        url = ready.read_text().split()[-1]
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        server.terminate()
        server.wait(10)


def test_analyze_an_existing_results_folder(installed: Path, tmp_path: Path) -> None:
    root = write_study(
        tmp_path / "results" / "syn",
        SyntheticSpec(variants=["plain", "mooncake_both"], n_requests=120, n_steps=120, seed=5),
    )
    env = {k: v for k, v in os.environ.items() if k != "CONNECTOR_TAX_ROOT"}
    done = subprocess.run(
        [str(installed / "bin" / "ctax"), "analyze", str(root), "--figures"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (root / "analysis" / "report.md").is_file() and (root / "analysis" / "aggregate.parquet").is_file()
    assert (root / "analysis" / "figures" / "fig1_ttft_p90_vs_rate.png").is_file()
