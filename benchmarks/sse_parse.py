"""Worker-loop cost of parsing a 64-token stream that arrives in one socket read.

    python benchmarks/sse_parse.py [--tokens 64] [--runs 3000]

The null server's response (vLLM's chunk format, usage chunk, [DONE]) goes through the
worker's HttpConnection and SSEReader three ways, side by side: as one read (one body entry,
the bulk path), and as one read per SSE event (the per-event path, what a slow stream costs
per token). Best of 5 timings; the loop cannot fire a due request while this runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _sse_null_server import Responses  # noqa: E402

from connector_tax.loadgen.http import HttpConnection, Response  # noqa: E402
from connector_tax.loadgen.sse import SSEReader  # noqa: E402


def best_us(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        best = min(best, (time.perf_counter() - t0) / runs)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3000)
    args = parser.parse_args()
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
    print(f"HTTP parse of the read (httptools, joined body): {best_us(http_read, args.runs):.1f} us")
    bulk, each = best_us(one_read, args.runs), best_us(per_event, args.runs)
    print(f"SSE, one read:            {bulk:.1f} us")
    print(f"SSE, one read per event:  {each:.1f} us  ({each / bulk:.1f}x)")


if __name__ == "__main__":
    main()
