"""A duet against `ctax sim` servers: two served side by side, driven by one generator with the same
requests at the same times, each target's cell in its own folder; one side that stalls, or dies
mid-cell, leaves the other's cell whole; the paired placement; and `ctax bench` with two `--url`.
Without servers (what each worker is handed, exactly): tests/unit/test_loadgen_duet.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import psutil
import pytest
from loadgen_common import SHAPE, by_index, options
from sim_server import MODEL, REPO, SimProcess, launch

from connector_tax.config import Cell
from connector_tax.contract.summary import to_builtins
from connector_tax.loadgen.schedule.session import LoadGenerator
from connector_tax.loadgen.stats.request_file import read_records


def run_duet(gen: LoadGenerator, root: Path, label: str, **kw: object) -> list[tuple[dict, list[dict]]]:
    """One cell on both targets: (summary, records by index) of each, target 0 first."""
    cell = Cell(**{"phase": "s", "label": label, "shape": SHAPE, "warmup_s": 0.0, **kw})  # type: ignore[arg-type]
    dirs = [root / label / "baseline", root / label / "variant"]
    for d in dirs:
        d.mkdir(parents=True)
    summaries = gen.run_duet_cell(cell, dirs)
    sides = []
    for summary, d in zip(summaries, dirs, strict=True):
        # Each folder holds an ordinary cell: the usual files, by the usual names.
        assert sorted(p.name for p in d.iterdir()) == [f"requests_s_{label}.jsonl", f"summary_s_{label}.json"]
        records = [msgspec.structs.asdict(r) for r in read_records(d / f"requests_s_{label}.jsonl")]
        sides.append((to_builtins(summary), by_index(records)))
    return sides


def paired(a: list[dict], b: list[dict]) -> None:
    """Both targets were sent the same requests, each at the same scheduled time."""
    keys = ("request_id", "t_scheduled_ns", "input_len", "output_len", "warmup")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


def _gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_both_targets_get_the_same_requests_at_the_same_times(sims: dict[str, SimProcess], tmp_path: Path) -> None:
    plain, twin = sims["plain"], sims["twin"]
    with LoadGenerator(options(plain.url, other_urls=(twin.url,))) as g:
        (s0, r0), (s1, r1) = run_duet(g, tmp_path, "duet", arrival="poisson", rate=30.0, duration_s=0.8, seed=77)
        assert [p.issued for p in g.progresses] == [len(r0), len(r1)]
    assert len(r0) >= 8
    paired(r0, r1)
    for summary, records, worker in ((s0, r0, 0), (s1, r1, 1)):
        assert all(r["status"] == "ok" and r["worker"] == worker for r in records)
        assert summary["counts"]["ok"] == len(records) and summary["cell_id"] == s0["cell_id"]
        assert set(summary["cpu_frac"]) == {"main", f"worker{worker}"}
        # Each server counted the cell's own shape: its usage checks passed.
        checks = {c["name"]: c["passed"] for c in summary["validity"]["checks"]}
        assert summary["usage"]["status"] == "checked"
        assert checks["prompt_tokens_off"] and checks["completion_tokens_off"]
        assert summary["lateness_us"]["n"] == len(records)  # lateness per target, over its own sends
    # Each server saw exactly its target's requests, with the cell's prompt length.
    for sim, records in ((plain, r0), (twin, r1)):
        seen = {x["request_id"]: x for x in sim.request_records() if x["request_id"].startswith("s_duet-")}
        assert sorted(seen) == sorted(r["request_id"] for r in records)
        assert {x["prompt_tokens"] for x in seen.values()} == {SHAPE["input"]}
    # Each copy left its worker on its own: both near the scheduled time, neither waiting on the other.
    late = [abs(a["t_send_ns"] - b["t_send_ns"]) / 1e6 for a, b in zip(r0, r1)]
    assert sorted(late)[len(late) // 2] < 5.0, late


def test_a_stalled_target_drops_its_own_and_holds_the_cell_to_min_completed(
    sims: dict[str, SimProcess], tmp_path: Path
) -> None:
    """The hung server stalls every stream: its 2 requests fill its in-flight cap and the rest are
    dropped on it alone, while the plain one is sent and answers every one; min-completed is the
    whole cell's, so it runs past its floor to its hard end waiting for the hung side."""
    opts = options(
        sims["plain"].url, other_urls=(sims["hang"].url,), inflight_cap=2, drain_timeout_s=0.3, drain_s_per_token=0.0
    )
    with LoadGenerator(opts) as g:
        pids = g.pool.pids()
        (s0, r0), (s1, r1) = run_duet(
            g, tmp_path, "stall", arrival="fixed", rate=5.0, duration_s=0.3, min_completed=2, max_duration_s=1.1
        )
    assert _gone(pids)  # no worker outlives the generator
    paired(r0, r1)
    assert len(r0) == 6  # 0, 0.2, ... 1.0 s: to the hard end, not the 0.3 s floor
    assert [r["status"] for r in r0] == ["ok"] * 6 and s0["counts"]["dropped"] == 0
    assert [r["status"] for r in r1] == ["timeout"] * 2 + ["dropped"] * 4
    assert all(r["error"] == "in-flight cap reached" and r["t_send_ns"] is None for r in r1[2:])
    assert all(r["error"].startswith("drain timeout") and r["chunks"] >= 1 for r in r1[:2])
    assert s0["extended"] and s1["extended"]
    assert "min_completed_shortfall 2.0 > 0" in s1["validity"]["reasons"]


