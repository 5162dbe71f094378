"""Prefill admission order for waiting requests: FIFO, or packing under the token budget.

As in the admission A/B (docs/admission-ab.md): `pack` looks at a window of the waiting queue
and greedily picks the cheapest prompts that fit the remaining budget, so short prompts are not stuck behind a long
one (head-of-line blocking); `force_fifo_every` makes every N-th round FIFO so that a long
prompt is never skipped forever. Selected requests keep their arrival order; what follows
them in the returned order may still take a prefill chunk of the budget left over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Literal, TypeVar

T = TypeVar("T")
AdmissionPolicy = Literal["fifo", "pack"]


@dataclass(frozen=True)
class AdmissionSettings:
    policy: AdmissionPolicy = "fifo"
    lookahead: int = 64
    force_fifo_every: int = 0


def admission_order(
    waiting: Iterable[T],
    cost: Callable[[T], int],
    budget: int,
    settings: AdmissionSettings,
    round_index: int,
) -> list[T]:
    """The order in which the scheduler should try to admit waiting requests this round."""
    force_fifo = settings.force_fifo_every > 0 and round_index % settings.force_fifo_every == 0
    if settings.policy == "fifo" or force_fifo:
        return list(waiting)
    queue = iter(waiting)
    window = list(islice(queue, settings.lookahead))
    if not window:
        return []
    costs = [cost(r) for r in window]
    selected = [False] * len(window)
    used = 0
    for i in sorted(range(len(window)), key=lambda i: (costs[i], i)):
        if used + costs[i] <= budget:
            selected[i] = True
            used += costs[i]
    if not any(selected):
        selected[0] = True
    first = [r for r, s in zip(window, selected) if s]
    rest = [r for r, s in zip(window, selected) if not s]
    return first + rest + list(queue)
