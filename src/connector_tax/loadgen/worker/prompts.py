"""Request bodies built in the worker, in microseconds, from a compact spec.

A pool of random token ids is encoded to JSON text once per worker; a prompt of n tokens is
then a byte slice of that text, so a 32k-token body costs a memcpy instead of 32k integer
encodings on the hot path. The first tokens of every synthetic prompt encode its key (in a
study cell `prompt_key`: the cell's traffic seed and the request's index; otherwise the request
id, which names the cell), so no two prompts of a server's life share even their first KV
block, across cells too (zero prefix reuse, as the study requires), while every variant gets the
same prompts in the same cell (common random numbers). Trace prompts map each hash id to a fixed
512-token block, so equal ids share prefix blocks exactly as the trace says.

Text and chat prompts are words the server's own tokenizer counts as one token each, after a
fixed lead (sizing.py found them, and what the lead, the special tokens and a chat template cost,
before the first cell: `TextLayout`): a prompt of n tokens is the lead and n - base_tokens words,
the first UNIQUE_WORDS from a hash of the prompt's key, the rest a slice of a per-worker pool of
random words, so they too share no KV block and are the same for every variant.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

POOL_TOKENS = 1 << 18  # longer than any prompt up to max_model_len 200k; ~0.1 s to build
TOKEN_LOW, TOKEN_HIGH = 1000, 30000  # clear of special-token ids
UNIQUE_TOKENS = 4
UNIQUE_WORDS = 16  # a text prompt's first words from its key's hash: >= 64 bits with >= 16 words
TRACE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TextLayout:
    """How text prompts reach an exact length on one server (sizing.py measured it): `lead`, then
    words each one token there; a prompt of n tokens has n - base_tokens words (base_tokens: the
    lead, the special tokens and, on the chat endpoint, the chat template around the message)."""

    lead: str
    words: tuple[str, ...]
    base_tokens: int

    def word_count(self, n: int) -> int:
        return n - self.base_tokens


@dataclass(frozen=True)
class BodySettings:
    model: str
    endpoint: str = "completions"  # completions | chat
    prompt: str = "token_ids"  # token_ids | text
    temperature: float = 0.0
    ignore_eos: bool = True
    stream: bool = True
    text: TextLayout | None = None  # text and chat prompts: the server's sizing (needed for them)

    @property
    def sends_text(self) -> bool:
        return self.endpoint == "chat" or self.prompt == "text"


def prompt_key(traffic_seed: int, index: int, attempt: int = 1) -> str:
    """What request `index` of a study cell's prompt derives from: the cell's traffic seed
    (config.cells.traffic_seed) and its index, so every variant sends the same token ids in the
    same cell and replicate (common random numbers), and no two cells share a prompt. A cell
    measured again in the same launch (`attempt` > 1: the validity gate, a suspected knee) sends
    the same schedule and shapes with prompts of its own: the first attempt's prompts are in the
    server's prefix cache, and re-sending them cut the default study's 32 req/s TTFT p90 by
    ~20 % (7 of 8 KV blocks hit), which hid multi_mooncake_lmcache's knee."""
    return f"{traffic_seed:x}-{index}" + (f"~{attempt}" if attempt > 1 else "")


class TokenPool:
    """A long random token sequence as JSON text, with the byte offset of every token."""

    def __init__(self, seed: int, size: int = POOL_TOKENS) -> None:
        ids = np.random.default_rng(seed).integers(TOKEN_LOW, TOKEN_HIGH, size=size)
        self.ids = ids  # the same tokens as integers (the virtual clock's prompts)
        texts = [str(i) for i in ids.tolist()]
        self.text = ",".join(texts).encode()
        lengths = np.fromiter((len(t) + 1 for t in texts), dtype=np.int64, count=size)
        self.offsets = np.concatenate(([0], np.cumsum(lengths)))
        self.size = size

    def slice(self, start: int, n: int) -> bytes:
        """Tokens [start, start+n) as "a,b,c" (no trailing comma)."""
        return self.text[self.offsets[start] : self.offsets[start + n] - 1]


class WordPool:
    """A long random sequence of a layout's words as one ASCII string, with each word's offset."""

    def __init__(self, words: tuple[str, ...], seed: int, size: int = POOL_TOKENS) -> None:
        picks = np.random.default_rng(seed).integers(0, len(words), size=size)
        chosen = [words[i] for i in picks.tolist()]
        self.text = " ".join(chosen).encode()
        lengths = np.fromiter((len(w) + 1 for w in chosen), dtype=np.int64, count=size)
        self.offsets = np.concatenate(([0], np.cumsum(lengths)))
        self.size = size

    def slice(self, start: int, n: int) -> bytes:
        """Words [start, start+n) as "a b c"."""
        return self.text[self.offsets[start] : self.offsets[start + n] - 1]


