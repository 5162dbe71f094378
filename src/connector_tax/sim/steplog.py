"""The per-step JSONL log, in the schema the vLLM instrumentation (patches/) also writes.

As there, `step_duration_us` is the scheduler's share of the step (Scheduler.schedule() entry
to exit, build_connector_meta included) and `engine_step_us` the whole step. The simulated
engine has one process, so its worker-connector hook times (start_load_kv_us, get_finished_us)
ride in the same record, as they do for vLLM's single-process executor; it writes no separate
worker records.
"""

from __future__ import annotations

from typing import IO

from connector_tax.contract.records import STEP_LOG_ENV, StepRecord, encode_line
from connector_tax.sim.engine import StepResult

__all__ = ["STEP_LOG_ENV", "StepLog", "step_record"]


def _us(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def step_record(result: StepResult, t_ns: int) -> StepRecord:
    """One step: the study's fields, then what only the simulator knows."""
    cost = result.cost
    return StepRecord(
        t_ns=t_ns,
        step_id=result.step_id,
        step_duration_us=_us(cost.schedule_us),
        build_meta_us=_us(cost.build_meta_us),
        get_finished_us=_us(cost.get_finished_us),
        start_load_kv_us=_us(cost.start_load_kv_us),
        num_running=result.num_running,
        num_waiting=result.num_waiting,
        prefill_tokens=result.prefill_tokens,
        decode_tokens=result.decode_tokens,
        engine_step_us=_us(cost.duration_us),
        forward_us=_us(cost.forward_us),
        num_preempted=result.num_preempted,
        kv_cache_usage=round(result.kv_cache_usage, 6),
        source="sim",
    )


class StepLog:
    """Appends one line per step and flushes it, so a crash loses no completed step."""

    def __init__(self, path: str) -> None:
        self._file: IO[bytes] = open(path, "ab")

    def write(self, result: StepResult, t_ns: int) -> None:
        self._file.write(encode_line(step_record(result, t_ns)))
        self._file.flush()

    def close(self) -> None:
        self._file.close()
