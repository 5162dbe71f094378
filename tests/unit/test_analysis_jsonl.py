"""The column reader: pyarrow fast path, stdlib fallback, truncated and corrupt lines."""

from __future__ import annotations

import json

import numpy as np

from connector_tax.analysis import jsonl
from connector_tax.analysis.jsonl import NULL_INT, read_columns

FIELDS = {"t": "int", "x": "float", "w": "bool", "s": "str"}


def _write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")


def test_columns_types_and_nulls(tmp_path):
    p = tmp_path / "a.jsonl"
    _write(
        p,
        [
            {"t": 3_000_000_000_000_123, "x": 1.5, "w": True, "s": "ok", "extra": [1, 2]},
            {"t": None, "x": None, "w": None, "s": None},
            {"x": 2},
        ],
    )
    cols = read_columns(p, FIELDS)
    assert cols["t"].dtype == np.int64 and cols["t"][0] == 3_000_000_000_000_123
    assert cols["t"][1] == NULL_INT and cols["t"][2] == NULL_INT
    assert np.isnan(cols["x"][1]) and cols["x"][2] == 2.0
    assert cols["w"].tolist() == [True, False, False]
    assert cols["s"].tolist() == ["ok", None, None]


def test_truncated_last_line_is_ignored_by_both_paths(tmp_path, monkeypatch):
    p = tmp_path / "b.jsonl"
    _write(p, [{"t": i, "x": float(i), "w": False, "s": "ok"} for i in range(5)], tail='{"t": 99, "x": 9')
    fast = read_columns(p, FIELDS)
    assert fast["t"].tolist() == [0, 1, 2, 3, 4]
    monkeypatch.setattr(jsonl, "pa", None)
    slow = read_columns(p, FIELDS)
    for k in FIELDS:
        assert fast[k].tolist() == slow[k].tolist()


def test_corrupt_middle_line_falls_back_to_stdlib(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"t": 1, "x": 1.0}\nnot json at all\n{"t": 2, "x": 2.0}\n', encoding="utf-8")
    cols = read_columns(p, {"t": "int", "x": "float"})
    assert cols["t"].tolist() == [1, 2]


def test_blocks_split_across_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "BLOCK_BYTES", 64)  # many blocks, lines cut at block edges
    p = tmp_path / "d.jsonl"
    recs = [{"t": i, "x": i / 3, "w": i % 2 == 0, "s": f"s{i}"} for i in range(300)]
    _write(p, recs)
    cols = read_columns(p, FIELDS)
    assert cols["t"].tolist() == list(range(300))
    assert cols["s"][-1] == "s299"


def test_empty_file(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text("")
    cols = read_columns(p, FIELDS)
    assert all(v.size == 0 for v in cols.values())
