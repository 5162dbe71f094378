"""report.md: a short Markdown report of one study's analysis (tables, verdicts, figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from connector_tax.analysis.contention import header_lines
from connector_tax.analysis.intervention_effects import pointers
from connector_tax.analysis.intervention_effects import render as render_interventions
from connector_tax.analysis.report_format import ci_text, num, table
from connector_tax.analysis.report_taxes import tax_sections
from connector_tax.analysis.streams import render as render_streams
from connector_tax.analysis.thread_cpu import render as render_threads
from connector_tax.config import PHASE_A, PHASES

# Which step each number is (docs/study-design.md, "What is recorded").
STEP_DEFINITIONS = (
    "Step timing: **step** = `step_duration_us`, `Scheduler.schedule()` entry to exit (build_connector_meta "
    "included), the study's definition (docs/study-design.md), which the step tax and figures 6-7 use; **engine step** = "
    "`engine_step_us`, the whole engine step (schedule, model, update), shown for scale only; **callback** = "
    "`connector_total_us` = build_meta + get_finished + start_load_kv, with the two worker hooks joined from the "
    "worker process's records by time when the worker runs in its own process (vLLM on CPU, TP > 1)."
)


def _header(agg: dict[str, Any]) -> list[str]:
    """What served the study, its settings, reference rates and how its numbers were made."""
    L: list[str] = [f"# connector-tax analysis: {agg['study']}", ""]
    served = agg.get("served_by") or f"backend {agg.get('backend')}"
    if agg.get("simulated"):
        L += [
            "> **SIMULATED DATA.** Every number and figure below comes from the embedded simulated vLLM "
            "(backend `sim`), not from a GPU. It exercises the pipeline; it measures nothing about vLLM.",
            "",
        ]
    else:
        L += [
            f"> **Served by {served}.** Every number and figure below was measured on that server"
            + ("; its latencies are a CPU's, not a GPU's" if " on CPU" in served else "")
            + ".",
            "",
        ]
    ref = agg.get("reference") or {}
    L += [
        f"- Served by: {served}",
        f"- Results: `{agg['results_dir']}`; backend `{agg.get('backend')}`; variants: "
        + ", ".join(f"`{c}`" for c in agg["variants"]),
        f"- Baseline for taxes: `{agg.get('baseline')}`"
        if agg.get("baseline")
        else f"- Baseline `{agg.get('baseline_requested')}` is not in this study: the connector-specific parts "
        "(taxes, H1–H6, success criteria 1–5, figures 4–8) are **not applicable**; per-cell statistics, "
        "saturation, reference rates and figures 1–3 are reported.",
        f"- Reference rates ({ref.get('source')}): ref_safe = **{num(ref.get('ref_safe'), 'g')} req/s**"
        + (f" (FLAGGED: {ref.get('ref_safe_reason')})" if ref.get("ref_safe_flagged") else "")
        + f", ref_load = **{num(ref.get('ref_load'), 'g')} req/s**"
        + (f" (FLAGGED: {ref.get('ref_load_reason')})" if ref.get("ref_load_flagged") else ""),
        "- Measured by: "
        + (", ".join(f"{k} {v}" for k, v in sorted((agg.get("code") or {}).items()) if isinstance(v, str)) or "–")
        + "; every cell below was checked against its fingerprint (aggregate.csv `fingerprint`).",
        f"- Confidence intervals: {agg['ci_method']['percentiles']}. Taxes: {agg['ci_method']['taxes']}.",
        _launches_line(agg),
        f"- Saturation criterion 1 basis: effective / {agg['saturation']['throughput_basis']} rate; thresholds "
        + ", ".join(f"{k} {v:g}" for k, v in agg["saturation"]["thresholds"].items())
        + ".",
        "",
    ]
    for note in ref.get("notes") or []:
        L.append(f"- Note: {note}")
    # -- connector packages and declared interventions, from the launches
    if agg.get("connector_packages"):
        L.append(f"- Connector packages (the server's Python): {agg['connector_packages']}")
    for name, items in (agg.get("workarounds") or {}).items():
        L += [f"- Intervention (declared), `{name}`: {w}" for w in items]
    for name, items in (agg.get("interventions_seen") or {}).items():
        L += [f"- Intervention of `{name}`, {w}" for w in items]
    for name, mode in (agg.get("lmcache_modes") or {}).items():
        L.append(f"- LMCache mode, `{name}`: {mode}")
    for name, items in (agg.get("sidecars") or {}).items():
        L += [f"- Sidecar of `{name}` (started before its server, its CPU in the thread tables): {w}" for w in items]
    L += ["", STEP_DEFINITIONS, ""]

    return L


def _contention(agg: dict[str, Any], hyp: dict[str, Any]) -> list[str]:
    """How much of the study was measured under contention and how busy the host was; a banner
    when calls rest on perturbed cells."""
    lines = header_lines(agg.get("contention") or {}, list(hyp.get("perturbed_calls") or []))
    ref = agg.get("reference") or {}
    for name in ("ref_safe", "ref_load"):
        if ref.get(f"{name}_perturbed"):
            lines.append(f"- {name} was chosen with perturbed Phase A cells: " + ", ".join(ref[f"{name}_perturbed"]))
    return lines + ([""] if lines else [])


def _variants(agg: dict[str, Any]) -> list[str]:
    """Each variant's preflight, phases and step timing."""
    L: list[str] = []
    L += ["## Configurations", ""]
    rows = []
    for name in agg["variants"]:
        st = agg["variant_status"].get(name) or {}
        cells = []
        for ph in PHASES:
            runs = [(key, p) for key, p in (st.get("phases") or {}).items() if key.partition(".r")[0] == ph]
            cells.append(
                "; ".join(
                    ("" if key == ph else f"{key.partition('.')[2]}: ")
                    + (
                        "– (no cell planned)"  # Phase B' of a variant it does not list
                        if p["status"] == "ok" and not p["cells"]
                        else f"{p['status']} ({len(p['cells'])} cells)"
                    )
                    + (f": {p['reason']}" if p.get("reason") else "")
                    for key, p in runs
                )
                or "–"
            )
        timing = [p for p in (st.get("phases") or {}).values()]
        step = (
            "yes"
            if any(p["step_timing_available"] for p in timing)
            else (
                next((p["step_timing_reason"] for p in timing if p.get("step_timing_reason")), "no") if timing else "–"
            )
        )
        rows.append(
            [
                f"`{name}`",
                num(st.get("preflight")) + (f": {st['preflight_reason']}" if st.get("preflight_reason") else ""),
                *cells,
                str(step),
            ]
        )
    L += table(["variant", "preflight", "Phase A", "Phase B", "Phase B'", "step timing"], rows)

    return L


