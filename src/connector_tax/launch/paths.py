"""Where the connector-tax checkout is: vLLM imports tools/ and patches/ from it by dotted path."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The connector-tax checkout whose tools/ and patches/ vLLM must import.

    $CONNECTOR_TAX_ROOT if set; else the checkout this package lives in (an editable or
    source install); else the current directory if it is a checkout."""
    candidates = []
    if os.environ.get("CONNECTOR_TAX_ROOT"):
        candidates.append(Path(os.environ["CONNECTOR_TAX_ROOT"]))
    candidates += [Path(__file__).resolve().parents[3], Path.cwd()]
    for root in candidates:
        if (root / "tools" / "noop_connector.py").is_file() and (root / "patches" / "step_timing.py").is_file():
            return root.resolve()
    raise ValueError(
        "CONNECTOR_TAX_ROOT: cannot find the connector-tax checkout (tools/noop_connector.py, "
        "patches/step_timing.py); set CONNECTOR_TAX_ROOT to it"
    )


def tools_dir() -> Path:
    return repo_root() / "tools"
