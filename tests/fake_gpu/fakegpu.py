"""The state of a fake GPU host's devices, shared by the fake `nvidia-smi` and the `vllm` stand-in.

One JSON file ($FAKE_GPU_STATE), read and written under an flock: the devices (index, PCI bus
id, total MiB) and the memory holders ({gpu, mib, pid, variant}). A holder with a pid holds its
memory while that process lives and for `release_s` after it was first seen gone, as a driver
gives a dead process's memory back seconds later; a holder without a pid (a foreign process the
test placed) holds it until removed. Standard library only: the fake nvidia-smi runs under any
Python.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_ENV = "FAKE_GPU_STATE"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) holds no GPU memory
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def state(path: str | None = None) -> Iterator[dict[str, Any]]:
    """The state, locked, with gone holders aged; written back on exit."""
    file = Path(path or os.environ[STATE_ENV])
    with open(file, "r+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        doc = json.load(fh)
        now = time.time()
        kept = []
        for holder in doc["holders"]:
            pid = holder.get("pid")
            if pid is not None and holder.get("gone_at") is None and not _alive(pid):
                holder["gone_at"] = now
            if holder.get("gone_at") is not None and now - holder["gone_at"] >= doc["release_s"]:
                doc.setdefault("released", []).append({**holder, "released_at": now})
                continue
            kept.append(holder)
        doc["holders"] = kept
        yield doc
        fh.seek(0)
        fh.truncate()
        json.dump(doc, fh, indent=1)


def used_mib(doc: dict[str, Any], gpu: str) -> int:
    return sum(int(h["mib"]) for h in doc["holders"] if str(h["gpu"]) == str(gpu))


def device(doc: dict[str, Any], gpu: str) -> dict[str, Any] | None:
    return next((d for d in doc["gpus"] if str(d["index"]) == str(gpu)), None)
