"""tools/noop_connector.py behaves as a no-op, checked with a stand-in for vLLM's base module
(its signatures against vLLM's real source are in tests/unit/test_vllm_static.py, and against the
real classes in tests/vllm_cpu/test_vllm_real_scheduler.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

STUB_BASE = """
import enum
from abc import ABC, abstractmethod

class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1

class KVConnectorMetadata(ABC):
    pass

class SupportsHMA(ABC):
    @abstractmethod
    def request_finished_all_groups(self, request, block_ids): ...

class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config, role, kv_cache_config):
        self.init_args = (vllm_config, role, kv_cache_config)
    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs): ...
    @abstractmethod
    def wait_for_layer_load(self, layer_name): ...
    @abstractmethod
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs): ...
    @abstractmethod
    def wait_for_save(self): ...
    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens): ...
    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens): ...
    @abstractmethod
    def build_connector_meta(self, scheduler_output): ...
"""

PROBE = """
import json
from tools.noop_connector import NoOpConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorRole, SupportsHMA
c = NoOpConnector("cfg", KVConnectorRole.SCHEDULER, "kvc")
m1, m2 = c.build_connector_meta(None), c.build_connector_meta(None)
print(json.dumps({
    "init": list(map(str, c.init_args)),
    "hma": isinstance(c, SupportsHMA),
    "matched": list(c.get_num_new_matched_tokens(object(), 7)),
    "meta_fresh": isinstance(m1, KVConnectorMetadata) and m1 is not m2,
    "finished": list(c.request_finished(object(), [1, 2])),
    "finished_all": list(c.request_finished_all_groups(object(), ([1], [2]))),
    "get_finished": list(c.get_finished({"a"})),
    "nones": [c.start_load_kv(None), c.wait_for_layer_load("l"), c.save_kv_layer("l", None, None),
              c.wait_for_save(), c.update_state_after_alloc(None, None, 0)],
}))
"""


def test_every_hook_is_a_no_op(tmp_path):
    env = _stub_env(tmp_path)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout)
    assert probe == {
        "init": ["cfg", "KVConnectorRole.SCHEDULER", "kvc"],
        "hma": True,
        "matched": [0, False],
        "meta_fresh": True,
        "finished": [False, None],
        "finished_all": [False, None],
        "get_finished": [None, None],
        "nones": [None, None, None, None, None],
    }


def test_tools_and_patches_import_nothing_from_the_package():
    import ast

    for folder in ("tools", "patches"):
        for path in (REPO / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                assert not any(n.split(".")[0] == "connector_tax" for n in names), path


COUNT_PROBE = """
import json, sys
from tools.noop_connector import NoOpConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
s = NoOpConnector("cfg", KVConnectorRole.SCHEDULER, "kvc")
w = NoOpConnector("cfg", KVConnectorRole.WORKER, "kvc")
for _ in range(3):
    s.build_connector_meta(None)
s.get_num_new_matched_tokens(object(), 0)
w.start_load_kv(None)
w.wait_for_layer_load("l0"); w.wait_for_layer_load("l1")
print(json.dumps({"meta": type(s.build_connector_meta(None)).__name__,
                  "same_plain": "build_connector_meta" in vars(s)}))
"""


def _stub_env(tmp_path: Path) -> dict[str, str]:
    base = tmp_path / "vllm" / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "base.py"
    base.parent.mkdir(parents=True)
    for folder in [tmp_path / "vllm", *base.parents]:
        if str(folder).startswith(str(tmp_path / "vllm")):
            (folder / "__init__.py").touch()
    base.write_text(textwrap.dedent(STUB_BASE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    env.pop("CONNECTOR_TAX_STEP_LOG", None)
    return env


def test_call_counts_only_when_asked(tmp_path):
    env = _stub_env(tmp_path)
    env.pop("CONNECTOR_TAX_NOOP_COUNTS", None)
    plain = subprocess.run([sys.executable, "-c", COUNT_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["same_plain"] is False  # no instance wrappers: the class as is
    assert not list(tmp_path.glob("counts*"))

    env["CONNECTOR_TAX_NOOP_COUNTS"] = str(tmp_path / "counts")
    done = subprocess.run([sys.executable, "-c", COUNT_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"meta": "NoOpConnectorMetadata", "same_plain": True}
    (sched,) = tmp_path.glob("counts.scheduler.*.json")
    (worker,) = tmp_path.glob("counts.worker.*.json")
    assert json.loads(sched.read_text()) == {
        "get_num_new_matched_tokens": 1,
        "update_state_after_alloc": 0,
        "build_connector_meta": 4,
        "request_finished": 0,
        "request_finished_all_groups": 0,
    }
    assert json.loads(worker.read_text()) == {
        "start_load_kv": 1,
        "wait_for_layer_load": 2,
        "save_kv_layer": 0,
        "wait_for_save": 0,
        "get_finished": 0,
    }
