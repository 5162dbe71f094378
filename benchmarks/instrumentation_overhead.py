"""The step-timing instrumentation's own cost per engine step (patches/step_timing.py).

    python benchmarks/instrumentation_overhead.py [--steps 20000] [--repeat 7] [--json]

An engine step of fakes that do no work of their own is timed twice: plain, and with exactly the
wrappers a vLLM engine-core process gets (EngineCore.step_fn, Scheduler.schedule with the
prefill/decode split over every scheduled request, the scheduler connector's
build_connector_meta, the worker connector's start_load_kv and get_transfer_results), writing a
real JSONL record per step to a temporary file. The difference per step is the
instrumentation's cost; it is reported for several batch sizes (the split loops over the
batch). The design's budget is 1% of a typical step: a decode step of the study's model is
tens of milliseconds, so the budget is hundreds of microseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from patches import step_timing  # noqa: E402


class FakeRequest:
    __slots__ = ("num_prompt_tokens", "num_computed_tokens")

    def __init__(self, prompt: int, computed: int) -> None:
        self.num_prompt_tokens = prompt
        self.num_computed_tokens = computed


class FakeOutput:
    def __init__(self, scheduled: dict[str, int]) -> None:
        self.num_scheduled_tokens = scheduled
        self.total_num_scheduled_tokens = sum(scheduled.values())


class FakeScheduler:
    """A batch of `batch` running requests: one prefill chunk of 512 tokens, the rest decode."""

    def __init__(self, batch: int, connector: "FakeConnector") -> None:
        self.requests = {}
        scheduled = {}
        for i in range(batch):
            rid = f"req-{i}"
            if i == 0:
                self.requests[rid] = FakeRequest(4096, 1024 + 512)  # a 512-token prefill chunk
                scheduled[rid] = 512
            else:
                self.requests[rid] = FakeRequest(4096, 4096 + 10)  # decoding
                scheduled[rid] = 1
        self.output = FakeOutput(scheduled)
        self.running = list(self.requests)
        self.waiting: list[str] = []
        self.connector = connector

    def schedule(self, throttle_prefills: bool = False) -> FakeOutput:
        self.connector.build_connector_meta(self.output)
        return self.output

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting)


class FakeConnector:
    def build_connector_meta(self, scheduler_output: object) -> object:
        return object

    def start_load_kv(self, forward_context: object, **kwargs: object) -> None:
        return None

    def get_transfer_results(self, finished_req_ids: set[str]) -> tuple:
        return ()


class FakeEngine:
    def __init__(self, batch: int) -> None:
        self.scheduler = FakeScheduler(batch, FakeConnector())
        self.worker_connector = FakeConnector()
        self.step_fn = self.step
        self._finished: set[str] = set()

    def step(self) -> tuple[dict, bool]:
        out = self.scheduler.schedule(False)
        self.worker_connector.start_load_kv(None)
        self.worker_connector.get_transfer_results(self._finished)
        return {}, out.total_num_scheduled_tokens > 0


def time_steps(engine: FakeEngine, steps: int) -> float:
    step = engine.step_fn
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        step()
    return (time.perf_counter_ns() - t0) / 1000.0 / steps


def measure(batch: int, steps: int, repeat: int, folder: Path) -> dict[str, float]:
    plain = FakeEngine(batch)
    wrapped = FakeEngine(batch)
    rec = step_timing.StepRecorder(str(folder / f"bench_{batch}.jsonl"))
    step_timing.wrap_connector(wrapped.scheduler.connector, "scheduler", rec)
    step_timing.wrap_connector(wrapped.worker_connector, "worker", rec)
    step_timing.hook_engine_instance(wrapped, rec)
    time_steps(plain, steps // 10)  # warm-up
    time_steps(wrapped, steps // 10)
    plain_us, wrapped_us = [], []
    for _ in range(repeat):  # interleaved, so drift hits both alike
        plain_us.append(time_steps(plain, steps))
        wrapped_us.append(time_steps(wrapped, steps))
    for fd in rec.fds.values():
        step_timing.os.close(fd)
    records = (folder / f"bench_{batch}.engine.{rec.pid}.jsonl").read_text().splitlines()
    last = json.loads(records[-1])
    assert last["prefill_tokens"] == 512 and last["decode_tokens"] == batch - 1, last
    p, w = statistics.median(plain_us), statistics.median(wrapped_us)
    return {
        "batch": batch,
        "plain_us_per_step": round(p, 3),
        "instrumented_us_per_step": round(w, 3),
        "overhead_us_per_step": round(w - p, 3),
        "records_written": len(records),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000, help="steps per timing run")
    parser.add_argument("--repeat", type=int, default=7, help="timing runs per variant")
    parser.add_argument("--batches", default="1,64,256", help="running requests per step")
    parser.add_argument(
        "--step-ms", type=float, default=20.0, help="a typical real step, for the %% column"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(b, args.steps, args.repeat, Path(tmp)) for b in batches]
    for r in results:
        r["percent_of_typical_step"] = round(100 * r["overhead_us_per_step"] / (args.step_ms * 1000), 4)
    if args.json:
        print(json.dumps({"step_ms": args.step_ms, "results": results}, indent=2))
        return 0
    print(f"{'batch':>6} {'plain us':>10} {'instrumented us':>16} {'overhead us':>12} "
          f"{'% of ' + format(args.step_ms, 'g') + ' ms step':>16}")
    for r in results:
        print(f"{r['batch']:>6} {r['plain_us_per_step']:>10.2f} {r['instrumented_us_per_step']:>16.2f} "
              f"{r['overhead_us_per_step']:>12.2f} {r['percent_of_typical_step']:>16.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
