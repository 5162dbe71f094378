"""The two sides of `ctax compare`: each a study folder, or a variant of one, read once; which of
their cells are the same cell; the settings and versions that differ between them. Reads files
only (the study contract's checks refuse results of other settings, as for `ctax analyze`)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connector_tax.analysis.constants import PLAIN
from connector_tax.analysis.core import read_cells, served_by
from connector_tax.analysis.taxes import LaunchTaxes, SeriesMap
from connector_tax.analysis.usable_cells import Study, StudyRefused, load_study
from connector_tax.config import PHASE_A
from connector_tax.contract import StudyLayout
from connector_tax.contract.fingerprint import differences

# MANIFEST.tsv columns that say which software measured (the rest are facts of one run).
MANIFEST_VERSIONS = (
    "served_by",
    "vllm_version",
    "nixl_version",
    "mooncake_version",
    "lmcache_version",
    "torch_version",
    "connector_tax_sha",
    "workarounds",
    "interventions",
    "hma",
    "mooncake_transport",
    "gpu",
)


class CompareError(ValueError):
    """Bad arguments or a side that is not a study: str() is one line."""


@dataclass
class Cells:
    """A study's measured cells as the intervals need them: rows, requests, traffic seeds."""

    rows: list[dict[str, Any]]
    series: SeriesMap
    seeds: dict[tuple[str, str, str, int], int | None]  # (variant, phase, label, replicate) -> traffic seed
    baseline: str | None
    launch: LaunchTaxes = field(init=False)

    def __post_init__(self) -> None:
        self.launch = LaunchTaxes(self.series, self.rows)

    def measured(self, variant: str | None) -> set[tuple[str, str]]:
        return {(ph, c) for (n, ph, c, _r) in self.series if n == variant}

    def replicates(self, variant: str, phase: str, label: str) -> list[int]:
        return self.launch.replicates(variant, phase, label)


@dataclass
class Side:
    """One side of a comparison: a study, read once, and the variant asked for (if any)."""

    spec: str
    root: Path
    variant: str | None
    study: Study
    cells: Cells
    planned: dict[tuple[str, str], Any]  # (phase, label) -> the planned Cell


def pair_name(va: str, vb: str) -> str:
    """A compared pair in words: the variant, or "A's -> B's" when they differ."""
    return va if va == vb else f"{va} -> {vb}"


def parse_side(text: str) -> tuple[Path, str | None]:
    """`DIR` or `DIR:VARIANT` (a path that exists as written is a folder, colon or not)."""
    path = Path(text)
    if path.is_dir() or ":" not in text:
        return path, None
    folder, _, variant = text.rpartition(":")
    return Path(folder), variant or None


def open_side(text: str) -> Side:
    root, variant = parse_side(text)
    if not root.is_dir():
        raise CompareError(f"{text}: no such study folder (results/<study> or results/<study>:<variant>)")
    try:
        study = load_study(root)
    except StudyRefused as exc:
        raise CompareError(f"{text}: refused: {exc}") from None
    if variant is not None and variant not in study.variants:
        raise CompareError(f"{text}: no variant {variant!r} in study {study.name} ({', '.join(study.variants)})")
    rows, _grids, series = read_cells(study)
    seeds = {(c.variant, c.phase, c.label, c.replicate): c.planned.seed for c in study.cells()}
    planned = {(c.phase, c.label): c.planned for c in study.cells() if c.replicate == 1}
    baseline = PLAIN if PLAIN in study.variants else None  # the analysis's default: taxes against plain
    return Side(text, root, variant, study, Cells(rows, series, seeds, baseline), planned)


# --------------------------------------------------------------------------- what is comparable


def study_problem(a: Side, b: Side) -> str | None:
    """Why no cell of A compares with B's: another backend or model."""
    if a.study.backend != b.study.backend:
        return f"backend {a.study.backend} vs {b.study.backend}"
    ma, mb = a.study.settings.model.name, b.study.settings.model.name
    if ma != mb:
        return f"model {ma} vs {mb}"
    return None


def _shape(cell: Any) -> str:
    s = cell.shape
    return f"{s['input']}x{s['output']}" if "input" in s else "mixed"


def cell_problem(ca: Any, cb: Any) -> str | None:
    """Why cell A is not cell B although their phase and label agree (other rate, shape or
    arrival process), or None."""
    if ca.rate is None or cb.rate is None or abs(float(ca.rate) - float(cb.rate)) > 1e-9 * max(1.0, float(ca.rate)):
        return f"rate {ca.rate:g} vs {cb.rate:g} req/s"
    if ca.shape != cb.shape:
        return f"shape {_shape(ca)} vs {_shape(cb)}"
    if (ca.arrival, ca.gamma_shape if ca.arrival == "gamma" else None) != (
        cb.arrival,
        cb.gamma_shape if cb.arrival == "gamma" else None,
    ):
        return f"arrival {ca.arrival} vs {cb.arrival}"
    return None


# --------------------------------------------------------------------------- what differs


def settings_differences(a: Side, b: Side, pairs: list[tuple[str, str]], limit: int = 12) -> dict[str, list[str]]:
    """What differs between the sides, in "key: A -> B" lines: the study config (variants
    aside), each compared variant's first launch (run.json: launch settings, versions, code) and
    the manifests' software columns."""
    out: dict[str, list[str]] = {}
    if a.root.resolve() != b.root.resolve():
        ra = {k: v for k, v in a.study.settings.raw.items() if k not in ("study", "variants")}
        rb = {k: v for k, v in b.study.settings.raw.items() if k not in ("study", "variants")}
        if lines := differences(ra, rb, limit=limit):
            out["study config"] = lines
    manifest_a, manifest_b = _manifest(a.root), _manifest(b.root)
    for va, vb in pairs:
        run_a, run_b = _first_run(a, va), _first_run(b, vb)
        lines = []
        for key in ("launch", "code"):
            lines += [f"{key}.{line}" for line in differences(run_a.get(key) or {}, run_b.get(key) or {}, limit=limit)]
        ma, mb = manifest_a.get(va) or {}, manifest_b.get(vb) or {}
        lines += [
            f"manifest.{k}: {ma.get(k) or '-'} -> {mb.get(k) or '-'}"
            for k in MANIFEST_VERSIONS
            if ma.get(k) != mb.get(k)
        ]
        if lines:
            out[pair_name(va, vb)] = lines[: 3 * limit]
    return out


def _first_run(side: Side, variant: str) -> dict[str, Any]:
    run = side.study.run_of(variant, PHASE_A, 1)
    return (run.run if run else None) or {}


def _manifest(root: Path) -> dict[str, dict[str, str]]:
    """The first launch's MANIFEST.tsv row of each variant ({} without a manifest)."""
    try:
        text = StudyLayout(root).manifest_tsv.read_text(encoding="utf-8")
    except OSError:
        return {}
    out: dict[str, dict[str, str]] = {}
    for row in csv.DictReader(io.StringIO(text), delimiter="\t"):
        out.setdefault(row.get("variant") or "", row)
    return out


def describe(side: Side) -> dict[str, Any]:
    return {
        "spec": side.spec,
        "study": side.study.name,
        "results_dir": str(side.root),
        "variant": side.variant,
        "baseline": side.cells.baseline,
        "replicates": side.study.replicates,
        "seed": side.study.settings.seed,
        "served_by": served_by(side.study),
    }
