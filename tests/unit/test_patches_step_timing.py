"""The step-timing instrumentation (patches/) on fakes: records, availability, loading chain.

The fakes call the connector hooks in the orders vLLM's two model runners do (V1: the
KVConnectorModelRunnerMixin context; V2, 0.33's default on GPUs: ActiveKVConnector's
pre_forward / post_forward / finalize_step), checked against vLLM's source by
tests/unit/test_vllm_static.py.

The same code runs against vLLM's real Scheduler in tests/vllm_cpu/test_vllm_real_scheduler.py (when a
vLLM is importable) and is checked against vLLM's source in tests/unit/test_vllm_static.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from connector_tax.contract.records import ENGINE_STEP_FIELDS, STEP_FIELDS, WORKER_STEP_FIELDS, StepRecord
from connector_tax.contract.records import STEP_LOG_ENV as PACKAGE_STEP_LOG_ENV
from connector_tax.launch import steptiming
from connector_tax.launch.vllm import STEP_LOG_ENV as LAUNCH_STEP_LOG_ENV

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # patches/ is imported by dotted path from the repository root
    sys.path.insert(0, str(REPO))

from patches import engine_hooks, step_timing  # noqa: E402

# The package's step record (patches/ may not import it: these tests tie the two together).
STUDY_FIELDS = list(STEP_FIELDS)


# --------------------------------------------------------------------------- fakes


class FakeRequest:
    def __init__(self, prompt: int) -> None:
        self.num_prompt_tokens = prompt
        self.num_computed_tokens = 0


class FakeOutput:
    def __init__(self, scheduled: dict[str, int]) -> None:
        self.num_scheduled_tokens = scheduled
        self.total_num_scheduled_tokens = sum(scheduled.values())


class FakeScheduler:
    """Chunked prefill with a token budget, then one decode token per request per step."""

    def __init__(self, prompts: list[int], budget: int = 64, connector: object = None) -> None:
        self.requests = {f"r{i}": FakeRequest(p) for i, p in enumerate(prompts)}
        self.waiting = list(self.requests)
        self.running: list[str] = []
        self.budget = budget
        self.connector = connector
        self.calls = 0

    def schedule(self, throttle_prefills: bool = False) -> FakeOutput:
        self.calls += 1
        scheduled: dict[str, int] = {}
        budget = self.budget
        for rid in self.running + self.waiting:
            if budget <= 0:
                break
            req = self.requests[rid]
            need = max(1, req.num_prompt_tokens - req.num_computed_tokens)
            n = min(need, budget)
            scheduled[rid] = n
            budget -= n
            req.num_computed_tokens += n  # as vLLM's _update_after_schedule
            if rid in self.waiting:
                self.waiting.remove(rid)
                self.running.append(rid)
        out = FakeOutput(scheduled)
        if self.connector is not None:
            self.connector.build_connector_meta(out)
        return out

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting)


class FakeConnector:
    """A 'subclass override' of every hook, each with vLLM 0.33's parameters;
    get_transfer_results calls get_finished, as KVConnectorBase_V1's does."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def build_connector_meta(self, scheduler_output: object) -> object:
        self.calls.append("build_connector_meta")
        return object()

    def bind_connector_metadata(self, connector_metadata: object) -> None:
        self.calls.append("bind_connector_metadata")

    def start_load_kv(self, forward_context: object, **kwargs: object) -> None:
        self.calls.append("start_load_kv")

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.calls.append("wait_for_layer_load")

    def save_kv_layer(self, layer_name: str, kv_layer: object, attn_metadata: object, **kwargs: object) -> None:
        self.calls.append("save_kv_layer")

    def wait_for_save(self) -> None:
        self.calls.append("wait_for_save")

    def get_finished(self, finished_req_ids: set[str]) -> tuple[None, None]:
        self.calls.append("get_finished")
        return None, None

    def get_transfer_results(self, finished_req_ids: set[str]) -> str:
        self.calls.append("get_transfer_results")
        self.get_finished(finished_req_ids)
        return "results"

    def clear_connector_metadata(self) -> None:
        self.calls.append("clear_connector_metadata")


