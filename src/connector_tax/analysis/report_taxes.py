"""report.md's tax sections: the taxes per phase and point, and the A/A noise floor beside them."""

from __future__ import annotations

from typing import Any

from connector_tax.analysis.launch_intervals import MIN_P90_SAMPLES, survives
from connector_tax.analysis.report_format import launch_share, num, pct, ratio, table, us
from connector_tax.config import PHASE_B, PHASE_B_PRIME


def tax_sections(agg: dict[str, Any]) -> list[str]:
    """The taxes at the reference rates, their queueing amplification, and Phase B / B'."""
    L: list[str] = []
    taxes = agg.get("taxes")
    if taxes:
        L += [
            "## Substrate tax",
            "",
            f"Against `{taxes['baseline']}`. TTFT/TPOT: relative p90 tax [95% CI]; launch: the share of the "
            "tax's variance that is launch to launch; step: µs difference of p50 step duration (first launch); "
            "callback: the three connector hooks' p50 (µs); build_meta: the one of them that runs inside the step "
            "(get_finished and start_load_kv run after it, in the model's execution); unattributed = each step "
            "less its build_meta, against the baseline's step (p50s): the step's growth no hook inside it "
            "explains; engine step: relative p50 tax "
            "of the whole engine step (schedule, model, update) [95% CI]. A TTFT/TPOT tax without an interval "
            f"comes from a cell with fewer than {MIN_P90_SAMPLES} requests, too few to bound a p90.",
            "",
        ]
        for ref_name in ("ref_safe", "ref_load"):
            e = taxes["phase_a"].get(ref_name) or {}
            if not e.get("variants"):
                L += [
                    f"No tax at {ref_name}: "
                    + (
                        "; ".join(f"{k}: {v}" for k, v in (e.get("missing") or {}).items())
                        or "no Phase A cell at that rate"
                    ),
                    "",
                ]
                continue
            L += [f"### Phase A at {ref_name} = {num(e.get('rate'), 'g')} req/s (cell {e.get('cell')})", ""]
            L += table(
                [
                    "variant",
                    "tax TTFT p90",
                    "launch",
                    "tax TPOT p90",
                    "launch",
                    "tax step p50 (µs)",
                    "callback p50 (µs)",
                    "build_meta p50 (µs)",
                    "unattributed (µs)",
                    "tax engine step p50",
                ],
                [
                    [
                        f"`{n}`",
                        pct(t.get("ttft_p90")),
                        launch_share(t.get("ttft_p90")),
                        pct(t.get("tpot_p90")),
                        launch_share(t.get("tpot_p90")),
                        us(t.get("step_p50_us")),
                        us(t.get("callback_p50_us")),
                        us(t.get("build_meta_p50_us")),
                        us(t.get("unattributed_p50_us")),
                        pct(t.get("engine_step_p50")),
                    ]
                    for n, t in e["variants"].items()
                ],
            )
        amp = {
            n: a
            for n, a in (taxes.get("amplification") or {}).items()
            if any(
                (a.get(m) or {}).get("value") is not None or (a.get(m) or {}).get("unresolved")
                for m in ("ttft_p90", "tpot_p90")
            )
        }
        if amp:
            L += [
                "### Queueing amplification: tax at ref_load / tax at ref_safe",
                "",
                "[interval]: the ratio's over the box of the two taxes' 95% intervals (it holds whenever both "
                "do: at least 90% whatever their correlation, by Bonferroni, usually more).",
                "",
            ]
            L += table(
                ["variant", "TTFT p90 tax", "TPOT p90 tax"],
                [[f"`{n}`", _amplified(a.get("ttft_p90")), _amplified(a.get("tpot_p90"))] for n, a in amp.items()],
            )
        for phase, title in (
            (PHASE_B, "Phase B (shapes at ref_safe)"),
            (PHASE_B_PRIME, "Phase B' (shapes at ref_load)"),
        ):
            cells = (taxes.get(phase) or {}).get("cells") or {}
            if not cells:
                continue
            names = sorted({n for c in cells.values() for n in c["variants"]}, key=agg["variants"].index)
            L += [f"### {title}: tax TTFT p90 / tax TPOT p90", ""]
            L += table(
                ["shape"] + [f"`{n}`" for n in names],
                [
                    [label]
                    + [
                        f"{pct((c['variants'].get(n) or {}).get('ttft_p90'))} / "
                        f"{pct((c['variants'].get(n) or {}).get('tpot_p90'))}"
                        for n in names
                    ]
                    for label, c in cells.items()
                ],
            )

        L += noise_floor(agg, taxes)
    return L


def _tax_entries(taxes: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(where, variant, that variant's taxes) for every cell with taxes."""
    out = []
    for ref_name in ("ref_safe", "ref_load"):
        e = taxes["phase_a"].get(ref_name) or {}
        for n, t in (e.get("variants") or {}).items():
            out.append((f"Phase A {ref_name} ({e.get('cell')})", n, t))
    for phase, name in ((PHASE_B, "Phase B"), (PHASE_B_PRIME, "Phase B'")):
        for label, c in ((taxes.get(phase) or {}).get("cells") or {}).items():
            for n, t in c["variants"].items():
                out.append((f"{name} {label}", n, t))
    return out


def noise_floor(agg: dict[str, Any], taxes: dict[str, Any]) -> list[str]:
    """The A/A control's own "tax" (the study's noise floor) and which taxes stand out of it."""
    aa = agg.get("aa_controls") or {}
    base = taxes.get("baseline")
    controls = [a for a, b in aa.items() if b == base]
    entries = _tax_entries(taxes)
    if not controls:
        return []
    control = controls[0]
    floor = {(where, m): t.get(m) for where, n, t in entries if n == control for m in ("ttft_p90", "tpot_p90")}
    L = [
        f"### Noise floor: the A/A control `{control}` (= `{base}`, launched apart)",
        "",
        f"`{control}` is `{base}` again, so its true tax is 0: its intervals below are the study's own noise "
        "floor, launches included. A tax **survives** when its interval excludes 0 and its size exceeds the "
        "largest the A/A interval allows at the same cell.",
        "",
    ]
    L += table(
        ["cell", "A/A TTFT p90", "A/A TPOT p90", "covers 0"],
        [
            [
                where,
                pct(floor.get((where, "ttft_p90"))),
                pct(floor.get((where, "tpot_p90"))),
                " / ".join(_covers_zero(floor.get((where, m))) for m in ("ttft_p90", "tpot_p90")),
            ]
            for where in dict.fromkeys(w for w, _ in floor)
        ],
    )
    rows = []
    for where, n, t in entries:
        if n in aa:
            continue
        for m, label in (("ttft_p90", "TTFT"), ("tpot_p90", "TPOT")):
            ok, why = survives(t.get(m), floor.get((where, m)))
            rows.append([where, f"`{n}`", label, pct(t.get(m)), launch_share(t.get(m)), num(ok), why])
    L += ["Which taxes survive the noise floor:", ""]
    L += table(["cell", "variant", "metric", "tax [95% CI]", "launch share", "survives", "why"], rows)
    return L


def _covers_zero(est: dict[str, Any] | None) -> str:
    ci = (est or {}).get("ci")
    if not ci or None in ci:
        return "no interval"
    return "yes" if ci[0] <= 0 <= ci[1] else "**no**"


def _amplified(est: dict[str, Any] | None) -> str:
    """An amplification, or why there is none: a ratio over a ref_safe tax these cells cannot tell
    from 0 is noise, however large it prints."""
    below = (est or {}).get("unresolved")
    if below:
        return f"– (the ref_safe tax {pct(below)} covers 0)"
    return ratio(est)
