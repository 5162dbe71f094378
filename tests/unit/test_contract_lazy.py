"""The contract package's names load on first use: every exported name resolves, and a load
generator worker starts without the config and jsonschema (its start is on every launch's path)."""

from __future__ import annotations

import subprocess
import sys

import connector_tax.contract as contract


def test_every_exported_name_resolves() -> None:
    assert sorted(contract._MODULE_OF) == sorted(contract.__all__)
    for name in contract.__all__:
        assert getattr(contract, name) is not None


def test_a_worker_imports_neither_the_config_nor_jsonschema() -> None:
    code = (
        "import sys\nimport connector_tax.loadgen.worker.process\n"
        "print(sorted(m for m in ('jsonschema', 'connector_tax.config', 'yaml') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
