"""What a declared intervention explains: its variant beside the one it changes, from the run's records.

A variant that declares interventions (config/interventions.py) is compared with its *partner*:
the study's variant with the same settings but fewer interventions (the nearest such one; e.g.
`nixl_progress_off` with `nixl_both`). `effects` gives, per such variant and cell the taxes use
(Phase A at ref_safe, every Phase B shape): the direct change of its TTFT and TPOT p90s against
the partner's (paired by request, launch-aware: taxes.LaunchTaxes with the partner as baseline).
`render` makes the report's section: both variants' taxes against the baseline side by side, the
engine step, the thread the intervention addresses idle and under load, and a sentence of what
the intervention explains ("the TPOT tax falls from X [..] to Y [..]; the idle thread's CPU from A
to B"). `pointers` is the other direction (a symptom to an experiment): for a thread busy at idle
that plain lacks, the shipped interventions that address it and the overlay that measures them.
Reads the analysis's own documents; never a server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from connector_tax.analysis.taxes import LaunchTaxes
from connector_tax.config import PHASE_A, PHASE_B
from connector_tax.config.interventions import REGISTRY, addressing
from connector_tax.contract.fingerprint import canonical

_IDENTITY = ("name", "description", "interventions", "aa_of")
METRICS = (("ttft_p90", "ttft_ms", "TTFT p90"), ("tpot_p90", "tpot_ms", "TPOT p90"))


def partners(variants: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """{variant with interventions: the variant it changes}: the same settings (connector, server,
    env...), a strict subset of its interventions, the most of them (the nearest)."""

    def settings(v: Mapping[str, Any]) -> str:
        return canonical({k: x for k, x in v.items() if k not in _IDENTITY})

    out = {}
    for v in variants:
        mine = set(v.get("interventions") or [])
        if not mine - {i for i, r in REGISTRY.items() if r.cpu_only}:  # a required guard alone: nothing to explain
            continue
        candidates = [w for w in variants if settings(w) == settings(v) and set(w.get("interventions") or []) < mine]
        if candidates:
            out[v["name"]] = max(candidates, key=lambda w: len(w.get("interventions") or []))["name"]
    return out


def effects(
    variants: Sequence[Mapping[str, Any]], launch: LaunchTaxes, taxes: dict[str, Any] | None
) -> dict[str, dict[str, Any]]:
    """{variant: {"of": partner, "declared": [...], "cells": {cell key: {metric: estimate}}}}."""
    out: dict[str, dict[str, Any]] = {}
    cells = _cells(taxes)
    for name, partner in partners(variants).items():
        declared = next(v.get("interventions") or [] for v in variants if v["name"] == name)
        entry: dict[str, Any] = {"of": partner, "declared": declared, "cells": {}}
        for phase, label in cells:
            if launch.replicates(name, phase, label) and launch.replicates(partner, phase, label):
                entry["cells"][f"{phase}/{label}"] = {
                    m: launch.tax(name, partner, phase, label, s) for m, s, _ in METRICS
                }
        out[name] = entry
    return out


def _cells(taxes: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The cells the taxes use: Phase A at ref_safe, then every Phase B shape."""
    if not taxes:
        return []
    safe = ((taxes.get("phase_a") or {}).get("ref_safe") or {}).get("cell")
    shapes = list((taxes.get(PHASE_B) or {}).get("cells") or {})
    return ([(PHASE_A, safe)] if safe else []) + [(PHASE_B, s) for s in shapes]


# --------------------------------------------------------------------------- the report


def _pct(est: dict[str, Any] | None) -> str:
    if not est or est.get("value") is None:
        return "–"
    ci = est.get("ci")
    out = f"{est['value'] * 100:+.1f} %"
    return out + (f" [{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}]" if ci and None not in ci else "")


def _tax(agg: dict[str, Any], name: str, key: str, metric: str) -> dict[str, Any] | None:
    taxes = agg.get("taxes") or {}
    phase, label = key.split("/", 1)
    if phase == PHASE_A:
        return ((((taxes.get("phase_a") or {}).get("ref_safe") or {}).get("variants") or {}).get(name) or {}).get(
            metric
        )
    cell = ((taxes.get(PHASE_B) or {}).get("cells") or {}).get(label) or {}
    return ((cell.get("variants") or {}).get(name) or {}).get(metric)


def _row(agg: dict[str, Any], name: str, key: str) -> dict[str, Any]:
    phase, label = key.split("/", 1)
    return next(
        (
            r
            for r in agg["rows"]
            if (r["variant"], r["phase"], r["cell"]) == (name, phase, label) and (r.get("replicate") or 1) == 1
        ),
        {},
    )


def _thread(agg: dict[str, Any], name: str, state: str, needle: str | None) -> str:
    """The CPU of the thread an intervention addresses (started by the connector: `needle`), and
    the server's total, in one state ("idle", "load")."""
    use = (((agg.get("threads") or {}).get("variants") or {}).get(name) or {}).get(state)
    if not use:
        return "not sampled"
    if not needle:  # the intervention addresses no thread of its own: the server's total only
        return f"server {use['total_pct']:.0f} %"
    hit = next((t for t in use["threads"] if needle and needle in (t.get("started_by") or "")), None)
    top = use["threads"][-1]["cpu_pct"] if use["threads"] else 0.0
    mine = f"{hit['cpu_pct']:.0f} %" if hit else f"none among the busiest (< {max(top, 1.0):.0f} %)"
    return f"{mine} (server {use['total_pct']:.0f} %)"


