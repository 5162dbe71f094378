"""A stand-in for NIXL's Python API module (nixl_cu12._api of nixl 1.5.1), as far as the NIXL
interventions (patches/interventions/nixl_progress.py) touch it: `nixl_agent_config` with its first
parameters, the bindings' `nixlAgentConfig` and `nixlAgent`, and `nixl_agent.__init__` building
the C++ agent's config as nixl 1.5.1 does (useProgThread from the config, pthrDelay hard-coded 0).
An agent here is a dict of what the C++ agent would have been given."""

from __future__ import annotations

import textwrap
from pathlib import Path

FAKE_NIXL_API = textwrap.dedent(
    """
    import types

    class nixl_agent_config:  # nixl 1.5.1's signature, first parameters
        def __init__(self, enable_prog_thread=True, enable_listen_thread=False, num_threads=0, capture_telemetry=False):
            self.enable_pthread = enable_prog_thread
            self.num_threads = num_threads

    class _Config:
        pthrDelay = None
        useProgThread = None

    def _agent(name, config):
        return {"name": name, "pthrDelay": config.pthrDelay, "useProgThread": config.useProgThread}

    nixlBind = types.SimpleNamespace(nixlAgentConfig=_Config, nixlAgent=_agent, DRAM_SEG=1)

    class nixl_agent:  # what nixl 1.5.1's __init__ does with them
        def __init__(self, name, nixl_conf=None):
            nixl_conf = nixl_conf or nixl_agent_config()
            agent_config = nixlBind.nixlAgentConfig()
            agent_config.useProgThread = nixl_conf.enable_pthread
            agent_config.pthrDelay = 0
            self.agent = nixlBind.nixlAgent(name, agent_config)
    """
)


def fake_nixl(folder: Path) -> Path:
    """`folder`/nixl_cu12/_api.py: put `folder` on sys.path and `import nixl_cu12._api` finds it."""
    package = folder / "nixl_cu12"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").touch()
    (package / "_api.py").write_text(FAKE_NIXL_API)
    return folder
