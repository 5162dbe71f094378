"""Before a cell is measured: does anything answer at the URL, with the model and the endpoint the
run asks for? One line that says what is wrong when not (`ServerProblem`), instead of a cell of
errors, or of nothing, that looks measured.

Off the hot path: plain httpx requests, each bounded by a timeout, from the main process before the
workers start. The same client asks the server to count prompts (sizing.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import httpx

from connector_tax.loadgen.schedule.options import LoadgenOptions
from connector_tax.loadgen.worker.urls import parse_url

PROBE_TIMEOUT_S = 30.0  # a first request may wait for a cold engine's first step
MESSAGE_CHARS = 300  # of a server's error, in the one line


class ServerProblem(RuntimeError):
    """What stops a run before it starts, in one line (the flag it concerns first). A RuntimeError:
    in a study the phase job writes it down as the reason its cells were not measured."""


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
            raise ServerProblem(_unreachable(self.origin, exc)) from None
        except httpx.TimeoutException:
            raise ServerProblem(f"--url: {url} did not answer within {PROBE_TIMEOUT_S:g} s") from None
        except httpx.HTTPError as exc:
            raise ServerProblem(f"--url: {url}: {_reason(exc)}") from None

    def generate(self, text: str) -> Answer:
        """One one-token request at the run's endpoint, streamed with usage as the run's are: the
        server's status, its error in words, and its usage.prompt_tokens (None: not reported)."""
        body: dict[str, Any] = {"model": self.options.model, "max_tokens": 1, "temperature": 0, "stream": True}
        body["stream_options"] = {"include_usage": True}
        if self.options.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        try:
            with self.client.stream("POST", self.endpoint_url, json=body) as response:
                if response.status_code != 200:
                    response.read()
                    return Answer(response.status_code, error_message(response), None, False)
                return _read_stream(response)
        except httpx.ConnectError as exc:
            raise ServerProblem(_unreachable(self.origin, exc)) from None
        except httpx.TimeoutException:
            raise ServerProblem(f"--url: {self.endpoint_url} did not answer within {PROBE_TIMEOUT_S:g} s") from None
        except httpx.HTTPError as exc:
            raise ServerProblem(f"--url: {self.endpoint_url}: {_reason(exc)}") from None


@dataclass(frozen=True)
class Answer:
    status: int
    error: str | None
    prompt_tokens: int | None  # the stream's usage.prompt_tokens
    events: bool  # any `data: {...}` event came: an OpenAI-style stream


def _read_stream(response: httpx.Response) -> Answer:
    """The usage of an SSE stream, read line by line (off the hot path: no need for sse.py's care)."""
    prompt_tokens, events, error = None, False, None
    for line in response.iter_lines():
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        try:
            event = json.loads(line[5:])
        except ValueError:
            continue
        events = events or isinstance(event, dict)
        if not isinstance(event, dict):
            continue
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            prompt_tokens = usage["prompt_tokens"]
        if isinstance(event.get("error"), dict):
            error = " ".join(str(event["error"].get("message")).split())[:MESSAGE_CHARS]
    return Answer(200, error, prompt_tokens, events)


def _unreachable(origin: str, exc: Exception) -> str:
    if "SSL" in str(exc) or "certificate" in str(exc):
        return f"--url: TLS to {origin} failed: {_reason(exc)} (--cacert FILE, or --insecure)"
    return f"--url: nothing answers at {origin} ({_reason(exc)})"


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
    if answer.status != 200 or answer.error:
        where = "--url" if answer.status in (404, 405) and models is None else f"--endpoint {options.endpoint}"
        if answer.status in (401, 403):
            where = "--api-key-env"
        raise ServerProblem(
            f"{where}: {api.endpoint_url} answered {answer.status} to a one-token request: {answer.error}"
        )
    if not answer.events:
        raise ServerProblem(f"--url: {api.endpoint_url} answered 200 with no event stream: not an OpenAI API")
    return {"models": models, "reports_usage": answer.prompt_tokens is not None}