def _settings(agg: dict[str, Any]) -> list[str]:
    """The server settings each launch recorded, side by side."""
    L: list[str] = []
    settings = agg.get("like_for_like") or {}
    if settings:
        keys = sorted({k for row in settings.values() for k in row})
        L += ["## Server settings, as each launch recorded them (like for like)", ""]
        L += table(["variant"] + keys, [[f"`{n}`"] + [num(row.get(k)) for k in keys] for n, row in settings.items()])

    return L


def _verdicts(hyp: dict[str, Any]) -> list[str]:
    """H1-H6 and the success criteria, with their intervals and caveats."""
    L: list[str] = []
    L += ["## Verdicts", "", f"Rule: {hyp['verdict_rule']}.", ""]
    L += table(
        ["id", "verdict (on the point estimate)", "confidence (from the 95% interval)", "why"],
        [
            [h["id"], f"**{h['verdict']}**", num(h.get("confidence")), h["reason"].replace("|", "/")]
            for h in hyp["hypotheses"]
        ],
    )
    L += table(
        ["criterion", "status", "outcome", "confidence (from the 95% interval)", "why"],
        [
            [
                s["title"].split(":")[0],
                f"**{s['status']}**",
                num(s.get("outcome")),
                num(s.get("confidence")),
                s["reason"].replace("|", "/"),
            ]
            for s in hyp["success_criteria"]
        ],
    )
    for h in hyp["hypotheses"]:
        for c in h.get("caveats") or []:
            L.append(f"- {h['id']} caveat: {c}")
    L.append("")

    return L


