"""Per-thread CPU of a server's processes: the sampler (metrics/threads.py) on real processes, and
its analysis (analysis/thread_cpu.py): a thread that spins while the server is idle shows up by
itself, named, with the core it ran on, beside plain's threads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from connector_tax.analysis import thread_cpu as analysis
from connector_tax.metrics.threads import ThreadSampler, record_idle, sample_tree

# A parent that starts a child; the child runs a named thread that spins and one that sleeps.
SERVER = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    if sys.argv[1] == "parent":
        child = subprocess.Popen([sys.executable, __file__, "child"])
        print("ready", flush=True)
        child.wait()
    else:
        import ctypes
        libc = ctypes.CDLL(None)
        def spin():
            libc.prctl(15, b"spinner", 0, 0, 0)  # PR_SET_NAME: the thread's name in /proc
            while True:
                pass
        threading.Thread(target=spin, daemon=True).start()
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
        time.sleep(600)
    """
)


@pytest.fixture
def server(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    proc = subprocess.Popen([sys.executable, str(script), "parent"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    import psutil

    deadline = time.monotonic() + 30  # the child and its threads start (slowly on a loaded host)
    while time.monotonic() < deadline:
        children = psutil.Process(proc.pid).children()
        if children and len(children[0].threads()) >= 3:
            break
        time.sleep(0.05)
    time.sleep(0.2)  # the thread names are set right after the threads start
    yield proc

    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def test_the_sampler_sees_every_thread_of_the_tree_with_its_time_and_core(server, tmp_path):
    snap = sample_tree(server.pid, labels={})
    assert len(snap.procs) == 2 and snap.procs[0].pid == server.pid
    child = snap.procs[1]
    names = {t.name for t in child.threads}
    assert "spinner" in names and len(child.threads) == 3
    assert all(isinstance(t.core, int) and t.user >= 0 for t in child.threads)
    out = tmp_path / "threads.jsonl"
    spinner_tid = next(t.tid for t in child.threads if t.name == "spinner")
    with ThreadSampler(server.pid, out, interval_s=0.25, labels=lambda: {str(spinner_tid): "TestConnector worker"}):
        time.sleep(1.2)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) >= 5 and all(line["clk_tck"] > 0 for line in lines)
    use = analysis.usage(out)
    top = use["threads"][0]
    assert top["thread"] == "spinner" and top["started_by"] == "TestConnector worker" and not top["main"]
    assert top["process"].startswith("python")  # neither the root (API server) nor a vLLM process name
    assert analysis.label(top).endswith(f"(tid {top['tid']}, started by TestConnector worker)")
    sleeper = [t for t in use["threads"] if t["pid"] == child.pid and t["thread"] != "spinner"]
    assert all(t["cpu_pct"] < 5 for t in sleeper)
    # How much CPU the spinner gets depends on the host's load (40-90 % alone, 7 % at load 13):
    # judged against its sleeping siblings in the same window, not against a fixed share.
    assert top["cpu_pct"] > 0 and all(top["cpu_pct"] >= 5 * t["cpu_pct"] for t in sleeper), use["threads"][:3]


def test_an_idle_window_is_written_whole_or_not_at_all(server, tmp_path):
    path = tmp_path / "threads_idle.jsonl"
    n = record_idle(server.pid, path, 0.6, 0.2, dict)
    assert path.is_file() and not (tmp_path / "threads_idle.jsonl.tmp").exists()
    assert n == len(path.read_text().splitlines()) >= 3


def test_a_gone_server_is_a_line_that_says_so(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    snap = sample_tree(proc.pid)
    assert snap.procs == [] and snap.error


def _sample(t_ns: int, procs: list[tuple[int, str, list[tuple[int, str, int, int]]]]) -> dict:
    return {
        "t_ns": t_ns,
        "clk_tck": 100,
        "procs": [
            {
                "pid": pid,
                "ppid": 1,
                "name": name,
                "cpus": [0, 1] if name == "vllm" else [1],
                "threads": [
                    {"tid": tid, "name": tname, "user": ticks, "system": 0, "core": core}
                    for tid, tname, ticks, core in threads
                ],
            }
            for pid, name, threads in procs
        ],
    }


def _write(path: Path, samples: list[dict]) -> None:
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))


def _study(tmp_path: Path, spinner: bool) -> SimpleNamespace:
    """Two configurations' Phase A launches: plain and nixl_both (with a spinning thread)."""
    runs = {}
    for name in ("plain", "nixl_both"):
        folder = tmp_path / name / "phase_a"
        folder.mkdir(parents=True)
        busy = spinner and name == "nixl_both"
        extra = [(40, "VLLM::Worker", 0 if not busy else 100, 1)]
        _write(
            folder / "threads_idle.jsonl",
            [
                _sample(0, [(10, "vllm", [(10, "vllm", 0, 0)]), (30, "VLLM::Worker", [(30, "VLLM::Worker", 0, 1)])]),
                _sample(
                    3_000_000_000,
                    [
                        (10, "vllm", [(10, "vllm", 3, 0)]),
                        (
                            30,
                            "VLLM::Worker",
                            [(30, "VLLM::Worker", 6, 1), *[(t, n, v + 200, c) for t, n, v, c in extra]],
                        ),
                    ],
                ),
            ],
        )
        cell_path = folder / "threads_phase_a_r2.jsonl"
        _write(
            cell_path,
            [
                _sample(0, [(30, "VLLM::Worker", [(30, "VLLM::Worker", 0, 1)])]),
                _sample(2_000_000_000, [(30, "VLLM::Worker", [(30, "VLLM::Worker", 150, 1)])]),
            ],
        )
        if busy:  # the spinner was started by the connector's constructor (step-timing report)
            lines = [json.loads(x) for x in (folder / "threads_idle.jsonl").read_text().splitlines()]
            for s in lines:
                for p in s["procs"]:
                    for t in p["threads"]:
                        if t["tid"] == 40:
                            t["started_by"] = "NixlConnector worker"
            _write(folder / "threads_idle.jsonl", lines)
        cell = SimpleNamespace(rate=2.0, key="phase_a/r2", has=lambda kind: True, path=lambda kind, p=cell_path: p)
        runs[name] = SimpleNamespace(folder=folder, run={"idle_threads": {"file": "threads_idle.jsonl"}}, cells=[cell])
    return SimpleNamespace(variants=["plain", "nixl_both"], run_of=lambda name, phase: runs.get(name))


def test_a_thread_busy_at_idle_that_plain_lacks_is_named_in_the_report(tmp_path):
    tables = analysis.thread_tables(_study(tmp_path, spinner=True), {"ref_safe": 2.0})
    nixl = tables["variants"]["nixl_both"]
    assert nixl["load_cell"] == "phase_a/r2"
    top = nixl["idle"]["threads"][0]
    assert top["started_by"] == "NixlConnector worker" and top["cores"] == [1]
    (extra,) = tables["busy_beyond_plain"]["nixl_both"]
    assert extra["tid"] == 40 and extra["cpu_pct"] >= analysis.BUSY_PCT
    text = "\n".join(analysis.render(tables, ["plain", "nixl_both"]))
    assert "## Where the server's CPU goes" in text
    assert "Worker / VLLM::Worker (tid 40, started by NixlConnector worker)" in text
    assert "while the server is idle (plain has no such thread), on core(s) 1" in text
    assert text.index("| `plain` |") < text.index("| `nixl_both` |")  # plain's first, beside the others


def test_without_a_spinner_nothing_is_called_out(tmp_path):
    tables = analysis.thread_tables(_study(tmp_path, spinner=False), {"ref_safe": 2.0})
    assert tables["busy_beyond_plain"] == {}
    assert tables["variants"]["plain"]["load"]["threads"][0]["cpu_pct"] == 75.0  # 150 ticks over 2 s


def test_a_sidecars_threads_are_its_own_row_apart_from_the_servers_total(tmp_path):
    """An LMCache MP server beside vLLM (a sidecar, started before it: a lower pid): its processes
    are marked in the samples, named `sidecar <name>` and totalled apart; vLLM's root stays the API server."""
    folder = tmp_path / "lmcache_only" / "phase_a"
    folder.mkdir(parents=True)
    samples = [
        _sample(
            t,
            [(20, "vllm", [(20, "vllm", ticks, 0)]), (5, "lmcache", [(5, "lmcache", ticks // 2, 1), (6, "zmq", 0, 1)])],
        )
        for t, ticks in ((0, 0), (2_000_000_000, 100))
    ]
    for s in samples:
        s["procs"][1]["sidecar"] = "lmcache_server"
    _write(folder / "threads_idle.jsonl", samples)
    use = analysis.usage(folder / "threads_idle.jsonl")
    roles = {t["tid"]: t["process"] for t in use["threads"]}
    assert roles == {20: "API server", 5: "sidecar lmcache_server", 6: "sidecar lmcache_server"}
    assert use["total_pct"] == 50.0  # vLLM's processes alone
    assert use["sidecars"]["lmcache_server"]["total_pct"] == 25.0
    assert use["sidecars"]["lmcache_server"]["busiest"]["tid"] == 5
    run = SimpleNamespace(folder=folder, run={"idle_threads": {"file": "threads_idle.jsonl"}}, cells=[])
    study = SimpleNamespace(variants=["lmcache_only"], run_of=lambda name, phase: run)
    text = "\n".join(analysis.render(analysis.thread_tables(study, {}), ["lmcache_only"]))
    assert "| `lmcache_only` | idle window | 50% over 2 s | lmcache_server **25.0%** (lmcache 25.0%) |" in text


def test_the_sampler_marks_a_sidecars_processes(server, tmp_path):
    side = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        line = sample_tree(server.pid, {}, {side.pid: "lmcache_server"})
        marked = [p for p in line.procs if p.sidecar == "lmcache_server"]
        assert [p.pid for p in marked] == [side.pid]
        assert len([p for p in line.procs if p.sidecar is None]) == 2  # the server and its child
    finally:
        side.kill()
        side.wait()
