"""Analysis and plots read files only: they import neither the load generator, the simulator,
the pipeline, the server code nor the launchers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "connector_tax"
FORBIDDEN = (
    "connector_tax.sim",
    "connector_tax.loadgen",
    "connector_tax.pipeline",
    "connector_tax.measure",
    "connector_tax.planning",
    "connector_tax.serving",
    "connector_tax.launch",
    "connector_tax.metrics",
    "httpx",
    "zmq",
    "requests",
)


@pytest.mark.parametrize(
    "path",
    sorted((SRC / "analysis").glob("*.py")) + sorted((SRC / "plots").glob("*.py")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_no_forbidden_imports(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), f"{path.name} imports {name}"