class BodyBuilder:
    def __init__(self, settings: BodySettings, seed: int) -> None:
        self.settings = settings
        self.seed = seed
        self.pool = TokenPool(seed)
        layout = settings.text
        if settings.sends_text and layout is None:
            raise ValueError("text prompts need the server's sizing (TextLayout): sizing.size_prompts")
        self.words = WordPool(layout.words, seed) if settings.sends_text and layout else None
        tail: dict[str, Any] = {
            "temperature": settings.temperature,
            "ignore_eos": settings.ignore_eos,
            "stream": settings.stream,
        }
        if settings.stream:
            tail["stream_options"] = {"include_usage": True}
        self._model = json.dumps(settings.model).encode()
        self._tail = json.dumps(tail)[1:-1].encode()

    def _offset(self, key: int, n: int) -> int:
        return zlib.crc32(f"{self.seed}:{key}".encode()) % (self.pool.size - n)

    def _layout(self, request_id: str, n: int) -> tuple[list[int], int, int]:
        """(the unique head tokens, the pool offset of the rest, how many rest tokens)."""
        digest = hashlib.blake2b(f"{self.seed}:{request_id}".encode(), digest_size=8).digest()
        # 4 tokens x 16 bits: 64 bits of the request id's hash, clear of the pool's id range.
        unique = [
            TOKEN_HIGH + int.from_bytes(digest[2 * k : 2 * k + 2], "little") for k in range(min(UNIQUE_TOKENS, n))
        ]
        rest = n - len(unique)
        offset = int.from_bytes(digest, "little") % (self.pool.size - rest) if rest > 0 else 0
        return unique, offset, rest

    def token_ids(self, request_id: str, n: int) -> bytes:
        unique, offset, rest = self._layout(request_id, n)
        head = ",".join(map(str, unique)).encode()
        if rest <= 0:
            return head
        return head + b"," + self.pool.slice(offset, rest)

    def token_id_list(self, request_id: str, n: int) -> list[int]:
        """The same prompt as `token_ids`, as integers: what the virtual clock hands the engine."""
        unique, offset, rest = self._layout(request_id, n)
        return unique + (self.pool.ids[offset : offset + rest].tolist() if rest > 0 else [])

    def trace_token_ids(self, blocks: Sequence[tuple[int, int]]) -> bytes:
        """Concatenated fixed blocks: equal hash ids give byte-identical prefix blocks."""
        return b",".join(self.pool.slice(self._offset(-1 - hid, TRACE_BLOCK_TOKENS), n) for hid, n in blocks)

    def text(self, request_id: str, n: int) -> bytes:
        """A text prompt of n tokens by the server's count: the lead, UNIQUE_WORDS words from the
        key's hash, the rest from the pool (ASCII letters and spaces: JSON as it is)."""
        layout, pool = self.settings.text, self.words
        assert layout is not None and pool is not None
        k = max(0, layout.word_count(n))
        digest = hashlib.blake2b(f"{self.seed}:{request_id}".encode(), digest_size=UNIQUE_WORDS + 8).digest()
        head = [layout.words[b % len(layout.words)] for b in digest[: min(UNIQUE_WORDS, k)]]
        parts = [layout.lead.encode(), " ".join(head).encode()] if head else [layout.lead.encode()]
        rest = k - len(head)
        if rest > 0:
            parts.append(pool.slice(int.from_bytes(digest[UNIQUE_WORDS:], "little") % (pool.size - rest), rest))
        return b" ".join(parts)

    def body(self, request_id: str, input_len: int, output_len: int, blocks: Sequence[tuple[int, int]] | None) -> bytes:
        s = self.settings
        if s.sends_text:
            text = self.text(request_id, input_len)
            if s.endpoint == "chat":
                prompt = b'"messages":[{"role":"user","content":"' + text + b'"}]'
            else:
                prompt = b'"prompt":"' + text + b'"'
        else:
            ids = self.trace_token_ids(blocks) if blocks else self.token_ids(request_id, input_len)
            prompt = b'"prompt":[' + ids + b"]"
        return b'{"model":' + self._model + b"," + prompt + b',"max_tokens":%d,' % output_len + self._tail + b"}"
