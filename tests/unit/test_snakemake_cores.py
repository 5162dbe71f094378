"""`snakemake --cores 1` runs one job at a time: the study's numbers assume it.

Snakemake 9.13 to 9.16 (those checked) do not charge a job's cores when it was the only one
ready (a shortcut in the scheduler's job selection) yet give them back when it ends, so after the
first such job `--cores 1` runs jobs side by side: on the CPU study, four vLLM servers at once on
two cores and every cell measured beside the others. pyproject pins snakemake >= 9.17; this test
fails on an environment that has an affected snakemake anyway.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# One job ready alone (the shortcut), then three ready together: each writes when it ran.
SNAKEFILE = """
rule all:
    input: expand("after_{i}.txt", i=range(3))

rule first:
    output: "first.txt"
    shell: "touch {output}"

rule after:
    input: "first.txt"
    output: "after_{i}.txt"
    shell: "python3 -c 'import time; t = time.time(); time.sleep(0.5); print(t, time.time())' > {output}"
"""


def test_cores_1_runs_one_job_at_a_time(tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--quiet", "all"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    spans = sorted(tuple(map(float, (tmp_path / f"after_{i}.txt").read_text().split())) for i in range(3))
    overlaps = [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]
    assert overlaps == [], f"jobs ran side by side under --cores 1 (snakemake {_version()}): {overlaps}"


def _version() -> str:
    return subprocess.run(
        [sys.executable, "-c", "import snakemake; print(snakemake.__version__)"], capture_output=True, text=True
    ).stdout.strip()


# Eight GPU jobs of six threads each, as a vLLM phase job declares (planning.time_estimate.job_threads):
# each writes when it ran.
GPU_SNAKEFILE = """
rule all:
    input: expand("job_{i}.txt", i=range(8))

rule job:
    output: "job_{i}.txt"
    threads: 6
    resources: gpu=1
    shell: "python3 -c 'import time; t = time.time(); time.sleep(1.5); print(t, time.time())' > {output}"
"""


def _most_at_once(folder: Path, n: int) -> int:
    spans = [tuple(map(float, (folder / f"job_{i}.txt").read_text().split())) for i in range(n)]
    return max(sum(s[0] <= t < s[1] for s in spans) for t, _ in spans)


def test_the_command_ctax_plan_prints_runs_one_job_per_gpu(tmp_path: Path) -> None:
    """`--cores 8 --resources gpu=8` (what the docs used to say) runs six-thread GPU jobs one at a
    time; the command `ctax plan --gpus 8` prints for the H20 study runs eight at once."""
    plan = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "plan", "--config", "configs/h20-qwen3-coder.yaml", "--gpus", "8"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert plan.returncode == 0, plan.stderr
    command = next(line.split() for line in plan.stdout.splitlines() if line.strip().startswith("snakemake "))
    assert command[:6] == ["snakemake", "all", "--cores", "48", "--resources", "gpu=8"]
    for cores, expected in (("8", 1), (command[3], 8)):
        folder = tmp_path / cores
        folder.mkdir()
        (folder / "Snakefile").write_text(GPU_SNAKEFILE)
        out = subprocess.run(
            [sys.executable, "-m", "snakemake", "all", "--cores", cores, "--resources", "gpu=8", "--quiet"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert _most_at_once(folder, 8) == expected, f"--cores {cores}"


def test_a_target_after_resources_is_read_as_a_resource(tmp_path: Path) -> None:
    """Why the command puts `all` first: the docs' old `--resources gpu=8 all --configfile ...`
    does not parse on Snakemake 9 (--resources takes every word up to the next option)."""
    (tmp_path / "Snakefile").write_text(GPU_SNAKEFILE)
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "8", "--resources", "gpu=8", "all", "-n"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "dictionary update sequence element" in out.stderr
