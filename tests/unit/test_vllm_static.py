"""The vLLM backend checked against vLLM 0.33.0's own source, without importing vLLM.

The source comes from the released wheel: $CONNECTOR_TAX_VLLM_SRC (a folder holding `vllm/`),
else ~/.cache/connector-tax/vllm-0.33.0, which the first run fills with `pip download --no-deps
vllm==0.33.0` into a temporary folder and extracts only vllm/**/*.py from (nothing is written
into the repository). Skipped, with the reason, only when the package registry is unreachable.

Checked with `ast`:
* tools/noop_connector.py implements every abstract method of KVConnectorBase_V1 and
  SupportsHMA with vLLM's parameters, the 3-argument constructor, a non-None metadata;
* every instrumentation target of patches/step_timing.py exists with the expected parameters,
  and the call sites and attributes the instrumentation relies on are where it expects them;
* every --kv-transfer-config the 8 study configurations produce uses only KVTransferConfig's
  fields and connector names registered in KVConnectorFactory (or a module path that
  resolves to a class in this repository), a kv_role on every connector and child, no
  engine_id in children, and extra-config keys the connector reads;
* every `vllm serve` flag the launches use is defined by vLLM's argument parser (EngineArgs'
  literal add_argument calls, the serve parser's, and FrontendArgs' dataclass fields), and
  each `--no-X` is a boolean field's BooleanOptionalAction;
* the environment variables the launches set exist in vllm/envs.py.
"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from functools import cache
from pathlib import Path

import pytest
from typed import study_of, typed

from connector_tax.config import load_config
from connector_tax.launch import vllm as launch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from patches import step_timing  # noqa: E402

VLLM_VERSION = "0.33.0"
CONFIGS = [REPO / "configs" / "h20-qwen3-coder.yaml", REPO / "configs" / "default.yaml"]


# --------------------------------------------------------------------------- the source


def _has_source(root: Path) -> bool:
    version = root / "vllm" / "_version.py"
    return version.is_file() and f"'{VLLM_VERSION}'" in version.read_text()


def _extract(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.startswith("vllm/") and member.endswith(".py"):
                zf.extract(member, dest)


@pytest.fixture(scope="session")
def vllm_src() -> Path:
    """A folder that holds vLLM 0.33.0's `vllm/` Python source."""
    env = os.environ.get("CONNECTOR_TAX_VLLM_SRC")
    if env:
        root = Path(env)
        if root.name == "vllm" and not (root / "vllm").is_dir():
            root = root.parent
        if not _has_source(root):
            pytest.fail(f"CONNECTOR_TAX_VLLM_SRC={env} holds no vllm {VLLM_VERSION} source")
        return root
    cache_dir = Path.home() / ".cache" / "connector-tax" / f"vllm-{VLLM_VERSION}"
    if _has_source(cache_dir):
        return cache_dir
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    # One filler at a time: under `pytest -n 2` both processes find the cache empty, and a second
    # filler replacing the tree while the first one's tests read it made them fail.
    with open(cache_dir.parent / f".vllm-{VLLM_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _has_source(cache_dir):
            _fill(cache_dir)
    assert _has_source(cache_dir)
    return cache_dir


def _fill(cache_dir: Path) -> None:
    with tempfile.TemporaryDirectory(dir=cache_dir.parent) as tmp:
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp, f"vllm=={VLLM_VERSION}"],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        wheels = sorted(Path(tmp).glob("vllm-*.whl"))
        if download.returncode != 0 or not wheels:
            tail = (download.stderr or download.stdout).strip().splitlines()[-1:]
            pytest.skip(
                f"vllm=={VLLM_VERSION} source unavailable: the package registry is unreachable "
                f"({' '.join(tail) or 'no wheel'}); set CONNECTOR_TAX_VLLM_SRC to an extraction"
            )
        staging = Path(tmp) / "src"
        _extract(wheels[0], staging)
        if cache_dir.exists():
            shutil.rmtree(cache_dir)
        staging.rename(cache_dir)  # same filesystem: atomic, a half extraction is never seen


# --------------------------------------------------------------------------- ast helpers


@cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def module_file(src: Path, module: str) -> Path:
    base = src.joinpath(*module.split("."))
    path = base.with_suffix(".py")
    return path if path.is_file() else base / "__init__.py"


def find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found")


def methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def params(fn: ast.FunctionDef) -> tuple[str, ...]:
    """Parameter names in signature order, `*args` and `**kwargs` spelled as TARGETS does."""
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return tuple(names)


