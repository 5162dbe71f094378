"""A stand-in for vLLM 0.33's Mooncake bootstrap server, for the kv_consumer pre-flight.

What vLLM 0.33's MooncakeConnector talks to (vllm/distributed/kv_transfer/kv_connector/v1/
mooncake/mooncake_connector.py and mooncake_utils.py):

* A producer (kv_producer, kv_both) starts MooncakeBootstrapServer, an HTTP registry, on its
  TP0/PP0 worker at 0.0.0.0:$VLLM_MOONCAKE_BOOTSTRAP_PORT (8998), unless
  kv_connector_extra_config.bootstrap_server_address names an external one. Each producer
  worker then POSTs /register {engine_id, dp_rank, tp_rank, pp_rank, addr} (addr is its ZMQ
  side channel, tcp://host:port).
* A consumer (kv_consumer) starts no server and registers nowhere. Only a request whose
  kv_transfer_params say do_remote_prefill makes it GET <remote_bootstrap_addr>/query (the
  address comes in the request), then pull KV from the producer worker's ZMQ side channel.
  A request without kv_transfer_params is prefilled locally and touches no network.

So a kv_consumer needs nothing to start or to serve a plain request; this server exists for the
kv_consumer pre-flight check (started first, and its request log shows whether the consumer contacted
it: it should not) and as a minimal registry that speaks the same two routes: a producer can be
pointed at it with bootstrap_server_address, and /query answers as vLLM's does.

Standard library only; binds 127.0.0.1 unless told otherwise. Each request it serves is one
JSON line on stdout (or --log).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REGISTER_FIELDS = {"engine_id": str, "dp_rank": int, "tp_rank": int, "pp_rank": int, "addr": str}


class Registry:
    """The same bookkeeping as MooncakeBootstrapServer: {dp_rank: {engine_id, worker_addr:
    {tp_rank: {pp_rank: addr}}}}, with the same conflict rules."""

    def __init__(self) -> None:
        self.workers: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def register(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        for key, kind in REGISTER_FIELDS.items():
            value = payload.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                return HTTPStatus.UNPROCESSABLE_ENTITY, {"detail": f"{key}: expected {kind.__name__}, got {value!r}"}
        with self._lock:
            entry = self.workers.setdefault(payload["dp_rank"], {"engine_id": payload["engine_id"], "worker_addr": {}})
            if entry["engine_id"] != payload["engine_id"]:
                return HTTPStatus.BAD_REQUEST, {
                    "detail": (
                        f"Engine ID mismatch for dp_rank={payload['dp_rank']}: "
                        f"expected {entry['engine_id']}, got {payload['engine_id']}"
                    )
                }
            tp_entry = entry["worker_addr"].setdefault(payload["tp_rank"], {})
            existing = tp_entry.get(payload["pp_rank"])
            if existing is not None and existing != payload["addr"]:
                return HTTPStatus.BAD_REQUEST, {
                    "detail": (
                        f"Worker with dp_rank={payload['dp_rank']}, tp_rank={payload['tp_rank']}, "
                        f"pp_rank={payload['pp_rank']} is already registered at {existing}, "
                        f"but still want to register at {payload['addr']}"
                    )
                }
            tp_entry[payload["pp_rank"]] = payload["addr"]
        return HTTPStatus.OK, {"status": "ok"}

    def query(self) -> dict[str, Any]:
        with self._lock:  # JSON object keys are strings, as FastAPI renders int keys
            return json.loads(json.dumps(self.workers))


class BootstrapServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], log: Any) -> None:
        super().__init__(address, _Handler)
        self.registry = Registry()
        self.log = log
        self.requests_served = 0
        self._log_lock = threading.Lock()

    def note(self, method: str, path: str, status: int) -> None:
        line = json.dumps({"t_ns": time.monotonic_ns(), "method": method, "path": path, "status": status})
        with self._log_lock:
            self.requests_served += 1
            self.log.write(line + "\n")
            self.log.flush()


class _Handler(BaseHTTPRequestHandler):
    server: BootstrapServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        return  # one JSON line per request instead (BootstrapServer.note)

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        # Logged before the reply goes out, so a client that has its answer also sees the line.
        self.server.note(self.command, self.path, int(status))
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if self.path == "/query":
            self._reply(HTTPStatus.OK, self.server.registry.query())
        elif self.path == "/health":
            self._reply(HTTPStatus.OK, {"status": "ok"})
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/register":
            self._reply(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})
            return
        try:
            length = int(self.headers.get("content-length") or 0)
            payload = json.loads(self.rfile.read(length) or b"null")
        except (ValueError, json.JSONDecodeError):
            self._reply(HTTPStatus.UNPROCESSABLE_ENTITY, {"detail": "body is not JSON"})
            return
        if not isinstance(payload, dict):
            self._reply(HTTPStatus.UNPROCESSABLE_ENTITY, {"detail": "body is not an object"})
            return
        status, body = self.server.registry.register(payload)
        self._reply(status, body)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0-65535; 0 picks a free one)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dummy_bootstrap.py",
        description="A minimal Mooncake bootstrap server (POST /register, GET /query).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8998, help="port (default 8998, vLLM's; 0 picks a free one)")
    parser.add_argument("--log", metavar="PATH", help="append one JSON line per request here")
    parser.add_argument("--ready-file", metavar="PATH", help="write the bound port here once serving")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log = open(args.log, "a", encoding="utf-8") if args.log else sys.stdout  # noqa: SIM115
    try:
        server = BootstrapServer((args.host, args.port), log)
    except OSError as exc:
        print(f"dummy_bootstrap.py: --port {args.port}: cannot bind {args.host}: {exc.strerror}", file=sys.stderr)
        return 2
    port = server.server_address[1]

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"dummy_bootstrap: serving on http://{args.host}:{port}", file=sys.stderr, flush=True)
    if args.ready_file:
        tmp = f"{args.ready_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(f"{port}\n")
        os.replace(tmp, args.ready_file)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        print(
            f"dummy_bootstrap: stopped after {server.requests_served} request(s)",
            file=sys.stderr,
            flush=True,
        )
        if log is not sys.stdout:
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
