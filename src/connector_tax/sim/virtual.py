"""Run the engine model in virtual time: deterministic and far faster than real time.

Used by the tests of engine properties, to calibrate profiles and by the truth oracle
(truth.py); the server itself always runs in real time (runner.py). Time advances by each
step's modelled duration; a request is added before the first step that starts at or after its
arrival, and its tokens are stamped at the end of the step that produced them (as the runner
publishes them), so TTFT = first token - arrival counts no HTTP or client time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from connector_tax.sim.engine import EngineCore, SimRequest, StepResult


@dataclass
class VirtualRecord:
    request: SimRequest
    arrival_us: float
    first_token_us: float | None = None
    last_token_us: float | None = None

    @property
    def ttft_us(self) -> float:
        assert self.first_token_us is not None
        return self.first_token_us - self.arrival_us

    @property
    def tpot_us(self) -> float:
        assert self.first_token_us is not None and self.last_token_us is not None
        n = len(self.request.output_token_ids)
        return (self.last_token_us - self.first_token_us) / max(n - 1, 1)


def drive(
    core: EngineCore,
    arrivals: Iterable[tuple[float, SimRequest]],
    on_step: Callable[[float, StepResult], None],
    max_steps: int = 1_000_000,
) -> float:
    """Feed requests at their arrival times (µs, non-decreasing) and step until all are
    finished; `on_step(end_us, result)` sees every step. Requests are pulled from `arrivals`
    only when due, so a long run holds only the requests in the engine. Returns the end time."""
    source = iter(arrivals)
    upcoming = next(source, None)
    now = 0.0
    for _ in range(max_steps):
        while upcoming is not None and upcoming[0] <= now:
            core.add_request(upcoming[1])
            upcoming = next(source, None)
        result = core.step()
        if result is None:
            if upcoming is None:
                return now
            now = max(now, upcoming[0])
            continue
        on_step(now + result.cost.duration_us, result)
        now += result.cost.period_us  # the step, then the engine loop's gap (0 in hand-set profiles)
    raise RuntimeError(f"virtual run did not finish within {max_steps} steps")


def run_virtual(
    core: EngineCore,
    arrivals: list[tuple[float, SimRequest]],
    max_steps: int = 1_000_000,
) -> tuple[list[VirtualRecord], list[StepResult]]:
    """Every request's record and every step of a small run (the tests' view)."""
    pending = sorted(arrivals, key=lambda a: a[0])
    records = {id(r): VirtualRecord(r, t) for t, r in pending}
    steps: list[StepResult] = []

    def on_step(now: float, result: StepResult) -> None:
        steps.append(result)
        for out in result.outputs:
            rec = records[id(out.request)]
            if rec.first_token_us is None:
                rec.first_token_us = now
            rec.last_token_us = now

    try:
        drive(core, pending, on_step, max_steps)
    except RuntimeError:
        pass  # the old contract: return what ran within max_steps
    return list(records.values()), steps
