"""Where the server's CPU goes: per-thread CPU of the server's processes, idle and under load.

Reads what metrics/threads.py sampled (the server's processes, and a variant's sidecars marked
`sidecar`, which get their own total: the LMCache MP server of `lmcache_mp`): `threads_idle.jsonl` of a configuration's Phase A launch
(the ready server before its first request) and the `threads_<phase>_<cell>.jsonl` of its Phase A
cell at ref_safe (the cell the taxes use; the lowest complete Phase A cell when there is none at
ref_safe). A thread's CPU share over a file is its CPU ticks between the first and the last sample
over that span (100 % = one core). Threads are named by process role (API server: the launch's
root; EngineCore; Worker), thread name, whether it is the process's main thread, and the
connector whose constructor started it (`started_by`, from the step-timing instrumentation): a
library's threads otherwise carry the process's name.

`busy_beyond_plain` lists, per configuration, threads that use at least BUSY_PCT of a core while
the server is idle and that plain's server has no busy counterpart of: a connector's own
background work (NIXL's progress thread spins at idle). Analysis reads files, never servers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from connector_tax.analysis.constants import PLAIN
from connector_tax.config import PHASE_A
from connector_tax.contract.records import ProcessSample, ThreadSample, decode_lines

TOP = 5  # threads per configuration and state in the aggregate and the report
BUSY_PCT = 20.0  # % of one core: a thread this busy at idle is doing work of its own


def _samples(path: Path) -> list[ThreadSample]:
    """The file's samples that saw the server (an error line, or one with no process, is left out)."""
    try:
        return [s for s in decode_lines(path, ThreadSample) if s.procs and s.error is None]
    except (OSError, ValueError):
        return []


def _role(proc: ProcessSample, root: int) -> str:
    if proc.sidecar:  # a process the launch started beside the server (an LMCache MP server)
        return f"sidecar {proc.sidecar}"
    if proc.pid == root:
        return "API server"
    if proc.name.startswith("VLLM::EngineCor"):
        return "EngineCore"
    if proc.name.startswith("VLLM::Worker"):
        return "Worker"
    return proc.name or "?"


def usage(path: Path) -> dict[str, Any] | None:
    """Per-thread CPU over the file's span, busiest first; None with fewer than two samples."""
    samples = _samples(path)
    if len(samples) < 2:
        return None
    first, last = samples[0], samples[-1]
    seconds = (last.t_ns - first.t_ns) / 1e9
    if seconds <= 0:
        return None
    tck = float(last.clk_tck or 100)
    server = [p.pid for p in first.procs if not p.sidecar]
    root = min(server) if server else -1
    before = {(p.pid, t.tid): t.user + t.system for p in first.procs for t in p.threads}
    cores: dict[tuple[int, int], set[int]] = {}
    for s in samples:
        for p in s.procs:
            for t in p.threads:
                cores.setdefault((p.pid, t.tid), set()).add(t.core)
    threads: list[dict[str, Any]] = []
    for p in last.procs:
        role = _role(p, root)
        for t in p.threads:
            key = (p.pid, t.tid)
            ticks = t.user + t.system - before.get(key, 0)  # a thread born in the span: all of it
            threads.append(
                {
                    "process": role,
                    "pid": p.pid,
                    "tid": t.tid,
                    "thread": t.name,
                    "main": t.tid == p.pid,
                    "started_by": t.started_by,
                    "cpu_pct": round(100.0 * ticks / tck / seconds, 1),
                    "cores": sorted(cores.get(key, set())),
                    "allowed": p.cpus,
                }
            )
    threads.sort(key=lambda t: -t["cpu_pct"])
    sidecars: dict[str, dict[str, Any]] = {}
    for row in threads:
        if row["process"].startswith("sidecar "):
            entry = sidecars.setdefault(row["process"][len("sidecar ") :], {"total_pct": 0.0, "busiest": row})
            entry["total_pct"] = round(entry["total_pct"] + row["cpu_pct"], 1)
    return {
        "file": path.name,
        "seconds": round(seconds, 2),
        "samples": len(samples),
        # the server's processes; each sidecar's CPU apart (their sum is the configuration's)
        "total_pct": round(sum(t["cpu_pct"] for t in threads if not t["process"].startswith("sidecar ")), 1),
        "sidecars": sidecars,
        "threads": threads,
    }


def label(t: dict[str, Any]) -> str:
    """ "Worker / VLLM::Worker (tid 11979, started by NixlConnector worker)"."""
    extra = ["main thread" if t["main"] else f"tid {t['tid']}"]
    if t.get("started_by"):
        extra.append(f"started by {t['started_by']}")
    return f"{t['process']} / {t['thread']} ({', '.join(extra)})"


def _kind(t: dict[str, Any]) -> tuple[Any, ...]:
    """What a thread is, across launches (tids differ)."""
    return (t["process"], t["thread"], t["main"], t.get("started_by"))


