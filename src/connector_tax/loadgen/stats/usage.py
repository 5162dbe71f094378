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

from connector_tax.contract.summary import Check, ShapeRuleNote, Spread, TokenCounts, Usage
from connector_tax.loadgen.stats.request_file import RequestRecord
from connector_tax.loadgen.stats.sketch import DEFAULT_EXACT_CAP, Quantiles


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

    def describe(self) -> ShapeRuleNote:
        prompt = "exact" if not self.prompt_tolerance else f"within {self.prompt_tolerance:.0%} (at least 1 token)"
        return ShapeRuleNote(prompt, "exact (ignore_eos)" if self.exact_output else "at most requested")


def shape_rule(sends_text: bool, ignore_eos: bool, tolerance: float) -> ShapeRule:
    return ShapeRule(tolerance if sends_text else 0.0, ignore_eos)


def _spread(q: Quantiles) -> Spread:
    if not q.count:
        return Spread()
    return Spread(round(q.percentiles([50])[0], 1), round(q.min, 1), round(q.max, 1))


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

    def summary(self) -> tuple[Usage, list[Check]]:
        """The summary's `usage` and its checks (none for a count the server never reported)."""
        out = Usage(requests=self.requests, rule=self.rule.describe())
        checks = []
        unchecked = []
        for kind in ("prompt", "completion"):
            reported = self.server[kind].count
            server, asked = _spread(self.server[kind]), _spread(self.requested[kind])
            counts = TokenCounts(asked, server, reported, self.off[kind])
            if kind == "prompt":
                out.prompt_tokens = counts
            else:
                out.completion_tokens = counts
            if self.requests and not reported:
                unchecked.append(kind)
                continue
            if not reported:
                continue
            words = getattr(self.rule.describe(), kind)
            why = (
                f"{kind} tokens not the cell's: {self.off[kind]} of {reported} requests off "
                f"({words}; server counted {server.median:g} median, "
                f"{server.min:g}-{server.max:g}, for {asked.median:g} requested)"
            )
            checks.append(Check(f"{kind}_tokens_off", self.off[kind], 0, self.off[kind] == 0, why))
        out.status = "unchecked" if unchecked else ("checked" if self.requests else "no requests")
        if unchecked:
            out.unchecked = f"the server reported no {' and no '.join(unchecked)} token counts (usage)"
        return out, checks
