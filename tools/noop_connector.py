"""NoOpConnector: a KV connector that does nothing, to measure vLLM's connector framework alone.

vLLM's own ExampleConnector is no no-op (it writes every layer's KV to disk), so the study
ships this one. Every hook returns at once; only vLLM's dispatch around the hooks is paid:
building SchedulerOutput.kv_connector_metadata, binding/clearing metadata on the worker,
get_transfer_results bookkeeping, the request_finished path.

Loaded by vLLM from `--kv-transfer-config`:
    {"kv_connector": "NoOpConnector", "kv_connector_module_path": "tools.noop_connector",
     "kv_role": "kv_both"}
(vLLM 0.33 imports kv_connector_module_path as a module and takes kv_connector from it), with
the repository root on PYTHONPATH.

It implements SupportsHMA, so it can run with the hybrid KV cache manager on; the study still
launches every configuration with --disable-hybrid-kv-cache-manager, because LMCacheConnectorV1
does not support HMA and like must be compared with like (see src/connector_tax/launch/README.md).

For tests only: with $CONNECTOR_TAX_NOOP_COUNTS=PREFIX set, each instance counts the calls of
its role's hooks and rewrites PREFIX.<role>.<pid>.json after every call, so a test can show
that real vLLM called them. Unset (the study), the class is exactly the no-op above: the
counting wrappers are instance attributes made only when the variable is set.

Runs inside vLLM: imports vLLM, never connector_tax.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class NoOpConnectorMetadata(KVConnectorMetadata):
    """Empty per-step metadata (a fresh object each step, never None)."""


COUNTS_ENV = "CONNECTOR_TAX_NOOP_COUNTS"
# The hooks each role's caller reaches (vLLM's scheduler, vLLM's model runner).
COUNTED_HOOKS = {
    "scheduler": (
        "get_num_new_matched_tokens",
        "update_state_after_alloc",
        "build_connector_meta",
        # a SupportsHMA connector (this one) is finished through request_finished_all_groups;
        # vLLM calls request_finished only for connectors without HMA support
        "request_finished",
        "request_finished_all_groups",
    ),
    "worker": (
        "start_load_kv",
        "wait_for_layer_load",
        "save_kv_layer",
        "wait_for_save",
        "get_finished",
    ),
}


class _CallCounts:
    """Counts hook calls of one connector instance into PREFIX.<role>.<pid>.json."""

    def __init__(self, prefix: str, role: str) -> None:
        self.path = f"{prefix}.{role}.{os.getpid()}.json"
        self.counts = dict.fromkeys(COUNTED_HOOKS[role], 0)
        self.write()

    def write(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.counts, fh)
        os.replace(tmp, self.path)

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)  # keeps the signature the instrumentation checks
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            self.write()
            return fn(*args, **kwargs)

        return counted


class NoOpConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ):
        super().__init__(vllm_config, role, kv_cache_config)
        prefix = os.environ.get(COUNTS_ENV)
        if prefix:  # tests only (see the module docstring)
            role_name = str(getattr(role, "name", role)).lower()
            counter = _CallCounts(prefix, role_name)
            for name in COUNTED_HOOKS.get(role_name, ()):
                setattr(self, name, counter.wrap(name, getattr(self, name)))

    # ------------------------------------------------------------------ worker side

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(
        self,
        request: Request,
        num_computed_tokens: int,
    ) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return NoOpConnectorMetadata()

    def request_finished(
        self,
        request: Request,
        block_ids: list[int],
    ) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    def request_finished_all_groups(
        self,
        request: Request,
        block_ids: tuple[list[int], ...],
    ) -> tuple[bool, dict[str, Any] | None]:
        return False, None
