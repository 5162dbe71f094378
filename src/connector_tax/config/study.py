"""The study config as typed, read-only objects, built once from the validated mapping.

The schema has filled every default before these are built, so no reader downstream needs a
`.get(key, default)` of its own (a second default that could drift from the schema's). The
sections that are passed on whole to a server or a fingerprint (server, sim, vllm, connectors,
shapes) stay mappings: their meaning belongs to the launcher that reads them, and
`raw` is the validated mapping itself, which is what fingerprints and staged configs hash.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector_tax.config.errors import ConfigError
from connector_tax.config.gate_settings import Saturation, Validity
from connector_tax.config.merge import merged_server


@dataclass(frozen=True)
class Arrival:
    process: str  # poisson | gamma | fixed
    gamma_shape: float


@dataclass(frozen=True)
class Precision:
    """Adaptive cell length: run past the floor until the intervals reach `target`: the cell's p90
    intervals (of "p90"), or, of "tax", the taxes it feeds, paired against the baseline's cell."""

    target: float | None
    max_duration_s: float | None
    of: str = "p90"  # p90 | tax
    min_completed: int = 64  # of tax: the floor of completed requests of a cell that stops on its tax

    @property
    def on_tax(self) -> bool:
        return self.of == "tax" and self.target is not None


@dataclass(frozen=True)
class Request:
    """What each request asks and how long it may take (the `workload` keys the load generator
    sends by); the schema's defaults are the load generator's (config.load.default_request)."""

    endpoint: str  # completions | chat
    prompt: str  # token_ids | text
    tokenizer: str  # how text and chat prompts are sized: auto | server | usage | a tokenizer file
    temperature: float
    ignore_eos: bool
    inflight_cap: int
    timeout_s: float  # workload.request_timeout_s

    KEYS = ("endpoint", "prompt", "tokenizer", "temperature", "ignore_eos", "inflight_cap", "request_timeout_s")

    @classmethod
    def from_mapping(cls, workload: Mapping[str, Any]) -> Request:
        return cls(
            workload["endpoint"],
            workload["prompt"],
            workload["tokenizer"],
            float(workload["temperature"]),
            workload["ignore_eos"],
            workload["inflight_cap"],
            float(workload["request_timeout_s"]),
        )

    @property
    def sends_text(self) -> bool:
        """Text prompts (the chat endpoint always sends text), sized by `tokenizer`."""
        return self.endpoint == "chat" or self.prompt == "text"


@dataclass(frozen=True)
class Model:
    name: str
    served_name: str | None
    local: bool = False  # a folder on this host (relative to the repository root), not a hub id
    load_format: str | None = None  # vLLM's --load-format (dummy: random weights)

    @classmethod
    def from_mapping(cls, model: Mapping[str, Any]) -> Model:
        return cls(model["name"], model.get("served_name"), bool(model.get("local")), model.get("load_format"))

    @property
    def served(self) -> str:
        """The name requests carry: the served name when the server is given one."""
        return self.served_name or self.name


@dataclass(frozen=True)
class PhaseA:
    rates: tuple[float, ...]
    shape: Mapping[str, Any]
    prune_after_knee: bool


@dataclass(frozen=True)
class Workload:
    warmup_s: float
    duration_s: float
    min_completed: int
    request_timeout_s: float
    request: Request
    arrival: Arrival
    precision: Precision
    phase_a: PhaseA
    phase_b: Mapping[str, Any]
    phase_b_prime: Mapping[str, Any] | None
    replicates: int = 1  # launches per variant and phase
    aa_control: bool = False


@dataclass(frozen=True)
class LoadgenSettings:
    workers: int
    affinity: bool
    cpu_latency_us: int | None
    rt_priority: int | None = None


@dataclass(frozen=True)
class LmcacheServer:
    """`vllm.lmcache_mp`: the LMCache multi-process server that a connector of type `lmcache_mp`
    talks to, a sidecar of the launch (launch/lmcache_mp.py). Defaults are the schema's."""

    executable: str | None  # None: the `lmcache` beside vllm.executable (or on PATH)
    chunk_size: int
    l1_size_gb: float
    eviction_policy: str
    transfer_mode: str  # auto | engine_driven | lmcache_driven
    ready_timeout_s: float
    extra_args: tuple[str, ...]
    env: Mapping[str, str]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LmcacheServer:
        """From a validated config (the schema filled `vllm.lmcache_mp`)."""
        section = dict((config.get("vllm") or {})["lmcache_mp"])
        return cls(
            executable=section.get("executable"),
            chunk_size=section["chunk_size"],
            l1_size_gb=float(section["l1_size_gb"]),
            eviction_policy=section["eviction_policy"],
            transfer_mode=section["transfer_mode"],
            ready_timeout_s=float(section["ready_timeout_s"]),
            extra_args=tuple(section["extra_args"]),
            env=dict(section["env"]),
        )


