"""A paged KV cache with prefix caching by chained block hash, after vLLM v1's BlockPool.

Blocks are reference counted. A cached block whose count drops to zero goes to the tail of a
free queue but keeps its hash, so a later request with the same prefix can take it back; new
allocations take from the head of that queue, evicting the least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of a prompt: equal prefixes give equal hashes."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._refcount = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._owned: dict[str, list[int]] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def blocks_of(self, request_id: str) -> int:
        return len(self._owned.get(request_id, ()))

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, request_id: str, hashes: Sequence[int], num_prompt_tokens: int) -> int:
        """Take the cached blocks of the longest cached prefix; return the tokens they cover.

        As in vLLM, the last prompt token is always recomputed, so a full hit stops one
        block short of it.
        """
        if not self.enable_prefix_caching:
            return 0
        max_blocks = (num_prompt_tokens - 1) // self.block_size
        taken: list[int] = []
        for h in hashes[:max_blocks]:
            block = self._cached.get(h)
            if block is None:
                break
            if self._refcount[block] == 0:
                del self._free[block]
            self._refcount[block] += 1
            taken.append(block)
        self._owned.setdefault(request_id, []).extend(taken)
        return len(taken) * self.block_size

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        """Make the request hold enough blocks for num_tokens; False if the pool is short."""
        owned = self._owned.setdefault(request_id, [])
        missing = -(-num_tokens // self.block_size) - len(owned)  # blocks_needed, inlined: hot path
        if missing <= 0:
            return True
        if missing > len(self._free):
            return False
        for _ in range(missing):
            block, _ = self._free.popitem(last=False)
            old = self._hash_of[block]
            if old is not None:
                self._hash_of[block] = None
                if self._cached.get(old) == block:
                    del self._cached[old]
            self._refcount[block] = 1
            owned.append(block)
        return True

    def cache_blocks(self, request_id: str, hashes: Sequence[int], num_computed: int) -> None:
        """Register the hashes of the request's fully computed prompt blocks."""
        if not self.enable_prefix_caching:
            return
        owned = self._owned.get(request_id, [])
        full = min(num_computed // self.block_size, len(hashes), len(owned))
        for i in range(full):
            block = owned[i]
            if self._hash_of[block] is None and hashes[i] not in self._cached:
                self._hash_of[block] = hashes[i]
                self._cached[hashes[i]] = block

    def free(self, request_id: str) -> None:
        # As vLLM: blocks with no cached content go to the front (reused first); cached ones
        # to the back, tail blocks first, so a prompt's head stays cached longest.
        for block in reversed(self._owned.pop(request_id, [])):
            self._refcount[block] -= 1
            if self._refcount[block] == 0:
                self._free[block] = None
                if self._hash_of[block] is None:
                    self._free.move_to_end(block, last=False)
