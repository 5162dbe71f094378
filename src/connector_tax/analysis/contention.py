"""What the study's numbers rest on: which cells were measured while perturbed, and how busy the
host was while they ran.

The validity gate (measure/gate.py) marks a cell invalid when the host was busy or the load
generator was late enough to change what it measured; the pipeline measures such a cell again,
and when no attempt passes, the least perturbed one stands, marked. Here the analysis follows
what stands:

- `cells_behind`: the cells a hypothesis's number is computed from (H1-H4: every variant it
  names and the baseline at ref_safe; H5/H6: mooncake_both's and the baseline's Phase B shapes
  in the trend), and `rests_on`: which of them, and which of the cells that chose the reference
  rate, were perturbed. A call resting on any is never "confident" (hypotheses.py).
- `study_contention`: the report header's account: how many cells were measured under
  contention, how many needed another attempt, and how busy the host was (others' CPU share,
  the busiest second, steal, run queue), or that the cells ran in virtual time, on no host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from connector_tax.analysis import constants as K
from connector_tax.config import PHASE_A, PHASE_B
from connector_tax.contract.summary import SELF_STARVED

PERTURBED = "rests on perturbed cells"


def key(variant: str, phase: str, cell: str) -> str:
    return f"{variant}/{phase}/{cell}"


def perturbed_rows(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{variant/phase/cell: its row} of every cell the gate marked invalid."""
    return {key(r["variant"], r["phase"], r["cell"]): r for r in rows if r.get("valid") is False}


def cells_behind(rule_id: str, needs: tuple[str, ...], taxes: dict[str, Any], baseline: str) -> list[str]:
    """The cells a hypothesis's number is computed from."""
    if rule_id in ("H5", "H6"):
        along, across = ("input", "output") if rule_id == "H5" else ("output", "input")
        cells = ((taxes or {}).get(PHASE_B) or {}).get("cells") or {}
        groups: dict[Any, list[str]] = {}
        for label, cell in cells.items():
            if K.MOONCAKE_BOTH not in (cell.get("variants") or {}) or cell.get(along) is None:
                continue
            if {K.MOONCAKE_BOTH, baseline} & set(cell.get("saturated") or {}):
                continue  # left out of the trend (estimates.trend)
            groups.setdefault(cell.get(across), []).append(label)
        labels = [label for group in groups.values() if len(group) >= 2 for label in group]
        return [key(v, PHASE_B, label) for label in labels for v in (baseline, K.MOONCAKE_BOTH)]
    safe = (((taxes or {}).get("phase_a") or {}).get("ref_safe") or {}).get("cell")
    if safe is None:
        return []
    return [key(v, PHASE_A, safe) for v in (baseline, *needs)]


def rests_on(
    behind: list[str], perturbed: dict[str, dict[str, Any]], reference: dict[str, Any]
) -> dict[str, Any] | None:
    """The perturbed cells a call rests on (its own, and those that chose ref_safe), or None."""
    own = [k for k in behind if k in perturbed]
    chose = list((reference or {}).get("ref_safe_perturbed") or [])
    if not own and not chose:
        return None
    return {
        "cells": {k: perturbed[k].get("validity_reasons") or "invalid" for k in own},
        "ref_safe_chosen_with": chose,
    }


def describe_rest(rest: dict[str, Any]) -> str:
    parts = []
    if rest["cells"]:
        parts.append(
            "measured while perturbed: " + "; ".join(f"{k} ({_short(why)})" for k, why in rest["cells"].items())
        )
    if rest["ref_safe_chosen_with"]:
        parts.append("ref_safe was chosen with perturbed Phase A cells: " + ", ".join(rest["ref_safe_chosen_with"]))
    return "; ".join(parts)


def _short(reasons: str, n: int = 2) -> str:
    items = [r.strip() for r in str(reasons).split(";") if r.strip()]
    return "; ".join(items[:n]) + (f" (+{len(items) - n} more)" if len(items) > n else "")


def _stat(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "max": None}
    arr = np.asarray(values, dtype=float)
    return {"median": round(float(np.median(arr)), 4), "max": round(float(arr.max()), 4)}


