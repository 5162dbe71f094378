"""Time from `ctax sim` process start to its `ready` line and to a first served request.

    python benchmarks/sim_startup.py [--runs 10] [--variant mooncake_both]

Prints the median and max over the runs (the machine is shared and noisy: read the median).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import httpx


def one_run(connector: str) -> tuple[float, float]:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "connector_tax.cli", "sim", "--variant", connector, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        t_ready = time.monotonic() - t0
        url = line.split()[1]
        httpx.post(url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1}, timeout=10).raise_for_status()
        return t_ready, time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--variant", default="mooncake_both")
    args = parser.parse_args()
    ready, served = zip(*(one_run(args.variant) for _ in range(args.runs)))
    print(
        f"ctax sim start-up over {args.runs} runs: ready median {statistics.median(ready):.3f} s "
        f"(max {max(ready):.3f} s); first response median {statistics.median(served):.3f} s"
    )


if __name__ == "__main__":
    main()
