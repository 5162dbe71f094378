"""What a study's results directory holds: configs, phases, cells and their files.

Discovery trusts the files, not the plan: a cell is whatever has a summary or a request log
in <config>/<phase>/, joined with the labels run.json lists (a listed cell with no files is
kept, so its absence is reported rather than silently dropped). Phase B' cells run in the
Phase B launch, so a phase_b_prime folder without its own run.json borrows phase_b's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from connector_tax.analysis.constants import PHASE_A, PHASE_B, PHASE_B_PRIME, PHASES, parse_rate_label, parse_shape_label
from connector_tax.analysis.jsonl import read_json

KINDS = ("requests", "summary", "metrics", "engine_step")
_SUFFIX = {"requests": ".jsonl", "summary": ".json", "metrics": ".jsonl", "engine_step": ".jsonl"}


@dataclass
class Cell:
    config: str
    phase: str
    label: str
    folder: Path
    summary: dict[str, Any] | None = None

    def path(self, kind: str) -> Path:
        return self.folder / f"{kind}_{self.phase}_{self.label}{_SUFFIX[kind]}"

    def has(self, kind: str) -> bool:
        return self.path(kind).is_file()

    @property
    def rate(self) -> float | None:
        if self.summary and isinstance(self.summary.get("rate"), (int, float)):
            return float(self.summary["rate"])
        return parse_rate_label(self.label) if self.phase == PHASE_A else None

    @property
    def shape(self) -> tuple[int, int] | None:
        return parse_shape_label(self.label)

    @property
    def key(self) -> str:
        return f"{self.phase}/{self.label}"


@dataclass
class PhaseRun:
    config: str
    phase: str
    folder: Path
    run: dict[str, Any] | None
    cells: list[Cell] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.run is None:
            return "ok" if self.cells else "missing"
        return str(self.run.get("status") or "ok")

    @property
    def reason(self) -> str | None:
        if self.run is None:
            return None if self.cells else "no run.json and no cell files"
        return self.run.get("reason")

    @property
    def step_timing_available(self) -> bool:
        if self.run is not None and "step_timing_available" in self.run:
            return bool(self.run["step_timing_available"])
        return any(c.has("engine_step") for c in self.cells)

    @property
    def step_timing_reason(self) -> str | None:
        return (self.run or {}).get("step_timing_reason")


@dataclass
class Study:
    root: Path
    config: dict[str, Any]
    name: str
    configs: list[str]
    preflight: dict[str, Any]
    runs: dict[tuple[str, str], PhaseRun]
    reference_file: dict[str, Any] | None

    @property
    def backend(self) -> str | None:
        if self.config.get("backend"):
            return str(self.config["backend"])
        for run in self.runs.values():
            if run.run and run.run.get("backend"):
                return str(run.run["backend"])
        return None

    @property
    def simulated(self) -> bool:
        if self.backend == "sim":
            return True
        return any(bool((r.run or {}).get("simulated")) for r in self.runs.values())

    def run_of(self, config: str, phase: str) -> PhaseRun | None:
        return self.runs.get((config, phase))

    def cells(self, phase: str | None = None) -> list[Cell]:
        out = []
        for name in self.configs:
            for ph in PHASES:
                if phase is not None and ph != phase:
                    continue
                run = self.runs.get((name, ph))
                if run:
                    out.extend(run.cells)
        return out

    @property
    def phase_a_rates(self) -> list[float]:
        rates = ((self.config.get("workload") or {}).get("phase_a") or {}).get("rates")
        if rates:
            return sorted(float(r) for r in rates)
        found = {c.rate for c in self.cells(PHASE_A) if c.rate is not None}
        return sorted(found)  # type: ignore[arg-type]

    @property
    def saturation_thresholds(self) -> dict[str, float]:
        from connector_tax.analysis.constants import DEFAULT_SATURATION

        given = self.config.get("saturation") or {}
        return {k: float(given.get(k, v)) for k, v in DEFAULT_SATURATION.items()}


def _labels_from_files(folder: Path, phase: str) -> set[str]:
    labels: set[str] = set()
    if not folder.is_dir():
        return labels
    for kind in ("summary", "requests"):
        prefix, suffix = f"{kind}_{phase}_", _SUFFIX[kind]
        for path in folder.glob(f"{prefix}*{suffix}"):
            label = path.name[len(prefix): -len(suffix)]
            if phase == PHASE_B and path.name.startswith(f"{kind}_{PHASE_B_PRIME}_"):
                continue
            if label:
                labels.add(label)
    return labels


def _labels_from_run(run: dict[str, Any] | None, phase: str) -> set[str]:
    labels: set[str] = set()
    for item in (run or {}).get("cells") or []:
        item = str(item)
        if "/" in item:
            ph, label = item.split("/", 1)
            if ph == phase:
                labels.add(label)
        elif phase != PHASE_B_PRIME:  # bare labels belong to the run's own phase
            if (run or {}).get("phase") in (None, phase):
                labels.add(item)
    return labels


def _sort_key(cell: Cell) -> tuple:
    if cell.rate is not None and cell.phase == PHASE_A:
        return (0, cell.rate, cell.label)
    if cell.shape is not None:
        return (1, cell.shape[0], cell.shape[1], cell.label)
    return (2, 0, 0, cell.label)


def load_study(root: Path) -> Study:
    root = Path(root)
    config: dict[str, Any] = {}
    cfg_path = root / "study_config.yaml"
    if cfg_path.is_file():
        try:
            config = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            config = {}
    preflight = read_json(root / "preflight" / "preflight_status.json") or {}
    names = [str(c["name"]) for c in config.get("configs") or [] if isinstance(c, dict) and "name" in c]
    for name in preflight:
        if name not in names:
            names.append(str(name))
    extra = sorted(
        p.name for p in root.iterdir()
        if p.is_dir() and p.name not in names and any((p / ph).is_dir() for ph in PHASES)
    ) if root.is_dir() else []  # fmt: skip
    names += extra
    runs: dict[tuple[str, str], PhaseRun] = {}
    for name in names:
        for phase in PHASES:
            folder = root / name / phase
            run = read_json(folder / "run.json")
            borrowed = None
            if run is None and phase == PHASE_B_PRIME:
                borrowed = read_json(root / name / PHASE_B / "run.json")
            labels = _labels_from_files(folder, phase) | _labels_from_run(run or borrowed, phase)
            if run is None and not labels:
                continue
            cells = []
            for label in labels:
                cell = Cell(name, phase, label, folder)
                summary = read_json(cell.path("summary"))
                cell.summary = summary if isinstance(summary, dict) else None
                cells.append(cell)
            cells.sort(key=_sort_key)
            runs[(name, phase)] = PhaseRun(name, phase, folder, run if run is not None else borrowed, cells)
    return Study(
        root=root,
        config=config,
        name=str(config.get("study") or root.name),
        configs=names,
        preflight=preflight if isinstance(preflight, dict) else {},
        runs=runs,
        reference_file=read_json(root / "reference_rates.json"),
    )


def phase_completed(study: Study, config: str, phase: str = PHASE_A) -> tuple[bool, str | None]:
    """Did `config` complete `phase`? (run.json status ok, or without run.json every planned
    Phase A rate has a cell.)"""
    run = study.run_of(config, phase)
    if run is None:
        pf = study.preflight.get(config) or {}
        if pf.get("status") not in (None, "ok"):
            return False, f"preflight {pf.get('status')}: {pf.get('reason')}"
        return False, f"no {phase} results"
    if run.run is not None:
        status = run.run.get("status")
        if status not in ("ok", None):
            return False, f"{phase} {status}: {run.run.get('reason')}"
    if not run.cells:
        return False, f"no {phase} cells"
    return True, None