LAYERS = ("model.layers.0.attn", "model.layers.1.attn")


def v1_worker_step(conn: FakeConnector) -> None:
    """KVConnectorModelRunnerMixin._get_kv_connector_output around a forward (vLLM 0.33)."""
    conn.bind_connector_metadata(object())
    for layer in LAYERS:  # maybe_transfer_kv_layer around each attention layer
        conn.wait_for_layer_load(layer)
        conn.save_kv_layer(layer, None, None)
    conn.start_load_kv(None)  # async loads start after the forward
    conn.wait_for_save()
    conn.get_transfer_results(set())
    conn.clear_connector_metadata()


def v2_worker_step(conn: FakeConnector, defer_finalize: bool = False) -> None:
    """ActiveKVConnector (vLLM 0.33's V2 model runner): pre_forward, the forward,
    post_forward(defer_finalize), then finalize_step when deferred."""
    conn.bind_connector_metadata(object())  # pre_forward (after handle_preemptions)
    for layer in LAYERS:
        conn.wait_for_layer_load(layer)
        conn.save_kv_layer(layer, None, None)
    conn.start_load_kv(None, request_ids=["a"], num_tokens=4)  # post_forward, pending load
    if not defer_finalize:
        conn.wait_for_save()
    conn.get_transfer_results(set())
    if not defer_finalize:
        conn.clear_connector_metadata()
    else:  # finalize_step after the draft model
        conn.wait_for_save()
        conn.clear_connector_metadata()


class FakeEngine:
    def __init__(self, scheduler: FakeScheduler, worker: FakeConnector | None = None, runner=v1_worker_step) -> None:
        self.scheduler = scheduler
        self.worker = worker
        self.runner = runner
        self.step_fn = self.step

    def step(self) -> tuple[dict, bool]:
        out = self.scheduler.schedule(False)
        if self.worker is not None:
            self.runner(self.worker)
        return {}, out.total_num_scheduled_tokens > 0


def read_jsonl(path: Path) -> list[dict]:
    """The records as written, each checked to decode as the package's StepRecord."""
    lines = path.read_text().splitlines()
    for line in lines:
        msgspec.json.decode(line, type=StepRecord)
    return [json.loads(line) for line in lines]


# --------------------------------------------------------------------------- in-process


def test_env_var_is_defined_once_in_the_package_and_patches_copy_equals_it():
    from connector_tax.sim.steplog import STEP_LOG_ENV as SIM_STEP_LOG_ENV

    site = (REPO / "patches" / "site" / "sitecustomize.py").read_text()
    assert step_timing.STEP_LOG_ENV == PACKAGE_STEP_LOG_ENV  # patches' own copy
    assert SIM_STEP_LOG_ENV is PACKAGE_STEP_LOG_ENV and LAUNCH_STEP_LOG_ENV is PACKAGE_STEP_LOG_ENV
    assert f'"{PACKAGE_STEP_LOG_ENV}"' in site
    # and no module of the package spells it out again
    spelled = [p for p in (REPO / "src").rglob("*.py") if f'"{PACKAGE_STEP_LOG_ENV}"' in p.read_text()]
    assert spelled == [REPO / "src" / "connector_tax" / "contract" / "records.py"]


def test_required_instance_names_match_the_package_reader():
    assert step_timing.ENGINE_INSTANCES == steptiming.ENGINE_INSTANCES
    assert step_timing.SCHEDULER_CONNECTOR_INSTANCES == steptiming.SCHEDULER_CONNECTOR_INSTANCES
    assert step_timing.WORKER_CONNECTOR_INSTANCES == steptiming.WORKER_CONNECTOR_INSTANCES
    assert tuple(STUDY_FIELDS) == step_timing.RECORD_FIELDS


