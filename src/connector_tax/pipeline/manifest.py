"""MANIFEST.md and MANIFEST.tsv: one row per run (configuration × phase), skips included.

    python -m connector_tax.pipeline.manifest --config STUDY.yaml --results results/STUDY
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from connector_tax.atomic import write_atomic
from connector_tax.config import load_config
from connector_tax.pipeline.cells import PHASE_A, PHASE_B
from connector_tax.pipeline.provenance import git_sha, gpu_ids, versions

COLUMNS = [
    "date", "study", "config", "phase", "status", "reason", "simulated", "backend", "vllm_version",
    "mooncake_version", "nixl_version", "lmcache_version", "connector_tax_sha", "gpu", "hma",
    "step_timing_available", "step_timing_reason", "cells", "result_dir", "launch_command",
]  # fmt: skip


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def hma_note(config: dict[str, Any]) -> str:
    if config["backend"] != "vllm":
        return "n/a (not vLLM)"
    from connector_tax.launch.vllm import hma_policy

    return hma_policy(config)


def manifest_rows(config: dict[str, Any], results: Path) -> list[dict[str, Any]]:
    installed = versions()
    common = {
        "study": config["study"],
        "backend": config["backend"],
        "vllm_version": installed["vllm"] or f"{config['vllm_version']} (configured; not installed here)",
        "mooncake_version": installed["mooncake-transfer-engine"] or "",
        "nixl_version": installed["nixl"] or "",
        "lmcache_version": installed["lmcache"] or "",
        "connector_tax_sha": git_sha() or "",
        "gpu": gpu_ids(config["backend"]).replace("\n", "; "),
        "hma": hma_note(config),
    }
    preflight = _read(results / "preflight" / "preflight_status.json") or {}
    rows = []
    for variant in config["configs"]:
        name = variant["name"]
        for phase in (PHASE_A, PHASE_B):
            run = _read(results / name / phase / "run.json")
            if run is None:
                pre = preflight.get(name, {})
                run = {"status": "skipped" if pre.get("status") == "skip" else "not run",
                       "reason": pre.get("reason")}  # fmt: skip
            rows.append({
                **common,
                "date": run.get("finished") or run.get("started") or "",
                "config": name,
                "phase": phase,
                "status": run.get("status", ""),
                "reason": run.get("reason") or "",
                "simulated": config["backend"] == "sim",
                "step_timing_available": run.get("step_timing_available", False),
                "step_timing_reason": run.get("step_timing_reason") or "",
                "cells": " ".join(run.get("cells", [])),
                "result_dir": str(results / name / phase),
                "launch_command": shlex.join(run["launch_command"]) if run.get("launch_command") else "",
            })  # fmt: skip
    return rows


def render_tsv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, delimiter="\t", lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def render_md(config: dict[str, Any], rows: list[dict[str, Any]], results: Path) -> str:
    skipped_figures = _read(results / "analysis" / "figures" / "skipped.json") or {}
    simulated = config["backend"] == "sim"
    lines = [f"# Manifest — study `{config['study']}`", ""]
    if simulated:
        lines += ["**SIMULATED**: every number here comes from the embedded simulated vLLM (`ctax sim`), "
                  "a model of vLLM's engine, not from a GPU.", ""]  # fmt: skip
    first = rows[0] if rows else {}
    lines += [
        f"- backend: {config['backend']}; vLLM: {first.get('vllm_version', '')}; "
        f"connector-tax {first.get('connector_tax_sha', '')[:12]}",
        f"- GPU: {first.get('gpu', '')}; hybrid KV cache manager: {first.get('hma', '')}",
        f"- Mooncake {first.get('mooncake_version') or '—'}, NIXL {first.get('nixl_version') or '—'}, "
        f"LMCache {first.get('lmcache_version') or '—'}",
        "",
        "| date | config | phase | status | step timing | result dir | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        timing = "yes" if r["step_timing_available"] else f"no ({r['step_timing_reason']})" if r["step_timing_reason"] else "no"
        lines.append(f"| {r['date']} | {r['config']} | {r['phase']} | {r['status']} | {timing} | "
                     f"`{r['result_dir']}` | {r['reason']} |")  # fmt: skip
    lines += ["", "## Launch commands", ""]
    for r in rows:
        if r["launch_command"]:
            lines += [f"- {r['config']} / {r['phase']}: `{r['launch_command']}`"]
    lines += ["", "## Skipped figures", ""]
    lines += [f"- {fig}: {why}" for fig, why in skipped_figures.items()] or ["- none"]
    return "\n".join(lines) + "\n"


def write_manifest(config: dict[str, Any], results: Path) -> None:
    rows = manifest_rows(config, results)
    write_atomic(results / "MANIFEST.tsv", render_tsv(rows))
    write_atomic(results / "MANIFEST.md", render_md(config, rows, results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connector_tax.pipeline.manifest")
    parser.add_argument("--config", required=True)
    parser.add_argument("--results", required=True, type=Path)
    args = parser.parse_args(argv)
    write_manifest(load_config(args.config), args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
