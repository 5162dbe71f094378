"""Tests build and edit study configs as mappings (load_config, then a key changed); the code
takes them typed. These turn a mapping into what the code takes, at the call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from connector_tax.config import StudyConfig, Variant


def study_of(config: Mapping[str, Any]) -> StudyConfig:
    """A validated config mapping (edited or not) as the typed study."""
    return StudyConfig.from_mapping(config)


def typed(config: Mapping[str, Any], name: str) -> tuple[StudyConfig, Variant]:
    """(study, its variant `name`): the first two arguments of the launchers."""
    study = study_of(config)
    return study, study.variant(name)
