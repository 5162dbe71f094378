"""The order of a launch's steps (measure.runners.ServerRunner.launch): a simulated server's
load generator starts while the server boots; vLLM's only once it is ready (the load generator is
pinned after the server's threads, and the idle threads are recorded without it). The server and
the load generator are stand-ins that record what happened, so no process starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connector_tax.config import PHASE_B, StudyConfig, load_config
from connector_tax.contract import StudyLayout
from connector_tax.contract.index import PhaseIndex
from connector_tax.measure import runners

REPO = Path(__file__).resolve().parents[2]


def _events(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config: str) -> list[str]:
    events: list[str] = []

    class Server:
        proc = None
        cpus: tuple[int, ...] = ()

        def __init__(self, spec: Any, url: str, folder: Path, cpus: tuple[int, ...] = ()) -> None:
            self.url = url

        def __enter__(self) -> Server:
            events.append("server started")
            return self

        def __exit__(self, *exc: object) -> None:
            events.append("server stopped")

        def wait_ready(self, timeout_s: float, failure: Any) -> None:
            events.append("server ready")

    class Generator:
        def __init__(self, options: Any) -> None:
            self.options = options

        def __enter__(self) -> Generator:
            events.append("load generator started")
            return self

        def __exit__(self, *exc: object) -> None:
            events.append("load generator stopped")

    monkeypatch.setattr(runners, "ServerProcess", Server)
    monkeypatch.setattr(runners, "LoadGenerator", Generator)
    monkeypatch.chdir(tmp_path)
    raw = load_config(REPO / "configs" / config)
    if raw["model"].get("local"):  # a clean checkout has no tiny model: a folder vLLM's check accepts
        (tmp_path / "model").mkdir()
        (tmp_path / "model" / "config.json").write_text("{}")
        raw["model"]["name"] = str(tmp_path / "model")
    study = StudyConfig.from_mapping(raw)
    name = study.variants[0].name
    folder = StudyLayout.of(study.study).phase(name, PHASE_B, 1)
    index = PhaseIndex(study.study, name, PHASE_B, study.backend, {}, {}, [])
    with runners.ServerRunner(study, study.variant(name), folder).launch(index, lambda: None) as launched:
        assert launched.gen.options.url == launched.server.url
        events.append("cells")
    return events


def test_a_simulated_servers_load_generator_starts_while_it_boots(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    events = _events(monkeypatch, tmp_path, "default.yaml")
    assert events == [
        "server started",
        "load generator started",
        "server ready",
        "cells",
        "load generator stopped",
        "server stopped",
    ]


def test_vllms_load_generator_starts_once_it_is_ready(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    events = _events(monkeypatch, tmp_path, "vllm-cpu-tiny.yaml")
    assert events == [
        "server started",
        "server ready",
        "load generator started",
        "cells",
        "load generator stopped",
        "server stopped",
    ]
