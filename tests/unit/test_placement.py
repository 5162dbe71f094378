"""vllm.cpu.service_cpus: every server thread that is not bound to the compute cores is moved to the
service cores (serving/placement.py), checked on a real process tree; bad settings are one line
naming the key, before anything is launched."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from connector_tax.config import ConfigError
from connector_tax.config.vllm_rules import check_placement, cpu_list, cpu_placement
from connector_tax.serving.placement import pin_server_threads, pin_this_process

# A child with three threads: its main thread and one helper anywhere, one "compute" thread that
# binds itself to CPU 1 (as vLLM's OpenMP binding does), and a grandchild process.
CHILD = """
import os, subprocess, sys, threading, time
ready, tid = threading.Event(), []
def compute():
    os.sched_setaffinity(0, {1}); tid.append(threading.get_native_id()); ready.set(); time.sleep(60)
threading.Thread(target=compute, name="compute").start()
threading.Thread(target=lambda: time.sleep(60), name="helper").start()
ready.wait()
sub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(sub.pid, tid[0], flush=True)
time.sleep(60)
"""


def _cpu(vllm_cpu: dict) -> dict:
    return {"backend": "vllm", "vllm": {"device": "cpu", "cpu": vllm_cpu}, "variants": [{"name": "plain"}]}


def test_cpu_lists_and_the_placement_of_a_config():
    assert cpu_list("0") == (0,) and cpu_list("0-2,5") == (0, 1, 2, 5)
    with pytest.raises(ValueError):
        cpu_list("auto")
    assert cpu_placement(_cpu({"omp_threads_bind": "1", "service_cpus": "0"})) == ((0,), (1,))
    assert cpu_placement(_cpu({"omp_threads_bind": "1"})) is None
    assert cpu_placement({"backend": "sim", "vllm": {"cpu": {"service_cpus": "0"}}}) is None


@pytest.mark.parametrize(
    ("cpu", "message"),
    [
        ({"omp_threads_bind": "1", "service_cpus": "zero"}, "is not a CPU list"),
        ({"omp_threads_bind": "auto", "service_cpus": "0"}, "not auto"),
        ({"omp_threads_bind": "0-1", "service_cpus": "1"}, "overlaps"),
    ],
)
def test_bad_service_cpus_are_one_line_naming_the_key(cpu, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_placement(_cpu(cpu))
    assert "vllm.cpu.service_cpus" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1"
)
def test_every_thread_but_the_bound_one_goes_to_the_service_cores():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        grandchild, compute = map(int, child.stdout.readline().split())
        done = pin_server_threads(child.pid, (0,), (1,))
        assert len(done["compute_threads"]) == 1 and done["compute_threads"][0].endswith(f"({compute})")
        assert done["moved"] >= 3 and not done["failed"]  # main, helper, the grandchild's
        where = {
            int(t): os.sched_getaffinity(int(t))
            for pid in (child.pid, grandchild)
            for t in os.listdir(f"/proc/{pid}/task")
        }
        assert where.pop(compute) == {1}
        assert len(where) >= 3 and all(a == {0} for a in where.values())
    finally:
        child.kill()
        child.wait()


def test_nothing_is_moved_when_no_thread_is_bound_to_the_compute_cores():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        before = os.sched_getaffinity(child.pid)
        done = pin_server_threads(child.pid, (0,), (7,))
        assert "nothing pinned" in done["error"] and os.sched_getaffinity(child.pid) == before
    finally:
        child.kill()
        child.wait()


def test_the_calling_process_is_pinned_and_given_back():
    mine = os.sched_getaffinity(0)
    before = pin_this_process((min(mine),))
    try:
        assert os.sched_getaffinity(0) == {min(mine)}
    finally:
        pin_this_process(before)
    assert os.sched_getaffinity(0) == mine
