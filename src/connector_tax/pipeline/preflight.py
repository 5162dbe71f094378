"""Pre-flight readiness: does each configuration's server start and serve one streamed request?

A configuration that fails is SKIP with its reason; that is a result, not an error, so the
study goes on without it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from connector_tax.config import find_variant, load_config
from connector_tax.launch.command import launch_spec
from connector_tax.serving.process import ServerProcess, ServerStartError, free_port

READY_TIMEOUT_S = {"sim": 30.0, "vllm": 900.0, "openai": 30.0}


def _one_streamed_request(url: str, model: str) -> None:
    body = {"model": model, "prompt": list(range(1, 17)), "max_tokens": 4, "ignore_eos": True,
            "temperature": 0, "stream": True}  # fmt: skip
    with httpx.Client(timeout=30.0) as client, client.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise ServerStartError(f"test request answered HTTP {resp.status_code}: {resp.read()[:200]!r}")
        if not any(line.strip() == "data: [DONE]" for line in resp.iter_lines()):
            raise ServerStartError("test request's stream did not end with data: [DONE]")


def check_readiness(config_path: str, config: dict[str, Any], name: str, log_dir: Path) -> dict[str, Any]:
    variant = find_variant(config, name)
    backend = config["backend"]
    host = variant.get("server", {}).get("host") or config["server"]["host"]
    port = free_port(host)
    spec = launch_spec(config_path, config, variant, port)
    url = spec.url or f"http://{host}:{port}"
    model = config["model"].get("served_name") or config["model"]["name"]
    started = time.monotonic()
    try:
        with ServerProcess(spec, url, log_dir) as server:
            server.wait_ready(READY_TIMEOUT_S[backend])
            ready_s = time.monotonic() - started
            _one_streamed_request(server.url, model)
    except (ServerStartError, httpx.HTTPError) as exc:
        return {"config": name, "status": "skip", "reason": str(exc), "backend": backend}
    return {"config": name, "status": "ok", "reason": None, "backend": backend, "ready_s": round(ready_s, 3)}


def write_json(path: Path, data: Any) -> None:
    """Atomic: a reader never sees half a file, and an interrupted write leaves none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def merge_status(parts: list[Path]) -> dict[str, Any]:
    statuses = [json.loads(p.read_text(encoding="utf-8")) for p in parts]
    return {s["config"]: {k: v for k, v in s.items() if k != "config"} for s in statuses}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connector_tax.pipeline.preflight")
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("check", help="readiness of one configuration")
    check.add_argument("--config", required=True)
    check.add_argument("--name", required=True)
    check.add_argument("--out", required=True)
    check.add_argument("--log-dir", required=True)
    merge = sub.add_parser("merge", help="merge per-configuration results")
    merge.add_argument("--out", required=True)
    merge.add_argument("parts", nargs="+")
    args = parser.parse_args(argv)
    if args.action == "check":
        config = load_config(args.config)
        write_json(Path(args.out), check_readiness(args.config, config, args.name, Path(args.log_dir)))
    else:
        write_json(Path(args.out), merge_status([Path(p) for p in args.parts]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
