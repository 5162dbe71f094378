"""Text and chat prompts sized by the server's count before the first cell (loadgen/schedule/sizing.py),
against a small server whose tokenizer the test controls (fake_openai.py): by /tokenize, by the
usage of one-token requests, by a tokenizer file (the chat template measured apart); each way
exact; what cannot be sized is one line (ServerProblem / ValueError), never a crash."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fake_openai import CHATML_TOKENS, SIM_TOKEN_PATTERN, Fake, serving, write_word_tokenizer  # noqa: E402

from connector_tax.loadgen.schedule.options import LoadgenOptions  # noqa: E402
from connector_tax.loadgen.schedule.probe import Api, ServerProblem  # noqa: E402
from connector_tax.loadgen.schedule.sizing import CANDIDATES, LEAD, one_token_words, size_prompts  # noqa: E402
from connector_tax.loadgen.worker.prompts import BodyBuilder, BodySettings  # noqa: E402

pytest.importorskip("tokenizers")

WORD = re.compile(SIM_TOKEN_PATTERN)


def sim_count(text: str) -> int:
    return len(WORD.findall(text))


def odd_count(text: str) -> int:
    """Words of 5+ letters are two tokens; a BOS token first."""
    return 1 + sum(2 if len(w) >= 5 else 1 for w in WORD.findall(text))


def _size(fake: Fake, endpoint: str = "completions", tokenizer: str = "auto", prompt: str = "text"):
    options = LoadgenOptions(url=fake.url, model=fake.model, endpoint=endpoint, prompt=prompt, tokenizer=tokenizer)
    settings = BodySettings(fake.model, endpoint, prompt)
    with Api(options) as api:
        sizing = size_prompts(api, settings, tokenizer, seed=7)
    builder = BodyBuilder(BodySettings(fake.model, endpoint, prompt, text=sizing.layout), seed=7)
    return sizing, builder


def _chat_tokens(fake: Fake, text: str) -> int:
    return fake.prompt_tokens({"messages": [{"role": "user", "content": text}]})


@pytest.mark.parametrize("tokenize", [True, False])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_prompts_come_out_at_the_servers_count(tokenize: bool, endpoint: str) -> None:
    with serving(Fake(odd_count, tokenize=tokenize)) as fake:
        sizing, builder = _size(fake, endpoint)
    assert sizing.method == ("server /tokenize" if tokenize else "usage.prompt_tokens of one-token requests")
    assert set(sizing.layout.words) == {w for w in CANDIDATES if len(w) < 5}
    count = (lambda t: _chat_tokens(fake, t)) if endpoint == "chat" else fake.count
    # The lead (2), the BOS and, on chat, the template: what a prompt costs before its words.
    assert sizing.layout.base_tokens == count(LEAD) == 3 + (CHATML_TOKENS if endpoint == "chat" else 0)
    assert sizing.agrees_with_tokenizer and len(sizing.samples) == 2
    for n in (sizing.layout.base_tokens + 1, 64, 256, 1000, 4096):
        for key in ("k-1", "k-2"):
            assert count(builder.text(key, n).decode()) == n


def test_most_words_cost_few_counts() -> None:
    calls = []

    def count(text: str) -> int:
        calls.append(text)
        return sim_count(text)

    assert one_token_words(count, list(CANDIDATES)) == list(CANDIDATES)
    assert len(calls) == 2  # the lead, then every candidate at once


def test_a_tokenizer_file_sizes_prompts_and_the_chat_template_is_measured(tmp_path: Path) -> None:
    path = write_word_tokenizer(tmp_path / "tokenizer.json")
    with serving(Fake(sim_count, tokenize=False)) as fake:
        plain, builder = _size(fake, "completions", path)
        chat, chat_builder = _size(fake, "chat", str(tmp_path))  # a folder holding tokenizer.json
    assert plain.method == f"tokenizer file {path}" and plain.template_tokens is None
    assert fake.count(builder.text("a", 300).decode()) == 300
    assert chat.template_tokens == CHATML_TOKENS  # one request's usage minus the local count
    assert _chat_tokens(fake, chat_builder.text("a", 300).decode()) == 300
    assert chat.agrees_with_tokenizer and chat.describe()["template_tokens"] == CHATML_TOKENS


def test_a_tokenizer_file_the_server_disagrees_with_says_it_agrees_only_with_itself(tmp_path: Path) -> None:
    # The file counts every word as one token; the server counts words of 5+ letters as two. Sized
    # by the file, the samples come out at their length by the file's count, and nothing in the
    # summary's `usage.sizing` may read as the server's agreement (it said `exact: true`).
    path = write_word_tokenizer(tmp_path / "tokenizer.json")
    with serving(Fake(odd_count, tokenize=False)) as fake:
        sizing, builder = _size(fake, "completions", path)
    described = sizing.describe()
    assert described["method"] == f"tokenizer file {path}"
    assert described["agrees_with_tokenizer"] is True and "exact" not in described
    n = sizing.layout.base_tokens + 256
    assert fake.count(builder.text("a", n).decode()) != n  # the server's count: off


def test_what_cannot_be_sized_is_one_line(tmp_path: Path) -> None:
    with serving(Fake(sim_count, tokenize=False)) as fake:
        with pytest.raises(ServerProblem) as no_tokenize:
            _size(fake, tokenizer="server")
    assert str(no_tokenize.value) == (
        f"--tokenizer server: {fake.url}/tokenize answered 404: Not Found "
        "(the server has no /tokenize: --tokenizer usage, or a tokenizer file)"
    )
    with serving(Fake(sim_count, tokenize=False, usage=False)) as fake:
        with pytest.raises(ServerProblem, match=r"^--tokenizer auto: the server reports no usage.prompt_tokens"):
            _size(fake)
    with serving(Fake(len)) as fake:  # a character-level tokenizer: no word is one token
        with pytest.raises(ServerProblem, match=r"^--prompt text: only 0 of \d+ common words are one token"):
            _size(fake)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not a tokenizer")
    with serving(Fake(sim_count)) as fake:
        with pytest.raises(ValueError) as bad_file:
            _size(fake, tokenizer=str(garbage))
    message = str(bad_file.value)
    assert message.startswith(f"tokenizer: '{garbage}' is not a tokenizer the tokenizers library reads (")
    assert "\n" not in message
    with pytest.raises(ValueError, match=r"^tokenizer: '/no/such' is not auto, server, usage, a tokenizer.json"):
        LoadgenOptions(url="http://127.0.0.1:9", model="m", tokenizer="/no/such").check()
