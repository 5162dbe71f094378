"""metrics/host.py: who is the study and who is not, CPU time counted once when processes come
and go between snapshots, the host's bounds, and a real busy process seen as contention."""

from __future__ import annotations

import subprocess
import sys
import time

import msgspec
import psutil
import pytest

from connector_tax.config import default_validity
from connector_tax.metrics.host import HostSampler, Proc, Snapshot, Study, interval, judge, summarize

JOB, SERVER = 100, 200


def _proc(ppid: int, own: float, children: float = 0.0, pgrp: int | None = None, name: str = "p", start: int = 1):
    return Proc(
        ppid=ppid, pgrp=pgrp if pgrp is not None else ppid, name=name, own_s=own, children_s=children, start=start
    )


def _snap(
    t_s: float, procs: dict[int, Proc], busy: float | None = None, steal: float = 0.0, running: int = 1
) -> Snapshot:
    """Both CPUs busy all along unless `busy` says otherwise (it caps what counts as others')."""
    return Snapshot(int(t_s * 1e9), procs, 2.0 * t_s if busy is None else busy, steal, 2, running, None)


# init(1) -> shell(10) -> snakemake(20) -> job(100) -> worker(101); job -> server(200, own group) -> engine(201)
TREE = {
    1: _proc(0, 0.0, name="init"),
    10: _proc(1, 0.0, name="bash"),
    20: _proc(10, 0.0, name="snakemake"),
    JOB: _proc(20, 0.0, name="ctax"),
    101: _proc(JOB, 0.0, pgrp=JOB, name="ctax-worker"),
    SERVER: _proc(JOB, 0.0, pgrp=SERVER, name="ctax-sim"),
    201: _proc(SERVER, 0.0, pgrp=SERVER, name="engine"),
    300: _proc(10, 0.0, name="hog"),  # a sibling of snakemake: not the study
    400: _proc(1, 0.0, pgrp=SERVER, name="daemonized"),  # left its parent, still the server's group
}


def test_classify_the_study_its_server_and_everyone_else() -> None:
    cls = Study(JOB, SERVER).classify(TREE)
    assert cls[JOB] == cls[101] == "loadgen"
    assert cls[SERVER] == cls[201] == cls[400] == "server"
    assert cls[20] == cls[10] == cls[1] == "orchestration"
    assert cls[300] == "others"


def test_an_external_server_found_by_its_port_is_the_servers_not_contention() -> None:
    procs = {**TREE, 500: _proc(1, 0.0, name="vllm"), 501: _proc(500, 0.0, name="vllm-engine")}
    cls = Study(JOB, None, server_pid=500).classify(procs)
    assert cls[500] == cls[501] == "server"


def _with(base: dict[int, Proc], **changes: Proc) -> dict[int, Proc]:
    out = dict(base)
    for pid, p in changes.items():
        out[int(pid.lstrip("p"))] = p
    return out


def test_cpu_counted_once_when_a_child_is_reaped_between_snapshots() -> None:
    # hog (300) had a child (301) with 2 s when `a` was taken; by `b` the child ran 1 s more,
    # exited, and its 3 s landed in hog's children time: only the 1 s is new.
    a = _snap(0, _with(TREE, p300=_proc(10, 5.0), p301=_proc(300, 2.0, name="child")))
    b = _snap(1, _with(TREE, p300=_proc(10, 5.5, children=3.0)))
    step = interval(a, b, Study(JOB, SERVER))
    assert step["cpu_s"]["others"] == pytest.approx(0.5 + 1.0)


def test_a_grandchild_reaped_through_a_parent_that_exited_too() -> None:
    # 300 -> 301 -> 302, all busy in `a`; by `b` both 301 and 302 exited and 300 reaped 301,
    # whose children time held 302's: everything counted before `a` comes off 300's delta.
    a = _snap(
        0,
        _with(TREE, p300=_proc(10, 1.0), p301=_proc(300, 1.0, name="mid"), p302=_proc(301, 4.0, name="leaf")),
    )
    # 301 ran 0.5 s more and 302 ran 0.25 s more before they went: 300.children = 1.5 + 4.25
    b = _snap(1, _with(TREE, p300=_proc(10, 1.0, children=1.5 + 4.25)))
    step = interval(a, b, Study(JOB, SERVER))
    assert step["cpu_s"]["others"] == pytest.approx(0.75)