@dataclass(frozen=True)
class Variant:
    """One configuration of the study: a connector plus any server or simulator override."""

    name: str
    connector: Mapping[str, Any] | None
    raw: Mapping[str, Any]

    @property
    def server(self) -> Mapping[str, Any]:
        """Its own `server` overrides (merged over the study's by the launchers)."""
        server: Mapping[str, Any] = self.raw.get("server") or {}
        return server

    @property
    def host(self) -> str | None:
        """Its own server.host, where it overrides the study's."""
        host: str | None = self.server.get("host")
        return host

    @property
    def env(self) -> Mapping[str, str]:
        """Its own environment for its server (over the study's vllm.env)."""
        env: Mapping[str, str] = self.raw.get("env") or {}
        return env

    @property
    def sim(self) -> Mapping[str, Any]:
        """Its own `sim` overrides (merged over the study's by the simulator)."""
        sim: Mapping[str, Any] = self.raw.get("sim") or {}
        return sim

    @property
    def interventions(self) -> tuple[str, ...]:
        """The interventions it declares, by name (config/interventions.py says what each does)."""
        return tuple(self.raw.get("interventions") or ())


def baseline_name(config: Mapping[str, Any]) -> str:
    """plain if the study has it, else its first variant (the analysis's default baseline)."""
    names = [v["name"] for v in config["variants"]]
    return "plain" if "plain" in names else names[0]


