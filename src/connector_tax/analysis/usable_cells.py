"""Which cells a study's analysis may use: the config's plan, checked against the launch indexes.

The set of cells comes from study_config.yaml (the config the study ran with) and, for Phase B,
reference_rates.json; each planned cell is looked up in its launch's run.json index and used
only if

* the index belongs to this study and backend, and its launch settings (model, variant, server
  and backend settings) are the config's;
* the cell's recorded settings are the ones the config plans, and its fingerprint is the hash
  of what the index recorded (launch, cell, code);
* its sealed summary carries that fingerprint and every file it vouches for is there, intact
  (contract.index.verify_cell);
* every usable cell of the study was measured by the same code (load generator, sampler,
  simulator or instrumentation).

A violation of the first, second or fourth rule means results of other settings are on disk:
loading refuses with one line naming the cell (`StudyRefused`). A cell that failed, was never
measured or is incomplete is not used and is reported with its reason. Folders the plan does not
name (a configuration or cell removed from the config, superseded/ cells) are listed in
`ignored` and never read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from connector_tax.analysis.jsonl import read_json
from connector_tax.config import (
    LAUNCH_OF,
    LAUNCH_PHASES,
    PHASE_A,
    PHASE_B,
    PHASES,
    Cell,
    ConfigError,
    StudyConfig,
    launch_label,
    planned_cells,
    validate_config,
)
from connector_tax.contract import CellFiles, StudyLayout, phase_folder
from connector_tax.contract.fingerprint import canonical, cell_settings, differences, fingerprint, launch_settings
from connector_tax.contract.index import COMPLETE, PRUNED, PhaseIndex, read_index, read_summary, verify_cell
from connector_tax.contract.summary import CellSummary

# Launch settings the config determines (argv and server versions are facts of the launch).
_CONFIG_LAUNCH_KEYS = ("backend", "model", "variant", "server", "sim", "vllm", "openai")


class StudyRefused(ValueError):
    """Results on disk belong to other settings; str() is one line naming the cell."""


@dataclass
class Measurement:
    """A planned cell of the study with its files and sealed summary (only usable ones are made)."""

    variant: str
    phase: str
    label: str
    files: CellFiles
    planned: Cell
    summary: CellSummary | None = None

    @property
    def folder(self) -> Path:
        return self.files.folder

    def path(self, kind: str) -> Path:
        return self.files.path(kind)

    def has(self, kind: str) -> bool:
        return self.path(kind).is_file()

    @property
    def rate(self) -> float:
        return self.planned.rps

    @property
    def shape(self) -> tuple[int, int] | None:
        s = self.planned.shape
        return (int(s["input"]), int(s["output"])) if "input" in s else None

    @property
    def key(self) -> str:
        return f"{self.phase}/{self.label}"

    @property
    def replicate(self) -> int:
        return self.planned.replicate


@dataclass
class PhaseRun:
    variant: str
    phase: str
    folder: Path
    run: dict[str, Any] | None
    cells: list[Measurement] = field(default_factory=list)
    # Planned cells that cannot be used: {label: why} (failed, never measured, incomplete).
    problems: dict[str, str] = field(default_factory=dict)
    # Phase A cells not measured on purpose, past the configuration's knee: {label: why}.
    pruned: dict[str, str] = field(default_factory=dict)
    replicate: int = 1

    @property
    def status(self) -> str:
        return str((self.run or {}).get("status") or "missing")

    @property
    def reason(self) -> str | None:
        if self.run is None:
            return "no run.json index"
        return self.run.get("reason")

    @property
    def step_timing_available(self) -> bool:
        return bool((self.run or {}).get("step_timing_available"))

    @property
    def step_timing_reason(self) -> str | None:
        return (self.run or {}).get("step_timing_reason")


@dataclass
class Study:
    root: Path
    settings: StudyConfig  # study_config.yaml, typed (its raw mapping only checks fingerprints)
    name: str
    variants: list[str]
    preflight: dict[str, Any]
    runs: dict[tuple[str, str, int], PhaseRun]  # (variant, phase, replicate)
    reference_file: dict[str, Any] | None
    ignored: list[dict[str, str]] = field(default_factory=list)
    code: dict[str, Any] | None = None

    @property
    def backend(self) -> str:
        return self.settings.backend

    @property
    def simulated(self) -> bool:
        return self.backend == "sim"

    @property
    def replicates(self) -> int:
        return self.settings.workload.replicates

    def run_of(self, config: str, phase: str, replicate: int = 1) -> PhaseRun | None:
        return self.runs.get((config, phase, replicate))

    def runs_of(self, config: str, phase: str) -> list[PhaseRun]:
        """Every replicate's run of a variant's phase (one without replicates)."""
        return [r for r in (self.run_of(config, phase, k) for k in range(1, self.replicates + 1)) if r is not None]

    def cells(self, phase: str | None = None) -> list[Measurement]:
        return [
            c
            for name in self.variants
            for ph in PHASES
            if phase in (None, ph)
            for run in self.runs_of(name, ph)
            for c in run.cells
        ]

    @property
    def phase_a_rates(self) -> list[float]:
        return sorted(float(r) for r in self.settings.workload.phase_a.rates)


def _read_config(layout: StudyLayout) -> StudyConfig:
    where = layout.study_config
    try:
        raw = yaml.safe_load(where.read_text(encoding="utf-8"))
    except OSError:
        raise StudyRefused(
            f"{layout.root}: no study_config.yaml, so no plan to check results against "
            "(not a study folder written by the pipeline)"
        ) from None
    except yaml.YAMLError as exc:
        raise StudyRefused(f"{where}: unreadable: {exc}") from None
    try:
        return StudyConfig.from_mapping(validate_config(raw))
    except ConfigError as exc:
        raise StudyRefused(f"{where}: {exc}") from None


def _check_launch(study: StudyConfig, index: PhaseIndex, where: str) -> None:
    if index.study != study.study:
        raise StudyRefused(f"{where}: results of study {index.study!r}, not {study.study!r}")
    if index.backend != study.backend:
        raise StudyRefused(
            f"{where}: measured on backend {index.backend}, the study is backend "
            f"{study.backend}: results of two backends are never mixed"
        )
    expected = launch_settings(study.raw, study.variant(index.variant).raw, [], {})  # the fingerprint's own mapping
    recorded = {k: v for k, v in index.launch.items() if k in _CONFIG_LAUNCH_KEYS}
    wanted = {k: v for k, v in expected.items() if k in _CONFIG_LAUNCH_KEYS}
    if canonical(recorded) != canonical(wanted):
        changed = "; ".join(differences(recorded, wanted))
        raise StudyRefused(
            f"{where}: launched with other settings than study_config.yaml ({changed}); run the pipeline to re-measure"
        )


def _usable(
    config: Mapping[str, Any], index: PhaseIndex, cell: Cell, files: CellFiles, where: str
) -> tuple[CellSummary | None, str | None]:
    """(sealed summary, None) for a usable cell, (None, why) for one that is not; raises
    StudyRefused when the cell on record was planned with other settings."""
    entry = index.cell(cell.phase, cell.label)
    if entry is None:
        return None, "not in its launch's run.json index"
    expected = cell_settings(config, cell)
    if canonical(entry.settings) != canonical(expected):
        changed = "; ".join(differences(entry.settings, expected))
        raise StudyRefused(
            f"{where}: measured with other settings than study_config.yaml ({changed}); run the pipeline to re-measure"
        )
    if fingerprint(index.launch, entry.settings, index.code) != entry.fingerprint:
        raise StudyRefused(f"{where}: its fingerprint in run.json is not the hash of what run.json records")
    if entry.status != COMPLETE:
        return None, entry.reason if entry.status == PRUNED else f"{entry.status}: {entry.reason or 'not measured'}"
    ok, why = verify_cell(files, entry.fingerprint)
    if not ok:
        return None, f"incomplete: {why}"
    return read_summary(files), None


def _ignored(
    layout: StudyLayout, names: list[str], planned: dict[tuple[str, str, int], set[str]], replicates: range
) -> list[dict[str, str]]:
    out = [
        {"path": str(layout.root / d), "why": "configuration not in the study config (orphan)"}
        for d in layout.config_dirs()
        if d not in names
    ]
    planned_folders = {phase_folder(ph, r) for ph in PHASES for r in replicates}
    for name in names:
        folder = layout.root / name
        extra = sorted(p for p in folder.glob("*.r*") if p.is_dir() and p.name not in planned_folders)
        out += [{"path": str(p), "why": "replicate beyond workload.replicates (not analysed)"} for p in extra]
    for name, phase, replicate in ((n, ph, r) for n in names for ph in PHASES for r in replicates):
        pl = layout.phase(name, phase, replicate)
        if pl.superseded_root.is_dir():
            out += [
                {"path": str(p), "why": "superseded (kept, not analysed)"} for p in sorted(pl.superseded_root.iterdir())
            ]
        if not pl.folder.is_dir():
            continue
        for summary in sorted(pl.folder.glob(f"summary_{phase}_*.json")):
            label = summary.name[len(f"summary_{phase}_") : -len(".json")]
            if label not in planned.get((name, phase, replicate), set()):
                out.append(
                    {
                        "path": str(summary.parent / f"*_{phase}_{label}.*"),
                        "why": "cell not in the study config's plan (orphan)",
                    }
                )
    return out


def load_study(root: Path) -> Study:
    """The study under `root` (= results/<study>), as its config plans it; raises StudyRefused."""
    layout = StudyLayout(Path(root))
    study = _read_config(layout)
    config = study.raw  # what the fingerprints were computed from
    names = study.names
    preflight = read_json(layout.preflight_status) or {}
    reference = read_json(layout.reference_rates)
    runs: dict[tuple[str, str, int], PhaseRun] = {}
    planned_labels: dict[tuple[str, str, int], set[str]] = {}
    codes: dict[str, tuple[str, dict[str, Any]]] = {}
    replicates = range(1, study.workload.replicates + 1)
    for name, launch_phase, replicate in ((n, lp, r) for n in names for lp in LAUNCH_PHASES for r in replicates):
        who = launch_label(name, replicate)
        index = read_index(layout.index(name, launch_phase, replicate))
        phases = [ph for ph in PHASES if LAUNCH_OF[ph] == launch_phase]
        for ph in phases:
            folder = layout.phase(name, ph, replicate).folder
            doc = index.to_dict() if index else None
            runs[(name, ph, replicate)] = PhaseRun(name, ph, folder, doc, replicate=replicate)
        if launch_phase == PHASE_B and reference is None:
            if index is not None:
                runs[(name, PHASE_B, replicate)].problems["*"] = (
                    "no reference_rates.json: Phase B cells cannot be checked"
                )
            continue
        plan = planned_cells(study, name, launch_phase, reference, replicate)
        for cell in plan:
            planned_labels.setdefault((name, cell.phase, replicate), set()).add(cell.label)
        if index is None:
            for cell in plan:
                runs[(name, cell.phase, replicate)].problems[cell.label] = "never measured (no run.json index)"
            continue
        where = f"{who}/{launch_phase}"
        _check_launch(study, index, where)
        for cell in plan:
            files = layout.phase(name, cell.phase, replicate).cell(cell.label)
            summary, why = _usable(config, index, cell, files, f"{who}/{cell.key}")
            run = runs[(name, cell.phase, replicate)]
            if why is not None:
                (run.pruned if why.startswith(PRUNED) else run.problems)[cell.label] = why
                continue
            run.cells.append(Measurement(name, cell.phase, cell.label, files, cell, summary))
            codes.setdefault(canonical(index.code), (f"{name}/{cell.key}", index.code))
    if len(codes) > 1:
        (first, a), (second, b) = list(codes.values())[:2]
        raise StudyRefused(
            f"{second}: measured by other code than {first} ({'; '.join(differences(a, b))}): "
            "cells of one study must come from one version of the instruments"
        )
    for run in runs.values():
        run.cells.sort(key=_sort_key)
    return Study(
        root=layout.root,
        settings=study,
        name=study.study,
        variants=names,
        preflight=preflight,
        runs=runs,
        reference_file=reference,
        ignored=_ignored(layout, names, planned_labels, replicates),
        code=next(iter(codes.values()))[1] if codes else None,
    )


def _sort_key(cell: Measurement) -> tuple[int, float, int, str]:
    if cell.phase == PHASE_A:
        return (0, cell.rate, 0, cell.label)
    if cell.shape is not None:
        return (1, cell.shape[0], cell.shape[1], cell.label)
    return (2, 0, 0, cell.label)


def phase_completed(study: Study, config: str, phase: str = PHASE_A) -> tuple[bool, str | None]:
    """Did `config` complete `phase`? (a launch of it measured its planned cells; with replicates,
    at least one replicate did)"""
    outcomes = [_run_completed(study, config, phase, r) for r in range(1, study.replicates + 1)]
    return next((o for o in outcomes if o[0]), outcomes[0])


def _run_completed(study: Study, config: str, phase: str, replicate: int) -> tuple[bool, str | None]:
    run = study.run_of(config, phase, replicate)
    if run is None or run.run is None:
        pf = study.preflight.get(config) or {}
        if pf.get("status") not in (None, "ok"):
            return False, f"preflight {pf.get('status')}: {pf.get('reason')}"
        return False, f"no {phase} results"
    if run.status not in ("ok", "partial"):
        return False, f"{phase} {run.status}: {run.reason}"
    if not run.cells:
        return False, f"no usable {phase} cells"
    return True, None
