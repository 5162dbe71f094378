"""The analysis's callback time joins the worker process's hook records to the engine steps.

On vLLM's CPU build (and with TP > 1) the worker connector lives in its own process: engine
records carry build_meta_us but null get_finished_us / start_load_kv_us, and one worker record
per worker step carries those hooks. connector_total_us (the study's sum of the three callback
timings) must include them; each worker step belongs to the engine step that started last
before it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from connector_tax.analysis.cellstats import STEP_FIELDS_READ, join_worker_records
from connector_tax.analysis.jsonl import read_columns


def engine(
    t_ns: int,
    schedule_us: float | None,
    build_meta_us: float | None,
    engine_step_us: float,
    hooks: tuple[float | None, float | None] = (None, None),
) -> dict:
    return {
        "t_ns": t_ns,
        "step_id": t_ns,
        "step_duration_us": schedule_us,
        "build_meta_us": build_meta_us,
        "get_finished_us": hooks[0],
        "start_load_kv_us": hooks[1],
        "num_running": 1,
        "num_waiting": 0,
        "prefill_tokens": 0,
        "decode_tokens": 1,
        "engine_step_us": engine_step_us,
        "pid": 10,
        "role": "engine",
        "source": "vllm",
    }


def worker(t_ns: int, get_finished_us: float, start_load_kv_us: float) -> dict:
    return {
        "t_ns": t_ns,
        "step_id": t_ns,
        "step_duration_us": None,
        "build_meta_us": None,
        "get_finished_us": get_finished_us,
        "start_load_kv_us": start_load_kv_us,
        "num_running": None,
        "num_waiting": None,
        "prefill_tokens": None,
        "decode_tokens": None,
        "worker_step_us": 50.0,
        "wait_for_layer_load_us": 1.0,
        "wait_for_layer_load_calls": 2,
        "save_kv_layer_us": 1.0,
        "save_kv_layer_calls": 2,
        "wait_for_save_us": 1.0,
        "pid": 11,
        "role": "worker",
        "source": "vllm",
    }


def read(tmp_path: Path, records: list[dict]) -> dict[str, np.ndarray]:
    path = tmp_path / "engine_step.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return join_worker_records(read_columns(path, STEP_FIELDS_READ))


def test_worker_hooks_join_the_engine_step_that_started_last_before_them(tmp_path):
    records = [
        worker(500, 9.0, 9.0),  # before the slice's first engine step: no owner, dropped
        engine(1_000, 40.0, 5.0, 900.0),
        worker(1_100, 2.0, 3.0),
        engine(2_000, 30.0, 4.0, 800.0),
        worker(2_200, 1.0, 1.5),
        worker(2_600, 0.5, 0.5),  # a second worker step in the same engine step: summed
        engine(3_000, None, None, 10.0),  # an engine step that scheduled nothing, no worker step
    ]
    cols = read(tmp_path, records)
    assert list(cols["t_ns"]) == [1_000, 2_000, 3_000]  # engine records only
    assert list(cols["get_finished_us"][:2]) == [2.0, 1.5] and math.isnan(cols["get_finished_us"][2])
    assert list(cols["start_load_kv_us"][:2]) == [3.0, 2.0] and math.isnan(cols["start_load_kv_us"][2])
    assert list(cols["build_meta_us"][:2]) == [5.0, 4.0]


def test_without_worker_records_the_engine_fields_stand(tmp_path):
    """The simulator and vLLM's single-process executor put the hooks in the engine record."""
    cols = read(tmp_path, [engine(1_000, 40.0, 5.0, 900.0, (2.0, 3.0)), engine(2_000, 30.0, None, 800.0)])
    assert cols["get_finished_us"][0] == 2.0 and cols["start_load_kv_us"][0] == 3.0
    assert math.isnan(cols["get_finished_us"][1])


def test_connector_total_includes_the_joined_worker_hooks(tmp_path):
    """Through the analysis's own per-cell statistics: connector_total_us = build_meta +
    get_finished + start_load_kv, with the last two from the worker process."""
    from connector_tax.analysis.cellstats import step_stats

    class FakeCell:
        def has(self, kind: str) -> bool:
            return kind == "engine_step"

        def path(self, kind: str) -> Path:
            return tmp_path / "engine_step.jsonl"

    records = []
    for i in range(20):
        records.append(engine(1_000 * (i + 1), 40.0, 5.0, 900.0))
        records.append(worker(1_000 * (i + 1) + 300, 2.0, 3.0))
    (tmp_path / "engine_step.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    row, note, grid = step_stats(FakeCell(), (None, None))
    assert row["steps_n"] == 20 and note is None
    assert row["connector_total_us_p50"] == 10.0  # 5 + 2 + 3
    assert row["start_load_kv_us_p50"] == 3.0 and row["get_finished_us_p50"] == 2.0
    assert row["step_duration_us_p50"] == 40.0 and row["engine_step_us_p50"] == 900.0