def test_the_instrumentations_record_fields_are_the_package_step_records():
    """patches/targets.py spells the step record's fields itself (it runs inside vLLM and may not
    import the package): each kind of record it writes is the contract's, field for field."""
    assert step_timing.RECORD_FIELDS == STEP_FIELDS
    assert step_timing.ENGINE_FIELDS == ENGINE_STEP_FIELDS
    assert step_timing.WORKER_FIELDS == WORKER_STEP_FIELDS
    assert set(ENGINE_STEP_FIELDS) | set(WORKER_STEP_FIELDS) <= set(StepRecord.__struct_fields__)


def instrumented(tmp_path: Path, prompts: list[int], connector: bool = True, runner=v1_worker_step):
    rec = step_timing.StepRecorder(str(tmp_path / "steps.jsonl"))
    sched_conn = FakeConnector() if connector else None
    worker_conn = FakeConnector() if connector else None
    scheduler = FakeScheduler(prompts, budget=64, connector=sched_conn)
    engine = FakeEngine(scheduler, worker_conn, runner)
    rec.engine_process = True  # as the EngineCore.__init__ wrapper sets it
    if connector:
        step_timing.wrap_connector(sched_conn, "scheduler", rec)
        step_timing.wrap_connector(worker_conn, "worker", rec)
    step_timing.hook_engine_instance(engine, rec)
    return rec, engine, sched_conn, worker_conn


def test_engine_steps_write_study_records(tmp_path):
    rec, engine, sched_conn, worker_conn = instrumented(tmp_path, [100, 30])
    for _ in range(5):
        engine.step_fn()
    path = tmp_path / f"steps.engine.{os.getpid()}.jsonl"
    records = read_jsonl(path)
    assert [r["step_id"] for r in records] == [1, 2, 3, 4, 5]
    for r in records:
        assert list(r) == list(step_timing.ENGINE_FIELDS)
        assert list(r)[: len(STUDY_FIELDS)] == STUDY_FIELDS
        assert r["source"] == "vllm" and r["role"] == "engine" and r["pid"] == os.getpid()
        # the study's step_duration_us is schedule() alone: inside the whole engine step
        assert 0 < r["step_duration_us"] < r["engine_step_us"]
        assert 0 < r["build_meta_us"] < r["step_duration_us"]  # build_connector_meta runs inside
        # the worker connector lives in this process (single-process executor): its hooks'
        # time during the step rides in the engine record too
        assert r["start_load_kv_us"] > 0 and r["get_finished_us"] > 0
    t = [r["t_ns"] for r in records]
    assert t == sorted(t) and all(isinstance(x, int) for x in t)
    # budget 64: step 1 = 64 prompt tokens of r0; step 2 = 36 of r0 + 28 of r1; step 3 = 2 of
    # r1 + r0's first decode token; then decode only
    assert [(r["prefill_tokens"], r["decode_tokens"]) for r in records] == [
        (64, 0),
        (64, 0),
        (2, 1),
        (0, 2),
        (0, 2),
    ]
    assert records[0]["num_running"] == 1 and records[0]["num_waiting"] == 1
    assert records[-1]["num_running"] == 2 and records[-1]["num_waiting"] == 0
    # the hooks still ran and returned what the connector returned
    assert worker_conn.calls.count("get_transfer_results") == 5
    assert sched_conn.calls.count("build_connector_meta") == 5
    # and one worker record per worker-connector step, in its own file
    workers = read_jsonl(tmp_path / f"steps.worker.{os.getpid()}.jsonl")
    check_worker_records(workers, 5)


def check_worker_records(records: list[dict], steps: int) -> None:
    assert [r["step_id"] for r in records] == list(range(1, steps + 1))
    for r in records:
        assert list(r) == list(step_timing.WORKER_FIELDS)
        assert r["role"] == "worker" and r["source"] == "vllm"
        assert r["step_duration_us"] is None and r["build_meta_us"] is None  # not a scheduler step
        assert r["wait_for_layer_load_calls"] == r["save_kv_layer_calls"] == len(LAYERS)
        hooks = (
            "start_load_kv_us",
            "wait_for_layer_load_us",
            "save_kv_layer_us",
            "wait_for_save_us",
            "get_finished_us",
        )
        assert all(r[h] > 0 for h in hooks), r
        assert sum(r[h] for h in hooks) < r["worker_step_us"]


