"""A stand-in for the LMCache MP server beside a simulated lmcache_mp variant (simulated).

    python -m connector_tax.sim.lmcache_server --host H --port P --http-port Q
        [--fail-start REASON] [--never-ready] [--crash-after-s S]

It binds what the real server binds (a request port P, here a plain TCP listener, and an HTTP
frontend at Q answering /healthcheck and /status as LMCache's does), so that a simulated study
runs the sidecar's whole lifecycle (ports, readiness, per-thread CPU, stop, faults) without
LMCache. It stores nothing: the simulator models a connector's cost, not its transfers. Faults
(sim.faults.sidecar_*): exit at start with a reason, never answer /healthcheck, or exit a while
after its first healthy answer. Standard library only, and the package's one number parser
(connector_tax.arguments, itself standard library only).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from connector_tax.arguments import number


def _handler(ready: threading.Event, seen: threading.Event) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body: dict[str, object]
            if self.path == "/healthcheck" and ready.is_set():
                code, body = 200, {"status": "healthy"}
                seen.set()
            elif self.path == "/status" and ready.is_set():
                code, body = 200, {"is_healthy": True, "engine_type": "simulated"}
            else:
                code, body = 503, {"status": "unhealthy", "reason": "not ready"}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connector_tax.sim.lmcache_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=number(int, 0, 65535), required=True)
    parser.add_argument("--http-port", type=number(int, 0, 65535), required=True)
    parser.add_argument("--fail-start", metavar="REASON")
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--crash-after-s", type=number(float, 0))
    args = parser.parse_args(argv)
    if args.fail_start:
        print(f"RuntimeError: {args.fail_start}", file=sys.stderr, flush=True)
        return 1
    listener = socket.create_server((args.host, args.port))  # the request port: taken, or the start fails
    ready, seen = threading.Event(), threading.Event()  # seen: its owner has been told it is ready
    http = ThreadingHTTPServer((args.host, args.http_port), _handler(ready, seen))
    threading.Thread(target=http.serve_forever, name="sidecar-http", daemon=True).start()
    print(f"simulated LMCache MP server on {args.host}:{args.port} (HTTP {args.http_port})", flush=True)
    if not args.never_ready:
        ready.set()
    try:
        if args.crash_after_s is not None:
            # Counted from the first healthy answer, not from the start: on a loaded host the
            # owner's first readiness poll may come later than S, and the fault would hit the
            # start instead of the running server.
            seen.wait()
            time.sleep(args.crash_after_s)
            print("RuntimeError: simulated LMCache server crash (sim.faults.sidecar_crash_after_s)", file=sys.stderr)
            return 1
        while True:
            time.sleep(3600)
    finally:
        http.server_close()
        listener.close()


if __name__ == "__main__":
    sys.exit(main())
