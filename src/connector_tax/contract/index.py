"""A launch's index (run.json) and the seal that makes a cell complete.

A cell is measured into a staging folder. Sealing moves its record files into the phase folder
one atomic rename each (requests, metrics, engine_step, then the side files), and writes the
summary last, atomically, carrying the cell's fingerprint and the byte size and record count of
every file it vouches for. A cell is complete exactly when its summary says so, its fingerprint
is the expected one, and every file it vouches for is there with that size: a kill at any point
leaves either a complete cell or one that is redone.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from connector_tax.atomic import write_json
from connector_tax.contract.layout import CELL_RECORDS, CellFiles, now_iso
from connector_tax.contract.summary import SUMMARY_SCHEMA, CellSummary, FileCount, read_summary_file, write_summary

INDEX_SCHEMA = "connector-tax/run-index/3"  # 3: `variant` (was `config`)

# Cell states in the index. A pruned cell was not measured on purpose (Phase A, past the
# configuration's knee): a final state, like complete, never retried.
COMPLETE, FAILED, PENDING, PRUNED = "complete", "failed", "pending", "pruned"
DONE = (COMPLETE, PRUNED)
# Launch states: ok (every cell complete), partial (some failed), failed (no cell could run),
# skipped (preflight SKIP), interrupted (stopped by a signal), running (still going, or killed).
LAUNCH_STATES = ("ok", "partial", "failed", "skipped", "interrupted", "running")


@dataclass
class IndexEntry:
    phase: str
    label: str
    fingerprint: str
    settings: dict[str, Any]
    status: str = PENDING
    reason: str | None = None
    reused: bool = False
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.phase}/{self.label}"


@dataclass
class PhaseIndex:
    study: str
    variant: str
    phase: str
    backend: str
    launch: dict[str, Any]
    code: dict[str, Any]
    cells: list[IndexEntry]
    launch_id: str = ""
    status: str = "running"
    reason: str | None = None
    started: str | None = None
    finished: str | None = None
    run_order: list[str] = field(default_factory=list)
    launch_command: list[str] | None = None
    server_cpus: list[int] | None = None
    cpus_leased: list[int] | None = None
    gpu: str | None = None
    # Where the job ran: {"scheduler": "host", ...} or SLURM's job, node, GPUs and CPUs
    # (serving.slurm). A fact of the run, never part of a fingerprint.
    placement: dict[str, Any] | None = None
    server_versions: dict[str, Any] = field(default_factory=dict)
    # What served the launch in words ("vLLM 0.32.0 on CPU, dummy weights", "simulated vLLM
    # (ctax sim)"), and how its Mooncake connector moves KV ("tcp", "rdma (mlx5_0)"; None
    # without Mooncake): facts for the manifest, the report and the figures, not settings.
    served_by: str | None = None
    mooncake_transport: str | None = None
    # Which LMCache mode the variant ran ("in-process (LMCacheConnectorV1)", "multi-process
    # (LMCacheMPConnector + lmcache server, engine_driven)"; None without LMCache), and the
    # processes its launch started beside the server (serving/sidecar.py: name, what, argv, env,
    # ports, version, pid), e.g. the LMCache MP server.
    lmcache_mode: str | None = None
    sidecars: list[dict[str, Any]] = field(default_factory=list)
    step_timing_available: bool = False
    step_timing_reason: str | None = None
    # What the launch changed in the server's behaviour, in the words every output shows (its
    # declared interventions: the Mooncake CPU guard, NIXL's progress thread off...); the environment the launch set on top of the caller's
    # (CPU binding, threads, side-channel ports: like for like across configurations); and the
    # idle per-thread CPU window taken right after the server was ready (threads_idle.jsonl).
    workarounds: list[str] = field(default_factory=list)
    interventions: list[str] = field(default_factory=list)  # the variant's declared ones, by name
    # Whether each was seen to act in the launch (launch/evidence.py): {name: {"seen", "says", ...}};
    # one declared and not seen makes the launch fail, with the reason.
    interventions_seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    server_env: dict[str, str] | None = None
    idle_threads: dict[str, Any] | None = None
    restarts: list[dict[str, Any]] = field(default_factory=list)
    superseded: list[dict[str, Any]] = field(default_factory=list)
    replicate: int = 1  # which of workload.replicates launches of this variant and phase
    schema: str = INDEX_SCHEMA

    @property
    def simulated(self) -> bool:
        return self.backend == "sim"

    def cell(self, phase: str, label: str) -> IndexEntry | None:
        return next((c for c in self.cells if c.phase == phase and c.label == label), None)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["simulated"] = self.simulated
        out["cells_run"] = [c.key for c in self.cells if c.status in (COMPLETE, FAILED) and not c.reused]
        out["cells_resumed"] = [c.key for c in self.cells if c.reused]
        out["cells_failed"] = {c.key: c.reason for c in self.cells if c.status == FAILED}
        out["cells_pruned"] = {c.key: c.reason for c in self.cells if c.status == PRUNED}
        return out

    def write(self, path: Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> PhaseIndex:
        if doc.get("schema") != INDEX_SCHEMA:
            raise ValueError(f"not a {INDEX_SCHEMA} index (schema {doc.get('schema')!r})")
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in doc.items() if k in known}
        fields["cells"] = [IndexEntry(**c) for c in doc.get("cells") or []]
        return cls(**fields)


def read_index(path: Path) -> PhaseIndex | None:
    """The index at `path`, or None if it is absent, unreadable or of another schema."""
    try:
        return PhaseIndex.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def _measure(path: Path) -> FileCount:
    """Size and record (line) count of a closed file, after it reached the disk."""
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
        records = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return FileCount(path.stat().st_size, records)


def read_summary(files: CellFiles) -> CellSummary | None:
    """The cell's summary, or None if it is absent or not one (of any age: see contract.summary)."""
    return read_summary_file(files.summary)


