"""`ctax calibrate` on records with a known answer: a study the simulator made in virtual time with a
known profile (through `snakemake`, as a user runs a study). The fit must recover every term of
that profile within 5 %, and the check of the study against the profile that made it must find
no error at all (the replay is the pipeline's own virtual run: same arrivals, shapes, cell rules).
Bad inputs are one line each, through the real entry point."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys

import pytest
import yaml
from study_runner import REPO, snakemake, write_config
from test_calibrate_units import PROFILE

from connector_tax.calibrate.check import check
from connector_tax.calibrate.fit import calibrate
from connector_tax.calibrate.study_tables import CalibrationError, read_study

pytestmark = pytest.mark.e2e

# Rates from light to heavy load and shapes from short to long prompts, so that every term of
# the step time varies; the hooks of the connector variant have a per-block term too.
KNOWN = copy.deepcopy(PROFILE)
KNOWN["kind"] = "hand-set"
KNOWN["hardware"]["kv_cache_blocks"] = 65536
KNOWN["variants"]["nixl_both"]["hooks"]["start_load_kv"] = {"fixed_us": 20, "per_request_us": 0, "per_block_us": 0}
STUDY = {
    "study": "known",
    "backend": "sim",
    "seed": 3,
    "model": {"name": "results/models/tiny-llama", "served_name": "tiny-llama"},
    "server": {"max_model_len": 2048, "max_num_batched_tokens": 2048, "max_num_seqs": 32},
    "variants": [{"name": "plain"}, {"name": "nixl_both", "connector": {"type": "nixl", "role": "kv_both"}}],
    "workload": {
        "warmup_s": 2,
        "duration_s": 20,
        "min_completed": 60,
        "request_timeout_s": 60,
        "phase_a": {"rates": [4, 12], "shape": {"input": 256, "output": 32}},
        "phase_b": {"inputs": [64, 512], "outputs": [16, 64]},
    },
    "saturation": {
        "throughput_ratio_min": 0.01,
        "waiting_p50_max": 1000,
        "ttft_p90_ratio_max": 1000,
        "min_requests": 1,
        "min_scrapes": 1,
    },
    "loadgen": {"cpu_latency_us": None},
}


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    """(results folder, profile file) of a virtual study made with the KNOWN profile."""
    folder = tmp_path_factory.mktemp("known")
    profile = folder / "known.yaml"
    profile.write_text(yaml.safe_dump(KNOWN))
    config = copy.deepcopy(STUDY)
    config["sim"] = {"clock": "virtual", "profile": str(profile)}
    result = snakemake(folder, write_config(folder, config), "all", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "results" / "known", profile


def _ctax(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "connector_tax.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_calibration_recovers_the_profile_that_made_the_records(known):
    results, _ = known
    fitted = calibrate(results, simulated_ok=True)
    hw = KNOWN["hardware"]
    for key in ("step_base_us", "prefill_token_us", "decode_seq_us", "context_token_us"):
        assert fitted.hardware[key] == pytest.approx(hw[key], rel=0.05), key
        assert fitted.fit["engine_step"]["terms"][key]["identified"], key
    for key in ("schedule_base_us", "schedule_request_us", "step_gap_us"):
        assert fitted.hardware[key] == pytest.approx(hw[key], rel=0.05), key
    assert (fitted.hardware["block_size"], fitted.hardware["kv_cache_blocks"]) == (32, 65536)
    want = KNOWN["variants"]["nixl_both"]
    got = fitted.variants["nixl_both"]
    assert got.connector == want["connector"]
    for key in ("forward_scale", "extra_us", "schedule_scale"):
        assert getattr(got, key) == pytest.approx(want[key], rel=0.05), key
    for hook, terms in want["hooks"].items():
        for term, value in terms.items():
            if value:
                assert got.hooks[hook][term] == pytest.approx(value, rel=0.05), (hook, term)
            else:  # a term the profile did not have: fitted as zero, or not identified (and not guessed)
                assert got.hooks[hook][term] == pytest.approx(0.0, abs=1e-6), (hook, term)
                quality = fitted.fit["variants"]["nixl_both"]["hooks"][hook]["terms"][term]
                assert quality["identified"] or quality["why"], (hook, term)
    # the API server's delays: the quantiles the records show are the profile's
    for kind in ("ingress_us", "egress_us"):
        truth, found = KNOWN["api"][kind], getattr(fitted.api, kind)
        for q in (5, 10, 15):  # the 25th, 50th and 75th percentiles
            assert found[q] == pytest.approx(truth[q], rel=0.05), (kind, q)
    assert fitted.variants["plain"].connector is None
    cells = fitted.provenance["cells"]
    assert len(cells) == 12 and all(c["fingerprint"] for c in cells)


def test_api_path_finds_the_path_the_profile_put_there(known, tmp_path):
    """`ctax benchmark api_path` on a study whose path is known (the profile's uniform 1-3 ms
    ingress and egress): it measures that path from the records, and with it drawn in virtual time
    its light cells' TTFT p90 is the measured one's; without it every cell is over 3 ms lower (the
    path's two medians are 4 ms)."""
    results, _ = known
    out = tmp_path / "api_path.json"
    argv = ["benchmark", "api_path", "--results", str(results), "--variants", "plain,nixl_both", "--requests", "600"]
    done = _ctax(*argv, "--json", str(out), cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(out.read_text())["results"]
    for kind in ("ingress_us", "egress_us"):
        assert got["path"][kind]["q50"] == pytest.approx(2000, rel=0.05), got["path"]
    for row in got["p90_ms"]:
        assert row["samples"] == pytest.approx(row["fit grid"], rel=0.03), row
        assert row["none"] < row["fit grid"] - 3.0, row
    # The 64x16 cells are below saturation at the study's 12 req/s (the others queue, and a long
    # virtual run queues longer than a 60-request cell: they do not compare).
    light = [row for row in got["p90_ms"] if row["cell"] == "64x16"]
    assert len(light) == 2
    for row in light:
        assert row["fit grid"] == pytest.approx(row["measured"], rel=0.1), row


def test_the_check_of_a_study_against_the_profile_that_made_it_finds_no_error(known, tmp_path):
    results, profile = known
    result = check(results, profile, simulated_ok=True).as_dict()
    assert len(result["cells"]) == 12
    for cell in result["cells"]:
        assert cell["same_arrivals"], cell
        for metric in ("ttft_p90_ms", "tpot_p90_ms", "engine_step_p50_us", "throughput_rps"):
            assert cell[metric]["error"] == pytest.approx(0.0, abs=1e-9), (cell["cell"], metric)
    assert result["taxes"] and all(t["difference"] == pytest.approx(0.0, abs=1e-9) for t in result["taxes"])
    assert result["summary"]["goals_met"] == {"ttft_p90": True, "tpot_p90": True, "taxes": True}
    # the anchors' measure: the means replay exactly; the step model at each step's own batch is
    # the profile's (within what the reconstructed context tokens and KV blocks miss)
    for cell in result["cells"]:
        for metric in ("ttft_mean_ms", "tpot_mean_ms", "e2e_mean_ms"):
            assert cell["means"][metric]["error"] == pytest.approx(0.0, abs=1e-9), (cell["cell"], metric)
    judged = [c for c in result["compositions"] if c["judged"]]
    assert len(judged) >= 4 and sum(c["steps"] for c in judged) >= 2000
    assert all(abs(c["error"]) < 0.03 for c in judged), judged
    assert result["anchors"]["goals_met"] == {
        "ttft_mean": True,
        "tpot_mean": True,
        "step": True,
        "ttft_p90_inside": True,
        "tpot_p90_inside": True,
    }


def test_the_launch_speed_diagnostic_finds_the_records_at_the_profiles_own_speed(known):
    """Records the profile made run at its speed: every launch's measured / predicted step is 1
    (within what the reconstructed context tokens and KV blocks miss), and the replay at that
    speed stays within a few percent of the records."""
    results, profile = known
    result = check(results, profile, simulated_ok=True, launch_speed=True).as_dict()
    assert set(result["launch_speeds"]) == {f"{v}/{p}" for v in ("plain", "nixl_both") for p in ("phase_a", "phase_b")}
    assert all(abs(s - 1) < 0.02 for s in result["launch_speeds"].values()), result["launch_speeds"]
    assert result["summary"]["median_abs_error"]["engine_step_p50_us"] < 0.03


def test_a_profile_for_another_model_is_refused_by_the_check(known, tmp_path):
    results, _ = known
    other = copy.deepcopy(KNOWN)
    other["model"] = ["Qwen/Qwen3-Coder-30B-A3B-Instruct"]
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(other))
    with pytest.raises(CalibrationError) as err:
        check(results, path, simulated_ok=True)
    assert "\n" not in str(err.value) and "--profile" in str(err.value) and "fitted on model Qwen" in str(err.value)


def test_results_without_step_records_are_one_line(known, tmp_path):
    """What a run without step timing leaves: every engine-step file empty, and vouched for."""
    results, _ = known
    copy_root = tmp_path / "results" / "known"
    shutil.copytree(results, copy_root)
    for step_file in copy_root.glob("*/*/engine_step_*.jsonl"):
        step_file.write_text("")
        summary_path = step_file.with_name(
            step_file.name.replace("engine_step_", "summary_").replace(".jsonl", ".json")
        )
        summary = json.loads(summary_path.read_text())
        summary["files"]["engine_step"] = {"bytes": 0, "records": 0}
        summary_path.write_text(json.dumps(summary))
    with pytest.raises(CalibrationError) as err:
        read_study(copy_root, simulated_ok=True)
    assert "\n" not in str(err.value) and "no engine-step records" in str(err.value)


def test_bad_inputs_through_ctax_calibrate_are_one_line_each(known, tmp_path):
    results, profile = known
    cases = [
        (["calibrate", str(results), "-o", str(tmp_path / "p.yaml")], "a simulated study (backend sim)"),
        (["calibrate", str(tmp_path / "nowhere"), "-o", str(tmp_path / "p.yaml")], "no such folder"),
        (["calibrate", str(tmp_path), "-o", str(tmp_path / "p.yaml")], "no study_config.yaml"),
        (["calibrate", str(results)], "-o/--out"),
        (["calibrate", "--check", str(results)], "--check needs --profile"),
        (["calibrate", "--check", str(results), "--profile", str(profile)], "a simulated study (backend sim)"),
    ]
    for argv, words in cases:
        done = _ctax(*argv, cwd=REPO)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ctax calibrate: ") and words in lines[0], (argv, done.stderr)
    assert not (tmp_path / "p.yaml").exists()
