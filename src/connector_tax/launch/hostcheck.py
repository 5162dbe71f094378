"""What a vLLM study on a GPU host would trip over minutes in, refused before any launch.

`ctax config check FILE` and every preflight job run these on the host that will launch (a
config checked elsewhere: `ctax config check --static FILE`). Each is one ConfigError naming the
setting, the first found:

* the model is not on this host: a hub id not in the Hugging Face cache would be downloaded by
  the first launch inside server.ready_timeout_s (~61 GB for the H20 study's model, with up to
  one preflight per GPU downloading at once), so it must be downloaded first;
* PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the environment, vllm.env or a variant's
  env): vLLM 0.33 refuses every KV connector with it (VllmConfig's check: registered KV memory
  would be remapped) unless --enable-cumem-allocator, while plain vLLM runs, so the study
  would measure the baseline and SKIP the rest;
* an RDMA device Mooncake is told to use (vllm.mooncake.device_name, comma-separated names) that
  the kernel does not list (/sys/class/infiniband), or `auto` on a host that lists none.
"""

from __future__ import annotations

import os
from pathlib import Path

from connector_tax.config import ConfigError, StudyConfig
from connector_tax.launch.vllm import MOONCAKE_AUTO, model_path
from connector_tax.serving import topology
from connector_tax.serving.server_process import ready_timeout_s

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"
CUMEM_FLAG = "--enable-cumem-allocator"
WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


def hf_cache() -> Path:
    """Where huggingface_hub keeps downloaded models (its own rule: HF_HUB_CACHE, else HF_HOME/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _has_model(folder: Path, dummy: bool) -> bool:
    return (folder / "config.json").is_file() and (dummy or any(any(folder.glob(w)) for w in WEIGHTS))


def check_model(study: StudyConfig) -> None:
    model = study.model
    if model.local:
        model_path(study)  # its own one-line error
        return
    name = model.name
    dummy = model.load_format == "dummy"
    if Path(name).is_absolute():
        if _has_model(Path(name), dummy):
            return
        raise ConfigError("model.name", f"{name}: no model folder (config.json and weights) there")
    snapshots = hf_cache() / f"models--{name.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(_has_model(s, dummy) for s in snapshots.iterdir()):
        return
    ready = max(ready_timeout_s(study, v) for v in study.variants)
    raise ConfigError(
        "model.name",
        f"{name} is not in this host's Hugging Face cache ({hf_cache()}): the first launches would download it "
        f"inside their {ready:.0f} s start-up limit (server.ready_timeout_s), one per GPU at once; "
        f"download it first (`hf download {name}`)",
    )


def check_alloc_conf(study: StudyConfig) -> None:
    sources = [("the environment", os.environ), ("vllm.env", study.vllm.get("env") or {})]
    for i, variant in enumerate(study.variants):
        if not variant.connector:
            continue
        if CUMEM_FLAG in study.server_of(variant)["extra_args"]:
            continue
        for where, env in [*sources, (f"variants[{i}].env", variant.env)]:
            value = str(env.get(ALLOC_CONF) or "")
            if EXPANDABLE in value:
                key = ALLOC_CONF if where == "the environment" else f"{where}.{ALLOC_CONF}"
                raise ConfigError(
                    key,
                    f"{value!r} (from {where}): vLLM 0.33 refuses every KV connector with {EXPANDABLE} "
                    f"({variant.name} and the others would SKIP, plain would run); unset it, or add "
                    f"{CUMEM_FLAG} to server.extra_args",
                )


def check_rdma(study: StudyConfig) -> None:
    mooncake = study.vllm.get("mooncake") or {}
    if mooncake.get("protocol", "rdma") != "rdma" or not mooncake.get("device_name"):
        return  # tcp, or rdma without a device: the launch refuses that itself
    have = topology.rdma_devices()
    where = topology.sysfs() / "class/infiniband"
    if mooncake["device_name"] == MOONCAKE_AUTO:
        if not have:
            raise ConfigError(
                "vllm.mooncake.device_name", f"auto: this host lists no RDMA device ({where} is empty or absent)"
            )
        return
    for name in str(mooncake["device_name"]).split(","):
        if name.strip() not in have:
            raise ConfigError(
                "vllm.mooncake.device_name",
                f"{name.strip()!r} is not an RDMA device of this host (it has: {', '.join(have) or 'none'}, "
                f"in {where}); name one of them, or auto (Mooncake picks the one nearest each GPU)",
            )


def check_host(study: StudyConfig) -> None:
    """ConfigError (one line, naming the setting) for the first thing this host would fail on;
    nothing for studies that launch no vLLM on a GPU."""
    if study.backend != "vllm" or study.device == "cpu":
        return
    check_alloc_conf(study)
    check_rdma(study)
    check_model(study)
