"""The report's Interventions section (analysis/intervention_effects.py): an intervention's variant beside
the variant it changes, and the pointer from a thread busy at idle to the experiment that tests it."""

from __future__ import annotations

import numpy as np

from connector_tax.analysis.intervention_effects import effects, partners, pointers, render
from connector_tax.analysis.launch_intervals import Series
from connector_tax.analysis.taxes import LaunchTaxes
from connector_tax.analysis.thread_cpu import render as render_threads

NIXL = {"type": "nixl", "role": "kv_both"}
VARIANTS = [
    {"name": "plain"},
    {"name": "nixl_both", "connector": NIXL},
    {"name": "nixl_progress_off", "connector": NIXL, "interventions": ["nixl_progress_off"]},
    {"name": "nixl_progress_1ms", "connector": NIXL, "interventions": ["nixl_progress_delay_1ms"], "description": "x"},
    {
        "name": "mooncake_both",
        "connector": {"type": "mooncake", "role": "kv_both"},
        "interventions": ["mooncake_cpu_guard"],
    },
    {"name": "nixl_other", "connector": {**NIXL, "extra_config": {"a": 1}}, "interventions": ["nixl_progress_off"]},
]


def test_an_intervention_is_compared_with_the_same_variant_without_it():
    # the guard alone explains nothing (it is what lets Mooncake start), and another connector
    # setting is another variant: no partner
    assert partners(VARIANTS) == {"nixl_progress_off": "nixl_both", "nixl_progress_1ms": "nixl_both"}


def _series(scale: float, rng: np.random.Generator, n: int = 400) -> dict[str, Series]:
    base = rng.lognormal(0, 0.3, n)
    return {"ttft_ms": Series(np.arange(n), 100 * base), "tpot_ms": Series(np.arange(n), 10 * base * scale)}


def test_the_direct_change_is_paired_and_launch_aware():
    rows, series = [], {}
    scales = {"plain": 1.0, "nixl_both": 2.2, "nixl_progress_off": 1.05, "nixl_progress_1ms": 1.1}
    for r in (1, 2):
        rng = np.random.default_rng(r)
        traffic = {
            name: _series(s * (1.02 if (r + len(name)) % 2 else 0.98), np.random.default_rng(r))
            for name, s in scales.items()
        }
        for name in scales:
            series[(name, "phase_a", "r8", r)] = traffic[name]
            rows.append({"variant": name, "phase": "phase_a", "cell": "r8", "replicate": r})
        del rng
    taxes = {"phase_a": {"ref_safe": {"cell": "r8"}}}
    out = effects(VARIANTS[:4], LaunchTaxes(series, rows), taxes)
    assert set(out) == {"nixl_progress_off", "nixl_progress_1ms"}
    tpot = out["nixl_progress_off"]["cells"]["phase_a/r8"]["tpot_p90"]
    assert abs(tpot["value"] - (1.05 / 2.2 - 1)) < 0.05 and tpot["replicates"] == 2 and tpot["paired"]
    assert tpot["ci"][0] < tpot["value"] < tpot["ci"][1] < 0


def _agg() -> dict:
    def est(v, lo, hi):
        return {"value": v, "ci": [lo, hi]}

    thread = {
        "process": "Worker",
        "thread": "VLLM::Worker",
        "main": False,
        "tid": 7,
        "started_by": "NixlPullConnector worker",
        "cores": [1],
        "allowed": [1],
    }
    return {
        "baseline": "plain",
        "variants": ["plain", "nixl_both", "nixl_progress_off"],
        "interventions": {"nixl_progress_off": ["nixl_progress_off"]},
        "taxes": {
            "phase_a": {
                "ref_safe": {
                    "cell": "r8",
                    "variants": {
                        "nixl_both": {"ttft_p90": est(0.786, 0.276, 1.499), "tpot_p90": est(1.201, 0.635, 1.963)},
                        "nixl_progress_off": {"ttft_p90": est(0.02, -0.2, 0.3), "tpot_p90": est(0.05, -0.1, 0.2)},
                    },
                }
            }
        },
        "rows": [
            {"variant": "nixl_both", "phase": "phase_a", "cell": "r8", "replicate": 1, "engine_step_us_p50": 4200.0},
            {
                "variant": "nixl_progress_off",
                "phase": "phase_a",
                "cell": "r8",
                "replicate": 1,
                "engine_step_us_p50": 1400.0,
            },
        ],
        "intervention_effects": {
            "nixl_progress_off": {
                "of": "nixl_both",
                "declared": ["nixl_progress_off"],
                "cells": {"phase_a/r8": {"ttft_p90": est(-0.43, -0.6, -0.2), "tpot_p90": est(-0.52, -0.65, -0.35)}},
            }
        },
        "threads": {
            "variants": {
                "nixl_both": {"idle": {"total_pct": 99.0, "seconds": 3, "threads": [{**thread, "cpu_pct": 99.0}]}},
                "nixl_progress_off": {
                    "idle": {
                        "total_pct": 4.0,
                        "seconds": 3,
                        "threads": [{**thread, "started_by": None, "cpu_pct": 2.0}],
                    }
                },
            },
            "busy_beyond_plain": {"nixl_both": [{**thread, "cpu_pct": 99.0, "cores": [1]}]},
        },
    }


def test_the_section_says_what_the_intervention_explains():
    text = "\n".join(render(_agg()))
    assert "### `nixl_progress_off` beside `nixl_both`" in text
    assert (
        "| phase_a/r8 | tax TPOT p90 | +120.1 % [+63.5, +196.3] | +5.0 % [-10.0, +20.0] | -52.0 % [-65.0, -35.0] |"
        in text
    )
    assert "the TPOT p90 tax at phase_a/r8 falls from +120.1 % [+63.5, +196.3] to +5.0 % [-10.0, +20.0]" in text
    assert "it removes 94 % of `nixl_both`'s tax on the log scale" in text
    assert "the idle Nixl thread's CPU from 99 % (server 99 %) to none among the busiest (< 2 %) (server 4 %)" in text
    assert "| phase_a/r8 | engine step p50 | 4.20 ms (tax –) | 1.40 ms (tax –) | -66.7 % (first launches) |" in text
    assert render({**_agg(), "intervention_effects": {}}) == []


def test_a_busy_thread_points_to_the_overlay_unless_the_study_runs_it():
    agg = {**_agg(), "interventions": {}}
    advice = pointers(agg)
    assert list(advice) == ["nixl_both"]
    line = advice["nixl_both"][0]
    assert "`nixl_progress_off`" in line and "`nixl_progress_delay_1ms`" in line
    assert "configs/overlays/nixl-progress.yaml" in line
    text = "\n".join(render_threads(agg["threads"], agg["variants"], advice))
    assert "- `nixl_both`: a shipped intervention addresses it" in text
    assert "`nixl_agent_off_compute`" in line and "configs/overlays/nixl-reservation.yaml" in line
    running = ["nixl_progress_off", "nixl_progress_delay_1ms", "nixl_agent_off_compute"]
    assert pointers({**_agg(), "interventions": {"x": running}}) == {}
    other = {**_agg(), "interventions": {}}
    other["threads"]["busy_beyond_plain"]["nixl_both"][0]["started_by"] = "MooncakeConnector worker"
    assert pointers(other) == {}
