"""A small OpenAI-compatible server for the sizing tests, in a thread: it counts a prompt with a
tokenizer the test controls, answers /v1/models, one-token requests as a short event stream with
usage (or without, on cue) and vLLM's /tokenize (or a 404, on cue). Not for the load generator's
workers: their client tests use mini_http_server.py, whole cells the simulator."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHATML_TOKENS = 10  # what the fake's chat template adds around one user message


@dataclass
class Fake:
    count: Callable[[str], int]  # the server's tokenizer: tokens of a text
    model: str = "fake-model"
    tokenize: bool = True  # serve POST /tokenize
    usage: bool = True  # report usage in completions
    calls: list[str] = field(default_factory=list)
    url: str = ""

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        if "messages" in body:
            return sum(self.count(m["content"]) for m in body["messages"]) + CHATML_TOKENS
        return self.count(body["prompt"])


def _handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            fake.calls.append(f"GET {self.path}")
            if self.path == "/v1/models":
                self._answer(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
            else:
                self._answer(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            fake.calls.append(f"POST {self.path}")
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize" and fake.tokenize:
                n = fake.prompt_tokens(body)
                self._answer(200, {"count": n, "max_model_len": 4096, "tokens": list(range(n))})
            elif self.path in ("/v1/completions", "/v1/chat/completions"):
                # Streamed, as the load generator asks: one token, then usage when reported.
                events = [{"id": "x", "choices": [{"index": 0, "text": " a", "finish_reason": "length"}]}]
                if fake.usage:
                    n = fake.prompt_tokens(body)
                    usage = {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1}
                    events.append({"id": "x", "choices": [], "usage": usage})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()  # HTTP/1.0: the body ends when the connection closes
                for event in events:
                    self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
            else:
                self._answer(404, {"detail": "Not Found"})

    return Handler


@contextmanager
def serving(fake: Fake) -> Iterator[Fake]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


SIM_TOKEN_PATTERN = r"\w+|[^\w\s]"  # the simulator's stand-in tokenizer (sim/tokens.py), as a regex


def write_word_tokenizer(path: Any, specials: int = 0) -> str:
    """A tokenizer.json counting as the simulator does (a word, or a punctuation mark, is a token),
    with `specials` BOS tokens before every text when encoded with special tokens."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(SIM_TOKEN_PATTERN), behavior="isolated")]
    )
    if specials:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=" ".join(["<s>"] * specials + ["$A"]), special_tokens=[("<s>", 1)]
        )
    tokenizer.save(str(path))
    return str(path)
