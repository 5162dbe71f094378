"""Virtual-time cells: one configuration of a study driven at one load, in the simulator's
virtual time, with the study's arrival process and request shape.

A `Cell` is what a study cell asks of the server (rate, arrival process, shape); `run_cell`
drives the same engine, cost model and settings that `ctax sim` resolves for a configuration
(settings.resolve) with a seeded open-loop arrival stream of that load and returns every
request's TTFT and TPOT in arrival order, as the study defines them (TTFT = first token -
arrival; TPOT = (last - first) / (tokens - 1)). No HTTP, no load generator, no sleeping: what
a real run adds on top is discussed in README.md ("The truth oracle").

The same seed gives the same arrival times and shapes whatever the configuration, so two
configurations run on one seed see identical traffic (common random numbers): their p90s differ
only by what the configurations do, which makes the tax between them far more precise than
either p90 alone.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from connector_tax.config.cells import Cell, phase_a_cells, phase_b_cells, rate_label
from connector_tax.config.study import StudyConfig
from connector_tax.sim.apidelay import ApiDelays
from connector_tax.sim.engine import EngineCore, SimRequest, StepResult
from connector_tax.sim.settings import SimSettings
from connector_tax.sim.virtual import drive

# Prompt ids: a unique first token per request (so no two prompts share a KV block: zero prefix
# reuse, as the load generator's prompts), then a filler whose content the model ignores.
_UNIQUE_BASE = 100_000
_FILLER = [1000 + (i * 7919) % 29000 for i in range(1 << 18)]


def prompt_ids(index: int, input_len: int) -> list[int]:
    """Request `index`'s prompt of `input_len` tokens, sharing no KV block with any other."""
    return [_UNIQUE_BASE + index] + _FILLER[: input_len - 1]


def study_loads(study: StudyConfig, name: str, reference: dict[str, float]) -> list[Cell]:
    """The cells at which the analysis compares variant `name` with the baseline: its Phase A
    cell at each reference rate (the Phase A shape), and its Phase B and B' cells (the study
    config's own cell plan, so the shapes and rates are exactly the study's)."""
    template = phase_a_cells(study)[0]
    cells: dict[str, Cell] = {}
    for key in ("ref_safe", "ref_load"):
        rate = reference.get(key)
        if rate is not None:
            cells[rate_label(rate)] = dataclasses.replace(template, label=rate_label(rate), rate=float(rate))
    out = list(cells.values())
    if study.workload.phase_b:
        out += phase_b_cells(study, name, reference)
    return out


def seed_for(seed: int, load: Cell, replication: int, config: str = "") -> int:
    """One seed per (study seed, load, replication): the same for every configuration unless
    `config` is given (then each configuration draws its own traffic, as separate cells of a
    real study do)."""
    words = [seed, zlib.crc32(load.key.encode()), replication] + ([zlib.crc32(config.encode())] if config else [])
    return int(np.random.SeedSequence(words).generate_state(1)[0])


def _arrival_us(load: Cell, n: int, rng: np.random.Generator) -> np.ndarray:
    mean_us = 1e6 / load.rps
    if load.arrival == "fixed":
        gaps = np.full(n, mean_us)
        gaps[0] = 0.0
    elif load.arrival == "gamma":
        gaps = rng.gamma(load.gamma_shape, mean_us / load.gamma_shape, n)
    elif load.arrival == "poisson":
        gaps = rng.exponential(mean_us, n)
    else:
        raise ValueError(f"workload.arrival.process: {load.arrival!r} has no virtual-time model")
    return np.cumsum(gaps)


def _shapes(load: Cell, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 2) array of (input, output) per request: one pair, a weighted mix, or a pattern."""
    if load.pair is not None:
        return np.tile(np.array(load.pair), (n, 1))
    kind = "mix" if "mix" in load.shape else "pattern"
    pairs = np.array([[e["input"], e["output"]] for e in load.shape[kind]])
    if kind == "pattern":
        return pairs[np.arange(n) % len(pairs)]
    weights = np.array([float(e.get("weight", 1)) for e in load.shape["mix"]])
    return pairs[rng.choice(len(pairs), size=n, p=weights / weights.sum())]


@dataclass
class Latencies:
    """Every request of one virtual cell, in arrival order (ms)."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray  # NaN for one-token outputs (TPOT undefined)
    arrival_s: np.ndarray
    steps: int

    def after(self, warmup: int) -> Latencies:
        return Latencies(self.ttft_ms[warmup:], self.tpot_ms[warmup:], self.arrival_s[warmup:], self.steps)


def run_cell(settings: SimSettings, load: Cell, n: int, seed: int, ignore_eos: bool = True) -> Latencies:
    """Drive a fresh engine of `settings` with `n` requests of `load` (seeded) to the end."""
    rng = np.random.default_rng(seed)
    arrival = _arrival_us(load, n, rng)
    shapes = _shapes(load, n, rng)
    # Without ignore_eos a request stops where its EOS falls, 16-271 tokens for a random
    # prompt (tokens.natural_length), capped by max_tokens.
    targets = shapes[:, 1] if ignore_eos else np.minimum(shapes[:, 1], 16 + rng.integers(0, 256, n))
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    produced = np.zeros(n, dtype=np.int64)
    index: dict[int, int] = {}
    core = EngineCore(settings.engine, settings.cost_model)
    # A calibrated profile's API server (sim/apidelay.py): the engine sees a request `ingress`
    # after its arrival, the client a token `egress` after its step. None for hand-set profiles.
    api = ApiDelays(settings.api, seed)
    delays = np.array([api.draw(i) for i in range(n)]) if api.active else np.zeros((n, 3))
    at_engine = arrival + delays[:, 0]
    order = np.argsort(at_engine, kind="stable")

    def requests() -> Iterator[tuple[float, SimRequest]]:
        for i in order.tolist():
            inp, out = int(shapes[i, 0]), int(shapes[i, 1])
            req = SimRequest(str(i), prompt_ids(i, inp), out, int(targets[i]))
            index[id(req)] = i
            yield float(at_engine[i]), req

    steps = 0

    def on_step(now: float, result: StepResult) -> None:
        nonlocal steps
        steps += 1
        for o in result.outputs:
            i = index[id(o.request)]
            if produced[i] == 0:
                first[i] = now
            last[i] = now
            produced[i] += len(o.new_token_ids)
            if o.finished:
                del index[id(o.request)]

    drive(core, requests(), on_step, max_steps=2**62)
    first = first + delays[:, 1]
    last = np.maximum(last + delays[:, 2], first)
    ttft = (first - arrival) / 1000.0
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(produced > 1, (last - first) / np.maximum(produced - 1, 1) / 1000.0, np.nan)
    return Latencies(ttft, tpot, arrival / 1e6, steps)
