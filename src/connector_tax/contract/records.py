"""The record files' types (one msgspec Struct per record), their decoders and column schemas,
and the step-log variable.

Writers encode these Structs; readers decode them (`decode_lines`), and the analysis's column
reads take their schemas from them (`columns`), so a field is named once. Writers may add fields
(a record decodes with the ones it knows); a field a reader may rely on is declared here.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

S = TypeVar("S", bound=msgspec.Struct)


class RequestRecord(msgspec.Struct, gc=False):
    """requests_<phase>_<label>.jsonl: one line per request issued (warm-up included, flagged)."""

    # The study's fields (docs/study-design.md, What is recorded), in its order.
    request_id: str
    t_scheduled_ns: int
    t_send_ns: int | None
    t_first_token_ns: int | None
    t_last_token_ns: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    inflight_at_send: int
    warmup: bool
    status: str  # REQUEST_STATUSES
    error: str | None
    # More than the study asks for.
    input_len: int = 0
    output_len: int = 0
    chunks: int = 0
    http_status: int = 0
    worker: int | None = None
    cell: str | None = None  # the cell run that issued it (phase_label#run)
    # Token counts: completion_tokens is the server's usage when it sent one, else the content
    # chunks counted; usage_completion_tokens is the usage alone, and token_mismatch says the two
    # disagreed (a server may put several tokens in one chunk: recorded, not an error).
    usage_completion_tokens: int | None = None
    token_mismatch: bool = False
    # The server's usage.prompt_tokens alone (prompt_tokens falls back to the requested length):
    # None when the server sent no usage. Checked against the cell (loadgen.stats.usage).
    usage_prompt_tokens: int | None = None


REQUEST_STATUSES = ("ok", "error", "dropped", "timeout")
REQUEST_FIELDS = RequestRecord.__struct_fields__[: RequestRecord.__struct_fields__.index("error") + 1]


class StepRecord(msgspec.Struct, omit_defaults=True, gc=False):
    """engine_step_<phase>_<label>.jsonl: one line per engine step, from the instrumentation
    (patches/, inside vLLM) or the simulator; null where a process cannot know a field.

    step_duration_us is Scheduler.schedule() entry to exit (the study's step), build_meta_us the
    connector's build_connector_meta inside it; engine_step_us is the whole engine step (which
    overlaps the model under async scheduling). An engine record carries engine_step_us; a
    worker record (the worker-side connector hooks of one worker step, patches/README.md) carries
    worker_step_us and the layer hooks instead. The study's fields are always written."""

    t_ns: int
    step_id: int | None
    step_duration_us: float | None
    build_meta_us: float | None
    get_finished_us: float | None
    start_load_kv_us: float | None
    num_running: int | None
    num_waiting: int | None
    prefill_tokens: int | None
    decode_tokens: int | None
    # An engine record's.
    engine_step_us: float | None = None
    # A worker record's.
    worker_step_us: float | None = None
    wait_for_layer_load_us: float | None = None
    wait_for_layer_load_calls: int | None = None
    save_kv_layer_us: float | None = None
    save_kv_layer_calls: int | None = None
    wait_for_save_us: float | None = None
    # Who wrote it: vLLM's process and its role, or "sim".
    pid: int | None = None
    role: str | None = None
    source: str | None = None
    # What only the simulator knows.
    forward_us: float | None = None
    num_preempted: int | None = None
    kv_cache_usage: float | None = None


# The study's step fields (always written), in its order; then what each kind of record adds.
STEP_FIELDS = StepRecord.__struct_fields__[: StepRecord.__struct_fields__.index("decode_tokens") + 1]
ENGINE_STEP_FIELDS = (*STEP_FIELDS, "engine_step_us", "pid", "role", "source")
WORKER_STEP_FIELDS = (
    *STEP_FIELDS,
    "worker_step_us",
    "wait_for_layer_load_us",
    "wait_for_layer_load_calls",
    "save_kv_layer_us",
    "save_kv_layer_calls",
    "wait_for_save_us",
    "pid",
    "role",
    "source",
)
# The connector hooks a step's time is made of (step_duration_us holds build_meta_us).
STEP_TIMINGS = ("step_duration_us", "build_meta_us", "get_finished_us", "start_load_kv_us")


class MetricsSample(msgspec.Struct, gc=False):
    """metrics_<phase>_<label>.jsonl: one line per /metrics scrape: t_ns and every scraped
    vllm:* sample under its Prometheus name (an open set: these are the ones read), or `error`."""

    t_ns: int
    num_requests_running: float | None = msgspec.field(default=None, name="vllm:num_requests_running")
    num_requests_waiting: float | None = msgspec.field(default=None, name="vllm:num_requests_waiting")
    kv_cache_usage_perc: float | None = msgspec.field(default=None, name="vllm:kv_cache_usage_perc")
    error: str | None = None


METRIC_FIELDS = tuple(f.encode_name for f in msgspec.structs.fields(MetricsSample) if f.name != "error")


