"""compare.md and compare.csv: a comparison (compare.py) as a Markdown section and a tidy table."""

from __future__ import annotations

import csv
import io
from dataclasses import fields
from typing import Any

from connector_tax.analysis.compare import CALLS, LATENCIES, Change

CSV_COLUMNS = [f.name for f in fields(Change)]
_ORDER = {c: i for i, c in enumerate(CALLS)}


def to_csv(doc: dict[str, Any]) -> str:
    """One row per variant x phase x cell x metric: both sides' values, the change B / A - 1 with
    its 95 % interval (fractions), the call."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in doc["rows"]:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in CSV_COLUMNS})
    return buf.getvalue()


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:+.1f} %"


def _value(row: dict[str, Any], side: str) -> str:
    v = row.get(f"{side}_value")
    if v is None:
        return "–"
    if row["metric"] in LATENCIES:
        return f"{v:.1f} ms"
    lo, hi = row.get(f"{side}_ci_lo"), row.get(f"{side}_ci_hi")
    return _pct(v) + (f" [{lo * 100:+.1f}, {hi * 100:+.1f}]" if lo is not None and hi is not None else "")


def _change(row: dict[str, Any]) -> str:
    s = _pct(row.get("change"))
    if row.get("ci_lo") is not None and row.get("ci_hi") is not None:
        s += f" [{row['ci_lo'] * 100:+.1f}, {row['ci_hi'] * 100:+.1f}]"
    return s


def _table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| variant | phase | cell | metric | A | B | change B / A − 1 [95 % CI] | launch share | call |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        share = "–" if r.get("launch_share") is None else f"{r['launch_share'] * 100:.0f} %"
        call = f"**{r['call']}**" if r["call"] == "changed" else r["call"]
        out.append(
            f"| `{r['variant']}` | {r['phase']} | {r['cell']} | {r['metric']} | {_value(r, 'a')} | {_value(r, 'b')} "
            f"| {_change(r)} | {share} | {call} |"
        )
    return out + [""]


def _not_compared(doc: dict[str, Any]) -> list[str]:
    if not doc["not_comparable"]:
        return []
    lines = ["## Not compared", ""]
    lines += [f"- `{n['variant']}` {n['phase']} {n['cell']}: {n['why']}" for n in doc["not_comparable"]]
    return lines + [""]


def render(doc: dict[str, Any], figure: str | None = None) -> str:
    a, b, margin = doc["a"], doc["b"], doc["margin"]
    rows = doc["rows"]
    title = "What changed: B against A" + (" (SIMULATED)" if doc["simulated"] else "")
    lines = [f"# {title}", ""]
    for name, side in (("A", a), ("B", b)):
        what = f"variant `{side['variant']}` of " if side["variant"] else ""
        lines.append(
            f"- **{name}**: {what}study `{side['study']}` (`{side['results_dir']}`), {side['served_by']}, "
            f"{side['replicates']} launch(es) per variant and phase, seed {side['seed']}"
            + (f", taxes against `{side['baseline']}`" if side["baseline"] else ", no baseline: no taxes")
        )
    if doc.get("nothing_compared"):
        # No row: no headline about changes (an empty comparison is not "nothing changed").
        lines += ["", f"**Nothing was compared**: {doc['nothing_compared']}.", ""]
        return "\n".join(lines + _not_compared(doc)) + "\n"
    counts = {c: sum(r["call"] == c for r in rows) for c in CALLS}
    lines += [
        "",
        f"{len(rows)} comparisons: " + ", ".join(f"{counts[c]} {c}" for c in CALLS) + ". "
        f"**changed**: the 95 % interval of B / A − 1 excludes 0; **no change resolved**: it includes 0 and lies "
        f"within ±{margin * 100:g} % on the ratio's log scale ({(1 / (1 + margin) - 1) * 100:+.2f} % to "
        f"+{margin * 100:g} %, `--margin`); **below resolution**: it includes 0 and reaches past that band, "
        "so these cells cannot tell such a change from none; **no interval**: a cell "
        "behind it is too small to bound its p90. A tax's change is that of the ratio variant / baseline.",
        "",
    ]
    if figure:
        lines += [f"![the changes with their intervals]({figure})", ""]
    changed = sorted((r for r in rows if r["call"] == "changed"), key=lambda r: -abs(r.get("change") or 0))
    lines += ["## Changed", ""] + (_table(changed) if changed else ["Nothing changed beyond its interval.", ""])
    rest = sorted((r for r in rows if r["call"] != "changed"), key=lambda r: (_ORDER[r["call"]], r["variant"]))
    if rest:
        lines += ["## Not changed, or not resolved", ""] + _table(rest)
    lines += _not_compared(doc)
    lines += ["## Settings and versions that differ", ""]
    if not doc["differences"]:
        lines += ["None recorded (study config, launch indexes, manifests).", ""]
    for what, diffs in doc["differences"].items():
        lines += [f"- {what}:"] + [f"  - `{d}`" for d in diffs]
    notes = sorted({r["note"] for r in rows if r.get("note")})
    lines += ["", "## Method", "", doc["method"] + "."]
    if notes:
        lines += ["", "Notes on some rows:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"
