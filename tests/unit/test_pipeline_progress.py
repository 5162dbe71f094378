"""What a phase shows while a cell runs: a line every few seconds under snakemake (a pipe and a
log), a live bar when a user runs `ctax pipeline phase` in a terminal."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

import pytest

from connector_tax.loadgen.stats.collect import Progress
from connector_tax.measure import watch as measure


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _watch(monkeypatch, stream: io.StringIO, seconds: float) -> str:
    progress = Progress()
    progress.issued, progress.completed = 12, 9
    gen = SimpleNamespace(progress=progress, stop=lambda: None)
    server = SimpleNamespace(exited=lambda: None)
    sampler = SimpleNamespace(last_work=None)
    monkeypatch.setattr(measure.sys, "stderr", stream)
    monkeypatch.setattr(measure, "PROGRESS_S", 0.5)
    with measure.ServerWatch(server, gen, sampler, "plain/phase_a/r4", stall_s=60):
        time.sleep(seconds)
    return stream.getvalue()


def test_a_terminal_gets_a_live_bar(monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    shown = _watch(monkeypatch, _Terminal(), 1.3)
    assert "plain/phase_a/r4" in shown and "9req" in shown.replace(" ", "") and "sent 12, in flight" in shown
    assert "completed 9" not in capsys.readouterr().out  # no progress lines beside the bar


def test_a_pipe_gets_progress_lines(monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert _watch(monkeypatch, io.StringIO(), 1.3) == ""  # nothing drawn on a pipe
    lines = [line for line in capsys.readouterr().out.splitlines() if "plain/phase_a/r4" in line]
    assert lines and "sent 12, completed 9, errors 0, in flight" in lines[0]
