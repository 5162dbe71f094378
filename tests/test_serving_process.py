"""ServerProcess: CPU placement of a launched server, and its stop."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil

from connector_tax.launch.spec import LaunchSpec
from connector_tax.serving.process import ServerProcess

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
