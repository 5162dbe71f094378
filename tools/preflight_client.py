"""The HTTP side of the pre-flight verify scripts and the GPU smoke test (standard library only).

    preflight_client.py check --plan PLAN.json --pid PID --log LOG [--server-log SERVER_LOG] ...
        wait for /health 200 (or the server process to die, or vLLM's engine-failure line in
        SERVER_LOG with no exit 20 s later, or --start-timeout), then
        GET /v1/models (200, lists the model), then the plan's requests one after another
        (each 200 with a choice, all within the plan's budget), then /health 200 and the
        process alive: the engine-failure check (vLLM 0.33 has no
        vllm:engine_core_failed_total; a dead engine is /health 503 or the process gone).
        Narrative to LOG; the last stdout line is `OK` or `FAIL: <reason>`; exit 0 / 1.

    preflight_client.py record --file preflight_status.json --config NAME --status ok|skip
        --reason TEXT [--check CHECK] [--log PATH] [--run ID]
        merge one config's verdict into preflight_status.json ({name: {status, reason, ...}}),
        under a lock, replaced atomically: the verify scripts may run side by side. --run stamps
        the verdict with the run that asked for it (the pipeline's preflight checks the stamp).

The plan JSON comes from `python -m connector_tax.commands.for_tools plan`. Never imports
connector_tax; only talks to the address in the plan (the launch binds 127.0.0.1).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class CheckFailed(Exception):
    pass


# The FAIL reason of a server that died before /health answered; the shell adds its root cause.
EXITED_AT_START = "server process exited during start-up"
# vLLM's line when its engine core dies during start-up; the server usually exits a moment later,
# but vLLM 0.32 on CPU sometimes hangs instead (the Mooncake worker's shutdown raises). Seen in
# --server-log with the server still up ENGINE_FAILED_GRACE_S later: the start failed. The same
# marker as connector_tax.serving.server_process.ENGINE_FAILED (this file imports no connector_tax).
ENGINE_FAILED = "EngineCore failed to start"
ENGINE_FAILED_GRACE_S = 20.0
HUNG_AT_START = "engine core failed during start-up (the server hung instead of exiting)"


def engine_failed(server_log: str | None) -> bool:
    if not server_log:
        return False
    try:
        with open(server_log, "rb") as fh:
            return ENGINE_FAILED.encode() in fh.read()
    except OSError:
        return False


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child its parent has not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def http(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Log:
    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def __call__(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        self.fh.write(f"[{stamp}] {message}\n")
        self.fh.flush()


def wait_ready(
    url: str, pid: int, timeout: float, log: Log, server_log: str | None = None, grace: float = ENGINE_FAILED_GRACE_S
) -> float:
    start = time.monotonic()
    last = None
    failed_at = None
    while True:
        if not alive(pid):
            # the cause is vLLM's, read from its log by the package (verify_reason in
            # _verify_lib.sh): one reader of server logs for every path that reports a SKIP
            raise CheckFailed(EXITED_AT_START)
        if failed_at is None and engine_failed(server_log):
            failed_at = time.monotonic()
            log(f"the server log says {ENGINE_FAILED!r}; waiting {grace:.0f} s for the server to exit")
        if failed_at is not None and time.monotonic() - failed_at > grace:
            raise CheckFailed(HUNG_AT_START)
        try:
            status, _ = http("GET", url + "/health", timeout=5)
            if status == 200:
                elapsed = time.monotonic() - start
                log(f"ready: /health 200 after {elapsed:.1f} s")
                return elapsed
            last = f"/health {status}"
        except (OSError, urllib.error.URLError) as exc:
            last = f"/health: {getattr(exc, 'reason', exc)}"
        if time.monotonic() - start > timeout:
            raise CheckFailed(f"not ready within {timeout:.0f} s (last: {last})")
        time.sleep(1.0)


def check_models(url: str, model: str, log: Log) -> None:
    status, body = http("GET", url + "/v1/models")
    if status != 200:
        raise CheckFailed(f"/v1/models answered {status}")
    try:
        ids = [m["id"] for m in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError):
        raise CheckFailed("/v1/models answered 200 with no model list") from None
    if model not in ids:
        raise CheckFailed(f"/v1/models lists {ids}, not {model!r}")
    log(f"/v1/models 200, lists {model}")


def request_body(plan: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """One short request with random content (no prefix-cache reuse between requests)."""
    text = f"{uuid.uuid4()} Write one sentence about the number {uuid.uuid4().int % 997}."
    common = {
        "model": plan["model"],
        "max_tokens": plan["max_tokens"],
        "temperature": 0,
        "ignore_eos": True,
    }
    if plan.get("endpoint") == "chat":
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {**common, "prompt": text}


def send_requests(plan: dict[str, Any], pid: int, log: Log, per_request_timeout: float) -> float:
    url = plan["url"]
    budget = float(plan["budget_s"])
    start = time.monotonic()
    for i in range(int(plan["requests"])):
        left = budget - (time.monotonic() - start)
        if left <= 0:
            raise CheckFailed(f"{i} of {plan['requests']} requests done when {budget:.0f} s ran out")
        path, body = request_body(plan)
        t0 = time.monotonic()
        try:
            status, raw = http("POST", url + path, body, timeout=min(left, per_request_timeout))
        except (OSError, urllib.error.URLError) as exc:
            alive_now = alive(pid)
            raise CheckFailed(
                f"request {i + 1}: {getattr(exc, 'reason', exc)}" + ("" if alive_now else " (server process is gone)")
            ) from None
        if status != 200:
            raise CheckFailed(f"request {i + 1}: HTTP {status}: {raw[:200].decode(errors='replace')}")
        try:
            choices = json.loads(raw)["choices"]
            assert choices
        except (ValueError, KeyError, TypeError, AssertionError):
            raise CheckFailed(f"request {i + 1}: 200 without choices") from None
        log(f"request {i + 1}/{plan['requests']}: 200 in {time.monotonic() - t0:.2f} s")
    total = time.monotonic() - start
    if total > budget:
        raise CheckFailed(f"{plan['requests']} requests took {total:.1f} s (limit {budget:.0f} s)")
    log(f"{plan['requests']} request(s) done in {total:.2f} s (limit {budget:.0f} s)")
    return total


def check_alive(url: str, pid: int, log: Log) -> None:
    if not alive(pid):
        raise CheckFailed("server process exited after the requests")
    try:
        status, _ = http("GET", url + "/health", timeout=10)
    except (OSError, urllib.error.URLError) as exc:
        raise CheckFailed(f"/health after the requests: {getattr(exc, 'reason', exc)}") from None
    if status != 200:
        raise CheckFailed(f"/health answered {status} after the requests (engine dead)")
    log("after the requests: /health 200, server process alive")


def cmd_check(args: argparse.Namespace) -> int:
    plan = json.loads(Path(args.plan).read_text(encoding="utf-8"))
    log = Log(args.log)
    log(f"check {plan['check']} of {plan['name']} at {plan['url']} (pid {args.pid})")
    try:
        wait_ready(plan["url"], args.pid, args.start_timeout, log, args.server_log)
        check_models(plan["url"], plan["model"], log)
        send_requests(plan, args.pid, log, args.request_timeout)
        check_alive(plan["url"], args.pid, log)
    except CheckFailed as exc:
        log(f"FAIL: {exc}")
        print(f"FAIL: {exc}")
        return 1
    log("OK")
    print("OK")
    return 0


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def record_status(
    path: Path, config: str, status: str, reason: str, check: str | None, log: str | None, run: str | None = None
) -> dict[str, Any]:
    with locked(path):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        entry: dict[str, Any] = {"status": status, "reason": reason}
        if check:
            entry["check"] = check
        if log:
            entry["log"] = log
        if run:
            entry["run"] = run
        entry["checked_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        data[config] = entry
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    return data


def cmd_record(args: argparse.Namespace) -> int:
    record_status(Path(args.file), args.config, args.status, args.reason, args.check, args.log, args.run)
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="preflight_client.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check")
    p.add_argument("--plan", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--start-timeout", type=_positive, default=1200.0)
    p.add_argument("--server-log", help="the server's output: a start-up failure there ends the wait")
    p.add_argument("--request-timeout", type=_positive, default=120.0)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("record")
    p.add_argument("--file", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--status", required=True, choices=["ok", "skip"])
    p.add_argument("--reason", required=True)
    p.add_argument("--check")
    p.add_argument("--log")
    p.add_argument("--run", help="the run that asked for this verdict: written back as its stamp")
    p.set_defaults(func=cmd_record)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (OSError, ValueError) as exc:
        print(f"preflight_client.py {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
