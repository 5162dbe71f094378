"""SIMULATED: the 8-GPU host rehearsal (tests/rehearsal.py) as a measurement: the wall time (s)
`ctax plan --gpus N` predicts against the measured one (%), and the placement table (job, GPU,
CPUs, NUMA node).

Backs: ../docs/gpu-host.md#an-8-gpu-host-rehearsed-without-a-gpu
Backs: ../docs/performance.md#studies

The command `ctax plan --gpus N` prints, run through snakemake on the fake host; the placement
from each run.json; the plan's wall time beside the measured one over the phases (from the
command's start to the last phase job's end) and the whole command's, analysis included, which the
plan does not estimate.

    ctax benchmark gpu_rehearsal [--gpus N] [--no-crash] [--out DIR] [--launch-s S] [--json FILE]

--gpus: the free GPUs of the fake host (default 8, as the test; the plan gets `--gpus N`). Eight
phase jobs share this machine's two cores; with 2 the jobs have a core each, as on a GPU host,
so the plan's concurrency (N at once, in waves) is checked without the oversubscription.
--no-crash: no server killed mid-phase (the relaunch is a cost the plan cannot foresee).

--launch-s: the plan's start-up per launch (ctax plan --launch-s); by default it is timed here
first, eight stand-in launches at once, as the command starts them (tests/rehearsal.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _common import parser, write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from rehearsal import rehearse  # noqa: E402


def table(rows: list[dict]) -> str:
    lines = ["| job | GPU | CPUs | NUMA node (GPU / CPUs) | GPU waits (s) | restarts |", "|---|---|---|---|---|---|"]
    for r in rows:
        restarts = "; ".join(
            f"after {x['after'][:40]}…, GPU back in {x.get('gpu_released_after_s')} s" for x in r["restarts"] or []
        )
        lines.append(
            f"| {r['job']} | {r['gpu']} | {r['cpus']} | {r['numa_node']} / {r['cpus_numa_node']} "
            f"| {r['gpu_waits_s']} | {restarts or '—'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--out", type=Path, help="keep the rehearsal here (default: a temporary folder)")
    p.add_argument("--launch-s", type=float, help="the plan's start-up per launch, seconds (default: timed here)")
    p.add_argument("--gpus", type=int, default=8, choices=range(1, 9), metavar="N", help="free GPUs, 1-8 (default 8)")
    p.add_argument("--no-crash", action="store_true", help="kill no server mid-phase")
    args = p.parse_args(argv)
    folder = args.out or Path(tempfile.mkdtemp(prefix="ctax-rehearsal-"))
    folder.mkdir(parents=True, exist_ok=True)
    seen = rehearse(folder, launch_s=args.launch_s, gpus=args.gpus + 1, crash=not args.no_crash)
    predicted, phases, whole = seen["planned_wall_s"], seen["measured_phases_s"], seen["measured_all_s"]
    print(f"command: {seen['command']}")
    print(f"ctax plan --gpus {args.gpus} --launch-s {seen['launch_s']:.1f} ({args.gpus} stand-in launches at once)")
    print(table(seen["first"]))
    print(
        f"wall time: ctax plan predicted {predicted:.0f} s; measured {phases:.0f} s to the last phase job's end "
        f"({(predicted - phases) / phases:+.0%}), {whole:.0f} s for the whole command (analysis included); "
        f"the same command again, for the cell the crash cut short: {seen['rerun_s']:.0f} s"
    )
    write_json(args.json, {k: v for k, v in seen.items() if k not in ("host", "stdout", "stderr", "config")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
