"""A real study's records as the tables the fit needs: one row per engine step, one per request.

The study is read through the analysis's own loader (analysis.usable_cells.load_study), so only cells
the analysis would use (planned, sealed, fingerprints verified) are fitted, and their
fingerprints go into the profile's provenance. Per cell:

* **steps** — the engine records of the instrumentation (`engine_step_*.jsonl`), with the
  worker process's hooks joined in by time as the analysis joins them
  (analysis.cellstats.join_worker_records), and what the records do not hold, reconstructed:
  the context tokens a step attends (its prefill tokens, plus per decoding sequence its prompt
  and the tokens generated so far, read off the request records' first and last token times)
  and the KV blocks held; `gap_us`, the engine loop's time from a step's end to the next step's
  start while requests are running.
* **requests** — every successful request (warm-up included: the engine served it too) and
  the engine step that made its first token (the last prefill step to end before the client
  had it): `egress_us` (that step's end to the client's first token) and, where the engine was
  idle when the request was sent and that step is the next to start, `ingress_us` (the send to
  its start: no queueing in it).

Refusals are one line each (CalibrationError): not a study folder, a simulated study, no engine
step records.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from connector_tax.analysis.cellstats import join_worker_records
from connector_tax.analysis.jsonl import NULL_INT, read_columns
from connector_tax.analysis.usable_cells import Measurement, Study, StudyRefused, load_study
from connector_tax.contract.records import RequestRecord, StepRecord, columns
from connector_tax.contract.summary import CellSummary


class CalibrationError(ValueError):
    """The input cannot be calibrated from (or checked against); str() is one line."""


# Counts are read as floats (NaN where a record cannot know them): the fit does arithmetic on them.
_STEP_COUNTS = ("num_running", "num_waiting", "prefill_tokens", "decode_tokens")
STEP_FIELDS = columns(
    StepRecord,
    "t_ns",
    "step_duration_us",
    "build_meta_us",
    "get_finished_us",
    "start_load_kv_us",
    "engine_step_us",
    "worker_step_us",
    *_STEP_COUNTS,
    floats=_STEP_COUNTS,
)
REQUEST_FIELDS = columns(
    RequestRecord,
    "t_send_ns",
    "t_first_token_ns",
    "t_last_token_ns",
    "completion_tokens",
    "input_len",
    "warmup",
    "status",
)
# Busy-loop gaps longer than this are the engine waiting for work, not its loop's own time.
MAX_GAP_US = 50_000.0


@dataclass
class CellData:
    variant: str
    phase: str
    label: str
    fingerprint: str | None
    shape: tuple[int, int] | None
    steps: pd.DataFrame
    requests: pd.DataFrame
    summary: CellSummary = field(default_factory=CellSummary)

    @property
    def key(self) -> str:
        return f"{self.variant}/{self.phase}/{self.label}"


@dataclass
class StudyData:
    study: Study
    cells: list[CellData]
    block_size: int
    kv_cache_blocks: int | None
    runs: dict[tuple[str, str, int], dict[str, Any]]  # (variant, launch phase, replicate): its run.json

    @property
    def variants(self) -> list[str]:
        return [v for v in self.study.variants if any(c.variant == v for c in self.cells)]

    def steps(self, variant: str | None = None) -> pd.DataFrame:
        frames = [c.steps.assign(cell=c.key) for c in self.cells if variant in (None, c.variant)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def requests(self, variant: str | None = None) -> pd.DataFrame:
        frames = [c.requests.assign(cell=c.key) for c in self.cells if variant in (None, c.variant)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def open_study(results_dir: Path, purpose: str = "calibration", simulated_ok: bool = False) -> Study:
    """The study's usable cells, or CalibrationError naming what is wrong with the folder.
    `simulated_ok`: accept the simulator's own records (the tests' known answer; never the CLI)."""
    results_dir = Path(results_dir)
    if not results_dir.exists():
        raise CalibrationError(f"{results_dir}: no such folder")
    if not (results_dir / "study_config.yaml").is_file():
        raise CalibrationError(f"{results_dir}: no study_config.yaml (not a study's results folder)")
    try:
        study = load_study(results_dir)
    except StudyRefused as exc:
        raise CalibrationError(str(exc)) from None
    if study.simulated and not simulated_ok:
        raise CalibrationError(
            f"{results_dir}: a simulated study (backend sim): {purpose} needs a real server's records, "
            "not the simulator's own"
        )
    if not study.cells():
        raise CalibrationError(f"{results_dir}: no usable cell (nothing measured, or every cell failed)")
    return study


def _cache_config(cells: list[Measurement]) -> tuple[int | None, int | None]:
    """(block size, KV cache blocks) from vLLM's /metrics `vllm:cache_config_info` labels."""
    for cell in cells:
        if not cell.has("metrics"):
            continue
        with open(cell.path("metrics"), encoding="utf-8") as fh:
            try:
                scrape = json.loads(fh.readline() or "{}")
            except ValueError:
                continue
        for key in scrape:
            if not key.startswith("vllm:cache_config_info{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', key))
            try:
                blocks = int(labels.get("num_gpu_blocks") or 0) or int(labels.get("num_cpu_blocks") or 0) or None
            except ValueError:
                blocks = None
            size = labels.get("block_size")
            return (int(size) if size and size.isdigit() else None), blocks
    return None, None


def _requests(cell: Measurement) -> pd.DataFrame:
    if not cell.has("requests"):
        return pd.DataFrame(columns=list(REQUEST_FIELDS))
    r = read_columns(cell.path("requests"), REQUEST_FIELDS)
    ok = (
        (r["status"] == "ok")
        & (r["t_send_ns"] != NULL_INT)
        & (r["t_first_token_ns"] != NULL_INT)
        & (r["t_last_token_ns"] != NULL_INT)
    )
    frame = pd.DataFrame({k: v[ok] for k, v in r.items() if k != "status"})
    return frame.sort_values("t_send_ns", kind="stable").reset_index(drop=True)


def _steps(cell: Measurement) -> pd.DataFrame:
    cols = read_columns(cell.path("engine_step"), STEP_FIELDS)
    engine = join_worker_records(cols)
    frame = pd.DataFrame(engine).sort_values("t_ns", kind="stable").reset_index(drop=True)
    return frame[frame["engine_step_us"].notna()].reset_index(drop=True)


def _context(steps: pd.DataFrame, requests: pd.DataFrame, shape: tuple[int, int] | None, block_size: int) -> None:
    """Add context_tokens, blocks and gap_us to `steps` (see the module docstring)."""
    t = steps["t_ns"].to_numpy(dtype=float)
    decode = steps["decode_tokens"].fillna(0).to_numpy()
    prefill = steps["prefill_tokens"].fillna(0).to_numpy()
    fallback = (shape[0] + shape[1] / 2) if shape else np.nan
    mean_ctx = np.full(t.size, fallback)
    if len(requests):
        first = requests["t_first_token_ns"].to_numpy(dtype=float)
        last = requests["t_last_token_ns"].to_numpy(dtype=float)
        n = requests["completion_tokens"].to_numpy(dtype=float)
        n = np.where(n > 0, n, 1.0)
        inp = requests["input_len"].to_numpy(dtype=float)
        span = np.maximum(last - first, 1.0)
        for lo in range(0, t.size, 512):  # steps x requests in blocks: memory stays small
            tt = t[lo : lo + 512, None]
            active = (first[None, :] <= tt) & (tt < last[None, :])
            generated = 1.0 + (n[None, :] - 1.0) * np.clip((tt - first[None, :]) / span[None, :], 0.0, 1.0)
            ctx = np.where(active, inp[None, :] + generated, 0.0)
            count = active.sum(axis=1)
            mean = np.divide(ctx.sum(axis=1), count, out=np.full(count.size, np.nan), where=count > 0)
            mean_ctx[lo : lo + 512] = np.where(count > 0, mean, fallback)
    mean_ctx = np.where(np.isfinite(mean_ctx), mean_ctx, 0.0)
    steps["context_tokens"] = prefill + decode * mean_ctx
    prompt = shape[0] if shape else 0
    prefilling = np.where(prefill > 0, np.maximum(1.0, np.round(prefill / prompt)) if prompt else 1.0, 0.0)
    steps["blocks"] = steps["context_tokens"] / block_size + 0.5 * (decode + prefilling)
    end = t + steps["engine_step_us"].to_numpy() * 1000.0
    gap = np.append((t[1:] - end[:-1]) / 1000.0, np.nan)
    busy = steps["num_running"].fillna(0).to_numpy() > 0
    steps["gap_us"] = np.where(busy & (gap >= 0) & (gap < MAX_GAP_US), gap, np.nan)


def _api(steps: pd.DataFrame, requests: pd.DataFrame) -> None:
    """Add ingress_us and egress_us to `requests`. A request's first token comes from the last
    prefill step that ended before the client had it (egress: from that step's end); where the
    engine was idle when the request was sent and that step is the first to start after the
    send, the time from the send to its start is the ingress (no queueing in it)."""
    requests["ingress_us"] = np.nan
    requests["egress_us"] = np.nan
    pre = steps[steps["prefill_tokens"].fillna(0) > 0]
    if not len(requests) or not len(pre):
        return
    t = steps["t_ns"].to_numpy(dtype=float)
    end = t + steps["engine_step_us"].to_numpy() * 1000.0
    pre_pos = pre.index.to_numpy()  # positions in `steps` (its index is 0..n-1)
    pre_end = end[pre_pos]
    order = np.argsort(pre_end, kind="stable")
    pre_pos, pre_end = pre_pos[order], pre_end[order]
    first = requests["t_first_token_ns"].to_numpy(dtype=float)
    send = requests["t_send_ns"].to_numpy(dtype=float)
    k = np.searchsorted(pre_end, first, side="right") - 1
    has = k >= 0
    owner = np.where(has, pre_pos[np.maximum(k, 0)], -1)
    egress = np.where(has, (first - end[np.maximum(owner, 0)]) / 1000.0, np.nan)
    requests["egress_us"] = egress
    nxt = np.searchsorted(t, send, side="left")  # the first step starting at or after the send
    before = nxt - 1
    idle = (before < 0) | (end[np.maximum(before, 0)] < send)
    same = has & (nxt == owner) & (nxt < t.size)
    requests["ingress_us"] = np.where(idle & same, (t[np.minimum(nxt, t.size - 1)] - send) / 1000.0, np.nan)


def read_study(results_dir: Path, purpose: str = "calibration", simulated_ok: bool = False) -> StudyData:
    """The study's cells as tables; CalibrationError (one line) on input that cannot be used."""
    study = open_study(results_dir, purpose, simulated_ok)
    measured = study.cells()
    with_steps = [c for c in measured if c.has("engine_step") and c.path("engine_step").stat().st_size > 0]
    if not with_steps:
        raise CalibrationError(
            f"{results_dir}: no engine-step records (the study ran without step timing, or it was not available): "
            "the step time cannot be fitted"
        )
    block_size, blocks = _cache_config(measured)
    block_size = block_size or int(study.settings.server.get("block_size") or 16)
    cells = []
    for cell in with_steps:
        steps = _steps(cell)
        if steps.empty:
            continue
        requests = _requests(cell)
        _context(steps, requests, cell.shape, block_size)
        _api(steps, requests)
        summary = cell.summary or CellSummary()
        cells.append(
            CellData(cell.variant, cell.phase, cell.label, summary.fingerprint, cell.shape, steps, requests, summary)
        )
    if not cells:
        raise CalibrationError(f"{results_dir}: the engine-step records hold no engine step")
    runs = {k: run.run or {} for k, run in study.runs.items()}
    return StudyData(study, cells, block_size, blocks, runs)
