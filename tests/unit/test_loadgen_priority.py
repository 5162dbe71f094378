"""The load generator's real-time class (loadgen/host/priority.py): per thread, given back, never passed
to a process started under it unless asked, and a refusal said in one line rather than raised."""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Any

import pytest

from connector_tax.config import load_config
from connector_tax.config.cells import Cell
from connector_tax.contract.fingerprint import cell_settings
from connector_tax.contract.summary import Priority
from connector_tax.loadgen.host.priority import raised, set_fifo
from connector_tax.loadgen.schedule.options import LoadgenOptions

FIFO = os.SCHED_FIFO
root = pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root (or an RLIMIT_RTPRIO) here")


def _in_thread(fn: Any) -> Any:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


@root
def test_raised_is_this_thread_only_and_given_back() -> None:
    def inside() -> dict[str, Any]:
        me = threading.get_native_id()
        with raised(5) as state:
            seen = {
                "state": state.describe(),
                "me": os.sched_getscheduler(me) & ~os.SCHED_RESET_ON_FORK,
                "param": os.sched_getparam(me).sched_priority,
                "main": os.sched_getscheduler(threading.main_thread().native_id),
                "new thread": _in_thread(lambda: os.sched_getscheduler(threading.get_native_id())),
                "new process": subprocess.run(["sh", "-c", "chrt -p $$"], capture_output=True, text=True).stdout,
            }
        seen["after"] = os.sched_getscheduler(me)
        return seen

    seen = _in_thread(inside)
    assert seen["state"] == Priority(5, True, None)
    assert (seen["me"], seen["param"]) == (FIFO, 5)
    assert seen["main"] == seen["new thread"] == seen["after"] == os.SCHED_OTHER
    assert "SCHED_OTHER" in seen["new process"]  # a server started from it is never real-time


@root
def test_inherit_passes_the_class_to_what_is_started_inside() -> None:
    def inside() -> tuple[int, int]:
        with raised(5, inherit=True):
            child = _in_thread(lambda: os.sched_getscheduler(threading.get_native_id()))
        return child, os.sched_getscheduler(threading.get_native_id())

    assert _in_thread(inside) == (FIFO, os.SCHED_OTHER)


def test_none_leaves_the_class_alone_and_a_refusal_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set_fifo(None, inherit=True).describe() == Priority(None, False, None)

    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with raised(10) as state:
        assert not state.applied and state.why.startswith("SCHED_FIFO 10 not set: ")


def test_options_refuse_a_priority_outside_sched_fifo() -> None:
    with pytest.raises(ValueError, match=r"^rt_priority: must be 1\.\.99"):
        LoadgenOptions(url="http://127.0.0.1:1", model="m", rt_priority=0).check()


def test_the_fingerprint_holds_the_priority_only_when_set() -> None:
    config = load_config("configs/test-tiny.yaml")
    cell = Cell(phase="phase_a", label="r1", rate=1.0)
    assert "rt_priority" not in cell_settings(config, cell)["loadgen"]  # unset: fingerprints as before
    config["loadgen"]["rt_priority"] = 10
    assert cell_settings(config, cell)["loadgen"]["rt_priority"] == 10


@root
def test_raised_process_takes_every_thread_and_gives_each_its_class_back() -> None:
    # the phase job's samplers share the sending thread's GIL: all of them run real-time in a cell
    from connector_tax.loadgen.host.priority import raised_process

    stop = threading.Event()
    before = threading.Thread(target=stop.wait)
    before.start()
    started: list[int] = []
    try:
        with raised_process(6) as state:
            classes = {tid: os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK for tid in _tids()}
            inside = threading.Thread(target=lambda: (started.append(os.sched_getscheduler(0)), stop.wait()))
            inside.start()
            while not started:
                pass
        after = {tid: os.sched_getscheduler(tid) for tid in _tids()}
    finally:
        stop.set()
    assert state.applied and set(classes.values()) == {FIFO}  # the threads there before
    assert started == [FIFO]  # a thread the block started inherits it ...
    assert set(after.values()) == {os.SCHED_OTHER}  # ... and every one is normal again after


def _tids() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]
