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
