"""tools/dummy_bootstrap.py: the stand-in for vLLM 0.33's Mooncake bootstrap server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.dummy_bootstrap import BootstrapServer, Registry  # noqa: E402


def call(url: str, method: str = "GET", body: object = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture()
def server(tmp_path):
    log = (tmp_path / "log.jsonl").open("a")
    srv = BootstrapServer(("127.0.0.1", 0), log)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", srv, tmp_path / "log.jsonl"
    srv.shutdown()
    srv.server_close()
    log.close()


def payload(**kw):
    base = {"engine_id": "e1", "dp_rank": 0, "tp_rank": 0, "pp_rank": 0, "addr": "tcp://127.0.0.1:5000"}
    return {**base, **kw}


def test_register_and_query_like_vllms_server(server):
    url, srv, log = server
    assert call(url + "/query") == (200, {})
    assert call(url + "/register", "POST", payload()) == (200, {"status": "ok"})
    assert call(url + "/register", "POST", payload()) == (200, {"status": "ok"})  # retry is fine
    assert call(url + "/register", "POST", payload(tp_rank=1, addr="tcp://h:2")) == (200, {"status": "ok"})
    status, body = call(url + "/query")
    assert status == 200
    assert body == {
        "0": {"engine_id": "e1", "worker_addr": {"0": {"0": "tcp://127.0.0.1:5000"}, "1": {"0": "tcp://h:2"}}}
    }
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["method"], x["path"], x["status"]) for x in lines][:2] == [
        ("GET", "/query", 200),
        ("POST", "/register", 200),
    ]
    assert srv.requests_served == len(lines)


def test_conflicts_and_bad_bodies(server):
    url, _, _ = server
    call(url + "/register", "POST", payload())
    status, body = call(url + "/register", "POST", payload(engine_id="other"))
    assert status == 400 and "Engine ID mismatch" in body["detail"]
    status, body = call(url + "/register", "POST", payload(addr="tcp://elsewhere:1"))
    assert status == 400 and "already registered" in body["detail"]
    status, body = call(url + "/register", "POST", {"engine_id": "e1"})
    assert status == 422 and body["detail"].startswith("dp_rank:")
    assert call(url + "/nope")[0] == 404


def test_registry_rejects_bool_ranks():
    status, body = Registry().register(payload(dp_rank=True))
    assert status == 422


def test_command_line_binds_loopback_and_writes_the_ready_file(tmp_path):
    ready = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tools" / "dummy_bootstrap.py"),
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--log",
            str(tmp_path / "log.jsonl"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(1200):  # a bail-out of 60 s: a Python start on a loaded host takes seconds
            if ready.exists():
                break
            time.sleep(0.05)
        port = int(ready.read_text())
        assert call(f"http://127.0.0.1:{port}/health") == (200, {"status": "ok"})
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert f"serving on http://127.0.0.1:{port}" in err and "stopped after 1 request(s)" in err


@pytest.mark.parametrize("args, message", [(["--port", "70000"], "--port"), (["--port", "x"], "--port")])
def test_bad_arguments_exit_2(args, message):
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "dummy_bootstrap.py"), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and message in done.stderr