def _launches_line(agg: dict[str, Any]) -> str:
    k = int(agg.get("replicates") or 1)
    aa = agg.get("aa_controls") or {}
    control = "; A/A control: " + ", ".join(f"`{a}` (= `{b}`)" for a, b in aa.items()) if aa else "; no A/A control"
    if k < 2:
        return (
            "- Launches: one per variant and phase: **the between-launch variance is not estimated**, so a "
            "tax's interval covers the requests' noise only, not a launch's own bias (`workload.replicates: 2` "
            "or more estimates it)" + control + "."
        )
    return (
        f"- Launches: {k} per variant and phase, in {k} seeded interleaved rounds, paired by (cell, replicate) "
        "on common random numbers; every tax's interval includes the launch-to-launch variance" + control + "."
    )


def _phase_a(agg: dict[str, Any]) -> list[str]:
    """The rate sweep's cells and each variant's saturation rate."""
    L: list[str] = []
    ref = agg.get("reference") or {}
    pa = [r for r in agg["rows"] if r["phase"] == PHASE_A]
    several = any((r.get("replicate") or 1) > 1 for r in pa)
    if pa:
        L += [
            "## Phase A (rate sweep)",
            "",
            "Latencies in ms (TTFT p90 with its 95% CI); saturated: which criteria fired, no (none fired, a "
            "criterion with too few samples not judged), or unknown (none fired and one's interval straddles "
            "its threshold, none could be judged, or the cell was measured while the host perturbed it).",
            "",
        ]
        L += table(
            [
                "variant",
                "rate (req/s)",
                "n ok",
                "TTFT p90",
                "TPOT p90",
                "E2E p90",
                "eff/offered",
                "waiting p50",
                "step p50 (µs)",
                "engine step p50 (µs)",
                "saturated",
                "valid",
            ],
            [
                [
                    f"`{r['variant']}`" + (f" r{r.get('replicate') or 1}" if several else ""),
                    num(r["rate"], "g"),
                    num(r["n_ok"], "d"),
                    num(r["ttft_ms_p90"]) + ci_text(r["ttft_ms_p90_ci_lo"], r["ttft_ms_p90_ci_hi"], r.get("ttft_ms_n")),
                    num(r["tpot_ms_p90"], ".2f"),
                    num(r["e2e_ms_p90"]),
                    num(r["throughput_ratio"], ".3f"),
                    num(r["waiting_p50"], "g"),
                    num(r["step_duration_us_p50"]),
                    num(r["engine_step_us_p50"]),
                    (r["saturation_criteria"] or "yes")
                    if r["saturated"]
                    else "unknown"
                    if r["saturated"] is None
                    else "no",
                    num(r["valid"]) + (" (host busy)" if r.get("host_busy") else ""),
                ]
                for r in pa
            ],
        )
    sat_rates = ref.get("per_variant") or {}
    if sat_rates:
        L += table(
            ["variant", "saturation rate (req/s)", "criteria fired there", "unknown at (req/s)"],
            [
                [
                    f"`{n}`",
                    num(v.get("saturation_rate"), "g"),
                    ", ".join(v.get("fired_at_saturation") or []) or "–",
                    ", ".join(f"{r:g}" for r in v.get("unknown_rates") or []) or "–",
                ]
                for n, v in sat_rates.items()
            ],
        )
    # Why ref_safe is not the next rate up: a saturated cell, or one whose saturation is unknown
    # (never a reference rate), which the saturation rates alone do not show.
    blocked = ((ref.get("ref_safe_basis") or {}).get("blocked_above") or {}).items()
    if ref.get("ref_safe") is not None and blocked:
        L += [
            f"ref_safe = {num(ref['ref_safe'], 'g')} req/s, not higher: "
            + "; ".join(f"{rate}: " + "; ".join(why) for rate, why in blocked if why)
            + " (a cell whose saturation is unknown is never a reference rate).",
            "",
        ]

    return L