def study_contention(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How much of the study was measured under contention, and how busy the host was."""
    measured = [r for r in rows if r.get("host_measured")]
    virtual = [r for r in rows if r.get("host_measured") is False]
    out: dict[str, Any] = {
        "cells": len(rows),
        "host_measured": len(measured),
        "virtual_time": len(virtual),
        "host_busy": sum(1 for r in measured if r.get("host_busy")),
        "invalid": sum(1 for r in rows if r.get("valid") is False),
        "measured_again": sum(1 for r in rows if (r.get("attempts") or 1) > 1),
        "others_cpu_frac": _stat(
            [r["host_others_cpu_frac"] for r in measured if r.get("host_others_cpu_frac") is not None]
        ),
        "others_cores_max": _stat(
            [r["host_others_cores_max"] for r in measured if r.get("host_others_cores_max") is not None]
        ),
        "steal_frac": _stat([r["host_steal_frac"] for r in measured if r.get("host_steal_frac") is not None]),
        "run_queue_mean": _stat(
            [r["host_run_queue_mean"] for r in measured if r.get("host_run_queue_mean") is not None]
        ),
        "perturbed": [
            {"cell": k, "reasons": r.get("validity_reasons"), "attempts": r.get("attempts")}
            for k, r in perturbed_rows(rows).items()
        ],
    }
    return out


def header_lines(contention: dict[str, Any], calls_perturbed: list[str]) -> list[str]:
    """The report header's lines on contention."""
    c = contention
    if not c or not c.get("cells"):
        return []
    lines: list[str] = []
    if calls_perturbed:
        starved = any(SELF_STARVED in (p.get("reasons") or "") for p in c.get("perturbed") or [])  # "; "-joined
        if starved:
            # nothing outside the study was busy, the study was: the server starved the load generator
            advice = (
                "The load generator was late because the server under test took the CPUs it needed, and another "
                "run on this host would find the same. Give the load generator a real-time class "
                "(`loadgen.rt_priority`), more cores, or lower rates."
            )
        elif c.get("host_measured") and not c.get("host_busy"):
            # late on a host with CPU to spare: a stall the guest's counters do not show, which slowed
            # the server as well (docs/contention.md); another hour may not have it
            advice = (
                "No cell was measured while the host was busy by its own counters, yet the load generator was late "
                "with CPU to spare: a stall the host does not show (a virtual machine's), which slows the server "
                "too. Run the study again: `snakemake --cores 1 all` measures again exactly the cells that stand "
                "perturbed (`snakemake -n` lists them)."
            )
        else:
            advice = (
                "Run the study again on a quiet host: `snakemake --cores 1 all` measures again exactly the cells "
                "that stand perturbed (`snakemake -n` lists them)."
            )
        lines += [
            f"> **Measured under contention.** {c['invalid']} of {c['cells']} cells stand perturbed (the validity "
            f"gate: a busy host or a late load generator) after every attempt; the calls on "
            f"{', '.join(calls_perturbed)} rest on them and are marked `{PERTURBED}`, not confident. " + advice,
            "",
        ]
    if c["host_measured"] == 0 and c["virtual_time"]:
        lines.append(
            f"- Host contention: none possible: all {c['virtual_time']} cells were computed in virtual time, "
            "on no host (no number is given for a host that did not run them)."
        )
        return lines
    frac, peak, steal, rq = c["others_cpu_frac"], c["others_cores_max"], c["steal_frac"], c["run_queue_mean"]

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{x * 100:.1f} %"

    lines.append(
        f"- Host contention: {c['host_busy']} of {c['host_measured']} cells measured while the host was busy, "
        f"{c['invalid']} stand invalid, {c['measured_again']} measured again; CPU of processes outside the study: "
        f"median {pct(frac['median'])}, max {pct(frac['max'])} of the host's CPUs over a cell (busiest second "
        f"{'–' if peak['max'] is None else format(peak['max'], '.2f')} cores); steal max {pct(steal['max'])}; "
        f"run queue median {'–' if rq['median'] is None else format(rq['median'], '.1f')}"
        + (f"; {c['virtual_time']} cells in virtual time (no host)" if c["virtual_time"] else "")
        + "."
    )
    return lines