def test_others_never_counted_past_what_the_host_was_busy() -> None:
    # An orphan's time credited to init while its old grandparent is charged for it: the sum of
    # deltas would exceed the host's busy time; what counts is capped by /proc/stat's.
    a = _snap(0, _with(TREE, p300=_proc(10, 0.0, name="x")), busy=0.0)
    b = _snap(1, _with(TREE, p300=_proc(10, 3.0, name="x")), busy=1.2)
    step = interval(a, b, Study(JOB, SERVER))
    assert step["cpu_s"]["others"] == pytest.approx(1.2) and step["capped"]


def test_a_process_started_between_snapshots_counts_all_its_time_and_a_reused_pid_is_new() -> None:
    a = _snap(0, _with(TREE, p300=_proc(10, 9.0, start=5)))
    b = _snap(1, _with(TREE, p300=_proc(10, 0.4, start=50), p310=_proc(10, 0.3, name="new", start=60)))
    step = interval(a, b, Study(JOB, SERVER))
    assert step["cpu_s"]["others"] == pytest.approx(0.7)
    assert {name for _, name in step["others"]} == {"p", "new"}


def test_the_study_own_cpu_is_its_own() -> None:
    a = _snap(0, TREE, busy=0.0, steal=0.0)
    b = _snap(
        2,
        _with(
            TREE, p100=_proc(20, 0.2, name="ctax"), p101=_proc(JOB, 0.6, pgrp=JOB), p200=_proc(JOB, 1.0, pgrp=SERVER)
        ),
        busy=1.9,
        steal=0.2,
    )
    report = judge(summarize([interval(a, b, Study(JOB, SERVER))]), default_validity())
    assert report["study_cores"] == {"server": 0.5, "loadgen": 0.4, "orchestration": 0.0}
    assert report["others_cores"] == 0.0 and report["unattributed_cores"] == pytest.approx(0.05)
    assert report["steal_frac"] == pytest.approx(0.05) and report["busy"] is False


def test_busy_host_judged_with_the_busiest_second_and_the_names() -> None:
    quiet = _snap(0, TREE)
    mid = _snap(1, _with(TREE, p300=_proc(10, 0.05, name="hog")))
    loud = _snap(2, _with(TREE, p300=_proc(10, 1.05, name="hog")))
    study = Study(JOB, SERVER)
    report = judge(summarize([interval(quiet, mid, study), interval(mid, loud, study)]), default_validity())
    assert report["others_cores"] == pytest.approx(0.525) and report["others_cores_max"] == pytest.approx(1.0)
    assert report["others_cpu_frac"] == pytest.approx(0.2625)
    assert report["busy"] is True
    assert report["reasons"][0].startswith("host busy: others_cpu_frac 0.2625 > 0.1")
    assert "hog (300) 0.53" in report["reasons"][0]


def test_a_real_busy_process_is_seen_as_contention() -> None:
    """A busy loop outside the study shows in `others` by its pid, with most of its CPU."""
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        before = sum(psutil.Process(hog.pid).cpu_times()[:2])
        with HostSampler(None, Study(job.pid), 0.5, default_validity()) as sampler:
            time.sleep(2.0)
        after = sum(psutil.Process(hog.pid).cpu_times()[:2])
        report = msgspec.to_builtins(sampler.report())
    finally:
        hog.kill()
        job.kill()
        hog.wait()
        job.wait()
    assert report["measured"] and report["samples"] >= 4
    # The hog gets its share of what a busy host gives (the test suite may run beside it): all of
    # it is counted as outside the study, as the kernel counts it (10 ms ticks), and the whole
    # accounting agrees with /proc/stat's.
    hog_s = sum(s for i in sampler.intervals for (pid, _), s in i["others"].items() if pid == hog.pid)
    assert hog_s > 0.02 and hog_s == pytest.approx(after - before, abs=0.05)
    assert report["others_cores"] <= report["cpus"] + 0.1
    assert abs(report["unattributed_cores"]) < 0.25
    assert report["busy"] is True