def is_abstract(fn: ast.FunctionDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "abstractmethod")
        or (isinstance(d, ast.Attribute) and d.attr == "abstractmethod")
        for d in fn.decorator_list
    )


def self_assignments(fn: ast.FunctionDef) -> set[str]:
    out = set()
    for node in ast.walk(fn):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                out.add(t.attr)
    return out


def called_attributes(tree: ast.AST) -> set[str]:
    return {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}


def class_fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def base_file(src: Path) -> Path:
    return module_file(src, "vllm.distributed.kv_transfer.kv_connector.v1.base")


# --------------------------------------------------------------------------- NoOpConnector

NOOP = REPO / "tools" / "noop_connector.py"


def test_source_is_the_targeted_release(vllm_src):
    assert _has_source(vllm_src)


def test_noop_connector_implements_every_abstract_method(vllm_src):
    base_tree = _parse(base_file(vllm_src))
    noop_cls = find_class(_parse(NOOP), "NoOpConnector")
    noop_methods = methods(noop_cls)
    required = {}
    for cls_name in ("KVConnectorBase_V1", "SupportsHMA"):
        for name, fn in methods(find_class(base_tree, cls_name)).items():
            if is_abstract(fn):
                required[name] = fn
    assert {"start_load_kv", "build_connector_meta", "request_finished_all_groups"} <= set(required)
    for name, fn in required.items():
        assert name in noop_methods, f"NoOpConnector lacks abstract {name}"
        assert params(noop_methods[name]) == params(fn), name


def test_noop_connector_overrides_keep_vllms_signatures(vllm_src):
    base = methods(find_class(_parse(base_file(vllm_src)), "KVConnectorBase_V1"))
    hma = methods(find_class(_parse(base_file(vllm_src)), "SupportsHMA"))
    for name, fn in methods(find_class(_parse(NOOP), "NoOpConnector")).items():
        theirs = base.get(name) or hma.get(name)
        assert theirs is not None, f"NoOpConnector.{name} overrides nothing in vLLM"
        assert params(fn) == params(theirs), name
    init = methods(find_class(_parse(NOOP), "NoOpConnector"))["__init__"]
    # vLLM 0.33 refuses connectors whose constructor lacks kv_cache_config (factory.py)
    assert params(init) == ("self", "vllm_config", "role", "kv_cache_config")
    assert params(init) == params(base["__init__"])


def test_noop_connector_bases_imports_and_returns(vllm_src):
    tree = _parse(NOOP)
    cls = find_class(tree, "NoOpConnector")
    assert [b.id for b in cls.bases if isinstance(b, ast.Name)] == ["KVConnectorBase_V1", "SupportsHMA"]
    base_names = {n.name for n in _parse(base_file(vllm_src)).body if isinstance(n, ast.ClassDef)}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm"):
            assert module_file(vllm_src, node.module).is_file(), node.module
            if node.module.endswith("kv_connector.v1.base"):
                assert {a.name for a in node.names} <= base_names
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            assert not (mod or "").startswith("connector_tax"), "tools/ must not import the package"
    meta = methods(cls)["build_connector_meta"]
    (ret,) = [n for n in ast.walk(meta) if isinstance(n, ast.Return)]
    assert isinstance(ret.value, ast.Call), "build_connector_meta must return a fresh object"
    metadata_cls = find_class(tree, ret.value.func.id)
    assert [b.id for b in metadata_cls.bases] == ["KVConnectorMetadata"]
    matched = methods(cls)["get_num_new_matched_tokens"]
    (ret,) = [n for n in ast.walk(matched) if isinstance(n, ast.Return)]
    assert ast.literal_eval(ret.value) == (0, False)


# --------------------------------------------------------------------------- instrumentation


@pytest.mark.parametrize("target", sorted(step_timing.TARGETS))
def test_instrumentation_target_exists_with_expected_signature(vllm_src, target):
    module, _, qual = target.partition(":")
    cls_name, meth = qual.split(".")
    cls = find_class(_parse(module_file(vllm_src, module)), cls_name)
    fn = methods(cls).get(meth)
    assert fn is not None, f"{target}: no such method"
    expected = step_timing.TARGETS[target]
    if expected != ("*",):
        assert params(fn) == expected, target
    if meth == "create_connector":
        assert any(isinstance(d, ast.Name) and d.id == "classmethod" for d in fn.decorator_list)


def test_instrumentation_hook_modules_are_where_vllm_defines_the_classes(vllm_src):
    engine = _parse(module_file(vllm_src, step_timing.ENGINE_MODULE))
    factory = _parse(module_file(vllm_src, step_timing.FACTORY_MODULE))
    find_class(engine, "EngineCore")
    find_class(factory, "KVConnectorFactory")


