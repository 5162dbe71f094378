"""Cell identity: phases, labels, and which cells a study config plans for each configuration.

A cell is one (configuration, phase, label). Its label is derived from what the cell measures
(`r<rate>` in Phase A, `<input>x<output>` or `mix-<hash>` / `pattern-<hash>` in Phase B and B'),
so two cells of one phase can share a label only if their settings collide; `check_labels`
turns such a collision into a config error before anything runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connector_tax.config.study import StudyConfig

PHASE_A, PHASE_B, PHASE_B_PRIME = "phase_a", "phase_b", "phase_b_prime"
PHASES = (PHASE_A, PHASE_B, PHASE_B_PRIME)
# The phases that own a server launch (and its run.json index); Phase B' runs in Phase B's.
LAUNCH_PHASES = (PHASE_A, PHASE_B)
LAUNCH_OF = {PHASE_A: PHASE_A, PHASE_B: PHASE_B, PHASE_B_PRIME: PHASE_B}


def traffic_seed(study_seed: int, phase: str, label: str, replicate: int = 1) -> int:
    """The one seed of a cell's traffic: its arrival schedule, its shapes and its prompts' token
    ids. Derived from (study seed, phase, label, replicate) and nothing else, so every variant
    gets the same traffic in the same cell and replicate (common random numbers: a tax compares
    two servers on identical requests), while two cells, or two replicates of one cell, draw
    independent traffic. Both clocks use it (loadgen.schedule.realtime, oracle.virtual_run)."""
    return _derived("traffic", study_seed, phase, label, replicate)


def launch_seed(study_seed: int, variant: str, launch_phase: str, replicate: int = 1, restart: int = 0) -> int:
    """The seed of one server launch's own draws (the simulator's per-launch speed factor,
    sim.launch_bias_sd): one per (variant, launch phase, replicate, relaunch after a failure), so
    two launches differ and a re-run of the same launch draws the same."""
    return _derived("launch", study_seed, variant, launch_phase, replicate, restart)


def _derived(*words: Any) -> int:
    """A 63-bit seed from words (a hash: stable across Python versions and processes)."""
    digest = hashlib.blake2b("/".join(str(w) for w in words).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def rate_label(rate: float) -> str:
    """`r<rate>` with 6 significant digits (r0.5, r32, r1e+03): rates that collide here are
    rejected at config load rather than silently sharing a cell."""
    return f"r{rate:g}"


def _short_hash(obj: Any) -> str:
    # Canonical JSON: the label depends on the shape's content only, not on key order or on
    # whether a mix weight of 1 was written out (loadgen.schedule.shapes.ShapeSampler.label agrees).
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def shape_label(shape: dict[str, Any]) -> str:
    """ "4096x256", "mix-<hash>" or "pattern-<hash>"."""
    if "mix" in shape:
        content = [[e["input"], e["output"], float(e.get("weight", 1))] for e in shape["mix"]]
        return f"mix-{_short_hash(content)}"
    if "pattern" in shape:
        return f"pattern-{_short_hash([[e['input'], e['output']] for e in shape['pattern']])}"
    return f"{shape['input']}x{shape['output']}"


@dataclass(frozen=True)
class TraceRequest:
    """One request of a replayed trace (loadgen.schedule.trace reads them from a Mooncake-format file)."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class Cell:
    """What one cell measures: the one description every stage passes on (the pipeline plans it,
    the load generator and the virtual-time runner run it, the analysis reads it back). A study
    cell comes from the config (rates of Phase B from the reference stage); `ctax bench` builds
    its own, and only it uses the traffic patterns at the end (concurrency, a count, a trace)."""

    phase: str
    label: str
    rate: float | None = None  # req/s of an open-loop arrival process
    shape: dict[str, Any] = field(default_factory=lambda: {"input": 1024, "output": 128}, hash=False)
    warmup_s: float = 0.0
    duration_s: float = 60.0
    min_completed: int = 0
    arrival: str = "poisson"  # poisson | gamma | fixed (a study's); max | concurrency | trace (ctax bench)
    gamma_shape: float = 1.0
    precision_target: float | None = None  # workload.precision: adaptive length (measure.precision)
    max_duration_s: float | None = None  # hard end of the extension (default 10x duration + 60 s)
    overload_guard: bool = True  # workload.phase_b.overload_guard (Phase B and B' cells only)
    concurrency: int | None = None  # closed loop: requests kept in flight
    rampup_s: float = 0.0
    num_requests: int | None = None  # max-throughput count, or a cap on a trace
    trace: tuple[TraceRequest, ...] | None = None
    time_scale: float = 1.0
    # A study cell's traffic seed (traffic_seed: the same for every variant) and which of the
    # workload.replicates launches it belongs to; None: the load generator's own seed (ctax bench).
    seed: int | None = None
    replicate: int = 1
    # What its length past the floor is set by: the precision of its own p90s, or ("tax") of the
    # taxes it feeds, paired against the baseline's cell (measure.precision).
    precision_of: str = "p90"
    # Which measurement of the cell in its launch this is (measure.loop's attempts): not a
    # setting (not fingerprinted); a later attempt's prompts differ (loadgen.worker.prompts.prompt_key).
    attempt: int = 1

    @property
    def key(self) -> str:
        return f"{self.phase}/{self.label}"

    @property
    def pair(self) -> tuple[int, int] | None:
        """(input, output) of a single-shape cell; None for a mix, a pattern or a trace."""
        return (int(self.shape["input"]), int(self.shape["output"])) if "input" in self.shape else None

    def max_duration(self) -> float:
        return self.max_duration_s if self.max_duration_s is not None else 10 * self.duration_s + 60

    @property
    def rps(self) -> float:
        """The rate of an open-loop cell (every cell a study plans has one: Phase A's sweep, the
        reference rate of Phase B and B'); ValueError for one without (closed loop, a trace)."""
        if self.rate is None:
            raise ValueError(f"{self.phase}/{self.label}: a cell without an arrival rate")
        return self.rate

    def settings(self) -> dict[str, Any]:
        """What the cell's fingerprint hashes (contract.fingerprint.cell_settings)."""
        return {
            "phase": self.phase,
            "label": self.label,
            "rate": self.rate,
            "arrival": self.arrival,
            "gamma_shape": self.gamma_shape if self.arrival == "gamma" else None,
            "shape": self.shape,
            "warmup_s": self.warmup_s,
            "duration_s": self.duration_s,
            "min_completed": self.min_completed,
            "precision_target": self.precision_target,
            "max_duration_s": self.max_duration_s,
            # Only when off, so that the settings (and fingerprints) of cells measured before the
            # switch existed, all guarded, stay the same.
            **({} if self.overload_guard else {"overload_guard": False}),
            **({} if self.seed is None else {"traffic_seed": self.seed}),
            **({} if self.replicate == 1 else {"replicate": self.replicate}),
            **({} if self.precision_of == "p90" else {"precision_of": self.precision_of}),
        }

    def describe(self) -> dict[str, Any]:
        """The cell as a load generator's summary records it."""
        return {
            "phase": self.phase,
            "cell": self.label,
            "arrival": self.arrival,
            "rate": self.rate,
            "gamma_shape": self.gamma_shape if self.arrival == "gamma" else None,
            "shape": self.shape if self.trace is None else "trace",
            "concurrency": self.concurrency,
            "rampup_s": self.rampup_s,
            "warmup_s": self.warmup_s,
            "duration_s": self.duration_s,
            "min_completed": self.min_completed,
            "max_duration_s": self.max_duration(),
            "traffic_seed": self.seed,
            "replicate": self.replicate,
            **({} if self.attempt == 1 else {"attempt": self.attempt}),
        }


