"""A `vllm serve` stand-in that records what its launch gave it, for tests of what reaches a server.

    bin = write_fake_vllm(tmp_path / "bin", records=tmp_path / "records", nixl=fake_nixl(tmp_path / "nixl"))
    config["vllm"]["executable"] = str(bin)

It is launched as the study launches vLLM (argv, environment, PYTHONPATH with the site hook, so
the declared interventions install in it as in vLLM's own processes). It

* learns its variant from $FAKE_VLLM_VARIANT (set in each variant's `env`: two variants that
  differ only by their interventions launch with the same argv);
* for a NIXL connector (the argv's --kv-transfer-config), builds one NIXL agent with the stand-in
  NIXL API (tests/fake_nixl.py) as vLLM 0.32's NIXL worker does, unless $FAKE_VLLM_NO_AGENT is set
  (an intervention with nothing to act on);
* writes `<records>/<variant>.<pid>.json`: its connector-tax variables, PYTHONPATH and the agent;
* serves with `ctax sim` for its variant in the same process (not an exec: the intervention's
  evidence is this process's).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

VARIANT_ENV, NO_AGENT_ENV = "FAKE_VLLM_VARIANT", "FAKE_VLLM_NO_AGENT"


def write_fake_vllm(folder: Path, records: Path, nixl: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vllm"
    here = str(Path(__file__).resolve().parent)
    path.write_text(
        f"#!{sys.executable}\n"
        "# connector-tax test stand-in for `vllm serve` (tests/fake_vllm.py)\n"
        f"import sys\nsys.path.insert(0, {here!r})\nimport fake_vllm\n"
        f"sys.exit(fake_vllm.main({str(records)!r}, {str(nixl)!r}))\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def main(records: str, nixl: str) -> int:
    argv = sys.argv[1:]
    variant = os.environ[VARIANT_ENV]
    agent = None
    if "NixlConnector" in (_value(argv, "--kv-transfer-config") or "") and not os.environ.get(NO_AGENT_ENV):
        sys.path.insert(0, nixl)
        import importlib

        api = importlib.import_module("nixl_cu12._api")  # as vllm.distributed.nixl_utils does
        agent = api.nixl_agent("worker", api.nixl_agent_config(num_threads=4, capture_telemetry=True)).agent
    os.makedirs(records, exist_ok=True)
    seen = {k: v for k, v in os.environ.items() if k.startswith("CONNECTOR_TAX_") or k == "PYTHONPATH"}
    with open(os.path.join(records, f"{variant}.{os.getpid()}.json"), "w", encoding="utf-8") as out:
        json.dump({"variant": variant, "pid": os.getpid(), "argv": argv, "env": seen, "agent": agent}, out)
    from connector_tax.cli import main as ctax

    config = os.environ["FAKE_VLLM_CONFIG"]
    host, port = _value(argv, "--host") or "127.0.0.1", _value(argv, "--port") or "8000"
    return ctax(["sim", "--config", config, "--variant", variant, "--host", host, "--port", port])
