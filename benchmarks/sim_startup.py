"""`ctax sim`'s start-up: seconds from process start to its `ready` line and to a first served request
(bar < 2 s).

Backs: ../docs/performance.md#analysis-figures-simulator

    ctax benchmark sim_startup [--repeats 10] [--variant mooncake_both] [--json FILE]

Prints the median and max over the repeats (the machine is shared and noisy: read the median).
"""

from __future__ import annotations

import statistics
import sys
import time

import httpx
from _common import SimServer, parser, write_json


def one_run(connector: str) -> tuple[float, float]:
    t0 = time.monotonic()
    with SimServer(["--variant", connector]) as sim:
        t_ready = time.monotonic() - t0
        httpx.post(
            sim.url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1}, timeout=10
        ).raise_for_status()
        return t_ready, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, repeats=10, repeats_help="start-ups, one after another")
    p.add_argument("--variant", default="mooncake_both", help="the simulated server's variant (default mooncake_both)")
    args = p.parse_args(argv)
    ready, served = zip(*(one_run(args.variant) for _ in range(args.repeats)))
    print(
        f"ctax sim start-up over {args.repeats} repeats: ready median {statistics.median(ready):.3f} s "
        f"(max {max(ready):.3f} s); first response median {statistics.median(served):.3f} s"
    )
    write_json(
        args.json,
        {
            "variant": args.variant,
            "ready_s": {"median": statistics.median(ready), "max": max(ready), "each": list(ready)},
            "first_response_s": {"median": statistics.median(served), "max": max(served), "each": list(served)},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
