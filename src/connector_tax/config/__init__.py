"""A study config: read once, validated (schema, then cross-field checks), typed.

load_config(path) -> dict        the validated mapping, every schema default filled
load_study(path) -> StudyConfig  the same, as typed read-only objects (config.study)
default_validity() -> Validity   the validity gate's bounds as the schema sets them (no config)
default_request() -> Request     the request settings as the schema sets them (the load generator's defaults)
cells                            phases, cell labels and the cells a study plans (config.cells)
"""

from connector_tax.config.cells import (
    LAUNCH_OF,
    LAUNCH_PHASES,
    PHASE_A,
    PHASE_B,
    PHASE_B_PRIME,
    PHASES,
    Cell,
    launch_label,
    launch_order,
    phase_a_cells,
    phase_b_cells,
    phase_b_shapes,
    planned_cells,
    rate_label,
    run_order,
    shape_label,
)
from connector_tax.config.errors import ConfigError
from connector_tax.config.gate_settings import Saturation, Validity
from connector_tax.config.load import (
    default_config_path,
    default_request,
    default_saturation,
    default_validity,
    find_variant,
    load_config,
    load_study,
    ok_line,
    schema_path,
    validate_config,
)
from connector_tax.config.study import LmcacheServer, Model, Request, StudyConfig, Variant

__all__ = [
    "LAUNCH_OF",
    "LAUNCH_PHASES",
    "PHASES",
    "PHASE_A",
    "PHASE_B",
    "PHASE_B_PRIME",
    "Cell",
    "ConfigError",
    "LmcacheServer",
    "Model",
    "Request",
    "Saturation",
    "StudyConfig",
    "Validity",
    "Variant",
    "default_config_path",
    "default_request",
    "default_saturation",
    "default_validity",
    "find_variant",
    "launch_label",
    "launch_order",
    "load_config",
    "load_study",
    "ok_line",
    "phase_a_cells",
    "phase_b_cells",
    "phase_b_shapes",
    "planned_cells",
    "rate_label",
    "run_order",
    "schema_path",
    "shape_label",
    "validate_config",
]
