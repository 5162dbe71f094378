"""Which (input_len, output_len) each request of a cell gets.

A cell's shape is the config's `shape` (workflow/schemas/config.schema.yaml): one pair, a
weighted mix drawn per request, or a repeating pattern such as long-short-short-short
that makes head-of-line blocking show. The sampler is seeded so a cell replays identically.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

_BLOCK = 4096  # mix draws per numpy call


@dataclass(frozen=True)
class ShapePair:
    input: int
    output: int

    def __str__(self) -> str:
        return f"{self.input}x{self.output}"


def _length(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: must be an integer >= 1, got {value!r}")
    return value


def _pair(entry: Any, where: str) -> ShapePair:
    if not isinstance(entry, dict) or "input" not in entry or "output" not in entry:
        raise ValueError(f"{where}: needs input and output, got {entry!r}")
    return ShapePair(_length(entry["input"], f"{where}.input"), _length(entry["output"], f"{where}.output"))


def _short_hash(obj: Any) -> str:
    # Canonical JSON so the label depends only on the shape's content, not dict key order or
    # whether a weight of 1 was written out; 10 hex digits is plenty for a handful of cells.
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def shape_seed(traffic_seed: int) -> int:
    """The shape sampler's seed in a study cell: a stream of its own, derived from the cell's
    traffic seed, so that a request's shape is drawn independently of its arrival gap (the
    arrival process draws from the traffic seed itself)."""
    return int(np.random.SeedSequence([traffic_seed, 1]).generate_state(1, dtype=np.uint64)[0] >> 1)


class ShapeSampler:
    """Per-request shapes for one cell, from a config-style shape spec."""

    def __init__(self, spec: Mapping[str, Any], seed: int) -> None:
        if not isinstance(spec, Mapping):
            raise ValueError(f"shape: must be a mapping, got {spec!r}")
        kinds = [k for k in ("mix", "pattern") if k in spec]
        if len(kinds) > 1:
            raise ValueError("shape: give one of mix or pattern, not both")
        self._rng = np.random.default_rng(seed)
        self._buf: list[int] = []
        self._pos = 0
        if not kinds:
            self.kind = "single"
            self.pairs: tuple[ShapePair, ...] = (_pair(spec, "shape"),)
            self.weights: tuple[float, ...] = (1.0,)
        else:
            self.kind = kinds[0]
            entries = spec[self.kind]
            if not isinstance(entries, list) or not entries:
                raise ValueError(f"shape.{self.kind}: must be a non-empty list")
            self.pairs = tuple(_pair(e, f"shape.{self.kind}[{i}]") for i, e in enumerate(entries))
            if self.kind == "mix":
                weights = []
                for i, e in enumerate(entries):
                    w = e.get("weight", 1)
                    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < math.inf:
                        raise ValueError(f"shape.mix[{i}].weight: must be a positive number, got {w!r}")
                    weights.append(float(w))
                self.weights = tuple(weights)
                self._p = np.array(weights) / sum(weights)
            else:
                self.weights = tuple(1.0 for _ in self.pairs)

    def next(self) -> ShapePair:
        if self.kind == "single":
            return self.pairs[0]
        if self.kind == "pattern":
            pair = self.pairs[self._pos]
            self._pos = (self._pos + 1) % len(self.pairs)
            return pair
        if self._pos >= len(self._buf):
            self._buf = self._rng.choice(len(self.pairs), size=_BLOCK, p=self._p).tolist()
            self._pos = 0
        pair = self.pairs[self._buf[self._pos]]
        self._pos += 1
        return pair

    def label(self) -> str:
        """Filesystem-safe cell label: "4096x256", "mix-<hash>" or "pattern-<hash>"."""
        if self.kind == "single":
            return str(self.pairs[0])
        if self.kind == "mix":
            content: list[list[float]] = [[p.input, p.output, w] for p, w in zip(self.pairs, self.weights)]
        else:
            content = [[p.input, p.output] for p in self.pairs]
        return f"{self.kind}-{_short_hash(content)}"

    def max_total(self) -> int:
        """Largest input+output of any request: what must fit the server's max_model_len."""
        return max(p.input + p.output for p in self.pairs)

    def mean_output(self) -> float:
        """Expected output tokens per request (weighted for a mix, per cycle for a pattern)."""
        total = sum(self.weights)
        return sum(p.output * w for p, w in zip(self.pairs, self.weights)) / total

    def mean_input(self) -> float:
        total = sum(self.weights)
        return sum(p.input * w for p, w in zip(self.pairs, self.weights)) / total


_PAIR_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_shapes(text: str) -> list[ShapePair]:
    """Parse the CLI's `--shapes 512x64,4096x256`."""
    items = text.split(",")
    out = []
    for item in items:
        m = _PAIR_RE.match(item)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise ValueError(f"--shapes: {item.strip()!r} is not INPUTxOUTPUT with positive lengths (e.g. 512x64)")
        out.append(ShapePair(int(m.group(1)), int(m.group(2))))
    return out


def shape_spec(pair: ShapePair) -> dict[str, int]:
    """The config-style spec of one pair, for ShapeSampler."""
    return {"input": pair.input, "output": pair.output}
