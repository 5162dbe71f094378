"""The gate's settings: when a cell is saturated (`saturation:`) and when it is valid
(`validity:`). Their defaults and the rationale of each bound are the schema's
(workflow/schemas/config.schema.yaml), the one place they are written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from connector_tax.config.errors import ConfigError


@dataclass(frozen=True)
class Saturation:
    """The study's three saturation criteria (docs/study-design.md), and the smallest sample each
    judges (below it a criterion is "too few to judge", analysis/saturation.py). Their defaults are the schema's
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
