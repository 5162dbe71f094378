"""Stream coalescing: can a cell's client-side TPOT and ITL be trusted?

vLLM streams one SSE chunk per engine step a request took part in. When its API server is starved
of CPU (two cores shared by the API server, the engine core, the worker and the load generator),
it falls behind and then sends a request's tokens in a burst: several tokens in one chunk
(vLLM merges the outputs it has not sent yet), or one chunk per token back to back. The client
then sees inter-token gaps near zero and a TPOT that says nothing about the engine: the tokens
cannot have been made faster than one engine step each. Two checks per cell, from its records:

* chunks per token: a request's content chunks over its completion tokens; below 1 the server
  merged tokens into chunks;
* bursts: a request whose client-side time per output token ((last - first token) / (tokens - 1))
  is below BURST_FRACTION of the cell's median engine step (`engine_step_us_p50`) received its
  tokens faster than the engine could have made them.

A cell whose share of coalesced or bursty requests is above UNTRUSTED_SHARE has
`client_tpot_trusted` false: its TPOT and ITL columns are the client's view of a starved API
server, not the engine's. The engine-step records stay the step evidence either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from connector_tax.analysis.jsonl import NULL_INT, read_columns

COLUMNS = ["chunks_per_token_p50", "coalesced_share", "burst_share", "client_tpot_trusted", "stream_note"]

BURST_FRACTION = 0.25  # client-side time per token below this share of the median engine step
UNTRUSTED_SHARE = 0.10  # more than this share of a cell's requests coalesced or bursty

_FIELDS = {
    "status": "str",
    "warmup": "bool",
    "chunks": "int",
    "completion_tokens": "int",
    "t_first_token_ns": "int",
    "t_last_token_ns": "int",
}


def stream_stats(cell: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The COLUMNS of one cell (its request records, and its row's `engine_step_us_p50`)."""
    out: dict[str, Any] = dict.fromkeys(COLUMNS)
    if not cell.has("requests"):
        return out
    r = read_columns(cell.path("requests"), _FIELDS)
    tokens, first, last = r["completion_tokens"], r["t_first_token_ns"], r["t_last_token_ns"]
    ok = (
        (r["status"] == "ok")
        & ~r["warmup"]
        & (tokens != NULL_INT)
        & (tokens > 1)
        & (first != NULL_INT)
        & (last != NULL_INT)
    )
    n = int(ok.sum())
    if n == 0:
        return out
    chunks = r["chunks"][ok].astype(np.float64)
    tok = tokens[ok].astype(np.float64)
    out["chunks_per_token_p50"] = float(np.median(chunks / tok))
    out["coalesced_share"] = float(np.mean(chunks < tok))
    step_us = row.get("engine_step_us_p50")
    notes = []
    if isinstance(step_us, (int, float)) and step_us > 0:
        per_token_us = (last[ok] - first[ok]) / 1e3 / (tok - 1)
        out["burst_share"] = float(np.mean(per_token_us < BURST_FRACTION * step_us))
        itl = row.get("itl_ms_p50")
        if isinstance(itl, (int, float)) and itl * 1e3 < BURST_FRACTION * step_us:
            notes.append(
                f"ITL p50 {itl * 1e3:.0f} µs is below {BURST_FRACTION:g}× the engine step p50 ({step_us:.0f} µs)"
            )
    else:
        notes.append("no engine-step records: only the chunk check applies")
    shares = [s for s in (out["coalesced_share"], out["burst_share"]) if s is not None]
    trusted = max(shares) <= UNTRUSTED_SHARE and not any(n.startswith("ITL") for n in notes)
    out["client_tpot_trusted"] = bool(trusted)
    if out["coalesced_share"] > UNTRUSTED_SHARE:
        notes.append(f"{out['coalesced_share']:.0%} of requests got several tokens in one chunk")
    if out["burst_share"] is not None and out["burst_share"] > UNTRUSTED_SHARE:
        notes.append(
            f"{out['burst_share']:.0%} of requests received their tokens faster than "
            f"{BURST_FRACTION:g}× the engine step ({step_us:.0f} µs): streamed in bursts"
        )
    out["stream_note"] = "; ".join(notes) or None
    return out


def untrusted_cells(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose client-side TPOT/ITL cannot be trusted, for the report."""
    return [r for r in rows if r.get("client_tpot_trusted") is False]


def render(rows: list[dict[str, Any]]) -> list[str]:
    """The report's section (Markdown lines): where client-side TPOT/ITL cannot be trusted."""
    judged = [r for r in rows if r.get("client_tpot_trusted") is not None]
    if not judged:
        return []
    bad = untrusted_cells(judged)
    out = [
        "## Stream coalescing: where client-side TPOT and ITL cannot be trusted",
        "",
        f"Per cell: content chunks per completion token (1 = one chunk per token) and the share of requests "
        f"whose tokens arrived faster than {BURST_FRACTION:g}× the cell's median engine step (a starved API "
        f"server sending a request's tokens in a burst). Above {UNTRUSTED_SHARE:.0%} of requests, the cell's "
        "client-side TPOT and ITL measure the API server's backlog, not the engine: read the engine-step records "
        f"(step, engine step) there instead. {len(judged) - len(bad)} of {len(judged)} cells trusted.",
        "",
    ]
    if bad:
        out += ["| variant | cell | chunks/token p50 | coalesced | bursts | why |", "|---|---|---|---|---|---|"]
        for r in bad:
            burst = "–" if r.get("burst_share") is None else f"{r['burst_share']:.0%}"
            out.append(
                f"| `{r['variant']}` | {r['phase']}/{r['cell']} | {r['chunks_per_token_p50']:.2f} | "
                f"{r['coalesced_share']:.0%} | {burst} | {(r.get('stream_note') or '').replace('|', '/')} |"
            )
        out.append("")
    return out
