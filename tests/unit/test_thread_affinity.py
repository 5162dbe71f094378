"""Where each server thread may run, and who pinned it (issue 65, item 5).

vLLM's NIXL worker on CPU pins the thread that builds it (`rsv_cores_for_kv`); vLLM's OpenMP
binding pins the worker's main thread and every thread it starts. The study reads each thread's own
affinity at every sample (metrics/threads.py), records what the server pinned by the time it is
ready (serving/placement.server_pins, with the instrumentation's note of the thread each connector
was built on), and the report's thread tables say where and by whom (analysis/thread_cpu.py). Here on
real threads of this test process, pinned with os.sched_setaffinity on their native ids."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from connector_tax.analysis import thread_cpu as analysis
from connector_tax.contract.records import ThreadSample
from connector_tax.launch import steptiming
from connector_tax.metrics.threads import ThreadSampler, sample_tree
from connector_tax.serving.placement import server_pins

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # patches/ is imported by dotted path from the repository root
    sys.path.insert(0, str(REPO))

from patches import step_timing  # noqa: E402

ALLOWED = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(ALLOWED) < 2, reason="a thread can be pinned narrower only with 2+ CPUs")


@contextmanager
def pinned_thread(cpus: list[int], name: str = "pinned") -> Iterator[int]:
    """A thread of this process that pins itself to `cpus` and waits; yields its native id."""
    ready, done = threading.Event(), threading.Event()
    tid: list[int] = []

    def run() -> None:
        tid.append(threading.get_native_id())
        os.sched_setaffinity(0, cpus)  # 0: the calling thread (Linux keeps affinity per thread)
        ready.set()
        done.wait(30)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield tid[0]
    finally:
        done.set()
        thread.join(10)


@needs_two
def test_the_sampler_reads_each_threads_own_cpus_not_only_its_processes(tmp_path):
    with pinned_thread([ALLOWED[-1]]) as tid:
        (me,) = [p for p in sample_tree(os.getpid()).procs if p.pid == os.getpid()]
        threads = {t.tid: t for t in me.threads}
        assert threads[tid].cpus == [ALLOWED[-1]]
        assert me.cpus == ALLOWED and threads[os.getpid()].cpus == ALLOWED  # the main thread: unpinned
        out = tmp_path / "threads.jsonl"
        with ThreadSampler(os.getpid(), out, interval_s=0.1):
            pass
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    seen = [t for line in lines for p in line["procs"] for t in p["threads"] if t["tid"] == tid]
    assert seen and all(t["cpus"] == [ALLOWED[-1]] for t in seen)


def test_a_file_from_before_the_field_reads_with_cpus_unknown():
    old = b'{"t_ns":1,"clk_tck":100,"procs":[{"pid":5,"ppid":1,"name":"x","cpus":[0,1],"threads":[{"tid":5,"name":"x","user":1,"system":0,"core":0}]}]}'
    sample = msgspec.json.decode(old, type=ThreadSample)
    assert sample.procs[0].threads[0].cpus is None


@needs_two
def test_a_constructor_that_pins_its_caller_is_named_with_the_cpus_before_and_after(tmp_path):
    """As vLLM's NIXL worker does: create_connector re-pins the thread it runs on. The
    instrumentation notes the building thread's CPUs before and after; the launch reads them; what
    the server pinned by start-up names the constructor."""
    step_log = tmp_path / "steps.jsonl"
    rec = step_timing.StepRecorder(str(step_log))

    class Conn:
        pass

    class KVConnectorFactory:
        @classmethod
        def create_connector(cls, config, role, kv_cache_config):
            os.sched_setaffinity(0, [ALLOWED[0]])  # rsv_cores_for_kv, in vLLM's base_worker.py
            return Conn()

    assert step_timing.hook_factory_class(KVConnectorFactory, rec)
    built, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def worker_main() -> None:
        tids.append(threading.get_native_id())
        KVConnectorFactory.create_connector(None, type("R", (), {"name": "WORKER"}), None)
        built.set()
        done.wait(30)

    thread = threading.Thread(target=worker_main, daemon=True)
    thread.start()
    try:
        assert built.wait(10)
        (entry,) = steptiming.built_on(step_log)
        assert entry == {
            "connector": "Conn worker",
            "pid": os.getpid(),
            "tid": tids[0],
            "cpus_before": ALLOWED,
            "cpus_after": [ALLOWED[0]],
        }
        pins = server_pins(os.getpid(), ALLOWED, [entry])
        (group,) = [g for g in pins["pinned"] if tids[0] in g["tids"]]
        assert group["cpus"] == [ALLOWED[0]] and not group["main"] and pins["launch_cpus"] == ALLOWED
        before, after = "{" + ",".join(map(str, ALLOWED)) + "}", f"{{{ALLOWED[0]}}}"
        line = (
            f"Conn worker built on thread {tids[0]} (pid {os.getpid()}): {before} → {after} (the constructor pinned it)"
        )
        assert line in pins["summary"]
    finally:
        done.set()
        thread.join(10)


@needs_two
def test_what_the_server_pinned_lists_only_threads_narrower_than_its_start(tmp_path):
    with pinned_thread([ALLOWED[-1]]) as tid:
        pins = server_pins(os.getpid(), ALLOWED)
        assert [g["tids"] for g in pins["pinned"]] == [[tid]]
        (line,) = pins["summary"]
        assert line.endswith(f"1 thread(s) on {{{ALLOWED[-1]}}}")
        assert server_pins(os.getpid(), [ALLOWED[-1]])["pinned"] == []  # started there: none narrower
    assert "error" in server_pins(2**22 + 12345, ALLOWED)  # no such server


def _sample(t_ns: int, worker_ticks: int, spinner_cpus: list[int] | None) -> dict:
    spinner = {"tid": 41, "name": "VLLM::Worker", "user": worker_ticks, "system": 0, "core": 1}
    spinner["started_by"] = "NixlPullConnector worker"
    if spinner_cpus is not None:
        spinner["cpus"] = spinner_cpus
    main = {"tid": 30, "name": "VLLM::Worker", "user": t_ns // 40_000_000, "system": 0, "core": 0}
    api = {"tid": 10, "name": "vllm", "user": 1, "system": 0, "core": 0}
    if spinner_cpus is not None:
        main["cpus"], api["cpus"] = [0], [0]
    return {
        "t_ns": t_ns,
        "clk_tck": 100,
        "procs": [
            {"pid": 10, "ppid": 1, "name": "vllm", "cpus": [0], "threads": [api]},
            {"pid": 30, "ppid": 10, "name": "VLLM::Worker", "cpus": [0], "threads": [main, spinner]},
        ],
    }


PLACEMENT = {
    "server_pins": {
        "launch_cpus": [0, 1],
        "pinned": [
            {"pid": 30, "process": "VLLM::Worker", "cpus": [0], "main": True, "tids": [30]},
            {"pid": 30, "process": "VLLM::Worker", "cpus": [1], "main": False, "tids": [41]},
        ],
        "built_on": [
            {"connector": "NixlPullConnector worker", "pid": 30, "tid": 30, "cpus_before": [1], "cpus_after": [0]}
        ],
        "summary": [
            "VLLM::Worker (pid 30): 1 thread(s) on {0}, its main thread among them",
            "VLLM::Worker (pid 30): 1 thread(s) on {1}",
            "NixlPullConnector worker built on thread 30 (pid 30): {1} → {0} (the constructor pinned it)",
        ],
    },
    "server_threads": {"service_cpus": [0], "compute_cpus": [1], "moved": 12},
}


def _study(tmp_path: Path, with_cpus: bool) -> SimpleNamespace:
    folder = tmp_path / "nixl_kv_core_off" / "phase_a"
    folder.mkdir(parents=True)
    cpus = [1] if with_cpus else None
    samples = [_sample(0, 0, cpus), _sample(3_000_000_000, 270, cpus)]
    (folder / "threads_idle.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    run = {"idle_threads": {"file": "threads_idle.jsonl"}, "placement": PLACEMENT if with_cpus else {}}
    runs = {"nixl_kv_core_off": SimpleNamespace(folder=folder, run=run, cells=[])}
    return SimpleNamespace(variants=list(runs), run_of=lambda name, phase: runs.get(name))


def test_the_thread_table_says_which_threads_were_pinned_where_and_by_whom(tmp_path):
    tables = analysis.thread_tables(_study(tmp_path, with_cpus=True), {})
    idle = {t["tid"]: t for t in tables["variants"]["nixl_kv_core_off"]["idle"]["threads"]}
    assert idle[41]["pinned"] == "pinned to {1} by the server at start-up"  # vLLM's OpenMP core, inherited
    assert idle[30]["pinned"] == "pinned to {0} by NixlPullConnector worker"  # the constructor moved it
    assert idle[10]["pinned"] == "pinned to {0} by the study (service cores)"  # moved after start-up
    text = "\n".join(analysis.render(tables, ["nixl_kv_core_off"]))
    assert "(tid 41, started by NixlPullConnector worker) **90%** (1; pinned to {1} by the server at start-up)" in text
    assert "Worker / VLLM::Worker (main thread) **25%** (0; pinned to {0} by NixlPullConnector worker)" in text
    assert "### What the server pinned itself" in text
    assert "- `nixl_kv_core_off`: VLLM::Worker (pid 30): 1 thread(s) on {0}, its main thread among them;" in text
    assert "NixlPullConnector worker built on thread 30 (pid 30): {1} → {0} (the constructor pinned it)." in text


def test_records_from_before_say_nothing_about_pinning(tmp_path):
    tables = analysis.thread_tables(_study(tmp_path, with_cpus=False), {})
    idle = tables["variants"]["nixl_kv_core_off"]["idle"]["threads"]
    assert all(t["pinned"] is None and t["cpus"] is None for t in idle)
    text = "\n".join(analysis.render(tables, ["nixl_kv_core_off"]))
    assert "pinned" not in text.split("### Idle")[1] and "What the server pinned" not in text