@dataclass(frozen=True)
class StudyConfig:
    study: str
    backend: str  # sim | vllm | openai
    seed: int
    variants: tuple[Variant, ...]
    workload: Workload
    saturation: Saturation
    validity: Validity
    loadgen: LoadgenSettings
    raw: Mapping[str, Any]
    model: Model = Model("", None)
    host: str = "127.0.0.1"  # server.host: where the study's servers bind and are reached
    api_key_env: str | None = None  # backend openai: the variable holding the API key
    source: Path | None = None  # the file it was read from (a server it launches reads it too)
    vllm_version: str | None = None  # the vLLM the study is designed for (the manifest's, when none is found)
    # The file itself names sim.hardware_profile (load_study; the schema fills in tiny-fast when it
    # does not): a vLLM study's server is modelled only by a profile its config chose.
    hardware_profile_named: bool = False

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> StudyConfig:
        """From a mapping `validate_config` returned (defaults filled, checks passed)."""
        workload = config["workload"]
        phase_a = workload["phase_a"]
        return cls(
            study=config["study"],
            backend=config["backend"],
            seed=config["seed"],
            variants=tuple(Variant(v["name"], v.get("connector"), v) for v in config["variants"]),
            workload=Workload(
                warmup_s=workload["warmup_s"],
                duration_s=workload["duration_s"],
                min_completed=workload["min_completed"],
                request_timeout_s=workload["request_timeout_s"],
                request=Request.from_mapping(workload),
                arrival=Arrival(workload["arrival"]["process"], float(workload["arrival"]["gamma_shape"])),
                precision=Precision(
                    workload["precision"]["target"],
                    workload["precision"]["max_duration_s"],
                    workload["precision"]["of"],
                    workload["precision"]["min_completed"],
                ),
                phase_a=PhaseA(tuple(phase_a["rates"]), phase_a["shape"], phase_a["prune_after_knee"]),
                phase_b=workload["phase_b"],
                phase_b_prime=workload.get("phase_b_prime") or None,
                replicates=workload["replicates"],
                aa_control=workload["aa_control"],
            ),
            saturation=Saturation(**config["saturation"]),
            validity=Validity.from_mapping(config["validity"]),
            loadgen=LoadgenSettings(**config["loadgen"]),
            raw=config,
            model=Model.from_mapping(config["model"]),
            host=config["server"]["host"],
            api_key_env=(config.get("openai") or {}).get("api_key_env") if config["backend"] == "openai" else None,
            vllm_version=config.get("vllm_version"),
        )

    @property
    def server(self) -> Mapping[str, Any]:
        """The `server` section (vLLM's engine arguments, shared by every variant; each may
        override them): passed on whole to the launchers, which know its keys."""
        server: Mapping[str, Any] = self.raw["server"]
        return server

    @property
    def sim(self) -> Mapping[str, Any]:
        """The `sim` section (the simulated server's settings), passed on whole to the simulator."""
        sim: Mapping[str, Any] = self.raw.get("sim") or {}
        return sim

    @property
    def device(self) -> str:
        """ "cuda" (a GPU host) or "cpu" (vLLM's CPU build) for backend vllm; "cuda" otherwise."""
        from connector_tax.config.vllm_rules import device

        return device(self.raw)

    @property
    def cpu_placement(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(service CPUs, compute CPUs) of a vLLM CPU study that pins every server thread
        (vllm.cpu.service_cpus; serving/placement.py), else None."""
        from connector_tax.config.vllm_rules import cpu_placement

        return cpu_placement(self.raw)

    def virtual(self, profile: str | None = None) -> dict[str, Any]:
        """This study's config as a simulated one computed in virtual time (same name: it runs
        in a scratch folder of its own), with the engine `profile` file when one is given (in
        place of the hand-set hardware profile); the vLLM and external-server sections dropped, and
        the variants' interventions, which act inside vLLM's processes (a CPU study must declare
        Mooncake's guard: without this its prediction and calibration check were refused)."""
        out = copy.deepcopy(dict(self.raw))
        out["variants"] = [{k: v for k, v in dict(x).items() if k != "interventions"} for x in out["variants"]]
        out["backend"] = "sim"
        out["sim"] = {**(out.get("sim") or {}), "clock": "virtual"}
        if profile is not None:
            out["sim"]["profile"] = profile
            out["sim"].pop("hardware_profile", None)
        for section in ("vllm", "openai"):
            out.pop(section, None)
        return out

    @property
    def virtual_clock(self) -> bool:
        """A simulated study computed in the simulator's virtual time (sim.clock: virtual): no
        server is launched, each cell is computed (oracle/virtual_run.py)."""
        return self.backend == "sim" and (self.raw.get("sim") or {}).get("clock") == "virtual"

    @property
    def openai_url(self) -> str | None:
        """backend openai: the external server's URL."""
        return (self.raw.get("openai") or {}).get("url") if self.backend == "openai" else None

    @property
    def vllm(self) -> Mapping[str, Any]:
        """The `vllm` section (how vLLM is launched: executable, device, cpu, mooncake, lmcache,
        lmcache_mp, env, ...), passed on whole to the vLLM launcher, which knows its keys; empty
        for a study that has none."""
        vllm: Mapping[str, Any] = self.raw.get("vllm") or {}
        return vllm

    def server_of(self, variant: Variant) -> dict[str, Any]:
        """The `server` settings a variant launches with: the study's, its overrides on top
        (config/merge.py: extra_args of both, without those that cannot change a measurement)."""
        return merged_server(self.raw, variant.raw)

    @property
    def lmcache_server(self) -> LmcacheServer:
        """`vllm.lmcache_mp`: the LMCache MP server of the study's lmcache_mp variants."""
        return LmcacheServer.from_config(self.raw)

    @property
    def vllm_executable(self) -> str:
        """backend vllm: the `vllm` console script launches run (the schema's default: `vllm`)."""
        executable: str = self.raw["vllm"]["executable"]
        return executable

    @property
    def preflight_gated_only(self) -> bool:
        """backend vllm, `vllm.preflight_launch: gated`: only the verify scripts launch in the
        preflight; an ungated variant's first phase launch is its readiness check."""
        return self.backend == "vllm" and self.raw["vllm"]["preflight_launch"] == "gated"

    @property
    def names(self) -> list[str]:
        return [v.name for v in self.variants]

    @property
    def baseline(self) -> str:
        """The variant taxes are measured against by default: plain, else the first."""
        return baseline_name(self.raw)

    @property
    def aa_controls(self) -> dict[str, str]:
        """{A/A control variant: the variant it repeats}."""
        return {v.name: v.raw["aa_of"] for v in self.variants if v.raw.get("aa_of")}

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise ConfigError("variants", f"no variant named {name!r} (known: {', '.join(self.names)})")
