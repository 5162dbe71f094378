"""What `ctax bench` (bench.py) shows: a live progress bar or line per cell, and one line per cell
and target once it ends. A helper of that command (its name begins with an underscore), not one."""

from __future__ import annotations

import sys
import threading
import time

from connector_tax.contract.summary import CellSummary
from connector_tax.loadgen.schedule.session import LoadGenerator, Progress


def report_progress(gen: LoadGenerator, label: str, done: threading.Event) -> None:
    """A live bar on a terminal; a plain line every 5 s otherwise. Several targets: each one's
    counts, the bar counting target 0's completions."""
    tty = sys.stderr.isatty()
    bar = None
    if tty:
        from tqdm import tqdm

        bar = tqdm(desc=label, unit="req", file=sys.stderr, leave=False)
    last_line = 0.0
    while not done.wait(0.25 if tty else 1.0):
        progresses = gen.progresses
        fields = [_progress_fields(p) for p in progresses]
        if bar is not None:
            bar.n = progresses[0].completed
            if len(fields) == 1:
                bar.set_postfix(fields[0], refresh=True)
            else:
                bar.set_postfix_str(" | ".join(_fields_text(f, t) for t, f in enumerate(fields)), refresh=True)
        elif time.monotonic() - last_line >= 5.0:
            last_line = time.monotonic()
            text = " | ".join(_fields_text(f, t if len(fields) > 1 else None) for t, f in enumerate(fields))
            print(f"[{label}] {text}", file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()


def _progress_fields(p: Progress) -> dict[str, object]:
    ttft = p.ttft_p50_ms()
    return dict(
        issued=p.issued,
        completed=p.completed,
        in_flight=p.in_flight,
        ttft_p50_ms=f"{ttft:.1f}" if ttft is not None else "-",
    )


def _fields_text(fields: dict[str, object], target: int | None) -> str:
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    return text if target is None else f"target{target} {text}"


def line(summary: CellSummary, target: str = "") -> str:
    ttft, tpot = summary.latency_ms.ttft, summary.latency_ms.tpot
    rates, counts, v = summary.rates, summary.counts, summary.validity

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    valid = "valid" if v.valid else "INVALID: " + "; ".join(v.reasons)
    return (
        f"{summary.cell}{target}: ok={counts.ok} err={counts.error} timeout={counts.timeout} "
        f"dropped={counts.dropped} achieved={fmt(rates.achieved_dispatch_rps)}/s "
        f"TTFT p50/p90/p99={fmt(ttft.p50)}/{fmt(ttft.p90)}/{fmt(ttft.p99)} ms "
        f"TPOT p50/p90={fmt(tpot.p50)}/{fmt(tpot.p90)} ms "
        f"lateness p99={fmt(summary.lateness_us.p99)} us server tokens in/out={_tokens(summary)} [{valid}]"
    )


def _tokens(summary: CellSummary) -> str:
    """The server's median prompt/completion counts, or why there are none."""
    usage = summary.usage
    if usage is None:
        return "-/-"
    if usage.status == "unchecked":
        return "unchecked (no usage)"
    medians = [usage.prompt_tokens.server.median, usage.completion_tokens.server.median]
    return "/".join("-" if m is None else f"{m:g}" for m in medians)