def seal_cell(
    staging: CellFiles,
    final: CellFiles,
    fingerprint: str,
    summary: CellSummary | None = None,
    *,
    status: str = COMPLETE,
    reason: str | None = None,
) -> CellSummary:
    """Move a measured cell from staging into its phase folder, summary last: `summary` (the
    measuring loop's, with what it added to the load generator's), else the one in staging.
    Returns the sealed summary.

    status "failed" keeps the records for a person to read but the cell is not complete."""
    if summary is None:
        summary = read_summary(staging) or CellSummary(phase=staging.phase, cell=staging.label)
    final.folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, FileCount] = {}
    for kind in CELL_RECORDS:
        src = staging.path(kind)
        if not src.exists():
            src.write_bytes(b"")  # no scrape or no step in the window: an empty file, vouched for
        files[kind] = _measure(src)
    side = [p for p in staging.existing() if p.name not in {staging.path(k).name for k in (*CELL_RECORDS, "summary")}]
    for src in [staging.path(k) for k in CELL_RECORDS] + side:
        os.replace(src, final.folder / src.name)
    complete = status == COMPLETE and summary.complete is not False
    if status == COMPLETE and not complete:
        status, reason = FAILED, reason or "the load generator did not finish the cell"
    summary.schema = SUMMARY_SCHEMA
    summary.fingerprint = fingerprint
    summary.files = files
    summary.complete = complete
    summary.status = status
    summary.reason = reason
    summary.sealed = now_iso()
    write_summary(final.summary, summary)
    shutil.rmtree(staging.folder, ignore_errors=True)
    try:
        staging.folder.parent.rmdir()  # .staging/ itself, once no cell is in flight
    except OSError:
        pass
    return summary


def verify_cell(files: CellFiles, fingerprint: str | None = None) -> tuple[bool, str]:
    """(complete, why not). Complete: a sealed summary that says so, of `fingerprint` when one
    is given, and every file it vouches for present with the size it recorded."""
    summary = read_summary(files)
    if summary is None:
        return False, "no summary" if not files.summary.exists() else "unreadable summary"
    if summary.schema != SUMMARY_SCHEMA:
        return False, "summary was not sealed by the pipeline"
    if not summary.complete:
        return False, f"{summary.status or 'incomplete'}: {summary.reason or 'not complete'}"
    if fingerprint is not None and summary.fingerprint != fingerprint:
        return False, "measured with other settings (fingerprint differs)"
    vouched = summary.files
    if vouched is None or set(vouched) != set(CELL_RECORDS):
        return False, "summary does not list its files"
    for kind, expected in vouched.items():
        path = files.path(kind)
        try:
            size = path.stat().st_size
        except OSError:
            return False, f"{path.name} is missing"
        if size != expected.bytes:
            return False, f"{path.name} has {size} bytes, its summary says {expected.bytes}"
    return True, ""


def move_aside(files: list[Path], dest: Path, why: dict[str, Any]) -> Path:
    """Keep a cell's old files under superseded/ (never deleted, never read by the analysis)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in files:
        os.replace(path, dest / path.name)
    write_json(dest / "why.json", {**why, "moved": now_iso()})
    return dest
