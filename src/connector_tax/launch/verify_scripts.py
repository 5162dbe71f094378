"""Which of the study's pre-flight verify scripts (tools/verify_*.sh) gates a configuration."""

from __future__ import annotations

from pathlib import Path

from connector_tax.config import StudyConfig, Variant
from connector_tax.launch.paths import tools_dir

# Which pre-flight verify script gates which kind of configuration (the study's three).
PREFLIGHT_SCRIPTS = {
    "kv_consumer": "verify_kv_consumer.sh",
    "multi_connector": "verify_multi_connector.sh",
    "noop_connector": "verify_noop_connector.sh",
}


def preflight_check(variant: Variant) -> str | None:
    """Which pre-flight check gates a variant (a key of PREFLIGHT_SCRIPTS), or None."""
    connector = variant.connector or {}
    kind, role = connector.get("type"), connector.get("role")
    if kind == "multi":
        return "multi_connector"
    if kind in ("noop", "custom"):
        return "noop_connector"  # a class loaded by module path: the same risk
    if kind == "mooncake" and role == "kv_consumer":
        return "kv_consumer"
    return None


def preflight_script(study: StudyConfig, name: str) -> Path | None:
    """The verify script that gates config `name` (run it as `bash SCRIPT CONFIG_FILE OUT_DIR
    --only NAME`), or None if the study runs no pre-flight for it."""
    check = preflight_check(study.variant(name))
    return None if check is None else tools_dir() / PREFLIGHT_SCRIPTS[check]


def preflight_plan(study: StudyConfig) -> dict[str, Path]:
    """{config name: verify script} for every gated config of the study."""
    plan = {}
    for variant in study.variants:
        script = preflight_script(study, variant.name)
        if script is not None:
            plan[variant.name] = script
    return plan