@pytest.mark.parametrize("defer_finalize", [False, True])
def test_the_v2_model_runner_order_is_recorded_the_same(tmp_path, defer_finalize):
    def runner(conn):
        v2_worker_step(conn, defer_finalize)

    rec, engine, _, worker_conn = instrumented(tmp_path, [40], runner=runner)
    for _ in range(3):
        engine.step_fn()
    check_worker_records(read_jsonl(tmp_path / f"steps.worker.{os.getpid()}.jsonl"), 3)
    # get_finished was reached through get_transfer_results and timed once, not twice
    assert worker_conn.calls.count("get_finished") == 3


def test_get_finished_inside_get_transfer_results_is_timed_once(tmp_path, monkeypatch):
    # The hooks' clock is a fake that only get_finished moves, by exactly 2 ms: a wall-clock
    # sleep would be judged by how busy the host is, and this is about what is counted.
    from types import SimpleNamespace

    from patches import connector_hooks

    now = [0]
    monkeypatch.setattr(connector_hooks, "time", SimpleNamespace(monotonic_ns=lambda: now[0]))

    class Slow(FakeConnector):
        def get_finished(self, finished_req_ids):
            now[0] += 2_000_000
            return None, None

    rec = step_timing.StepRecorder(str(tmp_path / "steps.jsonl"))
    conn = Slow()
    step_timing.wrap_connector(conn, "worker", rec)
    conn.bind_connector_metadata(None)
    conn.get_transfer_results(set())
    conn.clear_connector_metadata()
    (record,) = read_jsonl(tmp_path / f"steps.worker.{os.getpid()}.jsonl")
    assert record["get_finished_us"] == 2000  # one 2 ms call, not two


def test_a_step_without_schedule_has_no_scheduler_fields(tmp_path):
    """EngineCore.step returns early when the scheduler has no requests, and a batch-queue
    step may only finish an older batch: no schedule() call, so no step_duration_us."""
    rec, engine, _, _ = instrumented(tmp_path, [10])
    engine.scheduler.schedule = engine.scheduler.schedule  # keep the wrapped one
    engine.step = lambda: ({}, False)
    engine.step_fn = engine_hooks.wrap_step_fn(engine.step, rec, engine.scheduler)
    engine.step_fn()
    (record,) = read_jsonl(tmp_path / f"steps.engine.{os.getpid()}.jsonl")
    assert record["step_duration_us"] is None and record["build_meta_us"] is None
    assert record["engine_step_us"] > 0
    assert record["prefill_tokens"] == record["decode_tokens"] == 0
    assert (record["num_running"], record["num_waiting"]) == (0, 1)


def test_num_waiting_counts_requests_holding_kv_as_vllm_metrics_does():
    class Old:  # a scheduler without get_request_counts
        running = ["a"]
        waiting = ["b", "c"]
        kv_holding_waiting = ["d"]

    assert step_timing.request_counts(Old()) == (1, 3)


def test_plain_vllm_has_null_connector_fields(tmp_path):
    rec, engine, _, _ = instrumented(tmp_path, [10], connector=False)
    engine.step_fn()
    (record,) = read_jsonl(tmp_path / f"steps.engine.{os.getpid()}.jsonl")
    assert record["build_meta_us"] is None
    assert record["get_finished_us"] is None and record["start_load_kv_us"] is None
    assert record["prefill_tokens"] == 10 and record["decode_tokens"] == 0


