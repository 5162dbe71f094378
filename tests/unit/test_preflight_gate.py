"""A gated preflight takes a verify script's verdict only when it is this run's and the script
exited 0 (pipeline/preflight.py run_gate); a phase job takes an ok only for the launch settings it
was checked with (pipeline/phase.py preflight_reason).

The verify scripts write their verdicts into a log folder that outlives a run
(results/<study>/preflight/<variant>/preflight_status.json): a script that failed, crashed, hung or
ignored its run ID must never pass on what an earlier run left there. Fake scripts stand in for
tools/verify_*.sh (the real ones against a server: tests/e2e/test_tools_verify_servers.py); the
study is the CPU study against a stand-in vLLM (tests/unit/test_preflight_probe.py), whose
noop_connector variant is gated by verify_noop_connector.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from test_preflight_probe import study as cpu_study

from connector_tax.config import load_study
from connector_tax.contract import StudyLayout
from connector_tax.measure.cellplan import launch_digest, launch_plan
from connector_tax.pipeline import phase, preflight

REPO = Path(__file__).resolve().parents[2]
NAME = "noop_connector"
# What verify_noop_connector.sh writes on a pass, as it wrote it before verdicts were stamped.
PASSED = "passed: started, /v1/models, requests, /health and process alive"
EARLIER = {
    NAME: {"status": "ok", "reason": PASSED, "check": "noop_connector", "checked_at": "2026-12-01T10:00:00+0000"}
}

# Every fake script gets `CONFIG OUT_DIR --only NAME --port P --start-timeout S --run ID`, as the real ones.
_ARGS = textwrap.dedent(
    """\
    out="$2"; shift 2
    name=""; run=""
    while [ $# -gt 0 ]; do
      case "$1" in
        --only) name="$2"; shift 2 ;;
        --run) run="$2"; shift 2 ;;
        *) shift ;;
      esac
    done
    """
)
_VERDICT = '{"%s": {"status": "%s", "reason": "%s", "run": "%s"}}'


def verdict(status: str, reason: str, run: str = '"$run"') -> str:
    """Bash writing {NAME: {status, reason, run}} as a verify script's record does."""
    return f'printf \'{_VERDICT}\\n\' "$name" {status} "{reason}" {run} > "$out/preflight_status.json"\n'


SCRIPTS = {
    "exit_2": "exit 2\n",
    "stale_ok": verdict("ok", PASSED, run='"an-earlier-run"'),
    "unstamped_ok": 'printf \'{"%s": {"status": "ok", "reason": "passed"}}\\n\' "$name" > "$out/preflight_status.json"\n',
    "ok_then_crash": verdict("ok", PASSED) + "kill -KILL $$\n",
    "ok_then_exit_1": verdict("ok", PASSED) + "exit 1\n",
    "skip_then_exit_1": verdict("skip", "the check client failed") + "exit 1\n",
    "other_name": "name=plain\n" + verdict("ok", PASSED),
    "garbled": 'echo "{not json" > "$out/preflight_status.json"\n',
    "hangs": "sleep 30\n",
    "ok": verdict("ok", PASSED),
    "which_python": verdict("ok", "$CTAX_PYTHON"),
    "skip": verdict("skip", "server process exited during start-up: NoOpConnector import failed"),
}