def _server_cpu(agg: dict[str, Any]) -> list[str]:
    """Where the server's CPU goes, and where client-side TPOT/ITL cannot be trusted
    (analysis/thread_cpu.py, analysis/streams.py)."""
    return render_threads(agg.get("threads") or {}, agg["variants"], pointers(agg)) + render_streams(agg["rows"])


def _figures(figures: dict[str, list[str]], skipped: dict[str, str], figures_made: bool) -> list[str]:
    """Links to the figures drawn, and why the others were not."""
    L: list[str] = []
    L += ["## Figures", ""]
    if not figures_made:
        L += ["Figures were not requested in this run (`--figures` not given).", ""]
    for name, paths in sorted(figures.items()):
        png = next((p for p in paths if p.endswith(".png")), paths[0])
        pdf = next((p for p in paths if p.endswith(".pdf")), None)
        L.append(f"- [{name}](figures/{Path(png).name})" + (f" ([pdf](figures/{Path(pdf).name}))" if pdf else ""))
    if skipped:
        L += ["", "Skipped figures (data missing; never drawn empty):", ""]
        L += [f"- **{name}**: {reason}" for name, reason in sorted(skipped.items())]
    L.append("")
    return L


def _flags(agg: dict[str, Any]) -> list[str]:
    """Cells flagged, not analysed, pruned or ignored, and missing artifacts."""
    L: list[str] = []
    notes = [
        f"{r['variant']}/{r['phase']}/{r['cell']}: {r['window_note']}" for r in agg["rows"] if r.get("window_note")
    ]
    invalid = [
        f"{r['variant']}/{r['phase']}/{r['cell']}"
        + (f" ({r['attempts']} attempts)" if (r.get("attempts") or 1) > 1 else "")
        + f": {r['validity_reasons']}"
        for r in agg["rows"]
        if r.get("valid") is False
    ]
    if invalid:
        L += (
            [
                "## Cells that stand invalid (the validity gate; the least perturbed attempt stands, the others are "
                "under `superseded/`; never a knee, a reference rate or a confident call)",
                "",
            ]
            + [f"- {x}" for x in invalid]
            + [""]
        )
    if notes:
        L += ["## Notes", ""] + [f"- {x}" for x in notes] + [""]
    not_analysed = [
        f"`{name}/{ph}/{label}`: {why}"
        for name, st in agg["variant_status"].items()
        for ph, p in (st.get("phases") or {}).items()
        for label, why in (p.get("not_analysed") or {}).items()
    ]
    if not_analysed:
        L += ["## Cells not analysed (failed, never measured or incomplete; a re-run measures them)", ""]
        L += [f"- {x}" for x in not_analysed] + [""]
    pruned = [
        f"`{name}/{ph}/{label}`: {why}"
        for name, st in agg["variant_status"].items()
        for ph, p in (st.get("phases") or {}).items()
        for label, why in (p.get("pruned") or {}).items()
    ]
    if pruned:
        L += (
            ["## Rates not measured, past a configuration's knee (Phase A pruning)", ""]
            + [f"- {x}" for x in pruned]
            + [""]
        )
    if agg.get("ignored"):
        L += ["## Ignored on disk (not in this study's plan; never read)", ""]
        L += [f"- `{x['path']}`: {x['why']}" for x in agg["ignored"]] + [""]
    art = agg.get("artifacts") or {}
    if art.get("missing"):
        L += ["## Missing artifacts", ""] + [f"- {x}" for x in art["missing"]] + [""]
    return L


def render_report(
    agg: dict[str, Any],
    hyp: dict[str, Any],
    figures: dict[str, list[str]],
    skipped: dict[str, str],
    figures_made: bool = True,
) -> str:
    """report.md, section by section."""
    sections = (
        _header(agg),
        _contention(agg, hyp),
        _variants(agg),
        _settings(agg),
        _verdicts(hyp),
        _phase_a(agg),
        tax_sections(agg),
        render_interventions(agg),
        _server_cpu(agg),
        _figures(figures, skipped, figures_made),
        _flags(agg),
    )
    return "\n".join(line for section in sections for line in section)
