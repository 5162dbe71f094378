"""The step-timing instrumentation's own cost per engine step (patches/): µs per step on fakes; with
`--real`, the A/B and A/A differences (% of a step, 95% CI) on vLLM's CPU build (goal < 1 %).

Backs: ../docs/performance.md#step-timing-instrumentation

    ctax benchmark instrumentation_overhead [--steps 20000] [--repeats 7] [--json FILE]
    ctax benchmark instrumentation_overhead --real [--rounds 8] [--requests 12] [--no-freeze] [--control] [--json FILE]

Fakes (default): an engine step of fakes that do no work of their own is timed twice: plain,
and with exactly the wrappers vLLM's processes get (EngineCore.step_fn, Scheduler.schedule with
the prefill/decode split over every scheduled request, the scheduler connector's
build_connector_meta, and one worker-connector step: bind, start_load_kv, wait_for_layer_load
and save_kv_layer on 2 layers, wait_for_save, get_transfer_results, clear), writing real JSONL
records to a temporary file. The difference per step is the instrumentation's cost, for several
batch sizes (the split loops over the batch).

Real (--real, benchmarks/_overhead_real.py): vLLM's CPU build serving the tiny dummy-weight
model (configs/vllm-cpu-tiny.yaml, noop_connector: every hook wrapped), three servers side by
side, one instrumented and two not, each seeded prompt sent to all three back to back in a
rotating order: the A/B difference and the A/A one (two identical launches) in one sitting.
The goal is < 1 % of a step (docs/study-design.md, "What is recorded").
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, comma_list, parser, positive_float, positive_int, write_json

sys.path.insert(0, str(REPO))  # patches/ is imported by dotted path from the repository root
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

    def __init__(self, batch: int, connector: FakeConnector) -> None:
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

    def bind_connector_metadata(self, connector_metadata: object) -> None:
        return None

    def start_load_kv(self, forward_context: object, **kwargs: object) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: object, attn_metadata: object, **kwargs: object) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def get_finished(self, finished_req_ids: set[str]) -> tuple:
        return None, None

    def get_transfer_results(self, finished_req_ids: set[str]) -> tuple:
        return self.get_finished(finished_req_ids)

    def clear_connector_metadata(self) -> None:
        return None


class FakeEngine:
    def __init__(self, batch: int) -> None:
        self.scheduler = FakeScheduler(batch, FakeConnector())
        self.worker_connector = FakeConnector()
        self.step_fn = self.step
        self._finished: set[str] = set()

    def step(self) -> tuple[dict, bool]:
        out = self.scheduler.schedule(False)
        w = self.worker_connector  # the V1 mixin's order around a 2-layer forward
        w.bind_connector_metadata(out)
        for layer in ("l0", "l1"):
            w.wait_for_layer_load(layer)
            w.save_kv_layer(layer, None, None)
        w.start_load_kv(None)
        w.wait_for_save()
        w.get_transfer_results(self._finished)
        w.clear_connector_metadata()
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
    rec.close()
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
    p = parser(__file__, __doc__, repeats=7, repeats_help="timing runs per variant, interleaved")
    p.add_argument("--steps", type=positive_int, default=20000, metavar="N", help="steps per timing run")
    p.add_argument(
        "--batches",
        type=comma_list(positive_int, "whole numbers of 1 or more"),
        default="1,64,256",
        help="running requests per step",
    )
    p.add_argument(
        "--step-ms", type=positive_float, default=20.0, metavar="MS", help="a typical real step, for the %% column"
    )
    p.add_argument("--real", action="store_true", help="on vLLM's CPU build (benchmarks/_overhead_real.py)")
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=8,
        help="--real: rounds of --requests prompts (each prompt: one request per server)",
    )
    p.add_argument("--requests", type=positive_int, default=12, help="--real: requests per round")
    p.add_argument("--output-len", type=positive_int, default=64, help="--real: tokens per request")
    p.add_argument(
        "--control",
        action="store_true",
        help="--real: no server instrumented (every difference is the set-up's own)",
    )
    p.add_argument(
        "--no-freeze",
        dest="freeze",
        action="store_false",
        help="--real: leave idle servers running while another serves (they then compete for its core)",
    )
    p.add_argument(
        "--launch-rotation",
        type=int,
        default=0,
        help="--real: launch order plain, plain2, instrumented rotated by this many places",
    )
    p.add_argument("--model-dir", default="results/models/tiny-llama", help="--real: tools/tiny_model.py folder")
    args = p.parse_args(argv)
    if args.real:
        from _overhead_real import run_real

        return run_real(args)
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(b, args.steps, args.repeats, Path(tmp)) for b in args.batches]
    for r in results:
        r["percent_of_typical_step"] = round(100 * r["overhead_us_per_step"] / (args.step_ms * 1000), 4)
    print(
        f"{'batch':>6} {'plain us':>10} {'instrumented us':>16} {'overhead us':>12} "
        f"{'% of ' + format(args.step_ms, 'g') + ' ms step':>16}"
    )
    for r in results:
        print(
            f"{r['batch']:>6} {r['plain_us_per_step']:>10.2f} {r['instrumented_us_per_step']:>16.2f} "
            f"{r['overhead_us_per_step']:>12.2f} {r['percent_of_typical_step']:>16.4f}"
        )
    write_json(args.json, {"step_ms": args.step_ms, "steps": args.steps, "repeats": args.repeats, "batches": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
