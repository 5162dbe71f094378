"""Per-request records (the design's requests_<phase>_<cell>.jsonl) and their writer."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import msgspec

_encode = msgspec.json.Encoder().encode  # dataclasses in field order, compact, ~10x json.dumps


@dataclass(slots=True)
class RequestRecord:
    # The design's fields, in its order.
    request_id: str
    t_scheduled_ns: int
    t_send_ns: int | None
    t_first_token_ns: int | None
    t_last_token_ns: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    inflight_at_send: int
    warmup: bool
    status: str  # ok | error | dropped | timeout
    error: str | None
    # More, as the design welcomes.
    input_len: int
    output_len: int
    chunks: int = 0
    http_status: int = 0
    worker: int | None = None
    cell: str | None = None  # the cell run that issued it (phase_label#run)
    # Token counts: completion_tokens is the server's usage when it sent one, else the
    # content chunks counted; usage_completion_tokens is the usage alone, and token_mismatch
    # says the two disagreed (a server may put several tokens in one chunk: recorded, not an error).
    usage_completion_tokens: int | None = None
    token_mismatch: bool = False
    # The server's usage.prompt_tokens alone (prompt_tokens falls back to the requested length):
    # None when the server sent no usage. Checked against the cell (usage.py).
    usage_prompt_tokens: int | None = None

    def line(self) -> bytes:
        return _encode(self) + b"\n"


class RecordWriter:
    """Appends and flushes each record as it completes; safe from two threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] = open(path, "wb")
        self._lock = threading.Lock()

    def write(self, record: RequestRecord) -> None:
        line = record.line()
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_records(path: Path) -> list[dict]:
    """Every complete line; a truncated last line (an interrupted write) is ignored."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            records.append(json.loads(line))
    return records
