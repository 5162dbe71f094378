"""Scrape a server's Prometheus /metrics at a fixed rate into JSONL, one line per scrape.

Each line is {"t_ns": monotonic ns of the scrape, "<vllm:sample name>": value, ...}; samples
that carry labels beyond model_name/engine (e.g. request_success by finished_reason) keep
them in the key, so nothing collides. A failed scrape is a line with "error" rather than a
gap nobody can explain.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import TracebackType

import httpx
from prometheus_client.parser import text_string_to_metric_families

_PLAIN_LABELS = {"model_name", "engine"}
# Counters that move whenever the engine does work: their sum standing still while requests are
# in flight means the server is stuck (serving.ServerWatch), whatever its /health says.
WORK_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
WAITING = "vllm:num_requests_waiting"


def parse_samples(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("vllm:") or sample.name.endswith("_created"):
                continue
            extra = {k: v for k, v in sample.labels.items() if k not in _PLAIN_LABELS}
            key = sample.name
            if extra:
                key += "{" + ",".join(f'{k}="{v}"' for k, v in sorted(extra.items())) + "}"
            samples[key] = sample.value
    return samples


class MetricsSampler:
    def __init__(
        self, url: str, path: Path, interval_s: float = 1.0, waiting: list[tuple[float, float]] | None = None
    ) -> None:
        self.url = url.rstrip("/") + "/metrics"
        self.path = path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctax-metrics-sampler", daemon=True)
        self.scrapes = 0
        # Read by other threads: monotonic time of the last scrape that answered, and of the last
        # one in which the engine's work counters had moved (None until they do).
        self.last_answer: float | None = None
        self.last_work: float | None = None
        self._work: float | None = None
        # (monotonic time, vllm:num_requests_waiting) of every answered scrape, appended to the
        # caller's list if given: the overload guard reads the queue's median once the cell's
        # floor has passed (saturation criterion 2).
        self.waiting: list[tuple[float, float]] = [] if waiting is None else waiting

    def __enter__(self) -> MetricsSampler:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with httpx.Client(timeout=max(0.5, self.interval_s)) as client, open(self.path, "w", encoding="utf-8") as out:
            next_t = time.monotonic()
            while True:
                line = self._scrape(client)
                out.write(json.dumps(line, separators=(",", ":")) + "\n")
                out.flush()
                self.scrapes += 1
                next_t += self.interval_s
                if self._stop.wait(max(0.0, next_t - time.monotonic())):
                    out.write(json.dumps(self._scrape(client), separators=(",", ":")) + "\n")
                    return

    def _scrape(self, client: httpx.Client) -> dict[str, object]:
        t_ns = time.monotonic_ns()
        try:
            response = client.get(self.url)
            response.raise_for_status()
            samples = parse_samples(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            return {"t_ns": t_ns, "error": f"{type(exc).__name__}: {exc}"}
        now = time.monotonic()
        self.last_answer = now
        if WAITING in samples:
            self.waiting.append((now, samples[WAITING]))
        work = sum(samples.get(name, 0.0) for name in WORK_COUNTERS)
        if self._work is None or work != self._work:
            self._work, self.last_work = work, now
        return {"t_ns": t_ns, **samples}
