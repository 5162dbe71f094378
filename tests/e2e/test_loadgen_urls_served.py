"""URLs as curl reads them, end to end through `ctax bench` against real servers: no scheme, a path and
an IPv6 literal; https (standard-library TLS, verified against a CA file or --insecure) with `--api-
key-env` sent as a bearer token."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sim_server import ran

REPO = Path(__file__).resolve().parents[2]


SERVER = REPO / "benchmarks" / "_sse_bench_server.py"


# -- end to end against the benchmark's SSE server -----------------------------------------------
@contextmanager
def bench_server(tmp: Path, *extra: str, host: str = "127.0.0.1") -> Iterator[tuple[str, Path]]:
    log = tmp / f"server-{len(list(tmp.glob('server-*')))}.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--host", host, "--port", "0", "--log", str(log), *extra],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("ready "), line
        yield line.split()[1], log
    finally:
        proc.terminate()
        proc.wait(10)


def bench(url: str, out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "connector_tax.cli",
        "bench",
        "--url",
        url,
        "--model",
        "m",
        "--rate",
        "20",
        "--duration",
        "0.5",
        "--warmup",
        "0",
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--no-affinity",
        "--cpu-latency-us",
        "off",
        "--phase",
        "u",
        "--out",
        str(out),
        *extra,
    ]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)  # a bail-out


def _records(out: Path) -> list[dict]:
    (path,) = out.glob("requests_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def _served(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.e2e  # real servers (TLS, IPv6) and requests: seconds each
def test_no_scheme_path_and_ipv6_end_to_end(tmp_path: Path) -> None:
    with bench_server(tmp_path) as (url, log):
        port = url.rsplit(":", 1)[1]
        proc = bench(f"127.0.0.1:{port}/base", tmp_path / "a")
        assert ran(proc), proc.stdout + proc.stderr
        assert all(r["status"] == "ok" and r["completion_tokens"] == 4 for r in _records(tmp_path / "a"))
    assert {e["path"] for e in _served(log)} == {"/base/v1/completions"}  # flushed at its exit
    try:
        ctx = bench_server(tmp_path, host="::1")
        url, log = ctx.__enter__()
    except AssertionError:
        pytest.skip("no IPv6 loopback here")
    try:
        port = url.rsplit(":", 1)[1]
        proc = bench(f"[::1]:{port}/v1", tmp_path / "b", "--endpoint", "chat")
        assert ran(proc), proc.stdout + proc.stderr
        records = _records(tmp_path / "b")
        assert records and all(r["status"] == "ok" and r["chunks"] == 4 for r in records)
    finally:
        ctx.__exit__(None, None, None)
    assert {e["path"] for e in _served(log)} == {"/v1/chat/completions"}


@pytest.mark.e2e  # real servers (TLS, IPv6) and requests: seconds each
def test_https_with_ca_file_or_insecure_and_bearer_key(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: no certificate to serve https with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=300,  # a bail-out
    )
    env = dict(os.environ, CTAX_TEST_KEY="s3cret")
    with bench_server(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), "--api-key", "s3cret") as (url, log):
        assert url.startswith("https://")
        port = url.rsplit(":", 1)[1]
        ok = bench(
            f"https://localhost:{port}",
            tmp_path / "ok",
            "--cacert",
            str(cert),
            "--api-key-env",
            "CTAX_TEST_KEY",
            env=env,
        )
        assert ran(ok), ok.stdout + ok.stderr
        assert all(r["status"] == "ok" and r["completion_tokens"] == 4 for r in _records(tmp_path / "ok"))
        insecure = bench(url, tmp_path / "k", "--insecure", "--api-key-env", "CTAX_TEST_KEY", env=env)
        assert ran(insecure) and all(r["status"] == "ok" for r in _records(tmp_path / "k"))
        # Verified by default: a self-signed certificate is one line before anything is measured.
        unverified = bench(url, tmp_path / "v", "--api-key-env", "CTAX_TEST_KEY", env=env)
        assert (unverified.returncode, unverified.stdout) == (2, "")
        line = unverified.stderr.strip()
        assert line.startswith(f"ctax bench: --url: TLS to {url} failed: [SSL: CERTIFICATE_VERIFY_FAILED]"), line
        assert line.endswith("(--cacert FILE, or --insecure)") and "\n" not in line
        # Without the key: the server's 401, with its message, in one line.
        nokey = bench(f"https://localhost:{port}", tmp_path / "n", "--cacert", str(cert))
        assert (nokey.returncode, nokey.stderr) == (
            2,
            f"ctax bench: --api-key-env: https://localhost:{port}/v1/completions answered 401 to a one-token "
            "request: bad api key\n",
        )
    assert _served(log) and all(e["auth_ok"] for e in _served(log))
