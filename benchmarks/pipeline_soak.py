"""Soak through the pipeline: RSS growth (%) and the floor of open file descriptors of every process of
a 10-minute Phase A cell on the simulator (bars <= 10 %, no rise).

Backs: ../docs/performance.md#soaks

    ctax benchmark pipeline_soak [--seconds 600] [--rate 100] [--interval 15] [--keep DIR] [--json FILE]

Runs `snakemake phase_a` on a one-configuration study whose single Phase A cell lasts
--seconds at --rate req/s (16-token prompts, 16-token outputs, the tiny-fast profile), and
samples every --interval seconds the RSS and open file descriptors of every process of the run
(snakemake, the phase job, the simulated server, the load generator's workers, the watchdog),
found by walking the process table for the run's folder. It prints one line per sample and, at
the end, each process's growth from the first sample after the warm-up minute to the last:
the bar is RSS growth <= 10 % and no rise in the floor of open file descriptors. Exit status 1
when it is missed, or when the run's processes could not be sampled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml
from _common import REPO, parser, positive_float, write_json

BAR_RSS_GROWTH = 0.10


def study(seconds: float, rate: float) -> dict:
    return {
        "study": "soak",
        "backend": "sim",
        "seed": 1,
        "model": {"name": "Qwen/Qwen3-Coder-30B-A3B-Instruct"},
        "sim": {"hardware_profile": "tiny-fast"},
        "variants": [{"name": "plain"}],
        "workload": {
            "warmup_s": 5,
            "duration_s": seconds,
            "min_completed": 1,
            "request_timeout_s": 30,
            "phase_a": {"rates": [rate], "shape": {"input": 16, "output": 16}},
            "phase_b": {"inputs": [16], "outputs": [16]},
        },
    }


def role(proc: psutil.Process) -> str:
    cmd = " ".join(proc.cmdline())
    for marker, name in (
        ("snakemake", "snakemake"),
        ("pipeline phase", "phase job"),
        (" sim ", "sim server"),
        ("spawn_main", "loadgen worker"),
        ("resource_tracker", "mp tracker"),
        ("killpg", "watchdog"),
        ("latency_holder", "cpu-latency holder"),
    ):
        if marker in cmd:
            return name
    return cmd[:40]


def ours(folder: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if (proc.info["cwd"] or "").startswith(str(folder)) or any(
                str(folder) in a for a in proc.info["cmdline"] or []
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def sample(folder: Path) -> dict[str, tuple[float, int]]:
    """{role#pid: (RSS MiB, open fds)}"""
    out = {}
    for proc in ours(folder):
        try:
            out[f"{role(proc)}#{proc.pid}"] = (proc.memory_info().rss / 2**20, proc.num_fds())
        except psutil.Error:
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, seconds=600.0, seconds_help="the Phase A cell's length")
    p.add_argument("--rate", type=positive_float, default=100.0, help="req/s (default 100)")
    p.add_argument("--interval", type=positive_float, default=15.0, help="seconds between samples (default 15)")
    p.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temp dir)")
    args = p.parse_args(argv)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="ctax-soak-"))
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "soak.yaml"
    config.write_text(yaml.safe_dump(study(args.seconds, args.rate)))
    argv_ = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "workflow" / "Snakefile"),
        "--cores",
        "1",
        "phase_a",
        "--configfile",
        str(config),
        "--directory",
        str(folder),
    ]
    print(f"soak: {args.rate:g} req/s for {args.seconds:g} s through `snakemake phase_a` in {folder}")
    run = subprocess.Popen(
        argv_, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    samples: list[tuple[float, dict[str, tuple[float, int]]]] = []
    t0 = time.monotonic()
    try:
        while run.poll() is None:
            time.sleep(args.interval)
            now = sample(folder)
            samples.append((time.monotonic() - t0, now))
            line = "  ".join(f"{k}: {rss:.0f} MiB/{fds} fds" for k, (rss, fds) in sorted(now.items()))
            print(f"t={samples[-1][0]:6.0f} s  {line}", flush=True)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, 15)
        run.wait()
    print(f"snakemake exited {run.returncode} after {time.monotonic() - t0:.0f} s")
    steady = [s for s in samples if s[0] >= 60.0] or samples
    ok = run.returncode == 0
    # Per process: its first steady sample against the last one it was seen in (the run's own end
    # leaves an empty last sample). Open fds swing with the connections in flight, so a leak is
    # a rising floor: the fewest fds in the second half of its samples against the first half.
    seen: dict[str, list[tuple[float, int]]] = {}
    for _, snapshot in steady:
        for key, value in snapshot.items():
            seen.setdefault(key, []).append(value)
    watched = {k: v for k, v in seen.items() if len(v) >= 4}
    if not any(k.startswith(("loadgen worker", "sim server", "phase job")) for k in watched):
        print(
            "FAIL: the run's processes were not sampled long enough to judge (shorter than 4 intervals past the first minute)"
        )
        write_json(args.json, {"snakemake_exit": run.returncode, "passed": False, "processes": {}})
        return 1
    print("process                     RSS first -> last (growth)     fds floor 1st half -> 2nd half")
    rows = {}
    for key in sorted(watched):
        values = watched[key]
        r0, r1 = values[0][0], values[-1][0]
        half = len(values) // 2
        f0, f1 = min(f for _, f in values[:half]), min(f for _, f in values[half:])
        growth = (r1 - r0) / r0 if r0 else 0.0
        passed = growth <= BAR_RSS_GROWTH and f1 <= f0
        ok &= passed
        rows[key] = {"rss_mib": [round(r0, 1), round(r1, 1)], "rss_growth": round(growth, 4), "fds_floor": [f0, f1]}
        print(
            f"{key:26}  {r0:7.1f} -> {r1:7.1f} MiB ({growth:+.1%})   {f0:4d} -> {f1:4d}   {'ok' if passed else 'FAIL'}"
        )
    print("PASS" if ok else "FAIL")
    write_json(
        args.json,
        {
            "rate": args.rate,
            "seconds": args.seconds,
            "snakemake_exit": run.returncode,
            "bar_rss_growth": BAR_RSS_GROWTH,
            "passed": ok,
            "processes": rows,
        },
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
