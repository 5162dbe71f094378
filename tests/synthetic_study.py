"""Synthetic results/<study>/ trees with KNOWN taxes and saturation knees.

Used by the tests (the analysis must recover what was injected) and by
benchmarks/analysis_scale.py (size). The files have exactly the pipeline's layout and record
schemas (src/connector_tax/contract/); nothing here talks to a server.

The model, per config c and cell:
  TTFT ~ base_ttft_ms(shape) * (1 + ttft_tax[c] * shape_factor) * LogNormal(0, sigma)
  TPOT ~ base_tpot_ms(shape) * (1 + tpot_tax[c] * shape_factor) * LogNormal(0, sigma)
  below the knee TTFT does not depend on the rate; at and above knee[c] it is multiplied by
  knee_ttft_growth ** (number of doublings past the knee + 1), the effective throughput is
  knee_throughput_ratio x the offered rate and vllm:num_requests_waiting is 5 (all three
  saturation criteria fire at the knee);
  step_duration_us ~ step_base_us * LogNormal(0, step_sigma) + step_tax_us[c];
  build_meta / get_finished / start_load_kv = callback_us[c] / 3 each (times a small noise),
  null for configs without a connector (plain).
Phase B: TTFT tax scales with (input / min input) ** input_exponent, TPOT tax with
(output / min output) ** output_exponent, so both grow monotonically (H5, H6).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from connector_tax.atomic import write_atomic, write_json
from connector_tax.config import (
    LAUNCH_PHASES,
    PHASE_A,
    PHASE_B,
    PHASE_B_PRIME,
    Cell,
    StudyConfig,
    find_variant,
    phase_a_cells,
    phase_b_cells,
    validate_config,
)
from connector_tax.contract import StudyLayout
from connector_tax.contract.fingerprint import cell_settings, code_versions, fingerprint, launch_settings
from connector_tax.contract.index import IndexEntry, PhaseIndex, seal_cell

CONNECTOR_CONFIGS = [
    "plain",
    "noop_connector",
    "mooncake_producer",
    "mooncake_consumer",
    "mooncake_both",
    "nixl_both",
    "lmcache_only",
    "multi_mooncake_lmcache",
]


@dataclass
class SyntheticSpec:
    study: str = "synthetic"
    variants: list[str] = field(default_factory=lambda: list(CONNECTOR_CONFIGS))
    rates: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0, 16.0])
    phase_a_shape: tuple[int, int] = (4096, 256)
    shapes: list[tuple[int, int]] = field(default_factory=lambda: [(512, 64), (4096, 64), (512, 256), (4096, 256)])
    prime_variants: list[str] = field(default_factory=lambda: ["plain", "mooncake_both", "nixl_both", "lmcache_only"])
    prime_shapes: list[tuple[int, int]] = field(default_factory=lambda: [(512, 256), (4096, 256)])
    phase_b: bool = True
    phase_b_prime: bool = True
    knee: dict[str, float] = field(default_factory=lambda: {"plain": 16.0, "mooncake_both": 8.0})
    default_knee: float | None = None  # configs not in `knee`: never saturate
    ttft_tax: dict[str, float] = field(
        default_factory=lambda: {
            "noop_connector": 0.05,
            "mooncake_producer": 0.20,
            "mooncake_consumer": 0.15,
            "mooncake_both": 0.45,
            "nixl_both": 0.38,
            "lmcache_only": 0.15,
            "multi_mooncake_lmcache": 0.62,
        }
    )
    tpot_tax: dict[str, float] = field(
        default_factory=lambda: {
            "noop_connector": 0.02,
            "mooncake_producer": 0.10,
            "mooncake_consumer": 0.08,
            "mooncake_both": 0.25,
            "nixl_both": 0.20,
            "lmcache_only": 0.08,
            "multi_mooncake_lmcache": 0.33,
        }
    )
    step_tax_us: dict[str, float] = field(
        default_factory=lambda: {
            "noop_connector": 40.0,
            "mooncake_producer": 150.0,
            "mooncake_consumer": 120.0,
            "mooncake_both": 300.0,
            "nixl_both": 250.0,
            "lmcache_only": 100.0,
            "multi_mooncake_lmcache": 420.0,
        }
    )
    callback_us: dict[str, float] = field(
        default_factory=lambda: {
            "noop_connector": 30.0,
            "mooncake_producer": 90.0,
            "mooncake_consumer": 80.0,
            "mooncake_both": 200.0,
            "nixl_both": 180.0,
            "lmcache_only": 60.0,
            "multi_mooncake_lmcache": 270.0,
        }
    )
    no_connector: tuple[str, ...] = ("plain",)
    base_ttft_ms: float = 200.0
    base_tpot_ms: float = 20.0
    sigma: float = 0.1
    step_base_us: float = 5000.0
    step_sigma: float = 0.2
    knee_ttft_growth: float = 3.0
    knee_throughput_ratio: float = 0.8
    input_exponent: float = 0.25
    output_exponent: float = 0.25
    n_requests: int = 1000  # post-warm-up requests per cell
    warmup_frac: float = 0.1
    n_steps: int = 2000  # post-warm-up steps per cell
    # Cells that stand perturbed (the validity gate: a busy host), as "variant/phase/label"
    # keys: their summaries say invalid, host busy, after 3 attempts; their numbers are unchanged.
    perturbed: tuple[str, ...] = ()
    error_frac: float = 0.0
    step_logs: bool | list[str] = True  # True, False, or the configs that have them
    step_timing_reason: str = "patch did not apply: synthetic"
    skipped: dict[str, str] = field(default_factory=dict)  # preflight SKIP {config: reason}
    simulated: bool = True
    write_reference: bool = True
    seed: int = 1
    # workload.replicates launches per variant and phase, every launch's latencies times its own
    # speed factor exp(N(0, launch_sd)) (the launch bias the intervals must carry).
    replicates: int = 1
    launch_sd: float = 0.0


def _tax(table: dict[str, float], c: str) -> float:
    return float(table.get(c, 0.0))


def _knee_factor(spec: SyntheticSpec, c: str, rate: float | None) -> tuple[bool, float]:
    knee = spec.knee.get(c, spec.default_knee)
    if rate is None or knee is None or rate < knee - 1e-9:
        return False, 1.0
    doublings = math.log2(rate / knee) + 1.0
    return True, spec.knee_ttft_growth**doublings


def _has_steps(spec: SyntheticSpec, c: str) -> bool:
    return spec.step_logs is True or (isinstance(spec.step_logs, list) and c in spec.step_logs)


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(lines), encoding="utf-8")


def _cell(
    spec: SyntheticSpec,
    rng: np.random.Generator,
    folder: Path,
    c: str,
    phase: str,
    label: str,
    rate: float,
    shape: tuple[int, int],
    ttft_tax: float,
    tpot_tax: float,
    saturate: bool,
    speed: float = 1.0,
) -> None:
    """Write one cell's files into `folder` (a staging folder: write_study seals it)."""
    folder.mkdir(parents=True, exist_ok=True)
    sat, growth = _knee_factor(spec, c, rate) if saturate else (False, 1.0)
    n_post = spec.n_requests
    n_warm = int(round(n_post * spec.warmup_frac))
    n = n_post + n_warm
    t0 = 1_000_000_000_000 + int(rng.integers(0, 10**9))
    gap_ns = int(1e9 / rate)
    sched = t0 + np.arange(n, dtype=np.int64) * gap_ns
    send = sched + 50_000
    inp, out = shape
    base_ttft = spec.base_ttft_ms * (1.0 + inp / 4096.0) / 2.0
    ttft_ms = speed * base_ttft * (1.0 + ttft_tax) * growth * rng.lognormal(0.0, spec.sigma, n)
    tpot_ms = speed * spec.base_tpot_ms * (1.0 + tpot_tax) * rng.lognormal(0.0, spec.sigma, n)
    first = send + (ttft_ms * 1e6).astype(np.int64)
    last = first + (tpot_ms * 1e6 * (out - 1)).astype(np.int64)
    status = np.array(["ok"] * n, dtype=object)
    if spec.error_frac > 0:
        status[rng.random(n) < spec.error_frac] = "error"
    lines = []
    for i in range(n):
        ok = status[i] == "ok"
        lines.append(
            json.dumps(
                {
                    "request_id": f"{phase}_{label}-{i}",
                    "t_scheduled_ns": int(sched[i]),
                    "t_send_ns": int(send[i]),
                    "t_first_token_ns": int(first[i]) if ok else None,
                    "t_last_token_ns": int(last[i]) if ok else None,
                    "prompt_tokens": inp,
                    "completion_tokens": out if ok else None,
                    "inflight_at_send": 1,
                    "warmup": i < n_warm,
                    "status": status[i],
                    "error": None if ok else "HTTP 500",
                    "input_len": inp,
                    "output_len": out,
                    "chunks": out if ok else 0,
                    "http_status": 200 if ok else 500,
                    "worker": i % 2,
                },
                separators=(",", ":"),
            )
            + "\n"
        )
    _write_lines(folder / f"requests_{phase}_{label}.jsonl", lines)

    w0, w1 = int(sched[n_warm]) if n_warm < n else int(sched[0]), int(sched[-1])
    effective = rate * (spec.knee_throughput_ratio if sat else 1.0)
    summary = {
        "phase": phase,
        "cell": label,
        "arrival": "poisson",
        "rate": rate,
        "shape": {"input": inp, "output": out},
        "warmup_s": n_warm / rate,
        "duration_s": n_post / rate,
        "counts": {
            "scheduled": n,
            "warmup": n_warm,
            "post_warmup": n_post,
            "ok": int((status[n_warm:] == "ok").sum()),
            "error": int((status[n_warm:] == "error").sum()),
            "timeout": 0,
            "dropped": 0,
        },
        "rates": {
            "requested_rps": rate,
            "scheduled_rps": rate,
            "achieved_dispatch_rps": rate,
            "offered_in_window_rps": rate,
            "effective_throughput_rps": effective,
            "throughput_ratio": effective / rate,
        },
        "latency_ms": {
            "itl": {
                "n": n_post * (out - 1),
                "mean": spec.base_tpot_ms,
                "p50": spec.base_tpot_ms * (1 + tpot_tax),
                "p90": spec.base_tpot_ms * (1 + tpot_tax) * 1.2,
                "p99": spec.base_tpot_ms * (1 + tpot_tax) * 1.5,
            }
        },
        "validity": {"valid": True, "reasons": []},
        "complete": True,
    }
    if f"{c}/{phase}/{label}" in spec.perturbed:
        reason = "host busy: others_cpu_frac 0.48 > 0.1 (others' CPU in cores: hog (4242) 0.96)"
        summary["validity"] = {"valid": False, "reasons": [reason], "host_busy": True, "instrument_valid": True}
        summary["host"] = {
            "measured": True,
            "busy": True,
            "others_cpu_frac": 0.48,
            "others_cores_max": 1.0,
            "steal_frac": 0.0,
            "run_queue_mean": 3.5,
            "reasons": [reason],
        }
        summary["attempts"] = [{"attempt": k, "valid": False} for k in (1, 2, 3)]
    else:
        summary["host"] = {
            "measured": True,
            "busy": False,
            "others_cpu_frac": 0.01,
            "others_cores_max": 0.05,
            "steal_frac": 0.0,
            "run_queue_mean": 1.5,
            "reasons": [],
        }
    (folder / f"summary_{phase}_{label}.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")

    # metrics: warm-up samples carry a big queue (the window must exclude them)
    waiting = 5.0 if sat else 0.0
    ts = list(range(int(sched[0]), w0, 1_000_000_000)) + list(range(w0, w1 + 1, 1_000_000_000))
    mlines = []
    for t in ts:
        warm = t < w0
        mlines.append(
            json.dumps(
                {
                    "t_ns": t,
                    "vllm:num_requests_running": 4.0,
                    "vllm:num_requests_waiting": 10.0 if warm else waiting,
                    "vllm:kv_cache_usage_perc": 0.3,
                    "vllm:prompt_tokens_total": 0.0,
                }
            )
            + "\n"
        )
    _write_lines(folder / f"metrics_{phase}_{label}.jsonl", mlines)

    if _has_steps(spec, c):
        n_steps = spec.n_steps
        n_warm_steps = max(1, n_steps // 10)
        t_steps = np.concatenate(
            [
                np.linspace(int(sched[0]), w0 - 1, n_warm_steps).astype(np.int64),
                np.linspace(w0, w1, n_steps).astype(np.int64),
            ]
        )
        dur = spec.step_base_us * rng.lognormal(0.0, spec.step_sigma, t_steps.size) + _tax(spec.step_tax_us, c)
        dur[:n_warm_steps] = 10 * spec.step_base_us  # warm-up steps: slow, must be excluded
        has_conn = c not in spec.no_connector
        cb = _tax(spec.callback_us, c) / 3.0
        noise = rng.lognormal(0.0, 0.05, (3, t_steps.size)) if has_conn else None
        slines = []
        for i in range(t_steps.size):
            hooks = (
                (
                    f'"build_meta_us":{cb * noise[0, i]:.3f},"get_finished_us":{cb * noise[1, i]:.3f},'
                    f'"start_load_kv_us":{cb * noise[2, i]:.3f}'
                )
                if has_conn
                else '"build_meta_us":null,"get_finished_us":null,"start_load_kv_us":null'
            )
            slines.append(
                f'{{"t_ns":{int(t_steps[i])},"step_id":{i},"step_duration_us":{dur[i]:.3f},{hooks},'
                f'"num_running":4,"num_waiting":{int(waiting)},"prefill_tokens":512,"decode_tokens":4,'
                f'"source":"synthetic"}}\n'
            )
        _write_lines(folder / f"engine_step_{phase}_{label}.jsonl", slines)


def study_config(spec: SyntheticSpec) -> dict[str, Any]:
    configs = []
    for c in spec.variants:
        entry: dict[str, Any] = {"name": c}
        if c not in spec.no_connector:
            entry["connector"] = {"type": "custom" if c not in CONNECTOR_CONFIGS else "mooncake", "role": "kv_both"}
            if entry["connector"]["type"] == "custom":
                entry["connector"]["module_path"] = "synthetic.connector:Synthetic"
        configs.append(entry)
    wl: dict[str, Any] = {
        "replicates": spec.replicates,
        "warmup_s": 1,
        "duration_s": 10,
        "min_completed": 20,
        "phase_a": {
            "rates": list(spec.rates),
            "shape": {"input": spec.phase_a_shape[0], "output": spec.phase_a_shape[1]},
        },
        "phase_b": {"rate": "ref_safe", "shapes": [{"input": i, "output": o} for i, o in spec.shapes]},
    }
    if spec.phase_b_prime:
        wl["phase_b_prime"] = {
            "rate": "ref_load",
            "variants": [c for c in spec.prime_variants if c in spec.variants],
            "shapes": [{"input": i, "output": o} for i, o in spec.prime_shapes],
        }
    return validate_config(
        {
            "study": spec.study,
            "backend": "sim" if spec.simulated else "vllm",
            "seed": spec.seed,
            "model": {"name": "synthetic/model"},
            "variants": configs,
            "workload": wl,
            "saturation": {"throughput_ratio_min": 0.95, "waiting_p50_max": 1, "ttft_p90_ratio_max": 1.5},
        }
    )


def _index(spec: SyntheticSpec, config: dict[str, Any], c: str, phase: str, replicate: int = 1) -> PhaseIndex:
    launch = launch_settings(config, find_variant(config, c), ["synthetic", c], {"server": "synthetic"})
    steps = _has_steps(spec, c)
    return PhaseIndex(
        study=spec.study,
        variant=c,
        phase=phase,
        backend=config["backend"],
        launch=launch,
        code=code_versions(config["backend"]),
        cells=[],
        launch_id=f"synthetic-{spec.study}-{spec.seed}-{c}-{phase}-r{replicate}",
        started="2026-05-26T10:00:00+00:00",
        finished="2026-05-26T11:00:00+00:00",
        status="ok",
        launch_command=["synthetic", c],
        step_timing_available=steps,
        step_timing_reason=None if steps else spec.step_timing_reason,
        replicate=replicate,
    )


def _write_cells(
    spec: SyntheticSpec,
    rng: np.random.Generator,
    layout: StudyLayout,
    config: dict[str, Any],
    index: PhaseIndex,
    cells: list[Cell],
    factors: Any,
) -> None:
    """Generate, seal and index each planned cell; factors(cell) -> (ttft tax, tpot tax, saturate)."""
    speed = float(np.exp(rng.normal(0.0, spec.launch_sd))) if spec.launch_sd > 0 else 1.0  # the launch's bias
    for cell in cells:
        folder = layout.phase(index.variant, cell.phase, index.replicate)
        staging = folder.staging(cell.label)
        ttft, tpot, saturate = factors(cell)
        shape = (cell.shape["input"], cell.shape["output"])
        _cell(
            spec,
            rng,
            staging.folder,
            index.variant,
            cell.phase,
            cell.label,
            cell.rate,
            shape,
            ttft,
            tpot,
            saturate,
            speed,
        )
        settings = cell_settings(config, cell)
        fp = fingerprint(index.launch, settings, index.code)
        seal_cell(staging, folder.cell(cell.label), fp)
        index.cells.append(IndexEntry(cell.phase, cell.label, fp, settings, status="complete"))
    folder = layout.phase(index.variant, index.phase, index.replicate)
    index.write(folder.index)
    write_atomic(folder.env_txt, "synthetic\n")


def write_study(root: Path, spec: SyntheticSpec | None = None) -> Path:
    """Write results/<study>/ under `root` (root IS the study folder) as the pipeline would,
    every cell sealed and indexed; returns it."""
    spec = spec or SyntheticSpec()
    layout = StudyLayout(Path(root))
    layout.root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    config = study_config(spec)
    write_atomic(layout.study_config, yaml.safe_dump(config, sort_keys=False))
    status = {
        c: {
            "status": "skip" if c in spec.skipped else "ok",
            "reason": spec.skipped.get(c),
            "backend": config["backend"],
        }
        for c in spec.variants
    }
    write_json(layout.preflight_status, status)
    ran = [c for c in spec.variants if c not in spec.skipped]
    for c in spec.skipped:
        for phase in LAUNCH_PHASES:
            index = _index(spec, config, c, phase)
            index.status, index.reason = "skipped", f"preflight SKIP: {spec.skipped[c]}"
            index.write(layout.index(c, phase))
    replicates = range(1, spec.replicates + 1)
    for r, c in ((r, c) for r in replicates for c in ran):
        _write_cells(
            spec,
            rng,
            layout,
            config,
            _index(spec, config, c, PHASE_A, r),
            phase_a_cells(StudyConfig.from_mapping(config), r),
            lambda cell, c=c: (_tax(spec.ttft_tax, c), _tax(spec.tpot_tax, c), True),
        )
    ref_safe, ref_load = _expected_refs(spec)
    reference: dict[str, Any] = {"ref_safe": ref_safe, "ref_load": ref_load}
    if spec.write_reference:
        from connector_tax.analysis.reference_rates import reference_rates

        reference = reference_rates(layout.root)
        write_json(layout.reference_rates, reference)
    if not spec.phase_b:
        return layout.root
    s_in, s_out = min(s[0] for s in spec.shapes), min(s[1] for s in spec.shapes)

    def factors(cell: Cell, c: str) -> tuple[float, float, bool]:
        f_in = (cell.shape["input"] / s_in) ** spec.input_exponent
        f_out = (cell.shape["output"] / s_out) ** spec.output_exponent
        boost = 1.5 if cell.phase == PHASE_B_PRIME else 1.0
        return _tax(spec.ttft_tax, c) * f_in * boost, _tax(spec.tpot_tax, c) * f_out * boost, False

    for r, c in ((r, c) for r in replicates for c in ran):
        cells = phase_b_cells(StudyConfig.from_mapping(config), c, reference, r)
        _write_cells(
            spec, rng, layout, config, _index(spec, config, c, PHASE_B, r), cells, lambda cell, c=c: factors(cell, c)
        )
    return layout.root


def _expected_refs(spec: SyntheticSpec) -> tuple[float, float]:
    """(ref_safe, ref_load) the spec implies: the largest rate below every knee / plain's knee."""
    ran = [c for c in spec.variants if c not in spec.skipped]
    knees = [spec.knee.get(c, spec.default_knee) for c in ran]
    knees = [k for k in knees if k is not None]
    safe = [r for r in spec.rates if all(r < k - 1e-9 for k in knees)]
    base = "plain" if "plain" in ran else (ran[0] if ran else None)
    bk = spec.knee.get(base, spec.default_knee) if base else None
    load = [r for r in spec.rates if bk is None or r < bk - 1e-9]
    return (max(safe) if safe else min(spec.rates)), (max(load) if load else min(spec.rates))


def expected_reference(spec: SyntheticSpec) -> tuple[float, float]:
    return _expected_refs(spec)
