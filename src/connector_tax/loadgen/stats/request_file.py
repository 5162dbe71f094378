"""The per-request record file's writer (requests_<phase>_<cell>.jsonl) and reader; the record
itself is the contract's (contract.records.RequestRecord)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import IO

from connector_tax.contract.records import RequestRecord, decode_lines, encode_line

__all__ = ["RecordWriter", "RequestRecord", "read_records"]


class RecordWriter:
    """Appends and flushes each record as it completes; safe from two threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] = open(path, "wb")
        self._lock = threading.Lock()

    def write(self, record: RequestRecord) -> None:
        line = encode_line(record)
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_records(path: Path) -> list[RequestRecord]:
    """Every complete record; a truncated last line (an interrupted write) is ignored."""
    return list(decode_lines(path, RequestRecord))
