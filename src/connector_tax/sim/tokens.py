"""A stand-in tokenizer: deterministic, so equal texts give equal tokens and prefix hits."""

from __future__ import annotations

import re
import zlib
from typing import Any

VOCAB_SIZE = 32000
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when "
    "if so no will can more out up into do any your what some could them other than then "
    "now only its time two may first new these also"
).split()
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str) -> list[int]:
    return [zlib.crc32(t.encode()) % VOCAB_SIZE for t in _TOKEN_RE.findall(text)]


def detokenize(token_id: int) -> str:
    return " " + _WORDS[token_id % len(_WORDS)]


def chat_prompt(messages: list[dict[str, Any]]) -> str:
    """A ChatML rendering, as Qwen's chat template produces, ending in the assistant turn."""
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


def natural_length(prompt_token_ids: list[int], max_tokens: int) -> int:
    """Where greedy decoding meets EOS when ignore_eos is off: fixed per prompt, 16-271."""
    seed = zlib.crc32(repr(prompt_token_ids[-64:]).encode())
    return min(max_tokens, 16 + seed % 256)
