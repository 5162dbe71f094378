"""Slice a launch's step log(s) into one engine_step_<phase>_<cell>.jsonl per cell, by time.

The server writes one step log for its whole life (the simulator to the path it is given;
instrumented vLLM one file per process next to it); cells are consecutive time windows of
that life, so each line goes to the cell whose window holds its t_ns.
"""

from __future__ import annotations

import json
from pathlib import Path

RAW_NAME = "engine_step_raw.jsonl"


def raw_step_files(phase_dir: Path) -> list[Path]:
    """The simulator's single file, or vLLM's per-process files (patches/step_timing.py)."""
    from connector_tax.launch.steptiming import step_log_files

    raw = phase_dir / RAW_NAME
    files = step_log_files(raw)
    return ([raw] if raw.exists() else []) + files["engine"] + files["worker"]


class StepLogSplitter:
    def __init__(self, phase_dir: Path) -> None:
        self.phase_dir = phase_dir
        self._offsets: dict[Path, int] = {}

    def split(self, t0_ns: int, t1_ns: int, dest: Path) -> int:
        lines: list[tuple[int, str]] = []
        for path in raw_step_files(self.phase_dir):
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
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text("".join(line + "\n" for _, line in lines), encoding="utf-8")
        return len(lines)


def step_timing_status(phase_dir: Path, backend: str, has_connector: bool) -> tuple[bool, str | None]:
    if backend == "openai":
        return False, "external server (backend openai): no step timing"
    if backend == "sim":
        return True, None
    from connector_tax.launch.steptiming import step_timing_status as vllm_status

    available, reason = vllm_status(phase_dir / RAW_NAME, has_connector)
    return available, None if available else reason
