"""Is a cell the shape it claims? The server's own token counts (`usage`) of every measured request,
against what the request asked for.

A cell says its shape (256 prompt tokens, 32 out); what the server processed is what it counted.
Token-id prompts must come out exactly; text and chat prompts (sized by the server's tokenizer
before the cell: sizing.py) within `validity.max_prompt_token_error` of the requested length (at
least one token); with `ignore_eos` the output exactly, else at most, what was asked. A request
off by more is counted, and a cell with any is invalid with the reason in words. A server that
reports no usage leaves the cell `unchecked`, said in the summary and in `ctax bench`'s line, never
silently passed. Streamed, in bounded memory (a `Quantiles` per count), like the rest of the summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connector_tax.loadgen.records import RequestRecord
from connector_tax.loadgen.sketch import DEFAULT_EXACT_CAP, Quantiles


@dataclass(frozen=True)
class ShapeRule:
    """How close the server's counts must be: `prompt_tolerance` 0 is exact (token ids), else a
    fraction of the requested length (text, chat); `exact_output` with ignore_eos."""

    prompt_tolerance: float = 0.0
    exact_output: bool = True

    def prompt_ok(self, counted: int, requested: int) -> bool:
        if not self.prompt_tolerance:
            return counted == requested
        return abs(counted - requested) <= max(1.0, self.prompt_tolerance * requested)

    def output_ok(self, counted: int, requested: int) -> bool:
        return counted == requested if self.exact_output else counted <= requested

    def describe(self) -> dict[str, str]:
        prompt = "exact" if not self.prompt_tolerance else f"within {self.prompt_tolerance:.0%} (at least 1 token)"
        return {"prompt": prompt, "completion": "exact (ignore_eos)" if self.exact_output else "at most requested"}


def shape_rule(sends_text: bool, ignore_eos: bool, tolerance: float) -> ShapeRule:
    return ShapeRule(tolerance if sends_text else 0.0, ignore_eos)


def _spread(q: Quantiles) -> dict[str, float | None]:
    if not q.count:
        return {"median": None, "min": None, "max": None}
    return {"median": round(q.percentiles([50])[0], 1), "min": round(q.min, 1), "max": round(q.max, 1)}


class UsageTally:
    """The measured (post-warm-up, ok) requests' counts, requested and server-reported."""

    def __init__(self, rule: ShapeRule, exact_cap: int = DEFAULT_EXACT_CAP) -> None:
        self.rule = rule
        self.requests = 0
        self.requested = {"prompt": Quantiles(exact_cap), "completion": Quantiles(exact_cap)}
        self.server = {"prompt": Quantiles(exact_cap), "completion": Quantiles(exact_cap)}
        self.off = {"prompt": 0, "completion": 0}

    def quantiles(self) -> list[Quantiles]:
        return [*self.requested.values(), *self.server.values()]

    def add(self, r: RequestRecord) -> None:
        self.requests += 1
        self.requested["prompt"].add(r.input_len)
        self.requested["completion"].add(r.output_len)
        if r.usage_prompt_tokens is not None:
            self.server["prompt"].add(r.usage_prompt_tokens)
            self.off["prompt"] += not self.rule.prompt_ok(r.usage_prompt_tokens, r.input_len)
        if r.usage_completion_tokens is not None:
            self.server["completion"].add(r.usage_completion_tokens)
            self.off["completion"] += not self.rule.output_ok(r.usage_completion_tokens, r.output_len)

    def summary(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The summary's `usage` and its checks (none for a count the server never reported)."""
        out: dict[str, Any] = {"requests": self.requests, "rule": self.rule.describe()}
        checks = []
        unchecked = []
        for kind in ("prompt", "completion"):
            reported = self.server[kind].count
            out[f"{kind}_tokens"] = {
                "requested": _spread(self.requested[kind]),
                "server": _spread(self.server[kind]),
                "reported": reported,
                "off": self.off[kind],
            }
            if self.requests and not reported:
                unchecked.append(kind)
                continue
            if not reported:
                continue
            server, asked = _spread(self.server[kind]), _spread(self.requested[kind])
            why = (
                f"{kind} tokens not the cell's: {self.off[kind]} of {reported} requests off "
                f"({self.rule.describe()[kind]}; server counted {server['median']:g} median, "
                f"{server['min']:g}-{server['max']:g}, for {asked['median']:g} requested)"
            )
            checks.append(
                {
                    "name": f"{kind}_tokens_off",
                    "value": self.off[kind],
                    "threshold": 0,
                    "passed": self.off[kind] == 0,
                    "why": why,
                }
            )
        out["status"] = "unchecked" if unchecked else ("checked" if self.requests else "no requests")
        if unchecked:
            out["unchecked"] = f"the server reported no {' and no '.join(unchecked)} token counts (usage)"
        return out, checks