def test_availability_report_lists_every_wrap(tmp_path):
    rec, engine, _, _ = instrumented(tmp_path, [10])
    engine.step_fn()
    report = json.loads((tmp_path / f"steps.targets.{os.getpid()}.json").read_text())
    assert report["role"] == "engine"
    for key in (
        *step_timing.ENGINE_INSTANCES,
        *step_timing.SCHEDULER_CONNECTOR_INSTANCES,
        *step_timing.WORKER_CONNECTOR_INSTANCES,
    ):
        assert report["instances"][key].startswith("wrapped"), key
    ok, reason = steptiming.step_timing_status(tmp_path / "steps.jsonl", has_connector=True)
    assert ok, reason


def test_wrapping_is_idempotent(tmp_path):
    rec, engine, sched_conn, _ = instrumented(tmp_path, [10])
    step_timing.hook_engine_instance(engine, rec)
    step_timing.wrap_connector(sched_conn, "scheduler", rec)
    engine.step_fn()
    (record,) = read_jsonl(tmp_path / f"steps.engine.{os.getpid()}.jsonl")
    assert record["step_id"] == 1


def test_a_changed_hook_signature_is_not_wrapped_and_is_reported(tmp_path):
    class Changed:
        def build_connector_meta(self, scheduler_output, extra):  # not 0.33's signature
            return object()

    rec = step_timing.StepRecorder(str(tmp_path / "steps.jsonl"))
    conn = Changed()
    step_timing.wrap_connector(conn, "scheduler", rec)
    assert "build_connector_meta" not in vars(conn)
    assert rec.instances["connector.scheduler.build_connector_meta"].startswith("absent: signature")


def test_worker_only_process_writes_worker_records(tmp_path):
    rec = step_timing.StepRecorder(str(tmp_path / "steps.jsonl"))
    worker = FakeConnector()
    step_timing.wrap_connector(worker, "worker", rec)
    for _ in range(3):
        v1_worker_step(worker)
    check_worker_records(read_jsonl(tmp_path / f"steps.worker.{os.getpid()}.jsonl"), 3)
    assert not (tmp_path / f"steps.engine.{os.getpid()}.jsonl").exists()
    report = json.loads((tmp_path / f"steps.targets.{os.getpid()}.json").read_text())
    assert report["role"] == "worker"
    assert set(report["records"]) == {"worker"}


def test_hook_exceptions_propagate_unchanged_and_time_is_kept(tmp_path):
    class Failing(FakeConnector):
        def build_connector_meta(self, scheduler_output):
            raise KeyError("boom")

    rec = step_timing.StepRecorder(str(tmp_path / "steps.jsonl"))
    conn = Failing()
    step_timing.wrap_connector(conn, "scheduler", rec)
    with pytest.raises(KeyError):
        conn.build_connector_meta(None)
    assert rec.build_meta_us > 0


def test_class_hooks_on_fake_vllm_classes(tmp_path):
    rec = step_timing.StepRecorder(str(tmp_path / "steps.jsonl"))

    class KVConnectorFactory:
        @classmethod
        def create_connector(cls, config, role, kv_cache_config):
            return FakeConnector()

    class EngineCore:
        def __init__(self, scheduler):
            self.scheduler = scheduler
            self.step_fn = self.step

        def step(self):
            return self.scheduler.schedule(), True

        def step_with_batch_queue(self):
            return self.step()

    assert step_timing.hook_factory_class(KVConnectorFactory, rec)
    assert step_timing.hook_engine_core_class(EngineCore, rec)
    conn = KVConnectorFactory.create_connector(None, type("R", (), {"name": "SCHEDULER"}), None)
    assert vars(conn)["build_connector_meta"].__wrapped__ == conn.__class__.build_connector_meta.__get__(conn)
    engine = EngineCore(FakeScheduler([5], connector=conn))
    engine.step_fn()
    (record,) = read_jsonl(tmp_path / f"steps.engine.{os.getpid()}.jsonl")
    assert record["prefill_tokens"] == 5 and record["build_meta_us"] > 0
    assert rec.targets["vllm.v1.engine.core:EngineCore.__init__"] == "wrapped"


# --------------------------------------------------------------------------- loading chain

