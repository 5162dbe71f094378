"""Resolve one server variant of a study config into what the simulated server runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connector_tax.config.merge import deep_merge
from connector_tax.sim.admission import AdmissionSettings
from connector_tax.sim.costs import CostModel, connector_terms
from connector_tax.sim.engine import EngineSettings
from connector_tax.sim.faults import FaultSettings
from connector_tax.sim.profiles import connector_cost_table, hardware_profile


@dataclass(frozen=True)
class SimSettings:
    variant: str
    model: str
    host: str
    vllm_version: str
    engine: EngineSettings
    cost_model: CostModel
    faults: FaultSettings
    connector: dict[str, Any] | None


def resolve(config: dict[str, Any], variant: dict[str, Any], faults: dict[str, Any]) -> SimSettings:
    """`config` is a validated study config and `variant` one of its `configs` entries;
    `faults` (from the command line) override the config's own."""
    server = deep_merge(config.get("server", {}), variant.get("server", {}))
    sim = deep_merge(config.get("sim", {}), variant.get("sim", {}))
    admission = AdmissionSettings(**sim.get("admission", {}))
    hardware = hardware_profile(sim.get("hardware_profile", "tiny-fast"), sim.get("hardware"))
    table, role_scale = connector_cost_table(sim.get("connector_costs"))
    connector = variant.get("connector")
    engine = EngineSettings(
        max_num_batched_tokens=server.get("max_num_batched_tokens", 8192),
        max_num_seqs=server.get("max_num_seqs", 256),
        max_model_len=server.get("max_model_len", 200000),
        enable_chunked_prefill=server.get("enable_chunked_prefill", True),
        enable_prefix_caching=server.get("enable_prefix_caching", True),
        admission=admission,
    )
    capacity = hardware.kv_cache_blocks * hardware.block_size
    if engine.max_model_len > capacity:
        # vLLM refuses to start in the same situation rather than hang on a long prompt.
        raise ValueError(
            f"server.max_model_len: {engine.max_model_len} exceeds the KV cache of the "
            f"'{sim.get('hardware_profile')}' profile ({capacity} tokens)"
        )
    return SimSettings(
        variant=variant["name"],
        model=config["model"].get("served_name") or config["model"]["name"],
        host=server.get("host", "127.0.0.1"),
        vllm_version=config.get("vllm_version", "0.33.0"),
        engine=engine,
        cost_model=CostModel(hardware, connector_terms(connector, table, role_scale)),
        faults=FaultSettings.from_dict({**sim.get("faults", {}), **faults}),
        connector=connector,
    )
