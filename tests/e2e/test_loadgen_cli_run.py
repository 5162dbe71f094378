"""`ctax bench` against `ctax sim`, end to end: one summary line per cell, its files, plain progress
lines off a terminal."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))


from sim_server import MODEL, REPO, ran, running_sim  # noqa: E402

from connector_tax.loadgen.stats.records import read_records  # noqa: E402

NUM = r"\d+(?:\.\d+)?"


SUMMARY_LINE = re.compile(
    rf"(?P<cell>\S+): ok=(?P<ok>\d+) err=(?P<err>\d+) timeout=(?P<timeout>\d+) dropped=(?P<dropped>\d+) "
    rf"achieved=(?P<achieved>{NUM})/s TTFT p50/p90/p99=(?P<ttft>{NUM})/{NUM}/{NUM} ms "
    rf"TPOT p50/p90={NUM}/{NUM} ms lateness p99=(?P<late>{NUM}) us "
    rf"server tokens in/out=(?P<tokens>\d+/\d+|-/-|unchecked \(no usage\)) \[(?P<valid>valid|INVALID: .+)\]"
)


PROGRESS_LINE = re.compile(r"\[(?P<cell>\S+)\] issued=\d+ completed=\d+ in_flight=\d+ ttft_p50_ms=(\d+\.\d|-)")


@pytest.mark.e2e  # a simulated server and a whole cell through ctax bench: seconds
def test_bench_against_the_sim(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    with running_sim(tmp_path / "sim", connector="plain") as sim:
        cmd = [
            sys.executable,
            "-m",
            "connector_tax.cli",
            "bench",
            "--url",
            sim.url,
            "--model",
            MODEL,
            "--rates",
            "20,40",
            "--duration",
            "1.3",
            "--warmup",
            "0",
            "--input-len",
            "64",
            "--output-len",
            "8",
            "--no-affinity",
            "--cpu-latency-us",
            "off",
            "--phase",
            "cli",
            "--seed",
            "3",
            "--out",
            str(out),
        ]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)  # a bail-out
    assert ran(proc), proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    cells = ["r20-64x8", "r40-64x8"]
    for line, cell in zip(lines, cells):
        m = SUMMARY_LINE.fullmatch(line)
        assert m, line
        summary = json.loads((out / f"summary_cli_{cell}.json").read_text())
        records = read_records(out / f"requests_cli_{cell}.jsonl")
        assert m["cell"] == cell == summary["cell"]
        assert int(m["ok"]) == summary["counts"]["ok"] == len(records) > 0
        assert (m["err"], m["timeout"], m["dropped"]) == ("0", "0", "0")
        assert float(m["ttft"]) == pytest.approx(summary["latency_ms"]["ttft"]["p50"], abs=0.005)
        assert summary["rate"] == float(cell[1:3])
        assert summary["cpu_latency"] == {"requested_us": None, "held": False, "detail": "not requested"}
        assert all(r.status == "ok" and r.prompt_tokens == 64 for r in records)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{kind}_cli_{cell}.{ext}" for cell in cells for kind, ext in (("requests", "jsonl"), ("summary", "json"))
    )
    # Not a terminal: plain progress lines only (no bar, no carriage returns), at least one per cell.
    err_lines = proc.stderr.splitlines()
    assert "\r" not in proc.stderr
    assert all(PROGRESS_LINE.fullmatch(line) for line in err_lines), proc.stderr
    assert {PROGRESS_LINE.fullmatch(line)["cell"] for line in err_lines} == set(cells)