FAKE_VLLM = {
    "vllm/__init__.py": "__version__ = '0.0-fake'\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/core.py": """
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        class Out:
            def __init__(self, n):
                self.num_scheduled_tokens = {"a": n}
                self.total_num_scheduled_tokens = n

        class Req:
            num_prompt_tokens = 8
            num_computed_tokens = 0

        class Scheduler:
            def __init__(self):
                self.requests = {"a": Req()}
                self.running, self.waiting = ["a"], []
                self.connector = KVConnectorFactory.create_connector(None, "SCHEDULER", None)

            def schedule(self, throttle_prefills=False):
                self.requests["a"].num_computed_tokens += 4
                self.connector.build_connector_meta(None)
                return Out(4)

            def get_request_counts(self):
                return 1, 0

        class EngineCore:
            def __init__(self):
                self.worker = KVConnectorFactory.create_connector(None, "WORKER", None)
                self.scheduler = Scheduler()
                self.step_fn = self.step

            def step(self):
                self.scheduler.schedule()
                self.worker.bind_connector_metadata(None)
                self.worker.wait_for_layer_load("l0")
                self.worker.save_kv_layer("l0", None, None)
                self.worker.start_load_kv(None)
                self.worker.wait_for_save()
                self.worker.get_transfer_results(set())
                self.worker.clear_connector_metadata()
                return {}, True

            def step_with_batch_queue(self):
                return self.step()
    """,
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/kv_transfer/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/factory.py": """
        class Conn:
            def build_connector_meta(self, scheduler_output):
                return object()

            def bind_connector_metadata(self, connector_metadata):
                return None

            def start_load_kv(self, forward_context, **kwargs):
                return None

            def wait_for_layer_load(self, layer_name):
                return None

            def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
                return None

            def wait_for_save(self):
                return None

            def get_finished(self, finished_req_ids):
                return None, None

            def get_transfer_results(self, finished_req_ids):
                return self.get_finished(finished_req_ids)

            def clear_connector_metadata(self):
                return None

        class KVConnectorFactory:
            @classmethod
            def create_connector(cls, config, role, kv_cache_config):
                return Conn()
    """,
}


def make_fake_vllm(root: Path) -> Path:
    for rel, text in FAKE_VLLM.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def run_python(code: str, env_extra: dict[str, str], pythonpath: list[Path]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", STEP_LOG_ENV_NAME)}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    env.update(env_extra)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


STEP_LOG_ENV_NAME = step_timing.STEP_LOG_ENV


def test_sitecustomize_installs_the_hooks_into_a_fresh_process(tmp_path):
    fake = make_fake_vllm(tmp_path / "fake")
    log = tmp_path / "out" / "engine_step.jsonl"
    code = "import vllm.v1.engine.core as core\ne = core.EngineCore()\nfor _ in range(3): e.step_fn()\nprint('ok')\n"
    out = run_python(
        code,
        {STEP_LOG_ENV_NAME: str(log)},
        [REPO, REPO / "patches" / "site", fake],
    )
    assert out.strip() == "ok"
    files = steptiming.step_log_files(log)
    (engine_file,) = files["engine"]
    (worker_file,) = files["worker"]  # the same process: the single-process executor
    assert [r["wait_for_layer_load_calls"] for r in read_jsonl(worker_file)] == [1, 1, 1]
    records = read_jsonl(engine_file)
    assert [r["prefill_tokens"] for r in records] == [4, 4, 0]
    assert [r["decode_tokens"] for r in records] == [0, 0, 4]
    assert all(r["start_load_kv_us"] is not None for r in records)
    ok, reason = steptiming.step_timing_status(log, has_connector=True)
    assert ok, reason
    merged = steptiming.merge_step_log(log)
    assert [json.loads(x)["step_id"] for x in merged.read_text().splitlines()] == [1, 2, 3]


def test_without_the_step_log_variable_nothing_is_loaded(tmp_path):
    fake = make_fake_vllm(tmp_path / "fake")
    code = (
        "import sys, vllm.v1.engine.core as core\n"
        "print('patches.step_timing' in sys.modules, core.EngineCore.__init__.__name__)\n"
    )
    out = run_python(code, {}, [REPO, REPO / "patches" / "site", fake])
    assert out.split() == ["False", "__init__"]
    assert not any(tmp_path.rglob("*.targets.*.json"))


def test_the_shadowed_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.OTHER_SITE_RAN = True\n")
    code = "import builtins, sys\nprint(getattr(builtins, 'OTHER_SITE_RAN', False))\n"
    out = run_python(
        code,
        {STEP_LOG_ENV_NAME: str(tmp_path / "s.jsonl")},
        [REPO, REPO / "patches" / "site", other],
    )
    assert out.strip() == "True"


def test_a_broken_target_leaves_vllm_running_and_reports_unavailable(tmp_path):
    fake = make_fake_vllm(tmp_path / "fake")
    factory = fake / "vllm/distributed/kv_transfer/kv_connector/factory.py"
    factory.write_text(
        factory.read_text().replace(
            "def create_connector(cls, config, role, kv_cache_config)",
            "def create_connector(cls, config, role, kv_cache_config, extra=None)",
        )
    )
    log = tmp_path / "out" / "s.jsonl"
    code = "import vllm.v1.engine.core as core\ne = core.EngineCore()\ne.step_fn()\nprint('ok')\n"
    out = run_python(code, {STEP_LOG_ENV_NAME: str(log)}, [REPO, REPO / "patches" / "site", fake])
    assert out.strip() == "ok"
    ok, reason = steptiming.step_timing_status(log, has_connector=True)
    assert not ok
    # the scheduler's connector is still reached through scheduler.connector; the worker's
    # only through the factory
    assert "connector.worker.start_load_kv (never reached)" in reason
    (report,) = steptiming.read_targets(log)
    key = "vllm.distributed.kv_transfer.kv_connector.factory:KVConnectorFactory.create_connector"
    assert report["targets"][key].startswith("absent: signature changed")
    # plain vLLM needs only the engine wraps, which still worked
    assert steptiming.step_timing_status(log, has_connector=False)[0]


def test_status_without_any_report(tmp_path):
    ok, reason = steptiming.step_timing_status(tmp_path / "none.jsonl", has_connector=False)
    assert not ok and "no instrumentation report" in reason


def test_read_step_records_skips_a_truncated_line_and_slices_by_time(tmp_path):
    path = tmp_path / "s.engine.1.jsonl"
    lines = [json.dumps({"t_ns": t, "step_id": i + 1, "pid": 1}) for i, t in enumerate([10, 20, 30])]
    path.write_text("\n".join(lines) + '\n{"t_ns": 40, "step')
    records = steptiming.read_step_records(tmp_path / "s.jsonl")
    assert [r["t_ns"] for r in records] == [10, 20, 30]
    window = steptiming.read_step_records(tmp_path / "s.jsonl", t0_ns=15, t1_ns=30)
    assert [r["t_ns"] for r in window] == [20]
    out = steptiming.merge_step_log(tmp_path / "s.jsonl", tmp_path / "cell.jsonl", 15, 31)
    assert [json.loads(x)["t_ns"] for x in out.read_text().splitlines()] == [20, 30]


def test_an_instance_attribute_wrapping_a_bound_method_is_still_wrapped(tmp_path):
    """A connector may replace its own hooks per instance (NoOpConnector's counting mode does,
    with functools.wraps over the bound method): the signature check must see through it."""
    import functools

    conn = FakeConnector()
    bound = conn.build_connector_meta

    @functools.wraps(bound)
    def counted(*args, **kwargs):
        return bound(*args, **kwargs)

    conn.build_connector_meta = counted
    rec = step_timing.StepRecorder(str(tmp_path / "steps.jsonl"))
    step_timing.wrap_connector(conn, "scheduler", rec)
    assert rec.instances["connector.scheduler.build_connector_meta"].startswith("wrapped")
    conn.build_connector_meta(None)
    assert rec.build_meta_us > 0
