"""`ctax bench` against `ctax sim`, end to end: one summary line per cell, its files, plain progress
lines off a terminal."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))


from sim_server import MODEL, REPO, poll, ran, running_sim  # noqa: E402

from connector_tax.loadgen.stats.request_file import read_records  # noqa: E402

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


def _bench(url: str, out: Path, tmp: Path, duration: float) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "connector_tax.cli", "bench", "--url", url, "--model", MODEL, "--rates", "20"]
    cmd += ["--duration", str(duration), "--warmup", "0", "--input-len", "64", "--output-len", "8"]
    cmd += ["--no-affinity", "--cpu-latency-us", "off", "--out", str(out)]
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.e2e  # two generators killed outright and one run to its end: ~15 s
def test_a_killed_generators_socket_folder_goes_with_the_next_run(tmp_path: Path) -> None:
    """SIGKILL runs no exit path, so a killed generator leaves its IPC folder in $TMPDIR; the next
    generator removes such a folder once it is an hour old (its pid dead), and leaves a young one,
    whose pid a process in another PID namespace may still own. No worker outlives a kill.
    A short $TMPDIR of its own: under pytest's deeper folders the generator would fall back to /tmp."""
    tmp = Path(tempfile.mkdtemp(prefix="ctax-t-", dir="/tmp"))
    try:
        _sweep_after_kills(tmp_path, tmp)
    finally:
        for orphan in _spawned_with(tmp):
            orphan.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _worker_started(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return any("spawn_main" in " ".join(c.cmdline()) for c in psutil.Process(pid).children())
    return False


def _spawned_with(tmp: Path) -> list[psutil.Process]:
    """Live processes whose $TMPDIR is `tmp`: the generators started here and their workers."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get("TMPDIR") == str(tmp) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
    return found


def _sweep_after_kills(tmp_path: Path, tmp: Path) -> None:
    with running_sim(tmp_path / "sim", connector="plain") as sim:
        assert sim.url is not None
        left = []
        for k in range(2):
            proc = _bench(sim.url, tmp_path / f"killed{k}", tmp, 60)
            try:
                mine = poll(lambda proc=proc: list(tmp.glob(f"ctax-loadgen-{proc.pid}-*")))
                assert poll(lambda proc=proc: _worker_started(proc.pid)), "no worker started"
            finally:
                proc.kill()
            # Killed as its first worker starts, before that has armed its death signal: none outlives
            # it (they hold its output pipes; a worker that missed the signal used to live for ever).
            assert poll(lambda: not _spawned_with(tmp), timeout=30), _spawned_with(tmp)
            proc.communicate(timeout=10)
            left.append(mine[0])
        assert all(p.is_dir() for p in left)  # the leak the sweep is for
        old = time.time() - 2 * 3600
        os.utime(left[0], (old, old))
        done = _bench(sim.url, tmp_path / "done", tmp, 0.5)
        stdout, stderr = done.communicate(timeout=300)  # a bail-out
    # ran to its end (exit 1: a cell judged invalid, by its lateness on a loaded host)
    assert done.returncode in (0, 1) and stdout.startswith("r20-64x8: ok="), stdout + stderr
    assert sorted(tmp.iterdir()) == [left[1]]  # the old one swept, its own removed on close
