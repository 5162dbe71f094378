"""Where the code vLLM imports by dotted path (tools/, patches/) is: vLLM's PYTHONPATH gets it."""

from __future__ import annotations

from pathlib import Path

from connector_tax import resources


def repo_root() -> Path:
    """The folder holding tools/ and patches/ (a checkout, or an installed package's bundle)."""
    return resources.root()


def tools_dir() -> Path:
    return repo_root() / "tools"
