"""Config files as a user gives them: YAML errors, duplicate keys, empty or odd files, each one line
prefixed with the file; and `ctax config check`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from config_errors import config_error, raw_config

from connector_tax import cli
from connector_tax.config import (
    ConfigError,
    load_config,
    ok_line,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["configs/default.yaml", "configs/h20-qwen3-coder.yaml", "configs/test-tiny.yaml"]


_raw = raw_config
_error = config_error


# --------------------------------------------------------------------------- files


def _write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line = str(info.value)
    assert "\n" not in line, line
    return line


def test_load_errors_are_prefixed_with_the_file(tmp_path: Path) -> None:
    config = _raw()
    config["variants"][2]["name"] = "Mooncake Both"
    path = _write(tmp_path, yaml.safe_dump(config))
    assert _load_error(path) == f"{path}: variants[2].name: 'Mooncake Both' does not match ^[a-z0-9][a-z0-9_-]*$"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert _load_error(path) == f"{path}: no such file"


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "study: x\nmodel:\n  name: m\n  served_name: [unclosed\nvariants: []\n")
    line = _load_error(path)
    assert line.startswith(f"{path}: line ")
    assert "YAML syntax error" in line


def test_yaml_syntax_error_line_number(tmp_path: Path) -> None:
    path = _write(tmp_path, "study: x\nbackend: sim\nmodel: {name: m\n")
    line = _load_error(path)
    assert line.startswith(f"{path}: line 4, column 1: YAML syntax error:"), line


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "study: x\nbackend: sim\nstudy: y\n")
    assert (
        _load_error(path)
        == f"{path}: line 3, column 1: YAML syntax error: duplicate key 'study' (first given on line 1)"
    )


def test_yaml_merge_key_overrides_are_not_duplicates(tmp_path: Path) -> None:
    text = (REPO / "configs/test-tiny.yaml").read_text()
    text = text.replace(
        "  - name: plain\n",
        "  - name: plain\n    server: &small {max_num_seqs: 8, max_num_batched_tokens: 2048}\n"
        "  - name: plain_4\n    server: {<<: *small, max_num_seqs: 4}\n",
    )
    config = load_config(_write(tmp_path, text))
    assert config["variants"][1]["server"] == {"max_num_seqs": 4, "max_num_batched_tokens": 2048}


def test_top_level_a_list(tmp_path: Path) -> None:
    path = _write(tmp_path, "- study: x\n- backend: sim\n")
    assert _load_error(path) == f"{path}: (top level): expected a mapping of study settings, got a list"


def test_empty_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "# nothing\n")
    assert _load_error(path).startswith(f"{path}: (top level): the file is empty")


def test_directory(tmp_path: Path) -> None:
    assert _load_error(tmp_path) == f"{tmp_path}: is a directory, not a config file"


# --------------------------------------------------------------------------- ctax config check


def test_ok_line() -> None:
    line = ok_line("configs/test-tiny.yaml", load_config("configs/test-tiny.yaml"))
    assert line == "ok: configs/test-tiny.yaml: study 'test-tiny', 3 variants, backend sim"


def test_cli_config_check_ok(capsys: pytest.CaptureFixture[str]) -> None:
    # --static: the file only (the host checks need the model downloaded: test_hostcheck.py)
    path = str(REPO / "configs/h20-qwen3-coder.yaml")
    assert cli.main(["config", "check", "--static", path]) == 0
    out, err = capsys.readouterr()
    assert out == f"ok: {path}: study 'h20-qwen3-coder', 10 variants, backend vllm\n"
    assert err == ""


def test_cli_config_check_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _raw()
    config["sim"]["admission"] = {"lookahed": 8}
    path = _write(tmp_path, yaml.safe_dump(config))
    assert cli.main(["config", "check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"{path}: sim.admission: unknown key 'lookahed' (did you mean 'lookahead'?)"]


def test_cli_config_check_subprocess(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "config", "check", "configs/default.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0] == "ok: configs/default.yaml: study 'default', 8 variants, backend sim"
    # its 3 s floor leaves a saturated Phase B cell too few requests for an interval: said, not refused
    assert [line.split(":")[0] for line in lines[1:]] == ["warning"]

    bad = _write(tmp_path, "study: x\nmodel: {name: m}\nvariants: [{name: plain}]\nworkload: {}\n")
    failed = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "config", "check", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 2
    assert failed.stdout == ""
    assert failed.stderr.splitlines() == [f"{bad}: workload: missing required keys 'phase_a', 'phase_b'"]
