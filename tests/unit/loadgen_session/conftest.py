"""The servers and the shared generator of the LoadGenerator tests: five `ctax sim` (plain, its twin
for a duet, hung, HTTP 500, malformed SSE) started once per test session, a two-worker generator with side files on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loadgen_common import SIM_FLAGS, options
from sim_server import SimProcess, launch

from connector_tax.loadgen.schedule.session import LoadGenerator


@pytest.fixture(scope="session")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("loadgen-sims")
    started: dict[str, SimProcess] = {}
    try:
        for name, flags in SIM_FLAGS.items():  # all start at once; then wait for each
            started[name] = launch(root, *flags, connector="plain", name=name)
        for sim in started.values():
            sim.wait_ready()
        yield started
    finally:
        for sim in started.values():
            sim.stop()


@pytest.fixture(scope="session")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loadgen-out")


@pytest.fixture(scope="session")
def gen(sims: dict[str, SimProcess]) -> Any:
    """Two workers against the plain sim, side files on."""
    with LoadGenerator(options(sims["plain"].url, workers=2, chunk_log=True, events_log=True)) as g:
        yield g