def _cell(
    study: StudyConfig,
    phase: str,
    label: str,
    rate: float,
    shape: Mapping[str, Any],
    replicate: int = 1,
    on_tax: bool = False,
) -> Cell:
    """on_tax: a cell that stops on the precision of the taxes it feeds (workload.precision.of tax,
    not the baseline's): its floor of completed requests is precision.min_completed. The baseline's
    cells of such a study run the study's cell rule alone (its precision target is the taxes')."""
    workload = study.workload
    pairs_only = workload.precision.on_tax and not on_tax
    return Cell(
        phase=phase,
        label=label,
        rate=float(rate),
        shape=dict(shape),
        warmup_s=workload.warmup_s,
        duration_s=workload.duration_s,
        min_completed=workload.precision.min_completed if on_tax else workload.min_completed,
        arrival=workload.arrival.process,
        gamma_shape=workload.arrival.gamma_shape,
        precision_target=None if pairs_only else workload.precision.target,
        max_duration_s=workload.precision.max_duration_s,
        seed=traffic_seed(study.seed, phase, label, replicate),
        replicate=replicate,
        precision_of="tax" if on_tax else "p90",
    )


def stops_on_tax(study: StudyConfig, name: str | None) -> bool:
    """Do `name`'s cells stop on their taxes' precision (workload.precision.of tax)? Every variant's
    but the baseline's, which runs first by the study's cell rule and is what they are paired with."""
    return name is not None and study.workload.precision.on_tax and name != study.baseline


def phase_a_cells(study: StudyConfig, replicate: int = 1, name: str | None = None) -> list[Cell]:
    """The rate sweep, lowest rate first (a knee found on the way up prunes the rest); `name`: the
    variant they are planned for (of tax, whether they stop on it)."""
    phase_a, tax = study.workload.phase_a, stops_on_tax(study, name)
    return [_cell(study, PHASE_A, rate_label(r), r, phase_a.shape, replicate, tax) for r in sorted(phase_a.rates)]


def phase_b_shapes(study: StudyConfig) -> list[dict[str, Any]]:
    """The Phase B grid: inputs x outputs, then the explicit shapes."""
    phase_b = study.workload.phase_b
    grid = [{"input": i, "output": o} for i in phase_b.get("inputs", []) for o in phase_b.get("outputs", [])]
    return grid + list(phase_b.get("shapes", []))


