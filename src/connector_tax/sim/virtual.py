"""Run the engine model in virtual time: deterministic and far faster than real time.

Used by the tests of engine properties and to calibrate profiles; the server itself always
runs in real time (runner.py).
"""

from __future__ import annotations

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


def run_virtual(
    core: EngineCore,
    arrivals: list[tuple[float, SimRequest]],
    max_steps: int = 1_000_000,
) -> tuple[list[VirtualRecord], list[StepResult]]:
    """Feed requests at their arrival times (µs) and step until all are finished."""
    pending = sorted(arrivals, key=lambda a: a[0])
    records = {id(r): VirtualRecord(r, t) for t, r in pending}
    steps: list[StepResult] = []
    now = 0.0
    i = 0
    for _ in range(max_steps):
        while i < len(pending) and pending[i][0] <= now:
            core.add_request(pending[i][1])
            i += 1
        result = core.step()
        if result is None:
            if i >= len(pending):
                break
            now = pending[i][0]
            continue
        now += result.cost.duration_us
        steps.append(result)
        for out in result.outputs:
            rec = records[id(out.request)]
            if rec.first_token_us is None:
                rec.first_token_us = now
            rec.last_token_us = now
    return list(records.values()), steps
