"""Messages between the load generator's main process and its workers (pickled tuples).

Only what the records need crosses IPC: a compact request spec one way, timestamps, counts,
status and the inter-chunk gaps the other way — never the chunks themselves.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

# main -> worker
FIRE = "fire"  # (FIRE, RequestSpec, t_scheduled_ns): sent ahead, fired at t_scheduled_ns
CANCEL_ALL = "cancel"  # (CANCEL_ALL, reason): abort everything in flight (drain timeout)
SET_CELL = "cell"  # (SET_CELL, chunk_log_path | None): per-cell side files
STOP = "stop"  # (STOP,)
# worker -> main
READY = "ready"  # (READY, worker_id, pid, its scheduling class: priority.PriorityState.describe())
RESULT = "result"  # (RESULT, RequestResult)
CELL_SET = "cell_set"  # (CELL_SET, worker_id): side files switched
BYE = "bye"  # (BYE, worker_id)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    index: int
    request_id: str
    input_len: int
    output_len: int
    # Trace replay: (hash_id, tokens) per prefix block; None for random content.
    blocks: tuple[tuple[int, int], ...] | None = None
    cell: str = ""  # the cell run this request belongs to; its result must name it back
    # What the prompt's token ids derive from: "<cell traffic seed>-<index>" in a study cell, the
    # same for every variant (common random numbers); "" for the request id (ctax bench).
    prompt_key: str = ""


@dataclass(frozen=True, slots=True)
class RequestResult:
    index: int
    worker: int
    t_send_ns: int | None
    t_first_token_ns: int | None
    t_last_token_ns: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    chunks: int
    http_status: int
    status: str  # ok | error | timeout
    error: str | None
    itl_us: bytes  # array('I') of gaps between content chunks, in µs
    # End to end identity: a result is matched to its request by both, never by position.
    cell: str = ""
    request_id: str = ""
    usage_completion_tokens: int | None = None  # what the server's usage said, if it said


def pack(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(data: bytes) -> tuple[Any, ...]:
    return pickle.loads(data)
