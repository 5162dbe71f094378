"""Interventions seen to act (issue 65, item 2): each writes what it did in each process (installed,
what it changed, the calls it intercepted) into the launch's own evidence folder, whether step timing
is on or not; the phase job reads it, refuses a launch in which a declared intervention did not act
(the reason in run.json), and run.json, the manifest and the report say "declared and seen" or
"declared, not seen: why" per launch. Writer and reader here on a fake launch folder; the site hook
in a fresh process in test_interventions.py and test_cpu_guard.py; a whole study in
tests/e2e/test_interventions_study.py."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest

from connector_tax.analysis.core import launch_facts
from connector_tax.analysis.report import _header
from connector_tax.config.interventions import EVIDENCE_ENV
from connector_tax.contract.index import PhaseIndex
from connector_tax.contract.layout import StudyLayout
from connector_tax.launch.evidence import read_evidence, seen, unseen, verdict
from connector_tax.measure.runners import _check_interventions
from connector_tax.pipeline.manifest import interventions_seen
from connector_tax.serving.server_process import ServerStartError
from patches import interventions

NAME = "nixl_progress_off"


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """A launch's evidence folder where the layout puts it, named to this process as vLLM's get it."""
    where = StudyLayout(tmp_path).phase("nixl_off", "phase_a").evidence("20261207T000000Z-1.0")
    monkeypatch.setenv(EVIDENCE_ENV, str(where))
    monkeypatch.setattr(interventions, "_EVIDENCE", {})
    return where


def test_the_writer_keeps_what_it_did_in_one_file_per_process_rewritten_whole(folder):
    ev = interventions.evidence(NAME)
    assert interventions.evidence(NAME) is ev  # one per name and process
    ev.installed(["nixl_cu12._api"])
    ev.changed("nixl_cu12._api.nixl_agent_config.__init__: enable_prog_thread=False")
    for _ in range(3):
        ev.fired("NIXL agent without its progress thread")
    (path,) = folder.iterdir()  # no temporary file left beside it
    assert path.name == f"{NAME}.{os.getpid()}.json"
    doc = json.loads(path.read_text())
    assert doc["installed"] is True and doc["calls"] == 3 and doc["pid"] == os.getpid() and doc["errors"] == []
    assert doc["waits_for"] == ["nixl_cu12._api"] and len(doc["changed"]) == 1 and doc["process"]
    interventions.evidence("nixl_progress_delay_1ms").failed("not applied to nixl_cu12._api: AttributeError()")
    failed = json.loads((folder / f"nixl_progress_delay_1ms.{os.getpid()}.json").read_text())
    assert failed["installed"] is False and failed["errors"] == ["not applied to nixl_cu12._api: AttributeError()"]


def test_without_an_evidence_folder_it_writes_nothing_but_stderr(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(EVIDENCE_ENV, raising=False)
    monkeypatch.setattr(interventions, "_EVIDENCE", {})
    monkeypatch.chdir(tmp_path)
    interventions.evidence(NAME).fired("acted")
    assert list(tmp_path.iterdir()) == [] and f"intervention {NAME}: acted" in capsys.readouterr().err


def test_a_forked_child_keeps_evidence_of_its_own(folder):
    interventions.evidence(NAME).installed(["nixl_cu12._api"])
    child = os.fork()
    if child == 0:  # vLLM's workers may be forked after the site hook ran: their calls are theirs
        try:
            interventions.evidence(NAME).fired("acted")
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    docs = {d["pid"]: d for d in read_evidence(folder)[NAME]}
    assert docs[os.getpid()]["calls"] == 0 and docs[child]["calls"] == 1
    assert seen(folder, [NAME])[NAME]["acted_in"] == [child]


def _write(folder: Path, name: str, pid: int, **doc) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    base = {"intervention": name, "pid": pid, "process": f"p{pid}", "installed": True, "waits_for": ["nixl_cu12._api"]}
    (folder / f"{name}.{pid}.json").write_text(json.dumps({**base, "changed": [], "calls": 0, "errors": [], **doc}))


def test_seen_when_it_acted_in_at_least_one_of_the_launchs_processes(folder):
    _write(folder, NAME, 11)  # the API server: NIXL never imported there, nothing to act on
    _write(folder, NAME, 12, changed=["nixl_agent_config"], calls=2)  # the worker: two agent configs
    (folder / f"{NAME}.13.json").write_text('{"intervention": "nixl_pro')  # half a record: skipped
    got = seen(folder, [NAME])[NAME]
    assert got["seen"] and got["calls"] == 2 and got["acted_in"] == [12] and got["processes"] == [11, 12]
    assert got["says"] == "declared and seen: 2 call(s) intercepted in 1 of 2 process(es) (pid 12 (p12): 2)"
    assert unseen({NAME: got}) is None


@pytest.mark.parametrize(
    "records, why",
    [
        ([], "no process of the launch installed it (no evidence)"),
        ([{}, {}], "installed in 2 process(es), none of which imported nixl_cu12._api"),
        ([{"changed": ["nixl_agent_config"]}], "nixl_agent_config, but no call went through it in 1 process(es)"),
        ([{"installed": False, "errors": ["not installed: ImportError()"]}], "not installed: ImportError()"),
    ],
)
def test_not_seen_says_why(folder, records, why):
    for pid, doc in enumerate(records, start=20):
        _write(folder, NAME, pid, **doc)
    got = seen(folder, [NAME])
    assert got[NAME]["seen"] is False and got[NAME]["says"] == f"declared, not seen: {why}"
    assert (
        unseen(got)
        == f"{NAME} declared, not seen: {why} (the launch ran without what its variant declares: not measured)"
    )


def _index(declared: list[str]) -> PhaseIndex:
    return PhaseIndex("s", "nixl_off", "phase_a", "vllm", {}, {}, [], interventions=declared)


def test_a_launch_whose_intervention_did_not_act_is_refused_with_the_reason_in_run_json(folder):
    index, saved = _index([NAME]), []
    _write(folder, NAME, 11)
    with pytest.raises(ServerStartError) as err:
        _check_interventions(index, folder, lambda: saved.append(index.to_dict()))
    assert str(err.value).startswith(f"{NAME} declared, not seen: installed in 1 process(es)")
    assert saved and saved[-1]["interventions_seen"][NAME]["seen"] is False  # on record before the refusal
    _write(folder, NAME, 12, changed=["x"], calls=1)
    _check_interventions(index, folder, lambda: None)  # it acted: the launch goes on
    assert index.interventions_seen[NAME]["seen"] is True


def test_the_manifest_and_the_report_say_it_per_launch():
    index = _index([NAME, "nixl_progress_delay_1ms"])
    index.interventions_seen = {NAME: verdict([{"pid": 5, "process": "w", "calls": 1}])}
    assert interventions_seen(index) == [
        f"{NAME} declared and seen: 1 call(s) intercepted in 1 of 1 process(es) (pid 5 (w): 1)",
        "nixl_progress_delay_1ms declared, not checked (no evidence read)",
    ]
    run = {**index.to_dict(), "replicate": 1}
    study = types.SimpleNamespace(runs={("nixl_off", "phase_a", 1): types.SimpleNamespace(run=run)})
    assert launch_facts(study)["interventions_seen"]["nixl_off"][0] == (
        f"phase_a (launch 1): `{NAME}` declared and seen: 1 call(s) intercepted in 1 of 1 process(es) (pid 5 (w): 1)"
    )
    agg = {
        "study": "s",
        "results_dir": "results/s",
        "variants": ["nixl_off"],
        "ci_method": {"percentiles": "p", "taxes": "t"},
        "saturation": {"throughput_basis": "offered", "thresholds": {}},
        **launch_facts(study),
    }
    assert f"- Intervention of `nixl_off`, phase_a (launch 1): `{NAME}` declared and seen: 1 call(s)" in "\n".join(
        _header(agg)
    )
