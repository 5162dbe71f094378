"""The study config as typed, read-only objects, built once from the validated mapping.

The schema has filled every default before these are built, so no reader downstream needs a
`.get(key, default)` of its own (a second default that could drift from the schema's). The
sections that are passed on whole to a server or a fingerprint (model, server, sim, vllm,
connectors, shapes) stay mappings: their meaning belongs to the launcher that reads them, and
`raw` is the validated mapping itself, which is what fingerprints and staged configs hash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from connector_tax.config.errors import ConfigError


@dataclass(frozen=True)
class Arrival:
    process: str  # poisson | gamma | fixed
    gamma_shape: float


@dataclass(frozen=True)
class Precision:
    """Adaptive cell length: run past the floor until the intervals reach `target`: the cell's p90
    intervals (of "p90"), or, of "tax", the taxes it feeds, paired against the baseline's cell."""

    target: float | None
    max_duration_s: float | None
    of: str = "p90"  # p90 | tax
    min_completed: int = 64  # of tax: the floor of completed requests of a cell that stops on its tax

    @property
    def on_tax(self) -> bool:
        return self.of == "tax" and self.target is not None


@dataclass(frozen=True)
class PhaseA:
    rates: tuple[float, ...]
    shape: Mapping[str, Any]
    prune_after_knee: bool


@dataclass(frozen=True)
class Workload:
    warmup_s: float
    duration_s: float
    min_completed: int
    request_timeout_s: float
    arrival: Arrival
    precision: Precision
    phase_a: PhaseA
    phase_b: Mapping[str, Any]
    phase_b_prime: Mapping[str, Any] | None
    replicates: int = 1  # launches per variant and phase
    aa_control: bool = False


@dataclass(frozen=True)
class Saturation:
    """The design's three saturation criteria, and the smallest sample each judges (below it a
    criterion is "too few to judge", analysis/saturation.py). Their defaults are the schema's
    (workflow/schemas/config.schema.yaml), the one place they are written."""

    throughput_ratio_min: float
    waiting_p50_max: float
    ttft_p90_ratio_max: float
    min_requests: int
    min_scrapes: int


@dataclass(frozen=True)
class Validity:
    """The gate a measured cell must pass (the `validity:` section; defaults and the rationale of
    each bound are the schema's, workflow/schemas/config.schema.yaml): the instrument's checks,
    judged by what lateness does to the measurement, the host's contention, and how many times a
    cell that fails is measured before the least perturbed attempt stands."""

    max_lateness_gap_frac: float
    max_lateness_ttft_frac: float
    max_lateness_p99_us: float | None
    max_lateness_max_us: float
    max_rate_error: float
    max_error_frac: float
    max_dropped_frac: float
    max_cpu_frac: float
    max_unissued: int
    max_overrun_ms: float
    max_unmatched: int
    max_prompt_token_error: float
    max_others_cpu_frac: float
    max_steal_frac: float
    attempts: int

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Validity:
        """From a validated `validity` section; a key this type does not know is an error (a
        misspelt bound must not be silently dropped)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"validity.{unknown[0]}", f"unknown key (known: {', '.join(sorted(known))})")
        missing = sorted(known - set(values))
        if missing:
            raise ConfigError(f"validity.{missing[0]}", "missing (validate the config first: the schema fills it)")
        return cls(**values)

    def replace(self, **changes: Any) -> Validity:
        """A copy with some bounds changed (tests, `ctax bench`); unknown names are an error."""
        return Validity.from_mapping({**asdict(self), **changes})


@dataclass(frozen=True)
class LoadgenSettings:
    workers: int
    affinity: bool
    cpu_latency_us: int | None
    rt_priority: int | None = None


@dataclass(frozen=True)
class Variant:
    """One configuration of the study: a connector plus any server or simulator override."""

    name: str
    connector: Mapping[str, Any] | None
    raw: Mapping[str, Any]


def baseline_name(config: Mapping[str, Any]) -> str:
    """plain if the study has it, else its first variant (the analysis's default baseline)."""
    names = [v["name"] for v in config["variants"]]
    return "plain" if "plain" in names else names[0]


@dataclass(frozen=True)
class StudyConfig:
    study: str
    backend: str  # sim | vllm | openai
    seed: int
    variants: tuple[Variant, ...]
    workload: Workload
    saturation: Saturation
    validity: Validity
    loadgen: LoadgenSettings
    raw: Mapping[str, Any]

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> StudyConfig:
        """From a mapping `validate_config` returned (defaults filled, checks passed)."""
        workload = config["workload"]
        phase_a = workload["phase_a"]
        return cls(
            study=config["study"],
            backend=config["backend"],
            seed=config["seed"],
            variants=tuple(Variant(v["name"], v.get("connector"), v) for v in config["variants"]),
            workload=Workload(
                warmup_s=workload["warmup_s"],
                duration_s=workload["duration_s"],
                min_completed=workload["min_completed"],
                request_timeout_s=workload["request_timeout_s"],
                arrival=Arrival(workload["arrival"]["process"], float(workload["arrival"]["gamma_shape"])),
                precision=Precision(
                    workload["precision"]["target"],
                    workload["precision"]["max_duration_s"],
                    workload["precision"]["of"],
                    workload["precision"]["min_completed"],
                ),
                phase_a=PhaseA(tuple(phase_a["rates"]), phase_a["shape"], phase_a["prune_after_knee"]),
                phase_b=workload["phase_b"],
                phase_b_prime=workload.get("phase_b_prime") or None,
                replicates=workload["replicates"],
                aa_control=workload["aa_control"],
            ),
            saturation=Saturation(**config["saturation"]),
            validity=Validity.from_mapping(config["validity"]),
            loadgen=LoadgenSettings(**config["loadgen"]),
            raw=config,
        )

    @property
    def names(self) -> list[str]:
        return [v.name for v in self.variants]

    @property
    def baseline(self) -> str:
        """The variant taxes are measured against by default: plain, else the first."""
        return baseline_name(self.raw)

    @property
    def aa_controls(self) -> dict[str, str]:
        """{A/A control variant: the variant it repeats}."""
        return {v.name: v.raw["aa_of"] for v in self.variants if v.raw.get("aa_of")}

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise ConfigError("variants", f"no variant named {name!r} (known: {', '.join(self.names)})")
