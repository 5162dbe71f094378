"""What the LoadGenerator tests share: the simulated servers they drive, the cell shape, and helpers
that run one cell and read its records back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from sim_server import MODEL

from connector_tax.config import Cell
from connector_tax.contract.summary import to_builtins
from connector_tax.loadgen.schedule.session import LoadGenerator, LoadgenOptions
from connector_tax.loadgen.stats.request_file import read_records

RECORD_KEYS = [
    "request_id",
    "t_scheduled_ns",
    "t_send_ns",
    "t_first_token_ns",
    "t_last_token_ns",
    "prompt_tokens",
    "completion_tokens",
    "inflight_at_send",
    "warmup",
    "status",
    "error",
    "input_len",
    "output_len",
    "chunks",
    "http_status",
    "worker",
    "cell",
    "usage_completion_tokens",
    "token_mismatch",
    "usage_prompt_tokens",
]
SHAPE = {"input": 64, "output": 8}
SIM_FLAGS = {
    "plain": (),
    "twin": (),  # a second plain server: the other side of a duet
    "hang": ("--hang-after-tokens", "2", "--hang-rate", "1"),
    "err500": ("--http-500-rate", "1"),
    "malformed": ("--malformed-sse-rate", "1"),
}


def options(url: str, **kw: Any) -> LoadgenOptions:
    return LoadgenOptions(
        **{"url": url, "model": MODEL, "affinity": False, "timeout_s": 5.0, "drain_timeout_s": 2.0, **kw}
    )


def run(gen: LoadGenerator, out: Path, label: str, **kw: Any) -> tuple[dict, list[dict]]:
    cell = Cell(**{"phase": "s", "label": label, "shape": SHAPE, "warmup_s": 0.0, **kw})
    summary = to_builtins(gen.run_cell(cell, out))
    records = [msgspec.structs.asdict(r) for r in read_records(out / f"requests_s_{label}.jsonl")]
    assert json.loads((out / f"summary_s_{label}.json").read_text()) == summary
    return summary, records


def by_index(records: list[dict]) -> list[dict]:
    return sorted(records, key=lambda r: int(r["request_id"].rsplit("-", 1)[1]))


def assert_one_record_each(records: list[dict], name: str) -> None:
    ids = [r["request_id"] for r in records]
    assert sorted(ids) == sorted(f"{name}-{i}" for i in range(len(records)))
