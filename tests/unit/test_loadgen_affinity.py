"""CPU affinity plan on synthetic machines, and discovery on this one."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from connector_tax.loadgen.host.affinity import (
    AffinityPlan,
    CpuInfo,
    Topology,
    apply_affinity,
    discover_topology,
    parse_cpulist,
    plan_affinity,
)


def all_assigned(plan: AffinityPlan) -> set[int]:
    return set(plan.loadgen_cpus).union(*(set(w) for w in plan.worker_cpus))


def test_two_core_machine_degrades() -> None:
    topo = Topology.synthetic(cores=2)
    plan = plan_affinity(1, topology=topo)
    assert plan.loadgen_cpus == (0,)
    assert plan.worker_cpus == ((1,),)
    assert plan.server_cpus == (0,)  # with the load generator, never on the worker's core
    assert plan.note.startswith("degraded: a server shares the load generator's cores")
    plan3 = plan_affinity(3, topology=topo)
    assert plan3.loadgen_cpus == (0,)
    assert plan3.worker_cpus == ((1,), (1,), (1,))
    assert "3 workers share 1 physical core" in plan3.note


def test_one_cpu_everybody_shares() -> None:
    plan = plan_affinity(2, topology=Topology((CpuInfo(cpu=0, core=0, node=0),)))
    assert plan.loadgen_cpus == (0,)
    assert plan.worker_cpus == ((0,), (0,))
    assert plan.server_cpus == (0,)
    assert plan.note.startswith("degraded: 1 physical core")


def test_one_core_with_smt_shares_both_threads() -> None:
    plan = plan_affinity(1, topology=Topology.synthetic(cores=1, threads_per_core=2))
    assert plan.loadgen_cpus == (0, 1)
    assert plan.worker_cpus == ((0, 1),)


def test_eight_core_smt() -> None:
    # Cores 5 and 2 are the fastest (boosted), the others equal.
    topo = Topology.synthetic(cores=8, threads_per_core=2, perf={5: 4000, 2: 3900})
    plan = plan_affinity(4, topology=topo)
    # Load generator: the two fastest physical cores, both hyperthreads of each.
    assert plan.loadgen_cpus == (2, 5, 10, 13)
    # Workers: one whole physical core each, fast -> slow, ties by core number.
    assert plan.worker_cpus == ((0, 8), (1, 9), (3, 11), (4, 12))
    assert not plan.note.startswith("degraded")
    assert len(all_assigned(plan)) == 12
    assert plan.server_cpus == (6, 7, 14, 15)  # what the plan leaves free
    # More workers than free cores: the 6 free cores are shared round-robin, never empty.
    plan9 = plan_affinity(9, topology=topo)
    assert plan9.worker_cpus[6] == plan9.worker_cpus[0] and all(plan9.worker_cpus)
    assert plan9.note.startswith("degraded: a server shares the load generator's cores; 9 workers share 6")
    assert plan9.server_cpus == plan9.loadgen_cpus


def test_two_numa_64_core_spills() -> None:
    # 64 physical cores x 2 threads over 2 nodes; node 1 holds the single fastest core (40).
    topo = Topology.synthetic(cores=64, threads_per_core=2, nodes=2, perf={40: 10})
    assert {i.node for i in topo.cpus if i.core < 32} == {0}
    plan = plan_affinity(40, loadgen_physical_cores=2, topology=topo)
    assert plan.loadgen_cpus == (32, 40, 96, 104)  # core 40 then the lowest-numbered peer on node 1
    cores = [min(w) for w in plan.worker_cpus]
    # First the rest of node 1 (30 cores), then node 0 in order.
    assert cores[:30] == [c for c in range(32, 64) if c not in (32, 40)]
    assert cores[30:] == list(range(10))
    assert all(len(w) == 2 and w[1] == w[0] + 64 for w in plan.worker_cpus)
    assert len({min(w) for w in plan.worker_cpus}) == 40  # no sharing
    assert "2 nodes used" in plan.note and not plan.note.startswith("degraded")


def test_primary_node_tie_prefers_bigger_node() -> None:
    cpus = [CpuInfo(cpu=c, core=c, node=0 if c < 2 else 1) for c in range(6)]
    plan = plan_affinity(2, topology=Topology(tuple(cpus)))
    assert plan.loadgen_cpus == (2, 3)
    assert plan.worker_cpus == ((4,), (5,))


def test_no_workers_and_errors() -> None:
    plan = plan_affinity(0, topology=Topology.synthetic(cores=4))
    assert plan.loadgen_cpus == (0, 1) and plan.worker_cpus == ()
    with pytest.raises(ValueError, match="^n_workers:"):
        plan_affinity(-1, topology=Topology.synthetic(cores=4))
    with pytest.raises(ValueError, match="^loadgen_physical_cores:"):
        plan_affinity(1, loadgen_physical_cores=0, topology=Topology.synthetic(cores=4))


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    with pytest.raises(ValueError):
        parse_cpulist("a-b")


def _fake_sysfs(root: Path, files: dict[str, str]) -> tuple[Path, Path]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root / "cpu", root / "node"


def test_discover_fake_sysfs_siblings(tmp_path: Path) -> None:
    """2 cores x 2 threads (siblings 0,2 and 1,3), two nodes, CPPC perf with core 1 faster."""
    files = {}
    for c in range(4):
        files[f"cpu/cpu{c}/topology/thread_siblings_list"] = f"{c % 2},{c % 2 + 2}"
        files[f"cpu/cpu{c}/acpi_cppc/highest_perf"] = "166" if c % 2 else "120"
    files["node/node0/cpulist"] = "0,2"
    files["node/node1/cpulist"] = "1,3"
    files["node/possible"] = "0-1"  # not a node directory: ignored
    topo = discover_topology(*_fake_sysfs(tmp_path, files), allowed={0, 1, 2, 3})
    assert [(i.cpu, i.core, i.node, i.perf) for i in topo.cpus] == [
        (0, 0, 0, 120),
        (1, 1, 1, 166),
        (2, 0, 0, 120),
        (3, 1, 1, 166),
    ]
    plan = plan_affinity(1, topology=topo)
    assert plan.loadgen_cpus == (1, 3) and plan.worker_cpus == ((0, 2),)


def test_discover_fake_sysfs_core_ids(tmp_path: Path) -> None:
    """No sibling lists: core_id repeats across packages, so the package must tell cores apart."""
    files = {}
    for c, (pkg, core) in enumerate([(0, 0), (1, 0), (0, 0), (1, 0)]):
        files[f"cpu/cpu{c}/topology/core_id"] = str(core)
        files[f"cpu/cpu{c}/topology/physical_package_id"] = str(pkg)
        files[f"cpu/cpu{c}/cpufreq/cpuinfo_max_freq"] = "3000000"
    files["cpu/cpu0/acpi_cppc/highest_perf"] = "200"  # only one CPU has it: source not used
    # CPU 3 is outside the affinity mask: not reported, even though sysfs lists it.
    topo = discover_topology(*_fake_sysfs(tmp_path, files), allowed=[0, 1, 2])
    assert [(i.cpu, i.core, i.node, i.perf) for i in topo.cpus] == [
        (0, 0, 0, 3000000),
        (1, 1, 0, 3000000),
        (2, 0, 0, 3000000),
    ]


def test_discover_bare_sysfs(tmp_path: Path) -> None:
    # Nothing in sysfs (a container, another OS): one node, a core per CPU, equal perf.
    topo = discover_topology(tmp_path / "none", tmp_path / "none", allowed=[0, 1, 5])
    assert [(i.cpu, i.core, i.node, i.perf) for i in topo.cpus] == [(0, 0, 0, 0), (1, 1, 0, 0), (5, 5, 0, 0)]


def test_discover_this_machine() -> None:
    topo = discover_topology()
    assert sorted(i.cpu for i in topo.cpus) == sorted(os.sched_getaffinity(0))
    plan = plan_affinity(2, topology=topo)
    assert plan.loadgen_cpus and all(plan.worker_cpus) and len(plan.worker_cpus) == 2
    assert all_assigned(plan) <= os.sched_getaffinity(0)


def test_apply_affinity_pins_threads_started_before() -> None:
    # ZMQ's I/O thread exists before the main process pins itself; it must move along.
    before = os.sched_getaffinity(0)
    started, release = threading.Event(), threading.Event()
    tid: list[int] = []

    def idle() -> None:
        tid.append(threading.get_native_id())
        started.set()
        release.wait(10)

    thread = threading.Thread(target=idle)
    thread.start()
    started.wait(10)
    try:
        target = (min(before),)
        assert apply_affinity(target) is True
        assert os.sched_getaffinity(tid[0]) == set(target)
    finally:
        release.set()
        thread.join()
        os.sched_setaffinity(0, before)


def test_apply_affinity_roundtrip() -> None:
    before = os.sched_getaffinity(0)
    try:
        target = (min(before),)
        assert apply_affinity(target) is True
        assert os.sched_getaffinity(0) == set(target)
        assert apply_affinity((10_000,)) is False  # no such CPU: refused, not raised
    finally:
        os.sched_setaffinity(0, before)