def runs_phase_b_prime(study: StudyConfig, name: str, reference: dict[str, Any]) -> bool:
    prime = study.workload.phase_b_prime
    return prime is not None and name in prime["variants"] and reference.get("ref_load") != reference.get("ref_safe")


def phase_b_cells(study: StudyConfig, name: str, reference: dict[str, Any], replicate: int = 1) -> list[Cell]:
    """Phase B at its reference rate, then Phase B' (same launch) where the study asks for it."""
    workload = study.workload
    rate = reference[workload.phase_b["rate"]]
    tax = stops_on_tax(study, name)
    cells = [_cell(study, PHASE_B, shape_label(s), rate, s, replicate, tax) for s in phase_b_shapes(study)]
    if runs_phase_b_prime(study, name, reference):
        prime = workload.phase_b_prime or {}
        paired = tax and runs_phase_b_prime(study, study.baseline, reference)  # else no cell to pair with
        cells += [
            _cell(study, PHASE_B_PRIME, shape_label(s), reference[prime["rate"]], s, replicate, paired)
            for s in prime["shapes"]
        ]
    guard = bool(workload.phase_b.get("overload_guard", True))
    return [dataclasses.replace(c, overload_guard=guard) for c in cells]


def planned_cells(
    study: StudyConfig, name: str, launch_phase: str, reference: dict[str, Any] | None, replicate: int = 1
) -> list[Cell]:
    """The cells of one launch (Phase A, or Phase B with its B'); Phase B needs the reference rates."""
    if launch_phase == PHASE_A:
        return phase_a_cells(study, replicate, name)
    if reference is None:
        raise ValueError("Phase B cells need the reference rates (reference_rates.json)")
    return phase_b_cells(study, name, reference, replicate)


def run_order(study: StudyConfig, launch_phase: str = PHASE_A) -> list[str]:
    """The study's defence against drift: configs in a seeded random order, a different one
    per phase (a config measured first in Phase A is not first again in Phase B)."""
    names = study.names
    seed = study.seed if launch_phase == PHASE_A else f"{launch_phase}/{study.seed}"
    random.Random(seed).shuffle(names)
    return names


def launch_label(name: str, replicate: int = 1) -> str:
    """A launch in words and in run orders: the variant's name, `<name>.r<k>` for replicate k > 1."""
    return name if replicate == 1 else f"{name}.r{replicate}"


def launch_order(study: StudyConfig, launch_phase: str = PHASE_A) -> list[tuple[str, int]]:
    """Every (variant, replicate) launch of a phase, in the order they run: rounds of every
    variant once (the baseline too), each round in its own seeded order, so a variant's launches
    are spread over the study and drift (thermal, the host) falls on all variants alike. The first
    round is run_order's (a study without replicates runs as before); a round never starts with
    the variant that ended the one before it. With workload.precision.of tax, the baseline opens
    every round: the others' cells stop on their paired taxes, so its cells must exist first."""
    order: list[tuple[str, int]] = []
    for replicate in range(1, study.workload.replicates + 1):
        names = run_order(study, launch_phase)
        if replicate > 1:
            random.Random(f"{launch_phase}/{study.seed}/r{replicate}").shuffle(names)
            if len(names) > 1 and names[0] == order[-1][0]:
                names[0], names[1] = names[1], names[0]
        if study.workload.precision.on_tax:  # the others are paired against it: it opens each round
            names.remove(study.baseline)
            names.insert(0, study.baseline)
        order += [(name, replicate) for name in names]
    return order


def check_labels(config: Mapping[str, Any]) -> tuple[str, str] | None:
    """(key path, problem) of the first pair of cells that would share a label, else None."""
    workload = config["workload"]
    seen: dict[str, int] = {}
    for i, rate in enumerate(workload["phase_a"]["rates"]):
        label = rate_label(rate)
        if label in seen:
            j = seen[label]
            first = workload["phase_a"]["rates"][j]
            return (
                f"workload.phase_a.rates[{i}]",
                f"{rate!r} gives the same cell label {label} as rates[{j}] ({first!r}); "
                "rates must differ in their first 6 significant digits",
            )
        seen[label] = i
    phase_b = workload["phase_b"]
    named: list[tuple[str, dict[str, Any]]] = [
        (f"workload.phase_b (inputs x outputs: {i}x{o})", {"input": i, "output": o})
        for i in phase_b.get("inputs", [])
        for o in phase_b.get("outputs", [])
    ]
    named += [(f"workload.phase_b.shapes[{j}]", s) for j, s in enumerate(phase_b.get("shapes", []))]
    problem = _duplicate_shape(named)
    if problem:
        return problem
    prime = workload.get("phase_b_prime") or {}
    return _duplicate_shape([(f"workload.phase_b_prime.shapes[{j}]", s) for j, s in enumerate(prime.get("shapes", []))])


def _duplicate_shape(named: list[tuple[str, dict[str, Any]]]) -> tuple[str, str] | None:
    seen: dict[str, str] = {}
    for where, shape in named:
        label = shape_label(shape)
        if label in seen:
            return (
                where,
                f"repeats the shape of {seen[label]} (cell {label}): every cell of a phase needs its own shape",
            )
        seen[label] = where
    return None
