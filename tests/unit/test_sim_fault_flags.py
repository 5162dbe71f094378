"""`ctax sim`'s command-line errors: an unknown connector, a fault flag out of range or not a number, a
bad, broken or missing config file: one stderr line, exit 2, before it serves. The faults
themselves: tests/e2e/test_sim_faults.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sim_server import (
    DEFAULT_CONFIG,
    REPO,
    WAIT_S,
    sim_command,
)


def run_cli(*args: str, timeout: float = WAIT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def stderr_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


# -- command-line errors ------------------------------------------------------------------
def test_unknown_connector(tmp_path: Path) -> None:
    result = run_cli(*sim_command(connector="no_such_connector"))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = stderr_lines(result)
    assert len(lines) == 1, lines
    assert "no_such_connector" in lines[0]


def test_fault_flag_out_of_range(tmp_path: Path) -> None:
    result = run_cli(*sim_command("--http-500-rate", "2"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "--http-500-rate" in result.stderr
    assert "error:" in stderr_lines(result)[-1]


def test_fault_flag_not_a_number(tmp_path: Path) -> None:
    result = run_cli(*sim_command("--crash-after-requests", "many"))
    assert result.returncode == 2
    assert "--crash-after-requests" in stderr_lines(result)[-1]


def test_bad_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEFAULT_CONFIG.read_text(encoding="utf-8").replace("max_num_seqs: 256", "max_num_seqs: -4"))
    result = run_cli(*sim_command(config=bad))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = stderr_lines(result)
    assert len(lines) == 1, lines
    assert "max_num_seqs" in lines[0]


@pytest.mark.parametrize("content", ["", "study: [unclosed\n", "just a string\n"])
def test_broken_config_file(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text(content)
    result = run_cli(*sim_command(config=bad))
    assert result.returncode == 2
    lines = stderr_lines(result)
    assert len(lines) == 1, lines
    assert "broken.yaml" in lines[0]


def test_missing_config_file(tmp_path: Path) -> None:
    result = run_cli(*sim_command(config=tmp_path / "nowhere.yaml"))
    assert result.returncode == 2
    lines = stderr_lines(result)
    assert len(lines) == 1, lines
    assert "nowhere.yaml" in lines[0]
