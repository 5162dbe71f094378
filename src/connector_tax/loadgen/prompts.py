"""Request bodies built in the worker, in microseconds, from a compact spec.

A pool of random token ids is encoded to JSON text once per worker; a prompt of n tokens is
then a byte slice of that text, so a 32k-token body costs a memcpy instead of 32k integer
encodings on the hot path. The first tokens of every synthetic prompt encode its key (in a
study cell `prompt_key`: the cell's traffic seed and the request's index; otherwise the request
id, which names the cell), so no two prompts of a server's life share even their first KV
block, across cells too (zero prefix reuse, as the design demands), while every variant gets the
same prompts in the same cell (common random numbers). Trace prompts map each hash id to a fixed
512-token block, so equal ids share prefix blocks exactly as the trace says.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass

import numpy as np

POOL_TOKENS = 1 << 18  # longer than any prompt up to max_model_len 200k; ~0.1 s to build
TOKEN_LOW, TOKEN_HIGH = 1000, 30000  # clear of special-token ids
UNIQUE_TOKENS = 4
TRACE_BLOCK_TOKENS = 512
_WORDS = (
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud "
    "forest ember quartz harbor signal vector matrix kernel socket buffer packet thread"
).split()


@dataclass(frozen=True)
class BodySettings:
    model: str
    endpoint: str = "completions"  # completions | chat
    prompt: str = "token_ids"  # token_ids | text
    temperature: float = 0.0
    ignore_eos: bool = True
    stream: bool = True


def prompt_key(traffic_seed: int, index: int, attempt: int = 1) -> str:
    """What request `index` of a study cell's prompt derives from: the cell's traffic seed
    (config.cells.traffic_seed) and its index, so every variant sends the same token ids in the
    same cell and replicate (common random numbers), and no two cells share a prompt. A cell
    measured again in the same launch (`attempt` > 1: the validity gate, a suspected knee) sends
    the same schedule and shapes with prompts of its own: the first attempt's prompts are in the
    server's prefix cache, and re-sending them cut the default study's 32 req/s TTFT p90 by
    ~40 % (7 of 8 KV blocks hit), which hid multi_mooncake_lmcache's knee."""
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


class BodyBuilder:
    def __init__(self, settings: BodySettings, seed: int) -> None:
        self.settings = settings
        self.seed = seed
        self.pool = TokenPool(seed)
        tail = {"temperature": settings.temperature, "ignore_eos": settings.ignore_eos, "stream": settings.stream}
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

    def trace_token_ids(self, blocks: list[tuple[int, int]]) -> bytes:
        """Concatenated fixed blocks: equal hash ids give byte-identical prefix blocks."""
        return b",".join(self.pool.slice(self._offset(-1 - hid, TRACE_BLOCK_TOKENS), n) for hid, n in blocks)

    def text(self, request_id: str, n: int) -> str:
        key = zlib.crc32(request_id.encode())
        words = [request_id] + [_WORDS[(key + k * 13) % len(_WORDS)] for k in range(n - 1)]
        return " ".join(words)

    def body(self, request_id: str, input_len: int, output_len: int, blocks: list[tuple[int, int]] | None) -> bytes:
        s = self.settings
        if s.endpoint == "chat" or s.prompt == "text":
            text = self.text(request_id, input_len)
            if s.endpoint == "chat":
                prompt = b'"messages":[{"role":"user","content":' + json.dumps(text).encode() + b"}]"
            else:
                prompt = b'"prompt":' + json.dumps(text).encode()
        else:
            ids = self.trace_token_ids(blocks) if blocks else self.token_ids(request_id, input_len)
            prompt = b'"prompt":[' + ids + b"]"
        return b'{"model":' + self._model + b"," + prompt + b',"max_tokens":%d,' % output_len + self._tail + b"}"