def test_what_the_instrumentation_reads_is_there(vllm_src):
    core = find_class(_parse(module_file(vllm_src, "vllm.v1.engine.core")), "EngineCore")
    assert {"step_fn", "scheduler"} <= self_assignments(methods(core)["__init__"])
    # the busy loop steps through step_fn
    assert "step_fn" in {
        n.func.attr
        for n in ast.walk(_parse(module_file(vllm_src, "vllm.v1.engine.core")))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    sched = find_class(_parse(module_file(vllm_src, "vllm.v1.core.sched.scheduler")), "Scheduler")
    assert {"requests", "running", "waiting", "connector"} <= self_assignments(methods(sched)["__init__"])
    # schedule() advances num_computed_tokens before returning (_update_after_schedule)
    assert "_update_after_schedule" in called_attributes(methods(sched)["schedule"])
    assert "num_computed_tokens" in self_assignments(
        methods(find_class(_parse(module_file(vllm_src, "vllm.v1.request")), "Request"))["__init__"]
    ) and "num_prompt_tokens" in self_assignments(
        methods(find_class(_parse(module_file(vllm_src, "vllm.v1.request")), "Request"))["__init__"]
    )
    out = find_class(_parse(module_file(vllm_src, "vllm.v1.core.sched.output")), "SchedulerOutput")
    assert {"num_scheduled_tokens", "total_num_scheduled_tokens"} <= class_fields(out)


def test_connector_call_sites_go_through_the_wrapped_names(vllm_src):
    mixin = _parse(module_file(vllm_src, "vllm.v1.worker.kv_connector_model_runner_mixin"))
    assert {"start_load_kv", "get_transfer_results"} <= called_attributes(mixin)
    sched = _parse(module_file(vllm_src, "vllm.v1.core.sched.scheduler"))
    assert {"create_connector", "build_connector_meta"} <= called_attributes(sched)
    state = _parse(module_file(vllm_src, "vllm.distributed.kv_transfer.kv_transfer_state"))
    assert "create_connector" in called_attributes(state)
    # get_finished is reached through get_transfer_results in 0.33 (base.py)
    base = methods(find_class(_parse(base_file(vllm_src)), "KVConnectorBase_V1"))
    assert "get_finished" in called_attributes(base["get_transfer_results"])


# --------------------------------------------------------------------------- kv-transfer-config


def kv_transfer_fields(src: Path) -> set[str]:
    cls = find_class(_parse(module_file(src, "vllm.config.kv_transfer")), "KVTransferConfig")
    return class_fields(cls)


def registered_connectors(src: Path) -> set[str]:
    tree = _parse(module_file(src, "vllm.distributed.kv_transfer.kv_connector.factory"))
    return {
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "register_connector"
        and n.args
        and isinstance(n.args[0], ast.Constant)
    }


def kv_roles(src: Path) -> set[str]:
    tree = _parse(module_file(src, "vllm.config.kv_transfer"))
    roles = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id in ("KVProducer", "KVConsumer"):
            roles |= {e.value for e in node.value.slice.elts}
    return roles


def extra_keys_read(src: Path, module: str) -> set[str]:
    """String keys a connector module reads from its extra config (.get("key", ...))."""
    tree = _parse(module_file(src, module))
    return {
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("get", "get_from_extra_config")
        and n.args
        and isinstance(n.args[0], ast.Constant)
        and isinstance(n.args[0].value, str)
    }


EXTRA_CONFIG_READERS = {
    "MooncakeConnector": "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector",
    "MultiConnector": "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector",
}


def all_variants() -> list:
    out = []
    for path in CONFIGS:
        config = load_config(path)
        for variant in config["variants"]:
            out.append(pytest.param(config, variant["name"], id=f"{path.stem}:{variant['name']}"))
    return out


def check_ktc(src: Path, ktc: dict, child: bool) -> None:
    fields = kv_transfer_fields(src)
    assert set(ktc) <= fields, set(ktc) - fields
    assert ktc.get("kv_role") in kv_roles(src), "kv_role is required whenever kv_connector is set"
    if child:
        assert "engine_id" not in ktc, "MultiConnector passes engine_id to children itself"
    name = ktc["kv_connector"]
    if "kv_connector_module_path" in ktc:
        module = ktc["kv_connector_module_path"]
        path = module_file(REPO, module)
        assert path.is_file(), f"{module} does not resolve under the repository root"
        find_class(_parse(path), name)
    else:
        assert name in registered_connectors(src), f"{name} is not registered in KVConnectorFactory"
    extra = ktc.get("kv_connector_extra_config", {})
    if name in EXTRA_CONFIG_READERS:
        assert set(extra) <= extra_keys_read(src, EXTRA_CONFIG_READERS[name]), set(extra)
    if name == "MooncakeConnector" and "mooncake_protocol" in extra:
        assert extra["mooncake_protocol"] in ("rdma", "tcp")
    if name == "MultiConnector":
        assert not child
        for c in extra["connectors"]:
            check_ktc(src, c, child=True)


@pytest.mark.parametrize("config, name", all_variants())
def test_kv_transfer_config_is_valid_for_vllm(vllm_src, config, name):
    ktc = launch.kv_transfer_config(*typed(config, name))
    if name == "plain":
        assert ktc is None
        return
    check_ktc(vllm_src, ktc, child=False)
    # what the launch prints is the same object
    argv = launch.vllm_argv(*typed(config, name), 8000)
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1]) == ktc