def test_a_target_that_dies_mid_cell_leaves_the_others_records_whole(
    sims: dict[str, SimProcess], tmp_path: Path
) -> None:
    victim = launch(tmp_path / "victim", connector="plain", name="victim")
    try:
        victim.wait_ready()
        with LoadGenerator(options(sims["plain"].url, other_urls=(victim.url,), timeout_s=2.0)) as g:
            pids = g.pool.pids()
            killer = threading.Timer(0.5, lambda: os.kill(victim.proc.pid, signal.SIGKILL))
            killer.start()
            try:
                (s0, r0), (s1, r1) = run_duet(g, tmp_path, "dies", arrival="fixed", rate=10.0, duration_s=1.2)
            finally:
                killer.cancel()
        assert _gone(pids)
    finally:
        victim.stop()
    paired(r0, r1)
    assert len(r0) == 12
    assert [r["status"] for r in r0] == ["ok"] * 12 and s0["counts"]["ok"] == 12
    # The dead server's requests: every one recorded, once, with what became of it.
    statuses = [r["status"] for r in r1]
    assert statuses[0] == "ok" and statuses[-1] == "error", statuses
    assert set(statuses) <= {"ok", "error", "timeout"}
    failed = [r for r in r1 if r["status"] != "ok"]
    assert all(r["error"] for r in failed)
    assert s1["counts"]["error"] + s1["counts"]["timeout"] == len(failed)
    assert any(reason.startswith("error_frac") for reason in s1["validity"]["reasons"])


def test_a_closed_loop_duet_keeps_both_targets_in_step(sims: dict[str, SimProcess], tmp_path: Path) -> None:
    with LoadGenerator(options(sims["plain"].url, other_urls=(sims["twin"].url,))) as g:
        (_, r0), (_, r1) = run_duet(g, tmp_path, "closed", arrival="concurrency", concurrency=2, duration_s=0.5)
    paired(r0, r1)
    assert len(r0) >= 4 and all(r["status"] == "ok" for r in r0 + r1)
    # A place frees when both copies have ended: never more than 2 pairs open at a request's time.
    ends = [max(a["t_last_token_ns"], b["t_last_token_ns"]) for a, b in zip(r0, r1)]
    for k, r in enumerate(r0):
        assert sum(1 for j in range(k) if ends[j] > r["t_scheduled_ns"]) <= 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a duet's CPU sets need two CPUs")
def test_paired_placement_pins_each_side_and_floats_the_main_process(sims: dict[str, SimProcess]) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    sets = ((cpus[0],), (cpus[1],))
    before = os.sched_getaffinity(0)
    opts = options(sims["plain"].url, other_urls=(sims["twin"].url,), affinity=True, target_cpus=sets)
    with LoadGenerator(opts) as g:
        assert g.pool.plan is not None and g.pool.plan.note.startswith("paired: ")
        assert os.sched_getaffinity(0) == set(cpus)  # the main process floats
        for k, pid in enumerate(g.pool.pids()):
            # Every thread of worker k (its loop and ZMQ's I/O thread) in target k's set.
            tids = [t.id for t in psutil.Process(pid).threads()]
            assert len(tids) >= 2 and {frozenset(os.sched_getaffinity(t)) for t in tids} == {frozenset(sets[k])}
    assert os.sched_getaffinity(0) == before


LINE = re.compile(r"(?P<cell>\S+)@target(?P<t>\d): ok=(?P<ok>\d+) err=0 timeout=0 dropped=0 .+ \[(valid|INVALID: .+)\]")


def test_ctax_bench_drives_two_servers_side_by_side(sims: dict[str, SimProcess], tmp_path: Path) -> None:
    out = tmp_path / "bench"
    urls = [sims["plain"].url, sims["twin"].url]
    cmd = [sys.executable, "-m", "connector_tax.cli", "bench", "--url", urls[0], "--url", urls[1], "--model", MODEL]
    cmd += ["--rates", "20,30", "--duration", "1.2", "--warmup", "0", "--input-len", "64", "--output-len", "8"]
    cmd += ["--no-affinity", "--cpu-latency-us", "off", "--phase", "duet", "--seed", "5", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)  # a bail-out
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.splitlines()
    matches = [LINE.fullmatch(line) for line in lines]
    assert all(matches) and len(lines) == 4, proc.stdout
    assert [(m["cell"], m["t"]) for m in matches if m] == [
        ("r20-64x8", "0"),
        ("r20-64x8", "1"),
        ("r30-64x8", "0"),
        ("r30-64x8", "1"),
    ]
    for t, url in enumerate(urls):
        assert f"ctax bench: target{t} {url} -> {out / f'target{t}'}" in proc.stderr.splitlines()
    assert sorted(p.name for p in out.iterdir()) == ["target0", "target1"]
    for cell in ("r20-64x8", "r30-64x8"):
        sides = [
            by_index(
                [msgspec.structs.asdict(r) for r in read_records(out / f"target{t}" / f"requests_duet_{cell}.jsonl")]
            )
            for t in range(2)
        ]
        paired(*sides)
        assert all(r["status"] == "ok" for side in sides for r in side)
        assert (out / "target1" / f"summary_duet_{cell}.json").is_file()
    # Off a terminal, a line a second or so: each names both targets.
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert progress and all(" | target1 issued=" in line for line in progress), proc.stderr
