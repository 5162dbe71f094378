"""URLs as curl reads them, end to end through `ctax bench`: no scheme, IPv6 literals, paths,
default ports, https (standard-library TLS, verified against a CA file or --insecure), and
`--api-key-env` sent as a bearer token; and each bad URL form as one line naming --url."""

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

from connector_tax.cli import main as ctax_main
from connector_tax.loadgen.worker.urls import parse_url

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "benchmarks" / "_sse_bench_server.py"


@pytest.mark.parametrize(
    ("url", "endpoint", "want"),
    [
        ("http://127.0.0.1:8000", "completions", ("http", "127.0.0.1", 8000, "127.0.0.1:8000", "/v1/completions")),
        ("localhost:8000", "completions", ("http", "localhost", 8000, "localhost:8000", "/v1/completions")),
        ("127.0.0.1", "chat", ("http", "127.0.0.1", 80, "127.0.0.1", "/v1/chat/completions")),
        (
            "https://api.example.com",
            "completions",
            ("https", "api.example.com", 443, "api.example.com", "/v1/completions"),
        ),
        ("https://h:8443/v1", "chat", ("https", "h", 8443, "h:8443", "/v1/chat/completions")),
        ("http://[::1]:8000/", "completions", ("http", "::1", 8000, "[::1]:8000", "/v1/completions")),
        ("[::1]:9", "completions", ("http", "::1", 9, "[::1]:9", "/v1/completions")),
        ("http://[::1]", "completions", ("http", "::1", 80, "[::1]", "/v1/completions")),
        ("http://h:80/proxy/vllm", "completions", ("http", "h", 80, "h", "/proxy/vllm/v1/completions")),
        ("http://h/v1/completions?x=1#frag", "chat", ("http", "h", 80, "h", "/v1/completions?x=1")),
        ("HTTP://H:1", "completions", ("http", "h", 1, "h:1", "/v1/completions")),
    ],
)
def test_parse_url_reads_like_curl(url: str, endpoint: str, want: tuple) -> None:
    t = parse_url(url, endpoint)
    assert (t.scheme, t.host, t.port, t.host_header, t.path) == want


BAD_URLS = {
    "ftp://h:21": "ctax bench: argument --url: 'ftp://h:21': scheme 'ftp' is not supported (http or https)",
    "http://h:99999": "ctax bench: argument --url: 'http://h:99999': port '99999' is not a number in 1-65535",
    "h:abc": "ctax bench: argument --url: 'h:abc': port 'abc' is not a number in 1-65535",
    "http://h:0": "ctax bench: argument --url: 'http://h:0': port 0 is not in 1-65535",
    "http://:8000": "ctax bench: argument --url: 'http://:8000': no host",
    "http://h:": "ctax bench: argument --url: 'http://h:': empty port",
    "http://[zz]:1": "ctax bench: argument --url: 'http://[zz]:1': 'zz' does not appear to be an IPv4 or IPv6 address",
    "http://[1.2.3.4]:1": "ctax bench: argument --url: 'http://[1.2.3.4]:1': An IPv4 address cannot be in brackets",
    "http://u:p@h:1": "ctax bench: argument --url: 'http://u:p@h:1': credentials in the URL are not supported (use --api-key-env)",
    "": "ctax bench: argument --url: empty URL",
}


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        rc = ctax_main(["bench", "--model", "m", *argv])
    except SystemExit as exc:
        rc = exc.code
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("url", list(BAD_URLS))
def test_bad_url_is_one_line_naming_the_flag(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _one_line_error(["--url", url], capsys) == BAD_URLS[url]


def test_unset_api_key_env_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CTAX_TEST_NO_SUCH_KEY", raising=False)
    line = _one_line_error(["--url", "http://127.0.0.1:9", "--api-key-env", "CTAX_TEST_NO_SUCH_KEY"], capsys)
    assert line == "ctax bench: --api-key-env: environment variable 'CTAX_TEST_NO_SUCH_KEY' is not set"
    line = _one_line_error(["--url", "http://127.0.0.1:9", "--api-key-env", "1BAD"], capsys)
    assert line == "ctax bench: argument --api-key-env: '1BAD' is not an environment variable name"
    line = _one_line_error(["--url", "https://127.0.0.1:9", "--cacert", "/no/such.pem"], capsys)
    assert line == "ctax bench: argument --cacert: '/no/such.pem' is not a file"


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


TIMING_CHECKS = ("lateness", "dispatch_rate_error", "cpu_frac", "issue_overrun", "unissued")


def ran(proc: subprocess.CompletedProcess) -> bool:
    """The run measured: exit 0, or 1 with its cell invalid only for its timing (a busy host's doing)."""
    if proc.returncode == 0:
        return True
    reasons = proc.stdout.rpartition("[INVALID: ")[2].rstrip("]\n").split("; ")
    return proc.returncode == 1 and all(r.startswith(TIMING_CHECKS) for r in reasons)


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