def test_multi_children_dicts_construct_a_kv_transfer_config(vllm_src):
    """MultiConnector builds KVTransferConfig(**child, engine_id=...): a child's keys must be
    fields and must not include engine_id (a duplicate keyword would be a TypeError)."""
    tree = _parse(module_file(vllm_src, "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector"))
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "KVTransferConfig"
    ]
    assert any(any(k.arg == "engine_id" for k in c.keywords) for c in calls)


# --------------------------------------------------------------------------- serve flags


@cache
def serve_flags(src: Path) -> tuple[frozenset[str], frozenset[str]]:
    """(flags `vllm serve` accepts, dest names of boolean EngineArgs fields)."""
    flags: set[str] = set()
    for module in ("vllm.engine.arg_utils", "vllm.entrypoints.common.cli_args"):
        for node in ast.walk(_parse(module_file(src, module))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                        flags.add(arg.value)
    frontend = _parse(module_file(src, "vllm.entrypoints.common.cli_args"))
    for cls_name in ("BaseFrontendArgs", "FrontendArgs"):
        flags |= {"--" + f.replace("_", "-") for f in class_fields(find_class(frontend, cls_name))}
    engine = find_class(_parse(module_file(src, "vllm.engine.arg_utils")), "EngineArgs")
    booleans = {
        n.target.id
        for n in engine.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and "bool" in ast.unparse(n.annotation)
    }
    return frozenset(flags), frozenset(booleans)


def test_serve_parser_takes_a_positional_model(vllm_src):
    tree = _parse(module_file(vllm_src, "vllm.entrypoints.common.cli_args"))
    positional = {
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "add_argument"
        and n.args
        and isinstance(n.args[0], ast.Constant)
        and n.args[0].value == "model_tag"
    }
    assert positional == {"model_tag"}


@pytest.mark.parametrize("config, name", all_variants())
def test_every_serve_flag_exists(vllm_src, config, name):
    flags, booleans = serve_flags(vllm_src)
    argv = launch.vllm_argv(*typed(config, name), 8000)
    assert argv[1:3] == ["serve", config["model"]["name"]]
    used = [a for a in argv[3:] if a.startswith("-")]
    for flag in used:
        if flag.startswith("--no-"):
            positive = "--" + flag[len("--no-") :]
            assert positive in flags, flag
            assert positive[2:].replace("-", "_") in booleans, f"{flag}: not a boolean field"
        else:
            assert flag in flags, f"vllm serve has no {flag}"
    for flag in ("--enable-prefix-caching", "--enable-chunked-prefill", launch.HMA_FLAG):
        assert flag[2:].replace("-", "_") in booleans  # so --no-<flag> exists too


def test_smoke_config_flags_exist(vllm_src):
    from connector_tax.config.smoke import smoke_config

    flags, _ = serve_flags(vllm_src)
    study = study_of(smoke_config(load_config(CONFIGS[0])))
    for variant in study.variants:
        argv = launch.vllm_argv(study, variant, 8000)
        assert all(a in flags for a in argv[3:] if a.startswith("--") and not a.startswith("--no-"))


def test_launch_environment_variables_exist_in_vllm(vllm_src):
    tree = _parse(module_file(vllm_src, "vllm.envs"))
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for var in ("VLLM_MOONCAKE_BOOTSTRAP_PORT", "VLLM_NIXL_SIDE_CHANNEL_PORT"):
        assert var in names


def test_dummy_bootstrap_speaks_the_routes_of_mooncakes_bootstrap_server(vllm_src):
    utils = module_file(vllm_src, "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_utils")
    text = utils.read_text()
    assert 'self.app.post("/register")' in text and 'self.app.get("/query"' in text
    payload = find_class(_parse(utils), "RegisterWorkerPayload")
    from tools.dummy_bootstrap import REGISTER_FIELDS

    assert class_fields(payload) == set(REGISTER_FIELDS)
    # and a consumer does not start one: the producer-only branches guard it
    connector = module_file(vllm_src, "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector")
    assert "# No need to launch server for D node." in connector.read_text()


def test_the_mooncake_cpu_guard_wraps_what_vllm_calls(vllm_src):
    """patches/cpu_guard.py answers torch.accelerator.current_device_index() inside
    MooncakeConnectorWorker.__init__ only: that is where vLLM asks it, and the index only reaches
    current_platform.set_device (a no-op on vLLM's CPU platform)."""
    from patches import cpu_guard

    path = module_file(vllm_src, cpu_guard.MOONCAKE_MODULE)
    init = methods(find_class(_parse(path), cpu_guard.WORKER_CLASS))["__init__"]
    assert "torch.accelerator.current_device_index()" in ast.unparse(init)
    assert "current_platform.set_device(self.device_id)" in ast.unparse(init)
    cpu = module_file(vllm_src, "vllm.platforms.cpu")
    set_device = methods(find_class(_parse(cpu), "CpuPlatform"))["set_device"]
    assert "torch.cpu.set_device(device)" in ast.unparse(set_device)


def _calls_on(tree: ast.AST, receiver: str) -> set[str]:
    """Method names called as `<receiver>.<name>(...)` (receiver: `self.kv_connector`, ...)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and ast.unparse(n.func.value) == receiver:
            out.add(n.func.attr)
    return out


def test_both_model_runners_reach_the_wrapped_worker_hooks(vllm_src):
    """V1 (KVConnectorModelRunnerMixin) and V2 (ActiveKVConnector, 0.33's default on GPUs) call
    the worker-step hooks the instrumentation wraps on the connector instance the factory made
    (get_kv_transfer_group()); the layer hooks come from maybe_transfer_kv_layer."""
    hooks = {
        "bind_connector_metadata",
        "start_load_kv",
        "wait_for_save",
        "get_transfer_results",
        "clear_connector_metadata",
    }
    v1 = _parse(module_file(vllm_src, "vllm.v1.worker.kv_connector_model_runner_mixin"))
    assert hooks <= _calls_on(v1, "kv_connector")
    v2_path = module_file(vllm_src, "vllm.v1.worker.gpu.kv_connector")
    v2 = find_class(_parse(v2_path), "ActiveKVConnector")
    assert hooks <= _calls_on(v2, "self.kv_connector")
    assert "self.kv_connector = get_kv_transfer_group()" in v2_path.read_text()
    layer = _parse(module_file(vllm_src, "vllm.model_executor.layers.attention.kv_transfer_utils"))
    assert {"wait_for_layer_load", "save_kv_layer"} <= _calls_on(layer, "connector")
    assert set(step_timing.WORKER_HOOKS) >= hooks | {"wait_for_layer_load", "save_kv_layer", "get_finished"}


def test_num_waiting_is_what_vllm_metrics_report(vllm_src):
    """vllm:num_requests_waiting = num_waiting_reqs + num_skipped_waiting_reqs, which make_stats
    derives from get_request_counts(): the count the instrumentation records."""
    sched = module_file(vllm_src, "vllm.v1.core.sched.scheduler").read_text()
    assert "num_running, num_waiting = self.get_request_counts()" in sched
    assert "return len(self.running), len(self.waiting) + len(self.kv_holding_waiting)" in sched
    loggers = module_file(vllm_src, "vllm.v1.metrics.loggers").read_text()
    assert "scheduler_stats.num_waiting_reqs\n                + scheduler_stats.num_skipped_waiting_reqs" in loggers


def test_vllm_serves_with_an_omp_num_threads_it_finds_and_sets_its_own_otherwise(vllm_src):
    """Why a launch drops the thread counts Snakemake exports (serving.spec.SCHEDULER_THREAD_VARS):
    vLLM leaves torch's threads at an OMP_NUM_THREADS set outside it, and sets one thread for
    serving when there is none, so an inherited one would make serving depend on --cores."""
    text = (vllm_src / "vllm" / "utils" / "torch_utils.py").read_text()
    body = text[text.index("def set_torch_threads_for_runtime") :]
    body = body[: body.index("\ndef ")]
    assert 'os.environ.get("OMP_NUM_THREADS")' in body and "return" in body
    assert "torch.set_num_threads(1)" in body
