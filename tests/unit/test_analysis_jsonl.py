"""The column reader: pyarrow fast path, stdlib fallback and small-file path, truncated and corrupt lines."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from connector_tax.analysis import jsonl
from connector_tax.analysis.jsonl import NULL_INT, read_columns

FIELDS = {"t": "int", "x": "float", "w": "bool", "s": "str"}


def _write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")


@pytest.fixture(params=["pyarrow", "line by line"])
def reader(request, monkeypatch):
    """Each test's small files through both readers: pyarrow's (as for a file of ARROW_MIN_BYTES
    or more) and the stdlib's (a smaller one)."""
    monkeypatch.setattr(jsonl, "ARROW_MIN_BYTES", 0 if request.param == "pyarrow" else 1 << 40)
    return request.param


def test_columns_types_and_nulls(tmp_path, reader):
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
    monkeypatch.setattr(jsonl, "ARROW_MIN_BYTES", 0)
    p = tmp_path / "b.jsonl"
    _write(p, [{"t": i, "x": float(i), "w": False, "s": "ok"} for i in range(5)], tail='{"t": 99, "x": 9')
    fast = read_columns(p, FIELDS)
    assert fast["t"].tolist() == [0, 1, 2, 3, 4]
    monkeypatch.setattr(jsonl, "pa", None)
    slow = read_columns(p, FIELDS)
    for k in FIELDS:
        assert fast[k].tolist() == slow[k].tolist()


def test_corrupt_middle_line_falls_back_to_stdlib(tmp_path, reader):
    p = tmp_path / "c.jsonl"
    p.write_text('{"t": 1, "x": 1.0}\nnot json at all\n{"t": 2, "x": 2.0}\n', encoding="utf-8")
    cols = read_columns(p, {"t": "int", "x": "float"})
    assert cols["t"].tolist() == [1, 2]


def test_blocks_split_across_reads(tmp_path, monkeypatch, reader):
    monkeypatch.setattr(jsonl, "BLOCK_BYTES", 64)  # many blocks, lines cut at block edges
    p = tmp_path / "d.jsonl"
    recs = [{"t": i, "x": i / 3, "w": i % 2 == 0, "s": f"s{i}"} for i in range(300)]
    _write(p, recs)
    cols = read_columns(p, FIELDS)
    assert cols["t"].tolist() == list(range(300))
    assert cols["s"][-1] == "s299"


def test_empty_file(tmp_path, reader):
    p = tmp_path / "e.jsonl"
    p.write_text("")
    cols = read_columns(p, FIELDS)
    assert all(v.size == 0 for v in cols.values())


def test_a_small_file_is_read_without_pandas(tmp_path):
    """A phase job's saturation checks read one cell's requests: they must not pay pandas' import
    (pyarrow's conversion to numpy imports it), while a file past ARROW_MIN_BYTES goes to pyarrow."""
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    _write(small, [{"t": i, "x": 0.5, "w": True, "s": "ok"} for i in range(100)])
    _write(large, [{"t": i, "x": 0.5, "w": True, "s": "ok"} for i in range(4000)])
    assert small.stat().st_size < jsonl.ARROW_MIN_BYTES <= large.stat().st_size
    code = (
        "import sys\nfrom connector_tax.analysis import jsonl\n"
        "calls = []\narrow = jsonl._read_arrow\n"
        "jsonl._read_arrow = lambda path, fields: calls.append(path) or arrow(path, fields)\n"
        f"cols = jsonl.read_columns({str(small)!r}, {FIELDS!r})\n"
        "assert cols['t'].tolist() == list(range(100)), cols\n"
        "print('pandas' in sys.modules, len(calls))\n"
        f"jsonl.read_columns({str(large)!r}, {FIELDS!r})\n"
        "print(len(calls))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "0", "1"]
