"""The servers the `ctax sim` API tests talk to: one module-scoped server with default faults, and
one whose max_model_len is small (the context-length rules)."""

from __future__ import annotations

import httpx
import pytest
from sim_api_common import SMALL_LEN
from sim_server import SimProcess, running_sim, small_config


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    with running_sim(tmp_path_factory.mktemp("sim-api")) as server:
        yield server


@pytest.fixture(scope="module")
def client(sim: SimProcess):
    with httpx.Client(base_url=sim.url, timeout=10.0) as c:
        yield c


@pytest.fixture(scope="module")
def small_client(tmp_path_factory: pytest.TempPathFactory):
    """A server whose max_model_len is 4096, for the context-length rules."""
    workdir = tmp_path_factory.mktemp("sim-small")
    config = small_config(workdir / "small.yaml", SMALL_LEN)
    with running_sim(workdir, config=config, logs=False) as server:
        with httpx.Client(base_url=server.url, timeout=10.0) as c:
            yield c
