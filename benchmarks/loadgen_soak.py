"""ctax's memory in a long cell: RSS growth (%) of its processes over 10 minutes at 1,000 req/s Poisson
against the benchmark server (bar <= 10 %).

Backs: ../docs/performance.md#soaks

The RSS of the load generator's processes is sampled every 5 s; its growth after the first
minute is printed.

    ctax benchmark loadgen_soak [--seconds 600] [--json /tmp/loadgen_soak.json]

The bar: RSS growth <= 10 % over the soak. The cell's own summary says how big its
bounded summary state ended (`summary_state_bytes`) and whether it kept up (`counts`, validity).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
from _common import BenchServer, ctax_bench, load_args, parser, reap_children_on_exit, spawn, write_json
from _peer_clients import MODEL, TOKENS


def soak(ctx: SimpleNamespace, seconds: float) -> dict[str, Any]:
    """ctax at 1,000 req/s for `seconds`: RSS of its processes every 5 s; growth after the first minute."""
    out = ctx.tmp / "soak"
    cmd = ctax_bench(ctx.server.url, MODEL, out, "soak", *load_args(1000, "poisson", 16, TOKENS, seconds, 5))
    proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()
    while proc.poll() is None:
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            rss = sum(p.memory_info().rss for p in tree) / 2**20
            samples.append((time.monotonic() - t0, rss))
            if len(samples) % 12 == 1:
                print(f"  soak t={samples[-1][0]:5.0f} s  RSS {rss:7.1f} MiB", flush=True)
        except psutil.Error:
            pass
        time.sleep(5)
    output = proc.communicate()[0]
    base = next((r for t, r in samples if t >= 60), samples[0][1] if samples else 0.0)
    end = samples[-2][1] if len(samples) > 1 else base  # the last live sample before exit
    peak = max((r for t, r in samples if t >= 60), default=base)
    summary = json.loads(next(out.glob("summary_*.json")).read_text()) if list(out.glob("summary_*.json")) else {}
    res = {
        "seconds": seconds,
        "rss_mib_at_60s": round(base, 1),
        "rss_mib_end": round(end, 1),
        "rss_mib_peak_after_60s": round(peak, 1),
        "growth_pct": round(100 * (end - base) / base, 2) if base else None,
        "peak_growth_pct": round(100 * (peak - base) / base, 2) if base else None,
        "counts": summary.get("counts"),
        "summary_state_bytes": summary.get("summary_state_bytes"),
        "lateness_us": summary.get("lateness_us"),
        "valid": summary.get("validity", {}).get("valid"),
        "output_tail": output.strip()[-400:],
    }
    print(
        f"soak: RSS {res['rss_mib_at_60s']} MiB at 60 s -> {res['rss_mib_end']} MiB at the end "
        f"(growth {res['growth_pct']} %, peak {res['rss_mib_peak_after_60s']} MiB = +{res['peak_growth_pct']} %, bar <= 10 %); "
        f"counts {res['counts']}",
        flush=True,
    )
    return res


def main(argv: list[str] | None = None) -> int:
    p = parser(
        __file__, __doc__, json_default="/tmp/loadgen_soak.json", seconds=600.0, seconds_help="the soak's length"
    )
    a = p.parse_args(argv)
    reap_children_on_exit()
    with tempfile.TemporaryDirectory(prefix="loadgen-soak-") as tmp:
        ctx = SimpleNamespace(args=a, tmp=Path(tmp))
        ctx.server = BenchServer(Path(tmp) / "server.jsonl", [0])
        try:
            report = soak(ctx, a.seconds)
        finally:
            ctx.server.close()
    write_json(a.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
