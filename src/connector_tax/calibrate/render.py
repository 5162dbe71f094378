"""What `ctax calibrate` prints: a fitted profile's terms and their quality (render_fit), a check's
predicted against measured, per cell and per tax, and the anchors' measure (render_check)."""

from __future__ import annotations

from typing import Any

from connector_tax.config.profile import HOOK_NAMES, EngineProfile


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "–"
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def _num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "–"
    return f"{x:,.{digits}f}"


def _term(t: dict[str, Any]) -> str:
    if not t.get("identified"):
        return f"not identified ({t.get('why')})"
    ci = t.get("ci95")
    return f"{t['value']:.4g}" + (f" [{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "")


def _fit_lines(title: str, fit: dict[str, Any]) -> list[str]:
    quality = f"n={fit.get('n')}"
    if fit.get("r2") is not None:
        quality += f", R²={fit['r2']:.3f}"
    if fit.get("residual_sd") is not None:
        quality += f", residual sd {fit['residual_sd']:.4g} µs, MAD {fit.get('residual_mad', 0):.4g} µs"
    lines = [f"{title} ({fit.get('target')}; {quality})"]
    if fit.get("note"):
        lines.append(f"    note: {fit['note']}")
    lines += [f"    {name:22} {_term(t)}" for name, t in fit.get("terms", {}).items()]
    return lines


def render_fit(profile: EngineProfile) -> str:
    fit, prov, hw = profile.fit, profile.provenance, profile.hardware
    lines = [
        f"profile {profile.name}: fitted on study {prov.get('study')} ({prov.get('served_by')}), "
        f"{len(prov.get('cells') or [])} cells, baseline {prov.get('baseline')}",
        "",
    ]
    lines += _fit_lines("engine step of the baseline", fit["engine_step"])
    lines += _fit_lines("scheduler's share", fit["schedule"])
    gap = fit.get("step_gap_us") or {}
    lines.append(f"engine loop gap: median {_num(gap.get('median'))} µs over {gap.get('n')} busy steps")
    empty = fit.get("empty_steps") or {}
    if empty.get("n"):
        lines.append(
            f"steps that scheduled no token: {empty['n']} ({empty['share']:.0%}), median {_num(empty['median_us'])} µs "
            "(not modelled)"
        )
    lines.append(f"KV cache: {hw['kv_cache_blocks']} blocks of {hw['block_size']} tokens")
    scatter = fit.get("scatter") or {}
    if scatter.get("ratio_p10_p50_p90_p99"):
        p = scatter["ratio_p10_p50_p90_p99"]
        lines.append(
            f"steps around the fit (measured / fitted, mean 1; not simulated): p10 {p[0]:.2f}, p50 {p[1]:.2f}, "
            f"p90 {p[2]:.2f}, p99 {p[3]:.2f}; consecutive steps' correlation {scatter['phi']} (n={scatter['n']})"
        )
    lines.append("API server beyond the engine (p50 / p90, µs; n):")
    for name, api in (fit.get("api") or {}).items():
        ing, eg = api["ingress"], api["egress"]
        lines.append(
            f"    {name:22} ingress {_num(ing.get('p50_us'))} / {_num(ing.get('p90_us'))} (n={ing['n']}), "
            f"egress {_num(eg.get('p50_us'))} / {_num(eg.get('p90_us'))} (n={eg['n']})"
        )
    for name, q in (fit.get("variants") or {}).items():
        v = profile.variants[name]
        lines += [
            "",
            f"variant {name} ({q.get('steps')} steps): forward x {v.forward_scale:g} + {v.extra_us:g} µs, "
            f"schedule() x {v.schedule_scale:g}",
        ]
        for hook in HOOK_NAMES:
            h = q["hooks"].get(hook) or {}
            if h.get("n", 0) == 0:
                lines.append(f"  hook {hook}: {h.get('note', 'not recorded')}")
            else:
                lines += ["  " + s for s in _fit_lines(f"hook {hook}", h)]
        lines += ["  " + s for s in _fit_lines("unexplained step time", q["unexplained"])]
        lines += ["  " + s for s in _fit_lines("scheduler's share", q["schedule"])]
    return "\n".join(lines) + "\n"


def render_check(result: dict[str, Any]) -> str:
    split = result["split"]
    lines = [
        f"check of profile {result['profile']} against study {result['study']} (seed {split['checked_seed']}, "
        f"Phase A rates {', '.join(f'{r:g}' for r in split['checked_phase_a_rates'])})",
        f"split: fitted on study {split['fitted_on']} (seed {split['fitted_seed']}, Phase A rates "
        f"{', '.join(f'{r:g}' for r in split.get('fitted_phase_a_rates') or [])}); "
        + (
            "held out: no checked cell was fitted on"
            if split["held_out"]
            else f"NOT held out: {split['cells_also_fitted']} checked cells were fitted on"
        ),
    ]
    if result.get("launch_speeds"):
        speeds = ", ".join(f"{k} x{v:.2f}" for k, v in result["launch_speeds"].items())
        lines.append(
            f"DIAGNOSTIC (--launch-speed): each launch's model time scaled by its own measured speed: {speeds}; "
            "the goals are judged without it"
        )
    lines += ["", "per cell: measured [95% CI] -> predicted (error; inside the interval?)"]
    head = f"{'variant/phase/cell':34} {'TTFT p90 ms':>32} {'TPOT p90 ms':>32} {'step p50 µs':>22} {'engine step p50 µs':>24} {'req/s':>18}"
    lines.append(head)

    def fmt(c: dict[str, Any], digits: int = 1, ci: bool = True) -> str:
        m = _num(c["measured"], digits)
        if ci and c.get("ci95"):
            m += f" [{_num(c['ci95'][0], digits)},{_num(c['ci95'][1], digits)}]"
        inside = {True: " in", False: " out", None: ""}[c.get("inside")]
        return f"{m} -> {_num(c['predicted'], digits)} ({_pct(c['error'])}{inside})"

    for c in result["cells"]:
        key = f"{c['variant']}/{c['phase']}/{c['cell']}" + (" *" if c.get("saturated") else "")
        lines.append(
            f"{key:34} {fmt(c['ttft_p90_ms']):>32} {fmt(c['tpot_p90_ms']):>32} {fmt(c['step_p50_us'], 0, False):>22} "
            f"{fmt(c['engine_step_p50_us'], 0, False):>24} {fmt(c['throughput_rps'], 2, False):>18}"
        )
    lines.append("(* saturated cell)")
    if result["taxes"]:
        lines += ["", "per variant, the tax: measured [95% CI] -> predicted (inside?)"]
        for t in result["taxes"]:
            ci = t.get("ci95")
            m = _pct(t["measured"]) + (f" [{_pct(ci[0])}, {_pct(ci[1])}]" if ci else " (no interval)")
            inside = {True: "inside", False: "OUTSIDE", None: "–"}[t["inside"]]
            lines.append(
                f"  {t['variant']:22} {t['at']:28} {t['metric']:9} {m:>34} -> {_pct(t['predicted']):>8}  {inside}"
            )
    s = result["summary"]
    met = s["goals_met"]
    lines += [
        "",
        f"summary: {s['cells']} cells; TTFT p90 within 10%: {s['ttft_p90_within_10pct'][0]}/{s['ttft_p90_within_10pct'][1]} "
        f"(goal >= 90%: {'met' if met['ttft_p90'] else 'not met'}); TPOT p90 within 5%: "
        f"{s['tpot_p90_within_5pct'][0]}/{s['tpot_p90_within_5pct'][1]} ({'met' if met['tpot_p90'] else 'not met'}); "
        f"inside the measured interval: TTFT {s['ttft_p90_inside_ci'][0]}/{s['ttft_p90_inside_ci'][1]}, "
        f"TPOT {s['tpot_p90_inside_ci'][0]}/{s['tpot_p90_inside_ci'][1]}; taxes inside their interval: "
        f"{s['taxes_inside_ci'][0]}/{s['taxes_inside_ci'][1]} ({s['taxes_without_ci']} without one; "
        f"{'met' if met['taxes'] else 'not met'}); median |error| TTFT {_pct(s['median_abs_error'].get('ttft_p90_ms'), False)}, "
        f"TPOT {_pct(s['median_abs_error'].get('tpot_p90_ms'), False)}, "
        f"engine step {_pct(s['median_abs_error'].get('engine_step_p50_us'), False)}",
    ]
    if result.get("anchors"):
        lines += render_anchors(result)
    return "\n".join(lines) + "\n"


def render_anchors(result: dict[str, Any]) -> list[str]:
    """The anchors' measure (calibrate/anchors.py): means per cell, step time per composition."""
    lines = ["", "the anchors' measure, per cell: mean measured -> predicted (error)"]
    lines.append(f"{'variant/phase/cell':34} {'mean TTFT ms':>26} {'mean TPOT ms':>26} {'mean E2E ms':>26}")
    for c in result["cells"]:
        means = c.get("means") or {}
        cols = [
            f"{_num(m.get('measured'), 2)} -> {_num(m.get('predicted'), 2)} ({_pct(m.get('error'))})"
            for m in (means.get(k) or {} for k in ("ttft_mean_ms", "tpot_mean_ms", "e2e_mean_ms"))
        ]
        lines.append(f"{c['variant'] + '/' + c['phase'] + '/' + c['cell']:34} " + " ".join(f"{x:>26}" for x in cols))
    lines += [
        "",
        "engine step per batch composition (prefill tokens x decoding sequences): steps, mean µs measured -> predicted (error)",
    ]
    for c in result.get("compositions") or []:
        mark = "" if c["judged"] else "  (too few steps to judge)"
        lines.append(
            f"  {c['variant']:24} prefill {c['prefill_tokens']:>9} decode {c['decode_seqs']:>5} {c['steps']:>7} "
            f"{_num(c['measured_us'], 0)} -> {_num(c['predicted_us'], 0)} ({_pct(c['error'])}){mark}"
        )
    a, g = result["anchors"], result["anchors"]["goals_met"]

    def frac(pair: list[int], ok: bool) -> str:
        return f"{pair[0]}/{pair[1]} ({'met' if ok else 'not met'})"

    lines += [
        "",
        f"anchors' summary: mean TTFT within 10%: {frac(a['ttft_mean_within_10pct'], g['ttft_mean'])}; mean TPOT within "
        f"5%: {frac(a['tpot_mean_within_5pct'], g['tpot_mean'])} (goals: >= 90% of cells); step time within 5%: "
        f"{frac(a['step_compositions_within_5pct'], g['step'])} compositions ({a['steps_judged']} steps; "
        f"{a['step_compositions_not_judged']} with too few); p90 inside the measured interval: TTFT "
        f"{frac(a['ttft_p90_inside_ci'], g['ttft_p90_inside'])}, TPOT {frac(a['tpot_p90_inside_ci'], g['tpot_p90_inside'])} "
        f"(goal >= 90%); median |error| of the means: TTFT {_pct(a['median_abs_error']['ttft_mean_ms'], False)}, "
        f"TPOT {_pct(a['median_abs_error']['tpot_mean_ms'], False)}, E2E {_pct(a['median_abs_error']['e2e_mean_ms'], False)}",
    ]
    return lines