def render(agg: dict[str, Any]) -> list[str]:
    """The report's "Interventions" section; nothing when no variant's intervention has a partner."""
    found = agg.get("intervention_effects") or {}
    if not found:
        return []
    base = agg.get("baseline") or "the baseline"
    out = [
        "## Interventions: what removing a suspected cause explains",
        "",
        f"Each variant that declares an intervention beside the same variant without it, both against `{base}` "
        "(taxes with their launch-aware 95 % intervals), and the direct change of one against the other (paired by "
        "request, launch-aware). Thread CPU: % of one core, the thread the intervention addresses (started by the "
        "connector) and the whole server, idle (before the first request) and under load (the Phase A cell).",
        "",
    ]
    for name, entry in found.items():
        partner, declared = entry["of"], entry["declared"]
        needle = next((REGISTRY[d].thread for d in declared if d in REGISTRY and REGISTRY[d].thread), None)
        out += [f"### `{name}` beside `{partner}`", ""]
        out += [f"- declares `{d}`: {REGISTRY[d].disclosure}" for d in declared if d in REGISTRY] + [""]
        out += [
            f"| cell | measure | `{partner}` | `{name}` | `{name}` / `{partner}` − 1 [95 % CI] |",
            "|---|---|---|---|---|",
        ]
        for key, direct in entry["cells"].items():
            for metric, _series, words in METRICS:
                out.append(
                    f"| {key} | tax {words} | {_pct(_tax(agg, partner, key, metric))} | "
                    f"{_pct(_tax(agg, name, key, metric))} | {_pct(direct.get(metric))} |"
                )
            eng = [_row(agg, n, key).get("engine_step_us_p50") for n in (partner, name)]
            cells = [
                "–" if v is None else f"{v / 1000:.2f} ms (tax {_pct(_tax(agg, n, key, 'engine_step_p50'))})"
                for n, v in zip((partner, name), eng)
            ]
            ratio = f"{(eng[1] / eng[0] - 1) * 100:+.1f} % (first launches)" if None not in eng and eng[0] else "–"
            out.append(f"| {key} | engine step p50 | {cells[0]} | {cells[1]} | {ratio} |")
        for state in ("idle", "load"):
            out.append(
                f"| {state} | thread CPU | {_thread(agg, partner, state, needle)} | {_thread(agg, name, state, needle)} | |"
            )
        out += ["", "- " + explains(agg, name, partner, entry, needle), ""]
    return out


def explains(agg: dict[str, Any], name: str, partner: str, entry: dict[str, Any], needle: str | None) -> str:
    """The sentence: the taxes at ref_safe before and after, the idle thread's CPU before and after,
    and the share of the partner's tax the intervention removes (log scale)."""
    key = next((k for k in entry["cells"] if k.startswith(PHASE_A)), next(iter(entry["cells"]), None))
    if key is None:
        return f"no cell of `{name}` and `{partner}` to compare."
    parts = []
    for metric, _series, words in METRICS:
        before, after = _tax(agg, partner, key, metric), _tax(agg, name, key, metric)
        if not before or not after or before.get("value") is None or after.get("value") is None:
            continue
        text = f"the {words} tax at {key} falls from {_pct(before)} to {_pct(after)}"
        if before["value"] > 0:
            share = 1 - math.log1p(after["value"]) / math.log1p(before["value"])
            text += f" (it removes {share * 100:.0f} % of `{partner}`'s tax on the log scale)"
        parts.append(text)
    if needle:
        idle = [_thread(agg, n, "idle", needle) for n in (partner, name)]
        parts.append(f"the idle {needle} thread's CPU from {idle[0]} to {idle[1]}")
    return ("; ".join(parts) or "no tax to compare") + "."


def pointers(agg: dict[str, Any]) -> dict[str, list[str]]:
    """{variant: lines} for threads busy at idle that plain lacks: the shipped interventions that
    address each, and the overlay that measures them (unless the study already runs them)."""
    busy = (agg.get("threads") or {}).get("busy_beyond_plain") or {}
    running = {i for names in (agg.get("interventions") or {}).values() for i in names}
    out: dict[str, list[str]] = {}
    for name, threads in busy.items():
        for t in threads:
            fixes = [i for i in addressing(t.get("started_by")) if i.name not in running]
            if not fixes:
                continue
            overlays = sorted({i.overlay for i in fixes if i.overlay})
            out.setdefault(name, []).append(
                "a shipped intervention addresses it: "
                + ", ".join(f"`{i.name}` ({i.removes})" for i in fixes)
                + (
                    "; measure it beside this variant with "
                    + " or ".join(f"`snakemake --cores 1 all --configfile <this study's config> {o}`" for o in overlays)
                    if overlays
                    else ""
                )
            )
    return out
