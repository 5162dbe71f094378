"""The truth document (truth.py) as the table `ctax truth` prints."""

from __future__ import annotations

from typing import Any


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def render(doc: dict[str, Any]) -> str:
    ref = doc["reference"]
    s = doc["settings"]
    found = doc.get("true_reference")
    lines = [
        *(
            [
                f"SIMULATED true reference rates (the study's saturation criteria on "
                f"{found['oracle']['replications']} x {found['oracle']['requests']} requests per variant and Phase A rate): "
                f"ref_safe {found['ref_safe']:g}, ref_load {found['ref_load']:g}"
                + "".join(
                    f"; {n} saturates at {v['saturation_rate']:g} ({', '.join(v['fired_at_saturation'])})"
                    for n, v in found["per_variant"].items()
                    if v["saturation_rate"] is not None
                )
            ]
            if found
            else []
        ),
        f"SIMULATED truth of study '{doc['study']}' at ref_safe {ref['ref_safe']:g} req/s, ref_load {ref['ref_load']:g} req/s",
        f"{doc['replications']} replications x {s['requests']} requests per configuration and cell (common random numbers); "
        "95% intervals from the replications",
        _precision(doc.get("precision") or {}),
        "",
        f"{'variant':24} {'cell':22} {'TTFT p90 ms':>16} {'TPOT p90 ms':>16} {'TTFT tax':>9} {'TPOT tax':>9}",
    ]
    tax = {(t["variant"], t["cell"], t["metric"]): t["value"] for t in doc["taxes"]}
    for c in doc["cells"]:
        key = (c["variant"], c["cell"])
        lines.append(
            f"{c['variant']:24} {c['cell']:22} {c['ttft_ms_p90']:9.3f} ±{c['ttft_ms_p90_half_width']:5.3f} "
            f"{c['tpot_ms_p90']:9.3f} ±{c['tpot_ms_p90_half_width']:5.3f} "
            f"{_pct(tax.get((*key, 'ttft_p90'))):>9} {_pct(tax.get((*key, 'tpot_p90'))):>9}"
        )
    lines += ["", "true verdicts (the analysis's rules on the true numbers):"]
    for h in doc["hypotheses"].values():
        m = h.get("margin")
        extra = (
            f"; {_distance(m['distance'], h['id'])} from the threshold = {m['in_half_widths']:.1f} oracle half-widths"
            if m
            else ""
        )
        lines.append(f"  {h['id']}: {h['verdict']:14} {h.get('reason', '')}{extra}")
    return "\n".join(lines) + "\n"


def _precision(p: dict[str, Any]) -> str:
    """What the replications reached against the target: a truth short of it says so on stdout."""
    if p.get("reached") is None:
        return "precision: no p90 to judge"
    line = f"worst p90 relative half-width {p['reached']:.2%}, target {p['target']:.2%}"
    return line if p.get("met") else line + ": NOT reached (--max-replications stopped it; these truths are that loose)"


def _distance(d: float, hid: str) -> str:
    """A distance between two of a hypothesis's numbers in its unit: a relative tax's in points."""
    from connector_tax.analysis.hypotheses import RULES

    unit = next((rule.unit for rule in RULES if rule.id == hid), "")
    return {"%": f"{d * 100:.1f} pp", "pp": f"{d:.1f} pp"}.get(unit, f"{d:.3g}")
