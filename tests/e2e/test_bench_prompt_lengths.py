"""Prompts of the cell's length by the server's own count, on every endpoint, through `ctax bench`
against the simulator: text and chat sized by the usage of one-token requests (the simulator has
no /tokenize), and by a tokenizer file the test controls; a tokenizer that disagrees with the
server leaves prompts off, and the cell invalid with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fake_openai import write_word_tokenizer  # noqa: E402
from sim_server import MODEL, REPO, running_sim  # noqa: E402

pytest.importorskip("tokenizers")
INPUT, OUTPUT = 200, 6


def bench(url: str, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    cmd = [sys.executable, "-m", "connector_tax.cli", "bench", "--url", url, "--model", MODEL, "--no-affinity"]
    cmd += ["--cpu-latency-us", "off", "--input-len", str(INPUT), "--output-len", str(OUTPUT), "--rate", "20"]
    cmd += ["--duration", "1", "--warmup", "0.2", "--out", str(out), *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)  # a bail-out
    summaries = list(out.glob("summary_*.json"))
    return proc, json.loads(summaries[0].read_text()) if summaries else {}


@pytest.mark.e2e  # a simulated server and five short runs of ctax bench: tens of seconds
def test_text_and_chat_prompts_have_the_cells_length_by_the_servers_count(tmp_path: Path) -> None:
    tokenizer = write_word_tokenizer(tmp_path / "tokenizer.json")
    skewed = write_word_tokenizer(tmp_path / "skewed.json", specials=12)  # counts 12 tokens the server does not
    with running_sim(tmp_path / "sim", connector="plain") as sim:
        runs = {
            "text": bench(sim.url, tmp_path / "text", "--prompt", "text"),
            "chat": bench(sim.url, tmp_path / "chat", "--endpoint", "chat"),
            "file": bench(sim.url, tmp_path / "file", "--prompt", "text", "--tokenizer", tokenizer),
            "chat-file": bench(sim.url, tmp_path / "chat-file", "--endpoint", "chat", "--tokenizer", tokenizer),
            "skewed": bench(sim.url, tmp_path / "skewed", "--prompt", "text", "--tokenizer", skewed),
        }
    for name in ("text", "chat", "file", "chat-file"):
        proc, summary = runs[name]
        # Valid, or invalid only for what a busy host does to timing: never for its tokens.
        assert proc.returncode in (0, 1) and summary, (name, proc.stderr)
        assert not [r for r in summary["validity"]["reasons"] if "tokens" in r], name
        usage = summary["usage"]
        assert usage["status"] == "checked", name
        assert usage["prompt_tokens"]["server"] == {"median": INPUT, "min": INPUT, "max": INPUT}, name
        assert usage["completion_tokens"]["server"]["median"] == OUTPUT
        assert usage["sizing"]["agrees_with_tokenizer"] is True, name
        assert f"server tokens in/out={INPUT}/{OUTPUT}" in proc.stdout, name
    assert runs["text"][1]["usage"]["sizing"]["method"] == "usage.prompt_tokens of one-token requests"
    # The chat template (ChatML: 17 of the simulator's tokens) and the lead (2) come off the words.
    assert runs["chat"][1]["usage"]["sizing"]["base_tokens"] == 19
    assert runs["chat-file"][1]["usage"]["sizing"]["template_tokens"] == 17
    # A tokenizer that is not the server's: every prompt 12 tokens short by the server's count (6 %).
    proc, summary = runs["skewed"]
    assert proc.returncode == 1
    assert summary["usage"]["prompt_tokens"]["server"]["median"] == INPUT - 12
    reason = "prompt tokens not the cell's:"
    assert any(r.startswith(reason) for r in summary["validity"]["reasons"])
    assert f"server tokens in/out={INPUT - 12}/{OUTPUT} [INVALID: " in proc.stdout and reason in proc.stdout
