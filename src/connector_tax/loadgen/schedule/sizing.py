"""Text and chat prompts of the length a cell says, by the server's own count, found before the
first cell (`size_prompts` -> `Sizing`, whose `layout` the workers build prompts from).

How many tokens a text is depends on the server's tokenizer, and a chat prompt also on its chat
template (a text of n words was 1,232 tokens for n = 256 on the CPU study's tiny model). So the
load generator asks a counter:

- `server`: vLLM's `POST /tokenize` (`prompt`, or `messages` with the generation prompt: exactly
  what the completions or chat endpoint will count, template and special tokens included);
- a tokenizer file (`tokenizer.json`, or a folder holding one, read with the `tokenizers`
  library): the text counted here; on the chat endpoint the template's tokens measured once,
  as one request's `usage.prompt_tokens` minus the local count of its message;
- `usage`: one-token requests whose `usage.prompt_tokens` is the server's count (any OpenAI
  server that reports usage);
- `auto` (the default): `server` where /tokenize answers, else `usage`.

With it, words each counted as one token after a fixed lead are kept from a built-in list
(groups of words counted at once, split only where a group costs more than one token a word),
`base_tokens` is what the lead costs with nothing after it (special tokens and chat template
included), and sample prompts built as the workers build them are counted: `agrees_with_tokenizer`
says whether every one came out at its length by the counter that sized them (`method`). That is
the server's own count with `auto`, `server` and `usage`, but a tokenizer file's with a PATH: a
file that is not the server's tokenizer agrees with itself. The server's verdict is each request's
`usage.prompt_tokens`, checked against its cell anyway (usage.py); sizing makes that check pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connector_tax.loadgen.schedule.probe import Api, ServerProblem, error_message
from connector_tax.loadgen.worker.prompts import BodyBuilder, BodySettings, TextLayout

LEAD = "Text:"
MIN_WORDS = 16  # fewer one-token words than this: prompts would repeat too soon to be unique
SAMPLE_LENGTHS = (32, 256)  # sample prompts counted after sizing, beyond base_tokens (tokens)
# Words a tokenizer is likely to count as one token each after a space: common English first,
# then the words the CPU study's tiny model was trained on (tools/tiny_model.py); lowercase
# letters only, so a prompt is JSON without escaping.
CANDIDATES = (
    "the of and to in is was for on that with as by at from it an be this are or which "
    "kv cache connector engine step schedule token prefill decode request rate latency block "
    "layer worker model server metric throughput saturation reference phase shape producer "
    "consumer both plain tax framework have not but they you all we can her there one will "
    "would what about out up their more time so when some them like into she him has two "
    "see way could our than first been water who its now people my made over did down only "
    "find day get come long little very after words called just where most know"
).split()


@dataclass
class Sizing:
    """The layout the workers use and how it was found (the summary's `usage.sizing`)."""

    layout: TextLayout
    method: str
    samples: list[dict[str, int]] = field(default_factory=list)
    template_tokens: int | None = None
    counts: int = 0  # how many counts it took

    @property
    def agrees_with_tokenizer(self) -> bool:
        """Every sample prompt at its length by `method`'s count (a file's is not the server's)."""
        return all(s["counted"] == s["requested"] for s in self.samples)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method,
            "lead": self.layout.lead,
            "words": len(self.layout.words),
            "base_tokens": self.layout.base_tokens,
            "agrees_with_tokenizer": self.agrees_with_tokenizer,
            "samples": self.samples,
            "counts": self.counts,
        }
        if self.template_tokens is not None:
            out["template_tokens"] = self.template_tokens
        return out


Count = Callable[[str], int]


def _tokenize_counter(api: Api, strict: bool) -> Count | None:
    """vLLM's /tokenize, checked with one call; None where the server has none (and not `strict`)."""
    chat = api.options.endpoint == "chat"
    url = api.root_url + "/tokenize"

    def count(text: str) -> int:
        body: dict[str, Any] = {"model": api.options.model}
        if chat:
            body.update(messages=[{"role": "user", "content": text}], add_generation_prompt=True)
        else:
            body["prompt"] = text
        answer = api.post(url, body)
        if answer.status_code != 200:
            raise ServerProblem(f"--tokenizer server: {url} answered {answer.status_code}: {error_message(answer)}")
        try:
            return int(answer.json()["count"])
        except (ValueError, KeyError, TypeError):
            raise ServerProblem(f"--tokenizer server: {url} answered without a token count") from None

    answer = api.post(url, {"model": api.options.model, "prompt": LEAD})
    if answer.status_code == 200:
        return count
    if not strict and answer.status_code in (404, 405):
        return None
    raise ServerProblem(
        f"--tokenizer server: {url} answered {answer.status_code}: {error_message(answer)}"
        + (
            " (the server has no /tokenize: --tokenizer usage, or a tokenizer file)"
            if answer.status_code == 404
            else ""
        )
    )


