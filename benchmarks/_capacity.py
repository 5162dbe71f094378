"""The capacity benchmark's parts that its clients' cells share: the sweep's context, one line
per cell (with what saturated the machine when a cell failed), the state of the load
generator's source, and the summary over repeats."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from _bench_procs import NullServer

HERE = Path(__file__).resolve().parent


class Ctx:
    """One capacity run: its settings, scratch folder, server, the competitor found, the repeat."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.events_per_stream = args.tokens + 2  # token chunks + usage chunk + [DONE]
        self.server: NullServer
        self.competitor_bin: Path | None = None
        self.repeat = 0
        self.deadline = time.monotonic() + args.budget_min * 60


def saturated(cell: dict[str, Any]) -> str:
    cpu = cell["cpu"]
    parts = []
    for label, v in cpu["by_process"].items():
        if v.get("main", 0) >= 0.85:
            parts.append(f"{label} main {v['main']:.2f}")
        if v.get("max_child", 0) >= 0.85:
            parts.append(f"{label} child {v['max_child']:.2f}")
    busy = cpu["machine_busy_cores"]
    if busy >= 0.9 * cpu["machine_cores"]:
        parts.append(f"machine {busy:.2f}/{cpu['machine_cores']} cores busy (other {cpu['other_cores']:.2f})")
    return "; ".join(parts) or "no process at >= 0.85 core"


def cell_line(c: dict[str, Any]) -> str:
    cpu = c["cpu"]["by_process"]
    cl, sv = cpu.get("client", {}), cpu.get("server", {})
    lat = c.get("lateness_us") or {}

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    return (
        f"{c['client']:<18} {c['rate']:>6g}/s  {'PASS' if c['passed'] else 'fail'}  "
        f"achieved {c.get('achieved_rps', 0):>8.1f}/s  events {c.get('events_per_s', 0):>9.0f}/s  "
        f"lateness p50/p99 {fmt(lat.get('p50'))}/{fmt(lat.get('p99'))} us  "
        f"cpu client main {cl.get('main', 0):.2f} max-child {cl.get('max_child', 0):.2f} "
        f"server {sv.get('main', 0):.2f} machine {c['cpu']['machine_busy_cores']:.2f} "
        f"(other {c['cpu']['other_cores']:.2f})" + (f"  [{c['reason']}]" if c.get("reason") else "")
    )


def source_state() -> dict[str, Any]:
    """Which load generator was measured: git HEAD and a hash of its sources as they are now
    (the tree may hold uncommitted edits; the hash is taken again at the end to catch changes)."""
    import hashlib

    src = HERE.parent / "src" / "connector_tax" / "loadgen"
    h = hashlib.sha256()
    for f in sorted(src.rglob("*.py")):
        h.update(str(f.relative_to(src)).encode() + f.read_bytes())
    try:
        head = subprocess.run(
            ["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(HERE.parent), "status", "--porcelain", "--", str(src)],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split()[1::2]
    except (OSError, subprocess.SubprocessError):
        head, dirty = "?", []
    return {"git_head": head, "loadgen_uncommitted": dirty, "loadgen_sha256": h.hexdigest()[:16]}


def summarize(args: argparse.Namespace, repeats: list[dict[str, Any]], competitor: str, wall: float) -> dict[str, Any]:
    names = list(dict.fromkeys(n for r in repeats for n in r))
    med: dict[str, dict[str, Any]] = {}
    for n in names:
        runs = [r[n] for r in repeats if n in r]
        med[n] = {
            "capacity_rps": statistics.median(x["capacity_rps"] for x in runs),
            "events_per_s": statistics.median(x["events_per_s"] for x in runs),
            "capacity_rps_each": [x["capacity_rps"] for x in runs],
            "events_per_s_each": [x["events_per_s"] for x in runs],
            "saturated_at_first_failure_each": [x["saturated_at_first_failure"] for x in runs],
        }
    ours = [n for n in names if n.startswith("ours")]
    theirs = [n for n in names if not n.startswith("ours")]
    best_ours = max(ours, key=lambda n: med[n]["capacity_rps"], default=None)
    best_theirs = max(theirs, key=lambda n: med[n]["capacity_rps"], default=None)
    ratio = ev_ratio = None
    if best_ours and best_theirs and med[best_theirs]["capacity_rps"] > 0:
        ratio = med[best_ours]["capacity_rps"] / med[best_theirs]["capacity_rps"]
        ev_ratio = med[best_ours]["events_per_s"] / max(med[best_theirs]["events_per_s"], 1e-9)

    print(
        f"\ncapacity: medians of {len(repeats)} repeat(s), {args.tokens}-token streams, {args.arrival} arrival, "
        f"null SSE server on loopback ({wall / 60:.1f} min)"
    )
    print(f"{'client':<20} {'capacity req/s':>15} {'SSE events/s':>13}   per repeat (req/s)")
    for n in names:
        m = med[n]
        each = ", ".join(f"{x:g}" for x in m["capacity_rps_each"])
        print(f"{n:<20} {m['capacity_rps']:>15g} {m['events_per_s']:>13.0f}   {each}")
    if ratio is not None:
        print(
            f"ratio {best_ours} / {best_theirs}: {ratio:.2f}x requests/s, {ev_ratio:.2f}x SSE events/s "
            f"(bar: >= 3x) [{competitor}]"
        )
    else:
        print(f"no ratio: competitor {competitor}")
    return {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "competitor": competitor,
        "machine_cpus": psutil.cpu_count(),
        "wall_s": round(wall, 1),
        "medians": med,
        "best_ours": best_ours,
        "best_competitor": best_theirs,
        "ratio_rps": ratio,
        "ratio_events": ev_ratio,
        "repeats": repeats,
    }