def _load_cell(study: Any, name: str, reference: dict[str, Any]) -> Any:
    run = study.run_of(name, PHASE_A)
    cells = [c for c in (run.cells if run else []) if c.has("threads")]
    if not cells:
        return None
    ref = reference.get("ref_safe")
    at_ref = [c for c in cells if ref is not None and abs(c.rate - float(ref)) < 1e-9]
    return (at_ref or sorted(cells, key=lambda c: c.rate))[0]


def thread_tables(study: Any, reference: dict[str, Any]) -> dict[str, Any]:
    """{"variants": {variant: {"idle": usage, "load": usage, "load_cell": label}}, "busy_beyond_plain":
    {config: [thread, ...]}, "top": TOP, "busy_pct": BUSY_PCT}; usages keep their TOP threads."""
    full: dict[str, dict[str, Any]] = {}
    for name in study.variants:
        run = study.run_of(name, PHASE_A)
        idle_file = ((run.run or {}).get("idle_threads") or {}).get("file") if run else None
        idle = usage(run.folder / idle_file) if run and idle_file else None
        cell = _load_cell(study, name, reference)
        load = usage(cell.path("threads")) if cell is not None else None
        if idle or load:
            full[name] = {"idle": idle, "load": load, "load_cell": cell.key if cell is not None else None}
    busy: dict[str, list[dict[str, Any]]] = {}
    plain_idle = (full.get(PLAIN) or {}).get("idle")
    plain_busy = {_kind(t) for t in (plain_idle or {}).get("threads", []) if t["cpu_pct"] >= BUSY_PCT}
    for name, entry in full.items():
        if name == PLAIN or not entry.get("idle") or plain_idle is None:
            continue
        extra = [t for t in entry["idle"]["threads"] if t["cpu_pct"] >= BUSY_PCT and _kind(t) not in plain_busy]
        if extra:
            busy[name] = extra
    for entry in full.values():
        for state in ("idle", "load"):
            if entry.get(state):
                entry[state] = {**entry[state], "threads": entry[state]["threads"][:TOP]}
    return {"variants": full, "busy_beyond_plain": busy, "top": TOP, "busy_pct": BUSY_PCT}


def render(tables: dict[str, Any], configs: list[str], advice: dict[str, list[str]] | None = None) -> list[str]:
    """The report's section (Markdown lines); nothing when no thread was sampled. `advice`: per
    variant, what to do about its threads busy at idle (interventions.pointers)."""
    found = tables.get("variants") or {}
    if not found:
        return []
    order = [PLAIN] + [n for n in configs if n != PLAIN]
    out = [
        "## Where the server's CPU goes (per-thread CPU time)",
        "",
        f"Every thread of the server's processes (API server, EngineCore, Worker) and of the processes its launch "
        f"started beside it (*sidecars*, e.g. the LMCache MP server of `lmcache_mp`), sampled with /metrics; CPU as % "
        f"of one core; *idle*: the ready server before its first request (Phase A launch); *load*: the Phase A cell "
        f"named. A sidecar's CPU is part of what its configuration costs. The {tables.get('top', TOP)} busiest "
        "threads per configuration, plain's first; `cores`: the cores the thread was seen on.",
        "",
    ]
    for state in ("idle", "load"):
        out += [f"### {state.capitalize()}", ""]
        out += [
            "| config | cell | server total | sidecars (total; busiest thread) | busiest threads (CPU % of one core, cores) |",
            "|---|---|---|---|---|",
        ]
        for name in order:
            entry = found.get(name) or {}
            use = entry.get(state)
            if not use:
                continue
            cell = "idle window" if state == "idle" else f"`{entry.get('load_cell')}`"
            threads = "; ".join(
                f"{label(t)} **{t['cpu_pct']:.0f}%** ({','.join(map(str, t['cores']))})"
                for t in use["threads"]
                if t["cpu_pct"] >= 1.0
            )
            sidecars = "; ".join(
                f"{side} **{v['total_pct']:.1f}%** ({v['busiest']['thread']} {v['busiest']['cpu_pct']:.1f}%)"
                for side, v in (use.get("sidecars") or {}).items()
            )
            out.append(
                f"| `{name}` | {cell} | {use['total_pct']:.0f}% over {use['seconds']:.0f} s | {sidecars or '–'} | "
                f"{threads or '–'} |"
            )
        out.append("")
    busy = tables.get("busy_beyond_plain") or {}
    for name, threads in busy.items():
        out += [f"- `{name}`: {line}." for line in (advice or {}).get(name, [])]
        for t in threads:
            allowed = ",".join(map(str, t.get("allowed") or []))
            out.append(
                f"- `{name}`: {label(t)} uses **{t['cpu_pct']:.0f}%** of a core while the server is idle "
                f"(plain has no such thread), on core(s) {','.join(map(str, t['cores']))}"
                + (f" (its process may run on {allowed})" if allowed else "")
                + "."
            )
    if busy:
        out.append("")
    return out
