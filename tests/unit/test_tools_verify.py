"""tools/verify_*.sh, tools/gpu_smoke.sh and tools/preflight_client.py without a server: the status
file's concurrent writers, one-line bad arguments, the root cause taken from vLLM's own error, the
stand-in vllm executable's template. Against live servers: tests/e2e/test_tools_verify_servers.py."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import yaml

from connector_tax.config import load_config

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import preflight_client  # noqa: E402


def script_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CONNECTOR_TAX_STEP_LOG")}
    env["CTAX_PYTHON"] = sys.executable
    env["GPU_SMOKE_SETTLE_S"] = "0"
    return env


def run_script(name: str, *args: str, env: dict | None = None, timeout: int = 120):
    return subprocess.run(
        ["bash", str(TOOLS / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or script_env(),
    )


def write_config(tmp_path: Path, mutate) -> Path:
    config = yaml.safe_load((REPO / "configs" / "test-tiny.yaml").read_text())
    config = copy.deepcopy(config)
    mutate(config)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    load_config(path)  # valid
    return path


# --------------------------------------------------------------------------- verify scripts


def test_verify_with_no_gated_config_says_so(tmp_path):
    def mutate(config):
        config["variants"] = [c for c in config["variants"] if c["name"] != "noop_connector"]
        config["workload"]["phase_b_prime"]["variants"] = ["plain"]

    path = write_config(tmp_path, mutate)
    done = run_script("verify_noop_connector.sh", path, tmp_path / "o")
    assert done.returncode == 0
    assert "no configuration of" in done.stdout and "needs the noop_connector check" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "usage: verify_noop_connector.sh CONFIG OUT_DIR"),
        (["nope.yaml", "o"], "CONFIG: nope.yaml: no such file"),
        (["{config}", "o", "--port", "x1"], "--port: 'x1' is not a port number"),
        (["{config}", "o", "--bogus"], "unknown argument: --bogus"),
        (["{config}", "o", "--only", "nope"], "no variant named 'nope'"),
        (["{config}", "o", "--run", "a b"], "--run: 'a b' is not an ID (letters, digits, . _ -)"),
        (["{config}", "o", "--run"], "--run needs an ID"),
    ],
)
def test_verify_bad_arguments_exit_2_with_one_line(tmp_path, args, message):
    config = str(REPO / "configs" / "test-tiny.yaml")
    args = [a.replace("{config}", config) for a in args]
    done = subprocess.run(
        ["bash", str(TOOLS / "verify_noop_connector.sh"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=script_env(),
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_status_file_merges_concurrent_writers(tmp_path):
    path = tmp_path / "preflight_status.json"
    threads = [
        threading.Thread(
            target=preflight_client.record_status,
            args=(path, f"c{i}", "ok" if i % 2 else "skip", f"r{i}", None, None),
        )
        for i in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = json.loads(path.read_text())
    assert sorted(data) == sorted(f"c{i}" for i in range(16))
    assert data["c3"] == {"status": "ok", "reason": "r3", "checked_at": data["c3"]["checked_at"]}


def test_a_verdict_is_stamped_with_the_run_that_asked_for_it(tmp_path):
    """`record --run ID` writes the ID back into the verdict (the pipeline's preflight takes only
    its own run's); without --run the verdict has no stamp, and a later record replaces it whole."""
    path = tmp_path / "preflight_status.json"
    record = [sys.executable, str(TOOLS / "preflight_client.py"), "record", "--file", str(path), "--config", "c"]
    subprocess.run([*record, "--status", "ok", "--reason", "passed"], check=True, timeout=60)
    assert "run" not in json.loads(path.read_text())["c"]
    subprocess.run([*record, "--status", "skip", "--reason", "r", "--run", "run-2"], check=True, timeout=60)
    assert json.loads(path.read_text())["c"] == {
        "status": "skip",
        "reason": "r",
        "run": "run-2",
        "checked_at": json.loads(path.read_text())["c"]["checked_at"],
    }


def test_root_cause_prefers_vllms_own_error_to_the_last_line(tmp_path):
    """What the verify scripts and gpu_smoke.sh ask for a server that died while starting: the
    engine's root cause above vLLM's generic last words (as vLLM 0.32 on CPU prints them)."""
    log = tmp_path / "server.log"
    log.write_text(
        "(Worker pid=1) ERROR [mooncake_connector.py:1179] Mooncake is not available\n"
        "(Worker pid=1) ERROR RuntimeError: Mooncake is not available\nTraceback (most recent call last):\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
        "UserWarning: resource_tracker: There appear to be 1 leaked shared_memory objects\n"
    )
    cli = [sys.executable, "-m", "connector_tax.commands.for_tools", "root-cause"]
    done = subprocess.run([*cli, str(log)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "Mooncake is not available\n"), done.stderr
    log.write_text(
        "INFO starting\nTraceback (most recent call last):\n  File x\n"
        "ModuleNotFoundError: No module named 'lmcache'\nINFO exiting\n"
    )
    done = subprocess.run([*cli, str(log)], capture_output=True, text=True, timeout=60)
    assert done.stdout == "No module named 'lmcache'\n"
    done = subprocess.run([*cli, str(tmp_path / "absent.log")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "SERVER_LOG:" in done.stderr


# --------------------------------------------------------------------------- GPU smoke test

FAKE_VLLM_EXECUTABLE = """\
#!{python}
# A stand-in for `vllm serve` on a machine without a GPU: serves the OpenAI routes the smoke
# test uses and runs a fake vLLM engine (importable as `vllm`) one step per output token, so the
# real instrumentation, loaded by sitecustomize from the launch's PYTHONPATH, writes records.
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, {fake_pkg!r})
args = sys.argv[1:]
assert args[0] == "serve"
model, host, port = args[1], args[args.index("--host") + 1], int(args[args.index("--port") + 1])
ktc = args[args.index("--kv-transfer-config") + 1] if "--kv-transfer-config" in args else ""
if "LMCacheConnectorV1" in ktc:
    print("ModuleNotFoundError: No module named 'lmcache'", file=sys.stderr)
    sys.exit(1)
if "NixlConnector" in ktc:
    print("RuntimeError: NIXL agent failed to initialise", file=sys.stderr)
    sys.exit(1)
if "kv_producer" in ktc:  # vLLM 0.33's words when mooncake is not installed
    print("(EngineCore pid=9) ERROR Mooncake is not available", file=sys.stderr)
    print("RuntimeError: Engine core initialization failed. See root cause above.", file=sys.stderr)
    sys.exit(1)
import vllm.v1.engine.core as core
engine = core.EngineCore()

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health": self.reply({{}})
        elif self.path == "/v1/models": self.reply({{"data": [{{"id": model}}]}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        for _ in range(body["max_tokens"]):
            engine.step_fn()
        self.reply({{"choices": [{{"text": "x"}}]}})

ThreadingHTTPServer((host, port), H).serve_forever()
"""


def test_gpu_smoke_bad_arguments(tmp_path):
    done = run_script("gpu_smoke.sh", "--mooncake-protocol", "udp")
    assert done.returncode == 2 and "--mooncake-protocol: 'udp' is not tcp or rdma" in done.stderr
    done = run_script("gpu_smoke.sh", "--config", tmp_path / "none.yaml")
    assert done.returncode == 2 and "no such file" in done.stderr


def test_fake_executable_template_is_valid_python(tmp_path):
    text = FAKE_VLLM_EXECUTABLE.format(python=sys.executable, fake_pkg=str(tmp_path))
    compile(textwrap.dedent(text), "vllm", "exec")
