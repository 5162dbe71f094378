"""URLs as curl reads them: no scheme, IPv6 literals, paths, default ports, https; each bad URL form as
one line naming --url, and an unset --api-key-env as one line. Against real servers through `ctax
bench` (TLS, IPv6, the bearer key): tests/e2e/test_loadgen_urls_served.py."""

from __future__ import annotations

import pytest

from connector_tax.cli import main as ctax_main
from connector_tax.loadgen.worker.urls import parse_url


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
