"""Shared by the config tests: the one-line error a mutated test-tiny.yaml gives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from connector_tax.config import ConfigError, validate_config

REPO = Path(__file__).resolve().parents[1]


def raw_config(name: str = "configs/test-tiny.yaml") -> dict[str, Any]:
    return yaml.safe_load((REPO / name).read_text())


def config_error(mutate: Callable[[dict[str, Any]], Any]) -> str:
    """The one-line error validate_config gives for test-tiny.yaml after `mutate`."""
    config = raw_config()
    mutate(config)
    with pytest.raises(ConfigError) as info:
        validate_config(config)
    line = str(info.value)
    assert "\n" not in line, line
    return line