class ThreadCpu(msgspec.Struct, omit_defaults=True, gc=False):
    """One thread's CPU time so far, in clock ticks, the core it last ran on and the cores it may
    run on (its own affinity: a thread can be pinned apart from its process's main thread)."""

    tid: int
    name: str
    user: int
    system: int
    core: int
    started_by: str | None = None  # the connector whose constructor started it (vLLM's step log)
    cpus: list[int] | None = None  # sched_getaffinity(tid); None in files written before it was read


class ProcessSample(msgspec.Struct, omit_defaults=True, gc=False):
    pid: int
    ppid: int
    name: str
    cpus: list[int] | None
    threads: list[ThreadCpu]
    sidecar: str | None = None  # the sidecar it belongs to (serving/sidecar.py), not the server


class ThreadSample(msgspec.Struct, omit_defaults=True, gc=False):
    """threads_<phase>_<label>.jsonl (and threads_idle.jsonl): one line per sample of the
    server's process tree, at the metrics cadence (metrics/threads.py)."""

    t_ns: int
    clk_tck: int
    procs: list[ProcessSample] = msgspec.field(default_factory=list)
    error: str | None = None


_ENCODER = msgspec.json.Encoder()


def encode_line(record: msgspec.Struct) -> bytes:
    """One JSONL line of a record (fields in their declared order, compact)."""
    return _ENCODER.encode(record) + b"\n"


def decode_lines(path: Path, kind: type[S]) -> Iterator[S]:
    """Every complete line of `path` as `kind`; a truncated last line (an interrupted write) is
    ignored. A line that is not a `kind` is an error naming the file and line."""
    decoder = msgspec.json.Decoder(kind)
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                return
            try:
                yield decoder.decode(line)
            except msgspec.ValidationError as exc:
                raise ValueError(f"{path}:{number}: not a {kind.__name__}: {exc}") from None


# read_columns' kinds (analysis/jsonl.py) by a field's type, None and defaults aside.
_KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


def _kind(annotation: Any) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) and len(args) == 1:
        annotation = args[0]
    try:
        return _KINDS[annotation]
    except (KeyError, TypeError):
        raise ValueError(f"no column kind for a field of type {annotation!r}") from None


def columns(kind: type[msgspec.Struct], *names: str, floats: tuple[str, ...] = ()) -> dict[str, str]:
    """{file name of the field: column kind} for `names` (encode names, e.g. vllm:...), in that
    order: the schema of a column read of `kind`'s file. `floats`: fields read as floats (NaN for
    null) whatever their type, for arithmetic on counts that may be null."""
    hints = typing.get_type_hints(kind)
    by_name = {f.encode_name: f.name for f in msgspec.structs.fields(kind)}
    out = {}
    for name in names:
        if name not in by_name:
            raise ValueError(f"{kind.__name__} has no field {name!r}")
        out[name] = "float" if name in floats else _kind(hints[by_name[name]])
    return out


# Where a server writes its step log. patches/step_timing.py runs inside vLLM and cannot import
# this package: it spells the name itself, and a test checks the two agree.
STEP_LOG_ENV = "CONNECTOR_TAX_STEP_LOG"
# The seed of one launch's own draws (config.cells.launch_seed): the simulator's per-launch speed
# factor (sim.launch_bias_sd) comes from it, so a launch's bias is reproducible and two differ.
LAUNCH_SEED_ENV = "CONNECTOR_TAX_LAUNCH_SEED"


# run.json's server_versions: the connector libraries among the server's packages, under every
# distribution name each is published as (one per CUDA major, or none: tools/vllm_cpu_env.sh
# installs the -non-cuda and -cu12 builds, tools/vllm_gpu_env.sh the CUDA 13 ones), named in
# every output.
CONNECTOR_DISTRIBUTIONS = {
    "mooncake": ("mooncake-transfer-engine", "mooncake-transfer-engine-cuda13", "mooncake-transfer-engine-non-cuda"),
    "nixl": ("nixl", "nixl-cu13", "nixl-cu12"),
    "lmcache": ("lmcache",),
}
CONNECTOR_PACKAGES = tuple(d for names in CONNECTOR_DISTRIBUTIONS.values() for d in names)


def connector_version(versions: dict[str, object], library: str) -> str:
    """The version of `library` (mooncake, nixl, lmcache) the server had, whichever distribution
    it came as; "" when it had none."""
    return next((str(versions[d]) for d in CONNECTOR_DISTRIBUTIONS[library] if versions.get(d)), "")


def connector_packages(versions: dict[str, object]) -> str:
    """ "nixl 1.5.1, nixl-cu12 1.5.1, mooncake-transfer-engine-non-cuda 0.3.13.post1, lmcache 0.5.6"
    (those the server's Python has), or "" when it has none."""
    return ", ".join(f"{d} {versions[d]}" for d in CONNECTOR_PACKAGES if versions.get(d))
