"""A study config: read once, validated (schema, then cross-field checks), typed.

load_config(path) -> dict        the validated mapping, every schema default filled
load_study(path) -> StudyConfig  the same, as typed read-only objects (config.study)
"""

from connector_tax.config.errors import ConfigError
from connector_tax.config.load import (
    check_file,
    default_config_path,
    find_variant,
    load_config,
    load_study,
    schema_path,
    validate_config,
)
from connector_tax.config.study import StudyConfig, Variant

__all__ = [
    "ConfigError",
    "StudyConfig",
    "Variant",
    "check_file",
    "default_config_path",
    "find_variant",
    "load_config",
    "load_study",
    "schema_path",
    "validate_config",
]
