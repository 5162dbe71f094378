"""Slice a launch's raw step log(s) into one engine_step_<phase>_<cell>.jsonl per cell, by time.

The server writes one raw step log for its whole life (the simulator to the path it is given;
instrumented vLLM one file per process next to it), named after the launch
(raw_steps/engine_step_raw.<launch>.jsonl), so a relaunch never writes into or deletes the log
of an earlier launch whose cells still need it. Cells are consecutive time windows of that
life; each line goes to the cell whose window holds its t_ns. A raw log is deleted once its
launch ended, when every cell it served has its slice (sealed or failed alike).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from connector_tax.atomic import write_atomic
from connector_tax.launch.steptiming import step_log_files
from connector_tax.launch.steptiming import step_timing_status as vllm_status


def raw_step_files(raw: Path) -> list[Path]:
    """The simulator's single file, or vLLM's per-process files (patches/step_timing.py)."""
    files = step_log_files(raw)
    return ([raw] if raw.exists() else []) + files["engine"] + files["worker"]


def drop_raw_logs(raw_dir: Path) -> None:
    """Raw logs of launches that ended (or were killed: their unsealed cells are redone)."""
    shutil.rmtree(raw_dir, ignore_errors=True)


class StepLogSplitter:
    def __init__(self, raw: Path) -> None:
        self.raw = raw
        self._offsets: dict[Path, int] = {}

    def split(self, t0_ns: int, t1_ns: int, dest: Path) -> int:
        """Write the steps of [t0_ns, t1_ns] to `dest` atomically; returns how many."""
        lines: list[tuple[int, str]] = []
        for path in raw_step_files(self.raw):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            for line in complete.decode("utf-8", "replace").splitlines():
                try:
                    t_ns = int(json.loads(line)["t_ns"])
                except (ValueError, KeyError, TypeError):
                    continue
                if t0_ns <= t_ns <= t1_ns:
                    lines.append((t_ns, line))
        lines.sort()
        write_atomic(dest, "".join(line + "\n" for _, line in lines))
        return len(lines)


def step_timing_status(raw: Path, backend: str, has_connector: bool) -> tuple[bool, str | None]:
    if backend == "openai":
        return False, "external server (backend openai): no step timing"
    if backend == "sim":
        return True, None
    available, reason = vllm_status(raw, has_connector)
    return available, None if available else reason
