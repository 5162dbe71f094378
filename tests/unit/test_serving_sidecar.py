"""Sidecars (serving/sidecar.py): ready before the server, stopped after it on every path, a
failure one line and prompt; their threads sampled with the server's, their CPU the study's own.

The stand-in LMCache server of the simulator (sim/lmcache_server.py) is the sidecar here: a real
process with its own ports, readiness and faults. The whole path through `snakemake` (kill -9 of
the phase job, SIGTERM, Ctrl-C, a crashed sidecar) is tests/e2e/test_sidecar_faults.py.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from connector_tax.metrics.host import Study, snapshot
from connector_tax.metrics.threads import sample_tree
from connector_tax.serving.server_process import ServerProcess, ServerStartError, free_port
from connector_tax.serving.sidecar import Sidecars
from connector_tax.serving.spec import LaunchSpec, SidecarSpec

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _standin(port: int, *faults: str, timeout_s: float = 30.0) -> SidecarSpec:
    argv = [sys.executable, "-m", "connector_tax.sim.lmcache_server", "--port", str(port), "--http-port", str(port + 1)]
    return SidecarSpec(
        name="lmcache_server",
        what="simulated LMCache MP server (ctax sim)",
        argv=[*argv, *faults],
        env={},
        port=port,
        ready=f"http://127.0.0.1:{port + 1}/healthcheck",
        ready_timeout_s=timeout_s,
    )


def _tcp(port: int, timeout_s: float = 30.0) -> SidecarSpec:
    """A sidecar that is ready when its port accepts (a Mooncake master would be one)."""
    code = f"import socket, time; s = socket.create_server(('127.0.0.1', {port})); time.sleep(60)"
    return SidecarSpec(
        "listener", "a TCP listener", [sys.executable, "-c", code], {}, port, f"tcp://127.0.0.1:{port}", timeout_s
    )


def _gone(pids: list[int], within_s: float = 30.0) -> bool:
    procs = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    _, alive = psutil.wait_procs(procs, timeout=within_s)
    return not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_sidecars_are_ready_in_order_logged_beside_the_server_and_stopped(tmp_path: Path) -> None:
    one, two = free_port(block=2), free_port()
    with Sidecars((_standin(one), _tcp(two)), tmp_path) as sidecars:
        roots = sidecars.roots()
        assert set(roots.values()) == {"lmcache_server", "listener"}
        assert sidecars.failure() is None
        with socket.create_connection(("127.0.0.1", one), timeout=2):  # its request port is bound
            pass
        records = sidecars.records()
        assert [r["name"] for r in records] == ["lmcache_server", "listener"] and all(r["pid"] for r in records)
    assert _gone(list(roots))
    assert (tmp_path / "sidecar_lmcache_server_stdout.log").read_text().startswith("simulated LMCache MP server")
    assert "connector_tax.sim.lmcache_server" in (tmp_path / "sidecar_lmcache_server.sh").read_text()


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        (
            ["--fail-start", "no module named lmcache"],
            "sidecar lmcache_server (simulated LMCache MP server (ctax sim)) exited with code 1: "
            "RuntimeError: no module named lmcache",
        ),
        (["--never-ready"], "sidecar lmcache_server (simulated LMCache MP server (ctax sim)) not ready after 2 s"),
    ],
    ids=["exits at start", "never ready"],
)
def test_a_sidecar_that_cannot_start_is_one_line_at_once(tmp_path: Path, faults: list[str], expected: str) -> None:
    port = free_port(block=2)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as err:
        with Sidecars((_standin(port, *faults, timeout_s=2),), tmp_path):
            pytest.fail("entered without a ready sidecar")
    assert time.monotonic() - t0 < 20  # its own timeout, not the server's (vLLM would wait 300 s)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_a_taken_port_fails_the_sidecar_with_the_reason(tmp_path: Path) -> None:
    port = free_port(block=2)
    with socket.create_server(("127.0.0.1", port)):  # someone else has its request port
        with pytest.raises(ServerStartError, match=r"exited with code 1: OSError: \[Errno 98\] Address already in use"):
            with Sidecars((_standin(port),), tmp_path):
                pass


def test_a_missing_executable_is_a_start_error_naming_it(tmp_path: Path) -> None:
    spec = SidecarSpec(
        "lmcache_server", "LMCache MP server", ["/nonexistent/lmcache", "server"], {}, 1, "tcp://127.0.0.1:1", 5
    )
    with pytest.raises(ServerStartError, match="cannot start /nonexistent/lmcache"):
        with Sidecars((spec,), tmp_path):
            pass


def test_a_sidecar_that_dies_fails_the_servers_start_within_a_poll(tmp_path: Path) -> None:
    port = free_port(block=2)
    with Sidecars((_standin(port, "--crash-after-s", "1"),), tmp_path) as sidecars:
        with ServerProcess(LaunchSpec(SLEEPER), "http://127.0.0.1:1", tmp_path) as server:
            t0 = time.monotonic()
            with pytest.raises(ServerStartError, match="sidecar lmcache_server .* exited with code 1: .*crash"):
                server.wait_ready(600, sidecars.failure)
            assert time.monotonic() - t0 < 20


# The owner starts a sidecar (with a child of its own) and a server, then sleeps: killed with -9,
# both groups must go (parent-death signal on the leaders, a watchdog per group for the rest).
OWNER = """
import sys, time
from pathlib import Path
from connector_tax.serving.server_process import ServerProcess
from connector_tax.serving.sidecar import Sidecars
from connector_tax.serving.spec import LaunchSpec, SidecarSpec
folder, port = Path(sys.argv[1]), int(sys.argv[2])
code = f"import socket, subprocess, time; subprocess.Popen(['sleep', '300']); s = socket.create_server(('127.0.0.1', {port})); time.sleep(300)"
spec = SidecarSpec("family", "a sidecar with a child", [sys.executable, "-c", code], {}, port, f"tcp://127.0.0.1:{port}", 60)
sidecars = Sidecars((spec,), folder).__enter__()
server = ServerProcess(LaunchSpec(["sleep", "300"]), "http://127.0.0.1:1", folder)
server.start()
(folder / "pids").write_text(" ".join(map(str, [*sidecars.roots(), server.proc.pid])))
time.sleep(300)
"""


def test_a_killed_owner_takes_its_sidecars_and_their_children_down(tmp_path: Path) -> None:
    owner = psutil.Popen([sys.executable, "-c", OWNER, str(tmp_path), str(free_port())], cwd=tmp_path)
    deadline = time.monotonic() + 60  # a bail-out: a Python start on a loaded host
    while not (tmp_path / "pids").exists():
        assert time.monotonic() < deadline and owner.poll() is None
        time.sleep(0.05)
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    family = pids + [c.pid for c in psutil.Process(pids[0]).children(recursive=True)]
    assert len(family) >= 3  # the sidecar, its child, the server
    owner.kill()
    owner.wait(10)
    assert _gone(family)


def test_sidecar_threads_are_sampled_marked_and_counted_as_the_servers(tmp_path: Path) -> None:
    port = free_port(block=2)
    with (
        Sidecars((_standin(port),), tmp_path) as sidecars,
        ServerProcess(LaunchSpec(SLEEPER), "http://127.0.0.1:1", tmp_path) as server,
    ):
        line = sample_tree(server.proc.pid, {}, sidecars.roots())
        marked = [p for p in line.procs if p.sidecar == "lmcache_server"]
        assert marked and marked[0].pid == next(iter(sidecars.roots())) and marked[0].threads
        assert [p.pid for p in line.procs if not p.sidecar] == [server.proc.pid]
        # the sidecar is the phase job's child, yet its CPU is the server's, never the load generator's
        study = Study(job=psutil.Process().pid, server_pgid=server.proc.pid, sidecar_pgids=sidecars.pgids())
        classes = study.classify(snapshot().procs)
        assert classes[marked[0].pid] == "server"


def test_one_failed_stop_does_not_leave_the_other_sidecars_running(tmp_path: Path, monkeypatch) -> None:
    """Issue 65: Sidecars stopped its sidecars in a loop without `try`: the first stop that raised
    (here the listener's, stopped first: last started) left the LMCache server running."""
    one, two = free_port(block=2), free_port()
    sidecars = Sidecars((_standin(one), _tcp(two)), tmp_path)
    real = ServerProcess.stop

    def stop(self: ServerProcess) -> int | None:
        real(self)
        if self.log_dir == tmp_path and "listener" in self.stdout_path.name:
            raise OSError("the listener's port could not be released")
        return 0

    monkeypatch.setattr(ServerProcess, "stop", stop)
    with pytest.raises(OSError, match="could not be released"), sidecars:
        roots = sidecars.roots()
    assert _gone(list(roots), within_s=10.0)
    again = Sidecars((_standin(free_port(block=2)), _tcp(free_port())), tmp_path)
    with pytest.raises(KeyError), again:  # an exception already on its way out stays the one raised
        roots = again.roots()
        raise KeyError("the cell")
    assert _gone(list(roots), within_s=10.0)
