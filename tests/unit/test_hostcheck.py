"""Fail early, in one line: what a GPU host would trip over minutes into a vLLM study is refused
by `ctax config check` and the preflight before any launch (launch/hostcheck.py); cells that
cannot be bounded are named with the setting that would bound them."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fake_gpu_host import FakeGpuHost
from typed import study_of, typed

from connector_tax.config import ConfigError, StudyConfig, load_config
from connector_tax.launch.hostcheck import check_host
from connector_tax.launch.vllm import kv_transfer_config, mooncake_transport
from connector_tax.planning.resolution import floor_for, unbounded_warnings

REPO = Path(__file__).resolve().parents[2]
H20 = REPO / "configs" / "h20-qwen3-coder.yaml"
MODEL = "Qwen/Qwen3-Coder-30B-A3B-Instruct"


def fake_model(cache: Path, name: str = MODEL, weights: bool = True) -> None:
    snapshot = cache / f"models--{name.replace('/', '--')}" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    if weights:
        (snapshot / "model-00001-of-00016.safetensors").write_bytes(b"\0" * 16)


@pytest.fixture
def h20(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("CONNECTOR_TAX_SYSFS", str(tmp_path / "sys"))
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    fake_model(tmp_path / "hub")
    return load_config(H20)


def one_line(config: dict) -> str:
    with pytest.raises(ConfigError) as err:
        check_host(study_of(config))
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_model_that_is_not_downloaded_is_refused(h20: dict, tmp_path: Path, monkeypatch) -> None:
    check_host(study_of(h20))  # downloaded: fine
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert one_line(h20).startswith(f"model.name: {MODEL} is not in this host's Hugging Face cache")
    assert "900 s start-up limit (server.ready_timeout_s)" in one_line(h20)
    fake_model(tmp_path / "empty", weights=False)  # a config without weights is not a model yet
    assert one_line(h20).startswith("model.name:")
    dummy = copy.deepcopy(h20)
    dummy["model"]["load_format"] = "dummy"  # dummy weights: the config is all vLLM reads
    check_host(study_of(dummy))


def test_expandable_segments_is_refused_where_connectors_are(h20: dict, monkeypatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:512")
    assert one_line(h20).startswith("PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments:True,max_split_size_mb:512'")
    plain = copy.deepcopy(h20)
    plain["variants"] = [v for v in plain["variants"] if not v.get("connector")]
    check_host(study_of(plain))  # vLLM runs plain with it
    cumem = copy.deepcopy(h20)
    cumem["server"]["extra_args"] = ["--enable-cumem-allocator"]
    check_host(study_of(cumem))
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    in_variant = copy.deepcopy(h20)
    in_variant["variants"][4]["env"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert one_line(in_variant).startswith("variants[4].env.PYTORCH_CUDA_ALLOC_CONF:")


def test_an_rdma_device_the_host_lacks_is_refused(h20: dict, tmp_path: Path) -> None:
    FakeGpuHost(tmp_path, gpus=2, rdma=("mlx5_0", "mlx5_1"))  # its sysfs is the one the fixture named
    rdma = copy.deepcopy(h20)
    rdma["vllm"]["mooncake"] = {"protocol": "rdma", "device_name": "mlx5_0,mlx5_3"}
    assert one_line(rdma).startswith("vllm.mooncake.device_name: 'mlx5_3' is not an RDMA device of this host")
    rdma["vllm"]["mooncake"]["device_name"] = "mlx5_1"
    check_host(study_of(rdma))
    rdma["vllm"]["mooncake"]["device_name"] = "auto"
    check_host(study_of(rdma))
    for p in (tmp_path / "sys/class/infiniband").iterdir():
        p.rmdir()
    assert one_line(rdma).startswith("vllm.mooncake.device_name: auto: this host lists no RDMA device")


def test_auto_leaves_the_nic_to_mooncakes_own_discovery(h20: dict) -> None:
    config = copy.deepcopy(h20)
    config["vllm"]["mooncake"] = {"protocol": "rdma", "device_name": "auto"}
    assert kv_transfer_config(*typed(config, "mooncake_both"))["kv_connector_extra_config"] == {
        "mooncake_protocol": "rdma"
    }
    assert mooncake_transport(*typed(config, "mooncake_both")).startswith("rdma (auto: Mooncake's topology discovery")


def test_config_check_refuses_on_this_host_and_static_does_not(tmp_path: Path) -> None:
    env = {"PATH": str(Path(sys.executable).parent), "HF_HUB_CACHE": str(tmp_path / "nothing")}
    run = [sys.executable, "-m", "connector_tax.cli", "config", "check"]
    here = subprocess.run([*run, str(H20)], capture_output=True, text=True, env=env, cwd=REPO)
    assert here.returncode == 2
    assert len(here.stderr.strip().splitlines()) == 1
    assert here.stderr.startswith(f"{H20}: on this host: model.name: {MODEL} is not in this host's")
    assert here.stdout == ""  # no "ok" line before the refusal
    static = subprocess.run([*run, "--static", str(H20)], capture_output=True, text=True, env=env, cwd=REPO)
    assert static.returncode == 0, static.stderr


def test_the_preflight_refuses_before_any_launch(tmp_path: Path) -> None:
    config = yaml.safe_load(H20.read_text())
    config["vllm"]["executable"] = str(tmp_path / "vllm-that-must-not-run")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "HF_HUB_CACHE": str(tmp_path / "nothing"),
        "CONNECTOR_TAX_LOCKS": str(tmp_path / "locks"),
    }
    out = tmp_path / "plain.json"
    done = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "pipeline", "preflight", "check", "--config", str(path)]
        + ["--variant", "plain", "--out", str(out), "--log-dir", str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().startswith("plain: refused before any launch: model.name:")
    assert len(done.stderr.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "logs").exists()


def test_cells_that_cannot_be_bounded_are_named_with_the_fix() -> None:
    config = load_config(H20)
    config["workload"]["duration_s"] = 60
    (line,) = unbounded_warnings(StudyConfig.from_mapping(config))
    assert line.startswith("workload.duration_s 60: a Phase B cell whose shape saturates")
    assert "about 30 requests at 0.5 req/s" in line and "set workload.duration_s: 160" in line
    assert floor_for(0.5) == 160 and floor_for(4) == 20
    config["workload"]["duration_s"] = 160
    assert unbounded_warnings(StudyConfig.from_mapping(config)) == []
    config["workload"]["duration_s"] = 60
    config["workload"]["phase_b"]["overload_guard"] = False
    assert unbounded_warnings(StudyConfig.from_mapping(config)) == []


def test_a_predicted_cell_ended_at_its_floor_is_named_with_a_floor_that_bounds_it(tmp_path: Path) -> None:
    from connector_tax.contract import StudyLayout
    from connector_tax.planning.resolution import ZERO, Resolved, TaxResolution, unbounded_cells

    layout = StudyLayout(tmp_path)
    folder = layout.phase("plain", "phase_b").cell("32768x1024").summary
    folder.parent.mkdir(parents=True)
    stop = "ended at its floor: saturated at this rate (waiting p50 14 > 1); left out of H5/H6"
    folder.write_text(json.dumps({"rate": 0.5, "duration_s": 160, "stop_reason": stop}))
    none, bounded = Resolved(None, None, 63), Resolved(None, 0.1, 80)
    entries = [
        TaxResolution("phase_b 32768x1024", ZERO, "plain", none, none),
        TaxResolution("phase_b 512x64", ZERO, "plain", bounded, bounded),
    ]
    (line,) = unbounded_cells(tmp_path, entries)
    # 63 requests in 160 s: 80 (64 and two sigma) need about 203 s
    assert (
        line
        == f"phase_b 32768x1024 plain: 63 requests ({stop}); to bound it: workload.duration_s: 210 (it ends at its 160 s floor)"
    )