NO_USAGE = "so it cannot count prompts for the load generator: name a tokenizer file (--tokenizer PATH)"


def _usage_counter(api: Api, flag: str, no_usage: str = NO_USAGE) -> Count:
    def count(text: str) -> int:
        answer = api.generate(text)
        if answer.status != 200 or answer.error:
            raise ServerProblem(
                f"{flag}: {api.endpoint_url} answered {answer.status} to a sizing request: {answer.error}"
            )
        if answer.prompt_tokens is None:
            raise ServerProblem(f"{flag}: the server reports no usage.prompt_tokens, {no_usage}")
        return answer.prompt_tokens

    return count


def load_tokenizer(path: str) -> Any:
    """A `tokenizers.Tokenizer` from tokenizer.json or a folder holding one; ValueError in one line."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError(
            f"tokenizer: {path!r} needs the tokenizers package (pip install 'connector-tax[tokenizer]')"
        ) from None
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise ValueError(f"tokenizer: {path!r} is not a tokenizer.json file or a folder holding one")
    try:
        return Tokenizer.from_file(file)
    except Exception as exc:  # the library's own error types vary: any failure is the file's
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"tokenizer: {file!r} is not a tokenizer the tokenizers library reads ({first})") from None


def _file_counter(api: Api, path: str) -> tuple[Count, int | None]:
    tokenizer = load_tokenizer(path)
    if api.options.endpoint != "chat":
        return (lambda text: len(tokenizer.encode(text).ids)), None
    # The chat template is the server's: what it adds around a message, measured once.

    def local(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    measure = _usage_counter(api, "--tokenizer", "so its chat template's tokens cannot be measured: use token ids")
    template = measure(LEAD) - local(LEAD)
    return (lambda text: local(text) + template), template


def counter(api: Api, tokenizer: str) -> tuple[Count, str, int | None]:
    """(count, how it counts, the chat template's tokens where measured apart)."""
    if tokenizer in ("auto", "server"):
        count = _tokenize_counter(api, strict=tokenizer == "server")
        if count is not None:
            return count, "server /tokenize", None
        return _usage_counter(api, "--tokenizer auto"), "usage.prompt_tokens of one-token requests", None
    if tokenizer == "usage":
        return _usage_counter(api, "--tokenizer usage"), "usage.prompt_tokens of one-token requests", None
    count, template = _file_counter(api, tokenizer)
    return count, f"tokenizer file {tokenizer}", template


def one_token_words(count: Count, candidates: list[str]) -> list[str]:
    """The candidates counted as one token each after the lead: a group is kept whole when it
    costs exactly one token a word, else split in two (few counts when most words qualify)."""
    base = count(LEAD)
    kept: list[str] = []

    def visit(group: list[str]) -> None:
        if count(LEAD + " " + " ".join(group)) - base == len(group):
            kept.extend(group)
        elif len(group) > 1:
            mid = len(group) // 2
            visit(group[:mid])
            visit(group[mid:])

    visit(candidates)
    return kept


def size_prompts(api: Api, settings: BodySettings, tokenizer: str, seed: int) -> Sizing:
    """The layout of text prompts for this server, checked on sample prompts; ServerProblem or
    ValueError (a bad tokenizer file) in one line when it cannot be found."""
    raw, method, template = counter(api, tokenizer)
    calls = 0

    def count(text: str) -> int:
        nonlocal calls
        calls += 1
        return raw(text)

    words = one_token_words(count, list(CANDIDATES))
    if len(words) < MIN_WORDS:
        raise ServerProblem(
            f"--prompt text: only {len(words)} of {len(CANDIDATES)} common words are one token each "
            f"by {method} (need {MIN_WORDS}): text prompts cannot be sized for this tokenizer; use token ids"
        )
    layout = TextLayout(LEAD, tuple(words), count(LEAD))
    builder = BodyBuilder(BodySettings(settings.model, settings.endpoint, settings.prompt, text=layout), seed)
    samples = []
    for i, extra in enumerate(SAMPLE_LENGTHS):
        n = layout.base_tokens + extra
        samples.append({"requested": n, "counted": count(builder.text(f"sizing-{i}", n).decode())})
    return Sizing(layout, method, samples, template, calls)
