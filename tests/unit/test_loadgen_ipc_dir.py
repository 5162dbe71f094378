"""The load generator's IPC folder: a socket path must fit sockaddr_un (107 bytes on Linux), so a
$TMPDIR too deep for it gives way to /tmp; a dead generator's old folder is swept, nothing else.
The SIGKILL case through `ctax bench`: tests/e2e/test_loadgen_cli_run.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from connector_tax.loadgen.schedule.workers import IPC_PREFIX, ipc_dir


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_tmpdir_too_deep_for_a_socket_gives_way_to_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    made = Path(ipc_dir())
    try:
        assert made.parent == Path("/tmp") and made.name.startswith(f"{IPC_PREFIX}{os.getpid()}-")
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PULL)
        sock.bind(f"ipc://{made}/requests-999")  # the longest name a pool binds fits
        sock.close(linger=0)
        ctx.term()
    finally:
        shutil.rmtree(made)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder shallow enough for a socket's path: pytest's own tmp_path is not under
    xdist (its popen-gwN level), where ipc_dir would rightly give way to /tmp."""
    folder = Path(tempfile.mkdtemp(prefix="ctax-t-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_only_a_dead_generators_old_folder_is_swept(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    dead, old = _dead_pid(), time.time() - 2 * 3600
    folders = {
        "dead_old": f"{IPC_PREFIX}{dead}-aaaaaaaa",
        "dead_young": f"{IPC_PREFIX}{dead}-bbbbbbbb",
        "alive_old": f"{IPC_PREFIX}{os.getpid()}-cccccccc",
        "no_pid": f"{IPC_PREFIX}3vnzw3m2",
        "other": f"other-{dead}-dddddddd",
    }
    for key, name in folders.items():
        (short_tmp / name).mkdir()
        if key != "dead_young":
            os.utime(short_tmp / name, (old, old))
    made = Path(ipc_dir())
    assert made.parent == short_tmp
    left = {p.name for p in short_tmp.iterdir()} - {made.name}
    assert left == set(folders.values()) - {folders["dead_old"]}
