"""Prompts of the cell's length by real vLLM's own count, on every endpoint: `ctax bench` with text
and chat prompts against the CPU build serving the tiny model (which has a chat template), sized
by vLLM's /tokenize, by the model's tokenizer.json and by usage; every request's
usage.prompt_tokens is the cell's, and so is its output.

Marked `vllm_cpu` (one server start, 30-60 s on two cores, and four short cells)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_vllm_cpu_serve import START_S, cpu_config, start  # noqa: F401 - cpu_config is a fixture

pytestmark = pytest.mark.vllm_cpu
INPUT, OUTPUT = 200, 8
RUNS = {
    "text": ["--prompt", "text"],
    "chat": ["--endpoint", "chat"],
    "text-file": ["--prompt", "text", "--tokenizer", "{model}"],
    "chat-usage": ["--endpoint", "chat", "--tokenizer", "usage"],
}


def bench(url: str, out: Path, args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "connector_tax.cli", "bench", "--url", url, "--model", "tiny-llama"]
    cmd += ["--rate", "4", "--arrival", "fixed", "--input-len", str(INPUT), "--output-len", str(OUTPUT)]
    cmd += ["--warmup", "0", "--duration", "2", "--timeout", "60", "--no-affinity", "--cpu-latency-us", "off"]
    proc = subprocess.run([*cmd, "--out", str(out), *args], capture_output=True, text=True, timeout=300)
    summaries = list(out.glob("summary_*.json"))
    return {"proc": proc, "summary": json.loads(summaries[0].read_text()) if summaries else None}


@pytest.fixture(scope="module")
def prompt_runs(cpu_config, tmp_path_factory) -> Iterator[dict]:  # noqa: F811 - the imported fixture
    out = tmp_path_factory.mktemp("prompts")
    server = start(cpu_config, "plain", out)
    model = cpu_config["model"]["name"]
    try:
        server.wait_ready(START_S)
        chat = httpx.post(
            server.url + "/tokenize",
            json={"model": "tiny-llama", "messages": [{"role": "user", "content": "Text:"}]},
            timeout=60,
        )
        runs = {
            name: bench(server.url, out / name, [a.format(model=model) for a in args]) for name, args in RUNS.items()
        }
    finally:
        server.stop()
    yield {"runs": runs, "chat_tokenize": chat}


def test_the_tiny_model_has_a_chat_template(prompt_runs):
    answer = prompt_runs["chat_tokenize"]
    assert answer.status_code == 200, answer.text
    assert answer.json()["count"] > 5  # the ChatML markers around the message, counted by vLLM


@pytest.mark.parametrize("name", list(RUNS))
def test_text_and_chat_prompts_land_on_the_cells_length(prompt_runs, name):
    run = prompt_runs["runs"][name]
    summary = run["summary"]
    assert summary is not None, run["proc"].stderr[-2000:]
    usage = summary["usage"]
    assert usage["status"] == "checked"
    assert usage["prompt_tokens"]["server"] == {"median": INPUT, "min": INPUT, "max": INPUT}, usage
    assert usage["completion_tokens"]["server"] == {"median": OUTPUT, "min": OUTPUT, "max": OUTPUT}
    assert usage["sizing"]["agrees_with_tokenizer"] is True
    assert not [r for r in summary["validity"]["reasons"] if "tokens" in r]
    assert f"server tokens in/out={INPUT}/{OUTPUT}" in run["proc"].stdout
    method = usage["sizing"]["method"]
    if name in ("text", "chat"):
        assert method == "server /tokenize"
    elif name == "text-file":
        assert method.startswith("tokenizer file ")
    else:
        assert method == "usage.prompt_tokens of one-token requests"
