"""The validity gate of a measured cell, and which of its attempts stands.

The load generator judges itself (loadgen.stats.summarize: on rate, lateness by its effect, CPU to spare,
every result matched); the runner measured the host around the cell (metrics.host, real time
only). `judge` puts the two together into the summary's `validity`: a cell measured while the
host was busy is invalid, however punctual the instrument was, and the reasons say so with the
numbers.

A cell invalid for a reason the host or the instrument's timing can cause (PERTURBATIONS) is
measured again, up to `validity.attempts` times in all; one invalid only for what the server did
(errors, a shortfall of completed requests) or for a bug (results matching no request) is not:
measuring again would find the same. Nor is an instrument late on a host the sampler found
quiet outside the study and mostly busy with it (`self_starved`): the study's own server took
the CPU, and would again.
When no attempt passes, the least perturbed one stands (`perturbation`: how far past its bound
the worst timing or host check went). The attempts that do not stand are kept under superseded/
with the reason each was set aside. A cell that stands perturbed is measured again by the next
run of the study (`stands_perturbed`), like a failed one: running it again in a quiet hour mends
exactly what the busy one could not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from connector_tax.config import Validity
from connector_tax.contract.index import read_summary
from connector_tax.contract.layout import CellFiles
from connector_tax.contract.summary import SELF_STARVED, AttemptNote, CellSummary, Verdict

# Checks whose failure a busy host or a late instrument explains, and a new attempt may not repeat.
PERTURBATIONS = (
    "lateness_gap_frac",
    "lateness_ttft_frac",
    "lateness_p99_us",
    "lateness_max_us",
    "dispatch_rate_error",
    "unissued",
    "issue_overrun_ms",
    "host_others_cpu_frac",
    "host_steal_frac",
)


def _perturbing(name: str) -> bool:
    return name in PERTURBATIONS or name.startswith("cpu_frac_")


def judge(summary: CellSummary, validity: Validity) -> Verdict:
    """The summary's `validity` with the host's checks added (in place, and returned): valid only
    when the instrument passed and the host was not busy. `instrument_valid` and `host_busy`
    keep the two apart (host_busy None: no host was measured, a virtual-time cell)."""
    v, host = summary.validity, summary.host
    v.instrument_valid = v.valid
    checks = [c for c in v.checks if not c.name.startswith("host_")]
    reasons = [r for r in v.reasons if not r.startswith("host busy") and r != SELF_STARVED]
    measured = host is not None and host.measured
    if host is not None and measured:
        checks += [msgspec.structs.replace(c, name=f"host_{c.name}") for c in host.checks]
        reasons += host.reasons
    v.checks, v.reasons = checks, reasons
    v.host_busy = host.busy if host is not None and measured else None
    v.valid = v.instrument_valid and not v.host_busy
    v.perturbation = perturbation(v)
    if self_starved(summary):
        reasons.append(SELF_STARVED)
    return v


def perturbation(validity: Verdict) -> float:
    """How far past its bound the worst timing or host check went, as a multiple of the bound
    (1.0: at the bound; a count bound of 0 reads 1 + the count past it); 0 with none failed."""
    worst = 0.0
    for c in validity.checks:
        if c.passed or not _perturbing(c.name):
            continue
        value, bound = float(c.value or 0.0), float(c.threshold or 0.0)
        worst = max(worst, value / bound if bound > 0 else 1.0 + value)
    return round(worst, 4)


# Outside the study, no second of the cell busier than this: nothing but the study itself can
# have made the instrument late (a brief burst elsewhere, below the cell's average bound, can).
QUIET_PEAK_CORES = 0.25
# ...and the study itself kept at least this share of the host's CPUs busy: only then can it have
# taken the instrument's CPU. vLLM's CPU build keeps 1.2-1.5 of 2 cores busy (0.6-0.77); the
# default study's simulated server 0.16-0.52 of 2 (0.08-0.26), and its late sends there mark a
# stall the guest cannot see, which slowed the server too (docs/contention.md): measured again.
SELF_STARVED_BUSY_SHARE = 0.5


def self_starved(summary: CellSummary) -> bool:
    """The instrument was late or short of CPU while the host, measured, was quiet outside the
    study, even in its busiest second, and the study's own processes kept most of it busy: they
    took the CPU (on the 2-core host, vLLM's three busy processes starved a load generator in the
    fair class: the CPU study's 8 req/s cells 0.35-1.1 s late in each of three attempts, others'
    busiest second 0.02 cores). Measuring again finds the same; the cell stands invalid. A burst
    from outside, or lateness on a host with CPU to spare, is measured again."""
    host = summary.host
    return (
        host is not None
        and host.measured
        and host.busy is False
        and host.others_cores_max is not None
        and host.others_cores_max < QUIET_PEAK_CORES
        and host.host_busy_cores is not None
        and bool(host.cpus)
        and host.host_busy_cores >= SELF_STARVED_BUSY_SHARE * (host.cpus or 0)
        and summary.validity.instrument_valid is False
    )


def remeasure_reason(summary: CellSummary) -> str | None:
    """Why this attempt is to be measured again, or None: only perturbations from outside the
    study qualify (a busy host, or an instrument late where the host was not measured)."""
    v = summary.validity
    if v.valid or self_starved(summary):
        return None
    failed = [c for c in v.checks if not c.passed]
    if not failed or not all(_perturbing(c.name) for c in failed):
        return None
    return "perturbed: " + "; ".join(v.reasons or [c.name for c in failed])


def stands_perturbed(files: CellFiles) -> str | None:
    """Why a sealed cell is to be measured again by the next run: it stands perturbed (every
    attempt failed the gate for a reason a quieter host may not repeat). None: keep it."""
    summary = read_summary(files)
    why = None if summary is None else remeasure_reason(summary)
    return None if why is None else f"stands {why} after every attempt; measured again"


@dataclass
class Attempt:
    """One measurement of a cell, in its own staging folder."""

    number: int
    staging: CellFiles
    summary: CellSummary
    failure: str | None
    set_aside: str | None = None  # why a new attempt was made after this one

    @property
    def valid(self) -> bool:
        return self.failure is None and self.summary.validity.valid

    def describe(self) -> AttemptNote:
        v, host = self.summary.validity, self.summary.host
        return AttemptNote(
            attempt=self.number,
            valid=self.valid,
            perturbation=v.perturbation,
            reasons=list(v.reasons) + ([self.failure] if self.failure else []),
            host_busy=v.host_busy,
            others_cpu_frac=host.others_cpu_frac if host is not None else None,
            measured_again_because=self.set_aside,
        )


def choose(attempts: list[Attempt]) -> Attempt:
    """The attempt that stands: a failed one when the server failed (the cell is redone on the
    next run), else the last valid one, else the least perturbed (the earlier one on a tie)."""
    failed = [a for a in attempts if a.failure is not None]
    if failed:
        return failed[-1]
    valid = [a for a in attempts if a.valid]
    if valid:
        return valid[-1]
    return min(attempts, key=lambda a: a.summary.validity.perturbation or math.inf)
