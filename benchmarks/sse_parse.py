"""The worker loop's cost of parsing a 64-token stream (µs): the HTTP parse of one read, and its SSE
events, each payload decoded as JSON, arriving in one read and one read per event.

Backs: ../docs/performance.md#the-load-generators-parts-alone
Backs: ../docs/loadgen.md#the-measurements-behind-its-decisions

    ctax benchmark sse_parse [--tokens 64] [--runs 3000] [--json FILE]

The null server's response (vLLM's chunk format, usage chunk, [DONE]) goes through the
worker's HttpConnection and SSEReader three ways, side by side: as one read (one body entry,
the bulk path), and as one read per SSE event (the per-event path, what a slow stream costs
per token). Best of 5 timings; the loop cannot fire a due request while this runs.
"""

from __future__ import annotations

import sys
import time

from _common import parser, positive_int, write_json
from _sse_null_server import Responses

from connector_tax.loadgen.worker.http import HttpConnection, Response
from connector_tax.loadgen.worker.sse import SSEReader


def best_us(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        best = min(best, (time.perf_counter() - t0) / runs)
    return best * 1e6


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--tokens", type=positive_int, default=64, metavar="N", help="tokens per stream (default 64)")
    p.add_argument(
        "--runs",
        type=positive_int,
        default=3000,
        metavar="N",
        help="parses per timing; best of 5 timings (default 3000)",
    )
    args = p.parse_args(argv)
    wire, _ = Responses("m").completion(
        False, {"max_tokens": args.tokens, "stream": True, "stream_options": {"include_usage": True}}
    )
    conn = HttpConnection(lambda c: None)
    conn.response = Response()
    conn.data_received(wire)
    body = conn.response.chunks[0][1]
    events = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]

    def http_read() -> None:
        conn.response = Response()
        conn.data_received(wire)

    def one_read() -> None:
        reader = SSEReader()
        reader.feed(1, body)
        reader.finish()

    def per_event() -> None:
        reader = SSEReader()
        for k, event in enumerate(events):
            reader.feed(k, event)
        reader.finish()

    print(f"{len(events)} SSE events, {len(body)} bytes")
    http = best_us(http_read, args.runs)
    print(f"HTTP parse of the read (httptools, joined body): {http:.1f} us")
    bulk, each = best_us(one_read, args.runs), best_us(per_event, args.runs)
    print(f"SSE, one read:            {bulk:.1f} us")
    print(f"SSE, one read per event:  {each:.1f} us  ({each / bulk:.1f}x)")
    write_json(
        args.json,
        {
            "events": len(events),
            "bytes": len(body),
            "runs_per_timing": args.runs,
            "best_of": 5,
            "us": {"http_parse": http, "sse_one_read": bulk, "sse_one_read_per_event": each},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
