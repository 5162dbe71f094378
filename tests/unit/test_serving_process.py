"""ServerProcess: CPU placement of a launched server, and its stop."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from connector_tax.serving.server_process import ServerProcess, ServerStartError
from connector_tax.serving.spec import LaunchSpec

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_server_is_pinned_where_asked_and_launch_sh_says_so(tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    with ServerProcess(LaunchSpec(SLEEPER), "http://127.0.0.1:1", tmp_path, cpus=(cpu,)) as server:
        assert server.proc is not None
        assert psutil.Process(server.proc.pid).cpu_affinity() == [cpu]
        assert server.cpus == (cpu,)
    assert f"pinned to CPUs {cpu}" in (tmp_path / "launch.sh").read_text()
    assert server.proc.poll() is not None


def test_unpinned_by_default_and_a_refused_pin_is_not_claimed(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    with ServerProcess(LaunchSpec(SLEEPER), "http://127.0.0.1:1", tmp_path) as server:
        assert psutil.Process(server.proc.pid).cpu_affinity() == allowed
    with ServerProcess(LaunchSpec(SLEEPER), "http://127.0.0.1:1", tmp_path, cpus=(10_000,)) as server:
        assert server.cpus == ()
        assert psutil.Process(server.proc.pid).cpu_affinity() == allowed
    assert "pinned" not in (tmp_path / "launch.sh").read_text()


# A "server" with a child of its own (as vLLM's API server has its engine core): the child is in
# the server's process group, and has no parent-death signal.
FAMILY = ["bash", "-c", "sleep 300 & echo $! > child.pid; sleep 300"]
OWNER = """
import sys, time
from pathlib import Path
from connector_tax.serving.spec import LaunchSpec
from connector_tax.serving.server_process import ServerProcess
folder = Path(sys.argv[1])
server = ServerProcess(LaunchSpec(sys.argv[2:]), "http://127.0.0.1:1", folder)
server.start()
(folder / "leader.pid").write_text(str(server.proc.pid))
time.sleep(300)
"""


def _family(tmp_path: Path) -> tuple[psutil.Process, list[psutil.Process]]:
    owner = psutil.Popen([sys.executable, "-c", OWNER, str(tmp_path), *FAMILY], cwd=tmp_path)
    deadline = time.monotonic() + 60  # a bail-out: a Python start on a loaded host
    while not ((tmp_path / "leader.pid").exists() and (tmp_path / "child.pid").exists()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.2)
    pids = [int((tmp_path / name).read_text()) for name in ("leader.pid", "child.pid")]
    return owner, [psutil.Process(pid) for pid in pids]


def _all_gone(procs: list[psutil.Process], within_s: float = 30.0) -> bool:
    _, alive = psutil.wait_procs(procs, timeout=within_s)
    return not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_a_killed_owner_takes_the_server_and_its_children_down(tmp_path: Path) -> None:
    owner, family = _family(tmp_path)
    owner.kill()  # SIGKILL: no cleanup code of the owner runs
    owner.wait(10)
    assert _all_gone(family)


def test_stop_takes_the_whole_group_down_even_when_the_leader_exits_first(tmp_path: Path) -> None:
    # The child ignores SIGTERM (as a busy engine core may); the leader exits on it at once.
    child_cmd = f"(trap '' TERM; exec sleep 300) & echo $! > {tmp_path}/child.pid"
    spec = LaunchSpec(["bash", "-c", f"{child_cmd}; trap 'exit 0' TERM; sleep 300 & wait"])
    with ServerProcess(spec, "http://127.0.0.1:1", tmp_path, grace_s=5) as server:
        deadline = time.monotonic() + 60  # a bail-out
        while not (tmp_path / "child.pid").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.2)
        child = psutil.Process(int((tmp_path / "child.pid").read_text()))
    assert server.proc.poll() is not None
    assert _all_gone([child])


def test_a_server_hung_after_vllms_engine_failure_fails_its_start_with_the_root_cause(tmp_path: Path) -> None:
    """vLLM 0.32 on CPU sometimes hangs after "EngineCore failed to start" instead of exiting:
    wait_ready gives up a grace period after that line, not at its (long) timeout."""
    hang = [
        sys.executable,
        "-c",
        "import sys, time; print('ERROR Mooncake is not available', file=sys.stderr); "
        "print('ERROR [core.py:1510] EngineCore failed to start.', file=sys.stderr, flush=True); time.sleep(60)",
    ]
    with ServerProcess(LaunchSpec(hang), "http://127.0.0.1:1", tmp_path) as server:
        server.engine_failed_grace_s = 0.5
        t0 = time.monotonic()
        with pytest.raises(ServerStartError) as err:
            server.wait_ready(60)
        assert time.monotonic() - t0 < 30 and server.exited() is None  # hung, yet the wait ended
    assert (
        str(err.value)
        == "engine core failed during start-up (the server hung instead of exiting): Mooncake is not available"
    )


def test_a_server_does_not_inherit_a_snakemake_jobs_thread_counts(tmp_path: Path, monkeypatch) -> None:
    """Snakemake exports a job's granted threads (OMP_NUM_THREADS=1 under --cores 1, 6 under the
    8-GPU command): vLLM serving with whatever --cores said. A launch drops them; one the study
    configures (vllm.env, a variant's env) is what the server gets, and launch.sh says both."""
    from connector_tax.serving.spec import SCHEDULER_THREAD_VARS

    for name in SCHEDULER_THREAD_VARS:
        monkeypatch.setenv(name, "6")
    monkeypatch.setenv("CTAX_TEST_KEPT", "yes")
    dump = [sys.executable, "-c", "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"]
    for configured, name in (({}, "none"), ({"OMP_NUM_THREADS": "2"}, "configured")):
        out = tmp_path / f"{name}.json"
        with ServerProcess(LaunchSpec([*dump, str(out)], env=configured), "http://127.0.0.1:1", tmp_path) as server:
            server.proc.wait(30)
        seen = json.loads(out.read_text())
        assert seen["CTAX_TEST_KEPT"] == "yes"  # the rest of the caller's environment stays
        assert {k: seen.get(k) for k in SCHEDULER_THREAD_VARS} == {
            k: configured.get(k) for k in SCHEDULER_THREAD_VARS
        }, name
    script = (tmp_path / "launch.sh").read_text()
    assert "export OMP_NUM_THREADS=2" in script
    assert f"unset {' '.join(v for v in SCHEDULER_THREAD_VARS if v != 'OMP_NUM_THREADS')}" in script
