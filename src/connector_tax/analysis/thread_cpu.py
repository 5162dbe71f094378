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

Where each thread may run is its own affinity (`cpus`, read at every sample; absent in files from
before it was recorded). A thread is *pinned* when those CPUs are narrower than the ones the server
was started on; who pinned it comes from the launch's run.json (`placement`): the server itself by
the time it was ready (`server_pins`: vLLM binds its worker to the OpenMP cores, and a connector's
constructor that moved the thread it ran on is named), or the study's own placement afterwards
(`server_threads`: the service cores).
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
                    "cpus": t.cpus,  # the thread's own, at the last sample (None: not recorded)
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


def _set(cpus: list[int] | None) -> str:
    return "{" + ",".join(map(str, cpus)) + "}" if cpus is not None else "?"


def pinned_by(t: dict[str, Any], placement: dict[str, Any] | None) -> str | None:
    """ "pinned to {1} by NixlPullConnector worker": where a thread of a launch may run and who put
    it there, from the launch's run.json `placement`; None when it is not pinned (its CPUs include
    all the server was started on) or nothing says so (an older launch)."""
    pins = (placement or {}).get("server_pins") or {}
    own, launch = t.get("cpus"), pins.get("launch_cpus")
    if own is None or launch is None or set(launch) <= set(own):
        return None
    where = f"pinned to {_set(own)}"
    for b in pins.get("built_on") or []:
        if b.get("tid") == t["tid"] and b.get("cpus_before") != b.get("cpus_after") and b.get("cpus_after") == own:
            return f"{where} by {b['connector']}"
    at_ready = next((g for g in pins.get("pinned") or [] if t["tid"] in g.get("tids", [])), None)
    if at_ready is not None and at_ready.get("cpus") == own:
        return f"{where} by the server at start-up"
    study = (placement or {}).get("server_threads") or {}
    if study.get("service_cpus") == own:
        return f"{where} by the study (service cores)"
    return f"{where} after start-up"


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
    """{"variants": {variant: {"idle": usage, "load": usage, "load_cell": label, "server_pins":
    [line, ...]}}, "busy_beyond_plain": {config: [thread, ...]}, "top": TOP, "busy_pct": BUSY_PCT};
    usages keep their TOP threads, each with `pinned` (pinned_by); `server_pins` is what the Phase A
    launch's server pinned by the time it was ready (run.json placement.server_pins.summary)."""
    full: dict[str, dict[str, Any]] = {}
    for name in study.variants:
        run = study.run_of(name, PHASE_A)
        placement = (run.run or {}).get("placement") if run else None
        idle_file = ((run.run or {}).get("idle_threads") or {}).get("file") if run else None
        idle = usage(run.folder / idle_file) if run and idle_file else None
        cell = _load_cell(study, name, reference)
        load = usage(cell.path("threads")) if cell is not None else None
        for use in (idle, load):
            for t in (use or {}).get("threads", []):
                t["pinned"] = pinned_by(t, placement)
        if idle or load:
            full[name] = {
                "idle": idle,
                "load": load,
                "load_cell": cell.key if cell is not None else None,
                "server_pins": ((placement or {}).get("server_pins") or {}).get("summary"),
            }
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
        "threads per configuration, plain's first; in brackets the cores the thread was seen on and, for a thread "
        "pinned narrower than the CPUs the server was started on, where and by whom (the server at start-up: "
        "vLLM or a library in it, or a connector's constructor named; the study's placement).",
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
                f"{label(t)} **{t['cpu_pct']:.0f}%** ({','.join(map(str, t['cores']))}"
                + (f"; {t['pinned']}" if t.get("pinned") else "")
                + ")"
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
    pins = [(name, (found.get(name) or {}).get("server_pins")) for name in order]
    pins = [(name, lines) for name, lines in pins if lines is not None]
    if pins:
        out += [
            "### What the server pinned itself",
            "",
            "Once each configuration's Phase A launch was ready, before the study moved any thread: the threads whose "
            "CPUs were narrower than those the server was started on, and the thread each connector was built on "
            "with its CPUs before and after the constructor (run.json `placement.server_pins`).",
            "",
        ]
        out += [f"- `{name}`: {'; '.join(lines) if lines else 'nothing pinned'}." for name, lines in pins]
        out.append("")
    busy = tables.get("busy_beyond_plain") or {}
    for name, threads in busy.items():
        out += [f"- `{name}`: {line}." for line in (advice or {}).get(name, [])]
        for t in threads:
            own = t.get("cpus")
            allowed = ",".join(map(str, own if own is not None else t.get("allowed") or []))
            whose = "it" if own is not None else "its process"
            out.append(
                f"- `{name}`: {label(t)} uses **{t['cpu_pct']:.0f}%** of a core while the server is idle "
                f"(plain has no such thread), on core(s) {','.join(map(str, t['cores']))}"
                + (f" ({whose} may run on {allowed}" if allowed else "")
                + (f"; {t['pinned']}" if allowed and t.get("pinned") else "")
                + (")" if allowed else "")
                + "."
            )
    if busy:
        out.append("")
    return out
