"""Before a cell is measured: does anything answer at the URL, with the model and the endpoint the
run asks for? One line that says what is wrong when not (`ServerProblem`), instead of a cell of
errors, or of nothing, that looks measured.

Off the hot path: plain httpx requests, each bounded by a timeout, from the main process before the
workers start. The same client asks the server to count prompts (sizing.py).
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from connector_tax.loadgen.options import LoadgenOptions
from connector_tax.loadgen.urls import parse_url

PROBE_TIMEOUT_S = 30.0  # a first request may wait for a cold engine's first step
MESSAGE_CHARS = 300  # of a server's error, in the one line


class ServerProblem(Exception):
    """What stops a run before it starts, in one line (the flag it concerns first)."""


class Api:
    """The server's OpenAI API as the run addresses it: its endpoint, its model list, its root
    (where vLLM's /tokenize is), one httpx client with the run's TLS and key."""

    def __init__(self, options: LoadgenOptions) -> None:
        self.options = options
        target = parse_url(options.url, options.endpoint)
        host = f"[{target.host}]" if ":" in target.host else target.host
        self.origin = f"{target.scheme}://{host}:{target.port}"
        path, _, query = target.path.partition("?")
        self.query = f"?{query}" if query else ""
        self.endpoint_url = self.origin + target.path
        # The base the endpoint hangs off (".../v1"): /models beside it; the root above it.
        base = path.removesuffix("/chat/completions") if path.endswith("/chat/completions") else path
        base = base.removesuffix("/completions")
        self.models_url = self.origin + base + "/models" + self.query
        self.root_url = self.origin + base.removesuffix("/v1")
        headers = {}
        if options.api_key_env:
            headers["Authorization"] = f"Bearer {os.environ.get(options.api_key_env, '')}"
        verify: Any = options.tls_ca_file or options.tls_verify
        self.client = httpx.Client(headers=headers, verify=verify, timeout=PROBE_TIMEOUT_S, trust_env=False)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def post(self, url: str, body: dict[str, Any]) -> httpx.Response:
        return self._send("POST", url, body)

    def get(self, url: str) -> httpx.Response:
        return self._send("GET", url, None)

    def _send(self, method: str, url: str, body: dict[str, Any] | None) -> httpx.Response:
        try:
            return self.client.request(method, url, json=body)
        except httpx.ConnectError as exc:
            raise ServerProblem(f"--url: nothing answers at {self.origin} ({_reason(exc)})") from None
        except httpx.TimeoutException:
            raise ServerProblem(f"--url: {url} did not answer within {PROBE_TIMEOUT_S:g} s") from None
        except httpx.HTTPError as exc:
            raise ServerProblem(f"--url: {url}: {_reason(exc)}") from None

    def generate(self, text: str, max_tokens: int = 1) -> httpx.Response:
        """One small request at the run's endpoint, not streamed: what the server counts and says."""
        body: dict[str, Any] = {"model": self.options.model, "max_tokens": max_tokens, "temperature": 0}
        if self.options.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        return self.post(self.endpoint_url, body)


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if "refused" in text.lower():
        return "connection refused"
    return text.splitlines()[0][:MESSAGE_CHARS]


def error_message(response: httpx.Response) -> str:
    """The server's own words: an OpenAI error's message, else the body's start."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error", data)
        message = err.get("message") if isinstance(err, dict) else err
        if message:
            return " ".join(str(message).split())[:MESSAGE_CHARS]
        if data.get("detail"):
            return " ".join(str(data["detail"]).split())[:MESSAGE_CHARS]
    return " ".join(response.text.split())[:MESSAGE_CHARS] or "(empty body)"


def check_server(api: Api) -> dict[str, Any]:
    """ServerProblem when the run cannot measure: nothing listens, no API at that path, a model the
    server does not serve, an endpoint that refuses a one-token request. Else what was learnt:
    the served models (when listed) and whether the server reports usage."""
    options = api.options
    listed = api.get(api.models_url)
    models: list[str] | None = None
    if listed.status_code == 200:
        try:
            models = [str(m.get("id")) for m in listed.json().get("data", []) if isinstance(m, dict)]
        except (ValueError, AttributeError):
            models = None
        if models and options.model not in models:
            served = ", ".join(repr(m) for m in models[:8])
            raise ServerProblem(f"--model: {options.model!r} is not served at {api.origin} (it serves {served})")
    elif listed.status_code in (401, 403):
        raise ServerProblem(f"--api-key-env: {api.models_url} answered {listed.status_code}: {error_message(listed)}")
    answer = api.generate("Hello")
    if answer.status_code != 200:
        where = "--url" if answer.status_code in (404, 405) and models is None else f"--endpoint {options.endpoint}"
        raise ServerProblem(
            f"{where}: {api.endpoint_url} answered {answer.status_code} to a one-token request: {error_message(answer)}"
        )
    try:
        usage = answer.json().get("usage") or {}
    except (ValueError, AttributeError):
        raise ServerProblem(f"--url: {api.endpoint_url} answered 200 with no JSON: not an OpenAI API") from None
    return {"models": models, "reports_usage": isinstance(usage, dict) and "prompt_tokens" in usage}
