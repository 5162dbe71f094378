"""What a verify script's or the smoke test's client checks against one variant's server (tools/
preflight_client.py reads it as JSON): its URL, model and endpoint, and the requests it sends and
the time they must complete in."""

from __future__ import annotations

from typing import Any

from connector_tax.config import StudyConfig
from connector_tax.launch.command import sidecar_names
from connector_tax.launch.vllm import preflight_check, side_ports

# The study's pre-flight checks: requests sent one after another, tokens each, and the time
# all of them must complete in (docs/study-design.md, Pre-flight).
CHECK_PLANS = {
    "kv_consumer": {"requests": 1, "max_tokens": 4, "budget_s": 30.0, "bootstrap": True},
    "multi_connector": {"requests": 5, "max_tokens": 32, "budget_s": 60.0, "bootstrap": False},
    "noop_connector": {"requests": 5, "max_tokens": 32, "budget_s": 30.0, "bootstrap": False},
    "smoke": {"requests": 3, "max_tokens": 16, "budget_s": 120.0, "bootstrap": False},
}


def connect_host(host: str) -> str:
    """Where a client on this host reaches a server bound to `host`."""
    if host in ("0.0.0.0", "", "*"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def plan(study: StudyConfig, name: str, port: int, check: str | None = None) -> dict[str, Any]:
    """The client's plan for variant `name` served on `port`: the variant's own pre-flight check
    unless `check` names one (ValueError naming CHECK for one that is not)."""
    variant = study.variant(name)
    check = check or preflight_check(variant) or "smoke"
    if check not in CHECK_PLANS:
        raise ValueError(f"CHECK: {check!r} is not one of {', '.join(CHECK_PLANS)}")
    side_ports(port)
    return {
        "name": name,
        "check": check,
        "backend": study.backend,
        "url": f"http://{connect_host(variant.host or study.host)}:{port}",
        "model": study.model.served,
        "has_connector": bool(variant.connector),
        "sidecars": sidecar_names(study, variant),
        "endpoint": study.workload.request.endpoint,
        **CHECK_PLANS[check],
    }
