"""Per-request shapes: single pairs, weighted mixes, repeating patterns, CLI parsing."""

from __future__ import annotations

import hashlib
import re
from collections import Counter

import pytest

from connector_tax.loadgen.schedule.shapes import ShapePair, ShapeSampler, parse_shapes, shape_spec

MIX = {
    "mix": [
        {"input": 512, "output": 64, "weight": 3},
        {"input": 4096, "output": 256},
        {"input": 16384, "output": 32, "weight": 0.5},
    ]
}
PATTERN = {"pattern": [{"input": 16384, "output": 64}] + [{"input": 256, "output": 64}] * 3}


def test_single() -> None:
    s = ShapeSampler({"input": 4096, "output": 256}, seed=1)
    assert {s.next() for _ in range(10)} == {ShapePair(4096, 256)}
    assert s.label() == "4096x256"
    assert str(ShapePair(512, 64)) == "512x64"
    assert s.max_total() == 4352
    assert s.mean_output() == 256


def test_mix_weights_respected() -> None:
    s = ShapeSampler(MIX, seed=11)
    n = 50_000
    counts = Counter(s.next() for _ in range(n))
    total_w = 4.5
    for pair, w in [(ShapePair(512, 64), 3), (ShapePair(4096, 256), 1), (ShapePair(16384, 32), 0.5)]:
        assert abs(counts[pair] / n - w / total_w) < 0.02
    assert s.max_total() == 16384 + 32
    assert s.mean_output() == pytest.approx((64 * 3 + 256 + 32 * 0.5) / 4.5)
    assert s.mean_input() == pytest.approx((512 * 3 + 4096 + 16384 * 0.5) / 4.5)


def test_mix_seeded() -> None:
    s1, s2, s3 = ShapeSampler(MIX, seed=5), ShapeSampler(MIX, seed=5), ShapeSampler(MIX, seed=6)
    seq1 = [s1.next() for _ in range(5000)]
    assert seq1 == [s2.next() for _ in range(5000)]
    assert seq1 != [s3.next() for _ in range(5000)]


def test_pattern_order() -> None:
    s = ShapeSampler(PATTERN, seed=0)
    seq = [s.next() for _ in range(10)]
    long, short = ShapePair(16384, 64), ShapePair(256, 64)
    assert seq == [long, short, short, short, long, short, short, short, long, short]
    assert s.mean_output() == 64
    assert s.max_total() == 16384 + 64


def test_labels_stable_and_safe() -> None:
    mix_label = ShapeSampler(MIX, seed=1).label()
    assert mix_label == ShapeSampler(MIX, seed=99).label()  # the seed is not part of the shape
    assert re.fullmatch(r"mix-[0-9a-f]{10}", mix_label)
    pat_label = ShapeSampler(PATTERN, seed=1).label()
    assert re.fullmatch(r"pattern-[0-9a-f]{10}", pat_label)
    # Key order and an explicit default weight do not change the label; content does.
    reordered = {
        "mix": [
            {"weight": 3, "output": 64, "input": 512},
            {"input": 4096, "output": 256, "weight": 1},
            {"input": 16384, "output": 32, "weight": 0.5},
        ]
    }
    assert ShapeSampler(reordered, seed=1).label() == mix_label
    other = {"mix": [{"input": 512, "output": 64, "weight": 2}, {"input": 4096, "output": 256}]}
    assert ShapeSampler(other, seed=1).label() != mix_label
    # Fixed value: labels name result directories across runs and machines.
    one = ShapeSampler({"pattern": [{"input": 1, "output": 2}]}, seed=0)
    assert one.label() == "pattern-" + hashlib.sha256(b"[[1,2]]").hexdigest()[:10]
    for label in (mix_label, pat_label, "4096x256"):
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", label)


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"input": 0, "output": 4}, "shape.input"),
        ({"input": 4}, "shape"),
        ({"mix": []}, "shape.mix"),
        ({"mix": [{"input": 1, "output": 1, "weight": 0}]}, "shape.mix[0].weight"),
        ({"pattern": [{"input": 1, "output": 1}, {"input": 1}]}, "shape.pattern[1]"),
        ({"mix": [{"input": 1, "output": 1}], "pattern": [{"input": 1, "output": 1}]}, "shape"),
        ("512x64", "shape"),
    ],
)
def test_spec_errors(spec, where: str) -> None:
    with pytest.raises(ValueError) as exc:
        ShapeSampler(spec, seed=0)
    assert str(exc.value).startswith(where + ":")


def test_parse_shapes() -> None:
    assert parse_shapes("512x64,4096x256") == [ShapePair(512, 64), ShapePair(4096, 256)]
    assert parse_shapes(" 512X64 ") == [ShapePair(512, 64)]
    cases = [("512x64,4096", "4096"), ("512x0", "512x0"), ("", ""), ("a x b", "a x b"), ("1x2,", "")]
    for bad, item in cases:
        with pytest.raises(ValueError) as exc:
            parse_shapes(bad)
        msg = str(exc.value)
        assert msg.startswith("--shapes:") and repr(item) in msg and "\n" not in msg


def test_shape_spec_roundtrip() -> None:
    pair = ShapePair(1024, 128)
    assert shape_spec(pair) == {"input": 1024, "output": 128}
    s = ShapeSampler(shape_spec(pair), seed=0)
    assert s.next() == pair and s.label() == str(pair)
