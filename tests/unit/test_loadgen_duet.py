"""A duet without servers: the paired CPU plan, the options' refusals, and one cell's hand-over to
two targets through a pool that answers on the spot (what each worker is handed, exactly). Against
real simulated servers, and through `ctax bench`: tests/unit/loadgen_session/test_loadgen_duet.py."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import msgspec
import pytest

from connector_tax.config import Cell
from connector_tax.loadgen import ipc
from connector_tax.loadgen.host.affinity import Topology, plan_affinity, plan_paired
from connector_tax.loadgen.host.cpu_latency import CpuLatencyHold
from connector_tax.loadgen.schedule.realtime import RealTimeRun, Session
from connector_tax.loadgen.schedule.session import LoadGenerator, LoadgenOptions, Progress
from connector_tax.loadgen.schedule.workers import WorkerPool
from connector_tax.loadgen.stats.request_file import read_records
from connector_tax.loadgen.worker.prompts import prompt_key

URLS = ("http://127.0.0.1:9", "http://127.0.0.1:10")


# -- the paired plan ----------------------------------------------------------------------
def test_paired_plan_puts_each_targets_workers_in_its_set_and_floats_the_main_process() -> None:
    topo = Topology.synthetic(cores=4, threads_per_core=2)  # CPUs 0-7
    plan = plan_paired([(0, 4), (2, 6, 1)], workers_per_target=2, topology=topo)
    assert plan.worker_cpus == ((0, 4), (0, 4), (1, 2, 6), (1, 2, 6))
    assert plan.helper_cpus == plan.worker_cpus  # a worker's ZMQ thread stays in its side's set
    assert plan.loadgen_cpus == tuple(range(8))
    assert plan.server_cpus == ()
    assert plan.note.startswith("paired: target 0's 2 workers on CPUs 0,4; target 1's 2 workers on CPUs 1,2,6")
    # The default plan is untouched by it: no helper sets of its own.
    assert plan_affinity(2, topology=topo).helper_cpus == ()


@pytest.mark.parametrize(
    ("sets", "line"),
    [
        ([(0,)], "target_cpus: 1 CPU set for 2 targets (one per URL)"),
        ([(0,), ()], "target_cpus: target 1's CPU set is empty"),
        ([(0,), (9,)], "target_cpus: CPU 9 of target 1 is not one this process may use ([0, 1, 2, 3])"),
        ([(0, 1), (1,)], "target_cpus: CPU 1 is in the sets of targets 0 and 1"),
    ],
)
def test_paired_plan_refuses_sets_a_duet_cannot_use(sets: list[tuple[int, ...]], line: str) -> None:
    from connector_tax.loadgen.host.affinity import check_target_cpus

    with pytest.raises(ValueError) as err:
        check_target_cpus(sets, 2, range(4))
    assert str(err.value) == line


# -- the options ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "line"),
    [
        ({"other_urls": ("ftp://x",)}, "other_urls: 'ftp://x': scheme 'ftp' is not supported (http or https)"),
        ({"other_urls": ("127.0.0.1:9/v1",)}, "other_urls: '127.0.0.1:9/v1' is target 0 already (each server once)"),
        (
            {"target_cpus": ((0,), (1,)), "affinity": False},
            "target_cpus: set with affinity off (nothing would be pinned)",
        ),
        ({"target_cpus": ((0,), (0,))}, "target_cpus: CPU 0 is in the sets of targets 0 and 1"),
        ({"target_cpus": ((0,),)}, "target_cpus: 1 CPU set for 2 targets (one per URL)"),
    ],
)
def test_options_refuse_a_bad_duet_in_one_line(kw: dict, line: str) -> None:
    other = kw.pop("other_urls", URLS[1:])
    with pytest.raises(ValueError) as err:
        LoadgenOptions(url=URLS[0], model="m", other_urls=other, **kw).check()
    assert str(err.value) == line


def test_run_cell_and_run_duet_cell_ask_for_one_folder_per_target(tmp_path: Path) -> None:
    cell = Cell(phase="s", label="x", shape={"input": 8, "output": 2})
    duet = LoadGenerator(LoadgenOptions(url=URLS[0], model="m", other_urls=URLS[1:], affinity=False))
    try:  # never entered: no worker starts
        with pytest.raises(ValueError, match=r"^out_dir: this generator drives 2 targets: run_duet_cell$"):
            duet.run_cell(cell, tmp_path)
        with pytest.raises(ValueError, match=r"^out_dirs: 1 folders for 2 targets \(one per target\)$"):
            duet.run_duet_cell(cell, [tmp_path])
        with pytest.raises(ValueError, match=r"^out_dirs: a folder given twice"):
            duet.run_duet_cell(cell, [tmp_path, tmp_path / "." / ""])
    finally:
        duet.pool.close()
    assert duet.pool.n_workers == 2 and [duet.pool.target_of(k) for k in range(2)] == [0, 1]
    assert not list(tmp_path.iterdir())


# -- one cell handed to two targets --------------------------------------------------------
class AnsweringPool:
    """What a cell's run asks of a WorkerPool, with nothing behind it: every request handed to a
    worker of an answering target is answered at once (ok, sent on time); the others never
    answer. `fired` keeps what each worker was handed."""

    target_of = WorkerPool.target_of
    workers_of = WorkerPool.workers_of

    def __init__(self, targets: int, answering: set[int], per_target: int = 1) -> None:
        self.per_target, self.n_workers = per_target, targets * per_target
        self.answering = answering
        self.fired: list[tuple[int, ipc.RequestSpec, int]] = []
        self.handler = None
        self.receive_errors, self.first_receive_errors = 0, []
        self.worker_priority = [None] * self.n_workers
        self.lock = threading.Lock()

    def set_cell(self, paths: list[str | None]) -> None:
        assert len(paths) == self.n_workers

    def set_handler(self, handler) -> None:
        self.handler = handler

    def cpu_seconds(self) -> dict[str, float]:
        return {"main": 0.0, **{f"worker{k}": 0.0 for k in range(self.n_workers)}}

    def live_workers(self) -> set[int]:
        return set(range(self.n_workers))

    def broadcast(self, message: object) -> None:
        pass

    def fire(self, worker: int, spec: ipc.RequestSpec, t_ns: int) -> bool:
        with self.lock:
            self.fired.append((worker, spec, t_ns))
        target = self.target_of(worker)
        if target in self.answering:
            result = ipc.RequestResult(
                spec.index, worker, t_ns, t_ns + 1_000_000, t_ns + 2_000_000, spec.input_len, spec.output_len,
                spec.output_len, 200, "ok", None, b"", spec.cell, spec.request_id, spec.output_len, target,
            )  # fmt: skip
            self.handler(ipc.Result(result))
        return True


def _run(tmp_path: Path, pool: AnsweringPool, cell: Cell, **kw: object) -> list[dict]:
    options = LoadgenOptions(
        url=URLS[0], model="m", other_urls=URLS[1:], affinity=False, drain_timeout_s=0.2, drain_s_per_token=0.0, **kw
    )
    progress = [Progress(), Progress()]
    session = Session(options, pool, progress, threading.Event(), CpuLatencyHold(None))  # type: ignore[arg-type]
    dirs = [tmp_path / "baseline", tmp_path / "variant"]
    for d in dirs:
        d.mkdir()
    summaries = RealTimeRun(session, cell, dirs, None, None).run()
    assert [s.cell_id for s in summaries] == [summaries[0].cell_id] * 2
    return [
        {"summary": msgspec.to_builtins(s), "records": sorted(read_records(d / "requests_s_x.jsonl"), key=_index)}
        for s, d in zip(summaries, dirs)
    ]


def _index(record: object) -> int:
    return int(record.request_id.rsplit("-", 1)[1])  # type: ignore[attr-defined]


def test_every_target_is_handed_the_same_spec_at_the_same_time(tmp_path: Path) -> None:
    pool = AnsweringPool(2, answering={0, 1})
    cell = Cell(phase="s", label="x", shape={"input": 32, "output": 4}, rate=150.0, duration_s=0.3, warmup_s=0.0,
                seed=12345)  # fmt: skip
    sides = _run(tmp_path, pool, cell)
    by_index: dict[int, list[tuple[int, ipc.RequestSpec, int]]] = {}
    for worker, spec, t in pool.fired:
        by_index.setdefault(spec.index, []).append((worker, spec, t))
    assert len(by_index) >= 20
    for index, copies in by_index.items():
        assert [w for w, _, _ in copies] == [0, 1]  # target 0's worker, then target 1's
        (_, a, ta), (_, b, tb) = copies
        assert a is b and ta == tb  # one spec object: same prompt key, shape, id and cell
        assert a.prompt_key == prompt_key(cell.seed, index)  # a study cell's prompt, common to both
    for side in sides:
        assert [r.request_id for r in side["records"]] == [f"s_x-{i}" for i in sorted(by_index)]
        assert [r.t_scheduled_ns for r in side["records"]] == [by_index[i][0][2] for i in sorted(by_index)]
        assert all(r.status == "ok" for r in side["records"])
    # Each target's summary is its own: its worker's CPU, none of the other's.
    assert set(sides[0]["summary"]["cpu_frac"]) == {"main", "worker0"}
    assert set(sides[1]["summary"]["cpu_frac"]) == {"main", "worker1"}
    assert sides[0]["records"][0].worker == 0 and sides[1]["records"][0].worker == 1


def test_a_result_naming_another_target_is_never_attached(tmp_path: Path) -> None:
    """Matched by cell, target, index and request id: the right request under a target the cell
    does not have is unmatched, and its request is recorded as lost."""

    class Crossed(AnsweringPool):
        def fire(self, worker: int, spec: ipc.RequestSpec, t_ns: int) -> bool:
            if spec.index == 0 and worker == 1:  # target 1's copy of request 0 comes back as target 7's
                result = ipc.RequestResult(0, 1, t_ns, None, None, None, None, 0, 200, "ok", None, b"", spec.cell,
                                           spec.request_id, None, 7)  # fmt: skip
                self.handler(ipc.Result(result))
                return True
            return super().fire(worker, spec, t_ns)

    pool = Crossed(2, answering={0, 1})
    cell = Cell(phase="s", label="x", shape={"input": 32, "output": 4}, arrival="fixed", rate=20.0, duration_s=0.1,
                warmup_s=0.0)  # fmt: skip
    first, second = _run(tmp_path, pool, cell)
    assert first["summary"]["counts"]["unmatched"] == 1
    assert "unmatched_results 1.0 > 0" in first["summary"]["validity"]["reasons"]
    unmatched = [r for r in first["records"] if r.error and r.error.startswith("unmatched")]
    assert len(unmatched) == 1 and unmatched[0].error.endswith("index 0: target 7, not 0")
    assert [r.status for r in first["records"] if r is not unmatched[0]] == ["ok", "ok"]
    # Target 1's request 0 never got its answer: recorded as lost, once.
    lost = [r for r in second["records"] if r.request_id == "s_x-0"]
    assert len(lost) == 1 and lost[0].status == "error" and lost[0].error == "no result from worker (worker 1)"


def test_the_in_flight_cap_is_each_targets_own(tmp_path: Path) -> None:
    pool = AnsweringPool(2, answering={0})  # target 1 never answers
    cell = Cell(phase="s", label="x", shape={"input": 32, "output": 4}, arrival="fixed", rate=100.0, duration_s=0.2,
                warmup_s=0.0)  # fmt: skip
    fast, stuck = _run(tmp_path, pool, cell, inflight_cap=3)
    n = len(fast["records"])
    assert n == 20 and len(stuck["records"]) == n
    assert [r.t_scheduled_ns for r in fast["records"]] == [r.t_scheduled_ns for r in stuck["records"]]
    assert [r.status for r in fast["records"]] == ["ok"] * n  # the other's drops change nothing here
    assert [r.status for r in stuck["records"]] == ["error"] * 3 + ["dropped"] * (n - 3)
    assert fast["summary"]["counts"]["dropped"] == 0 and stuck["summary"]["counts"]["dropped"] == n - 3
    # A dropped copy is not sent; its twin is.
    assert sorted(spec.index for w, spec, _ in pool.fired if w == 1) == [0, 1, 2]
    assert sorted(spec.index for w, spec, _ in pool.fired if w == 0) == list(range(n))


def test_min_completed_is_met_when_every_target_has_met_it(tmp_path: Path) -> None:
    pool = AnsweringPool(2, answering={0})
    cell = Cell(phase="s", label="x", shape={"input": 32, "output": 4}, arrival="fixed", rate=50.0, duration_s=0.1,
                warmup_s=0.0, min_completed=2, max_duration_s=0.4)  # fmt: skip
    fast, stuck = _run(tmp_path, pool, cell, inflight_cap=100)
    # Target 0 had its 2 by the floor (0.1 s); target 1 never: the cell ran to its hard end.
    assert len(fast["records"]) == len(stuck["records"]) == 20
    assert fast["summary"]["extended"] and stuck["summary"]["extended"]
    assert "min_completed_shortfall 2.0 > 0" in stuck["summary"]["validity"]["reasons"]


def test_a_closed_loop_frees_a_place_when_every_copy_has_ended(tmp_path: Path) -> None:
    """Concurrency over two targets: the next request waits for both copies of one in flight, so
    both are sent the same requests at the same times; one that never answers holds the loop."""
    pool = AnsweringPool(2, answering={0})
    cell = Cell(phase="s", label="x", shape={"input": 32, "output": 4}, arrival="concurrency", concurrency=2,
                duration_s=0.2, warmup_s=0.0)  # fmt: skip
    fast, stuck = _run(tmp_path, pool, cell)
    # Target 0 answers at once, yet it was sent only what target 1 could take: 2 requests.
    assert [r.request_id for r in fast["records"]] == [r.request_id for r in stuck["records"]] == ["s_x-0", "s_x-1"]
    assert [r.t_scheduled_ns for r in fast["records"]] == [r.t_scheduled_ns for r in stuck["records"]]


def test_one_target_runs_as_before(tmp_path: Path) -> None:
    """One target: one worker per target as `workers` says, its folder, records named as always."""
    options = LoadgenOptions(url=URLS[0], model="m", workers=3, affinity=False)
    gen = LoadGenerator(options)
    try:
        assert (gen.pool.n_workers, gen.pool.n_targets) == (3, 1)
        assert list(gen.pool.workers_of(0)) == [0, 1, 2] and gen.progress is gen.progresses[0]
    finally:
        gen.pool.close()
    assert dataclasses.replace(options, other_urls=URLS[1:]).urls == URLS
    assert os.sched_getaffinity(0)  # nothing pinned by a generator never entered