def script(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "scripts" / f"verify_{kind}.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + _ARGS + SCRIPTS[kind])
    return path


@pytest.fixture()
def gated(tmp_path):
    """The CPU study (stand-in vLLM) and a log folder holding an earlier run's ok."""
    config = cpu_study(tmp_path, "gated")
    out = tmp_path / "log"
    out.mkdir()
    (out / "preflight_status.json").write_text(json.dumps(EARLIER))
    return load_study(config), out


def gate(gated, tmp_path: Path, kind: str) -> dict:
    study, out = gated
    result = preflight.run_gate(study, NAME, script(tmp_path, kind), out)
    assert result["variant"] == NAME and result["gate"] == f"verify_{kind}.sh"
    assert "\n" not in (result["reason"] or "")  # one line
    return result


def test_a_script_that_only_exits_2_never_passes_on_an_earlier_runs_ok(gated, tmp_path):
    result = gate(gated, tmp_path, "exit_2")
    assert result["status"] == "skip"
    assert result["reason"].startswith("verify_exit_2.sh exited with status 2 and gave no verdict of this run (")
    assert "is another run's (with no run stamp, checked at 2026-12-01T10:00:00+0000" in result["reason"]


@pytest.mark.parametrize(
    "kind, why",
    [
        ("stale_ok", "is another run's (stamped run an-earlier-run;"),
        ("unstamped_ok", "is another run's (with no run stamp;"),  # a script that ignores --run
        ("other_name", f"no verdict for {NAME} in "),
        ("garbled", "preflight_status.json unreadable: "),
    ],
)
def test_exit_0_without_a_verdict_of_this_run_is_a_skip_saying_what_was_wrong(gated, tmp_path, kind, why):
    result = gate(gated, tmp_path, kind)
    assert result["status"] == "skip"
    assert result["reason"].startswith(f"verify_{kind}.sh exited 0 but gave no verdict of this run: ")
    assert why in result["reason"], result["reason"]


def test_an_ok_from_a_script_that_crashed_or_failed_is_a_skip(gated, tmp_path):
    crashed = gate(gated, tmp_path, "ok_then_crash")
    assert crashed["status"] == "skip"
    assert crashed["reason"] == (
        f"verify_ok_then_crash.sh was killed by signal 9 though its verdict says ok ({PASSED}): a failed check passes nothing"
    )
    failed = gate(gated, tmp_path, "ok_then_exit_1")
    assert failed["status"] == "skip"
    assert failed["reason"].startswith("verify_ok_then_exit_1.sh exited with status 1 though its verdict says ok")
    skipped = gate(gated, tmp_path, "skip_then_exit_1")
    assert skipped == {**skipped, "status": "skip"}
    assert skipped["reason"] == "the check client failed (verify_skip_then_exit_1.sh exited with status 1)"


def test_a_script_that_hangs_is_stopped_and_skipped(gated, tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "ready_timeout_s", lambda study, variant: 1.0)  # its server's start
    # and the script's checks beyond it (raising=False: the revert check runs this without GATE_S there)
    monkeypatch.setattr(preflight, "GATE_S", 1.0, raising=False)
    result = gate(gated, tmp_path, "hangs")
    assert result["status"] == "skip"
    assert result["reason"] == "verify_hangs.sh timed out after 2 s and was stopped"


def test_this_runs_verdict_of_a_script_that_exited_0_is_the_result(gated, tmp_path):
    study, out = gated
    ok = gate(gated, tmp_path, "ok")
    assert (ok["status"], ok["reason"]) == ("ok", PASSED)
    # the verdict the script wrote carries the run ID the preflight gave it, and nothing else does
    assert json.loads((out / "preflight_status.json").read_text())[NAME]["run"] == ok["run"]
    # the script runs the package through the pipeline's own Python, whatever PATH holds
    assert gate(gated, tmp_path, "which_python")["reason"] == sys.executable
    skip = gate(gated, tmp_path, "skip")
    assert skip["status"] == "skip" and skip["reason"].startswith("server process exited during start-up")
    assert skip["run"] != ok["run"]  # every run its own


def fake_root(tmp_path: Path, verify_noop: str) -> Path:
    """A project root (CONNECTOR_TAX_ROOT) that is this checkout but for verify_noop_connector.sh."""
    root = tmp_path / "root"
    (root / "tools").mkdir(parents=True)
    for part in ("workflow", "patches", "configs"):
        (root / part).symlink_to(REPO / part)
    for path in (REPO / "tools").iterdir():
        if path.name != "verify_noop_connector.sh":
            (root / "tools" / path.name).symlink_to(path)
    (root / "tools" / "verify_noop_connector.sh").write_text("#!/usr/bin/env bash\n" + _ARGS + verify_noop)
    return root


def test_through_ctax_a_gate_that_exits_2_beside_an_earlier_ok_is_a_skip(tmp_path):
    """`ctax pipeline preflight check`, what the preflight rule runs, with the study's own log
    folder holding what an earlier run's verify_noop_connector.sh left there."""
    cpu_study(tmp_path, "gated")
    ready = StudyLayout(tmp_path / "results" / "probe-test")
    log_dir = ready.preflight_logs(NAME)
    log_dir.mkdir(parents=True)
    (log_dir / "preflight_status.json").write_text(json.dumps(EARLIER))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CONNECTOR_TAX_ROOT"] = str(fake_root(tmp_path, SCRIPTS["exit_2"]))
    argv = [sys.executable, "-m", "connector_tax.cli", "pipeline", "preflight", "check", "--config", "study.yaml"]
    argv += ["--variant", NAME, "--out", str(ready.preflight_ready(NAME)), "--log-dir", str(log_dir)]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(ready.preflight_ready(NAME).read_text())
    assert result["status"] == "skip" and result["gate"] == "verify_noop_connector.sh", result
    assert result["reason"].startswith("verify_noop_connector.sh exited with status 2 and gave no verdict of this run")
    assert done.stdout.startswith(f"{NAME}: skip (verify_noop_connector.sh exited with status 2")


def test_a_phase_job_takes_an_ok_only_for_the_launch_settings_it_was_checked_with(tmp_path):
    from connector_tax.measure.cellplan import digest_of

    config = cpu_study(tmp_path, "gated")
    study = load_study(config)
    layout = StudyLayout(tmp_path / "results" / "probe-test")
    layout.preflight_status.parent.mkdir(parents=True)
    digest = launch_digest(study, config, NAME)
    # the phase job names its launch the way the preflight did
    assert digest_of(launch_plan(config, study, NAME, "phase_a", None).launch) == digest

    def status(entry: dict) -> str | None:
        layout.preflight_status.write_text(json.dumps({NAME: entry}))
        return phase.preflight_reason(layout, NAME, digest)

    assert status({"status": "ok", "launch": digest}) is None
    assert status({"status": "ok", "launch": "0123456789ab"}) == (
        f"preflight ok is for other launch settings (checked 0123456789ab, this launch {digest}): run the preflight again"
    )
    assert status({"status": "ok"}).startswith("preflight ok is for other launch settings (checked none named,")
    assert status({"status": "skip", "reason": "x", "launch": digest}) == "preflight SKIP: x"


def test_a_phase_job_with_an_ok_of_other_settings_launches_nothing(tmp_path, monkeypatch):
    """run_phase records the launch skipped with the reason, before any server is started."""
    config = cpu_study(tmp_path, "gated")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAKE_VLLM_LAUNCHES", str(tmp_path / "launches"))  # the stand-in's `serve` writes here
    study = load_study(config)
    edited = yaml.safe_load(Path(config).read_text())
    edited["server"]["max_num_seqs"] = 7  # a launch setting
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(edited))
    layout = StudyLayout.of(study.study)
    layout.preflight_status.parent.mkdir(parents=True)
    stale = launch_digest(load_study(other), other, NAME)
    assert stale != launch_digest(study, config, NAME)
    layout.preflight_status.write_text(json.dumps({NAME: {"status": "ok", "launch": stale}}))
    index = phase.run_phase(study, NAME, "phase_a")
    assert index.status == "skipped"
    assert index.reason.startswith(f"preflight ok is for other launch settings (checked {stale}, ")
    assert not (tmp_path / "launches").exists()  # the stand-in vLLM was never started
