"""The study contract: labels, fingerprints, the seal, and what a cell's completeness means."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from connector_tax.config import (
    PHASE_A,
    PHASE_B,
    ConfigError,
    StudyConfig,
    Variant,
    phase_a_cells,
    phase_b_cells,
    run_order,
    shape_label,
    validate_config,
)
from connector_tax.contract import StudyLayout
from connector_tax.contract.estimate import Estimate, unit_of
from connector_tax.contract.fingerprint import cell_settings, code_versions, differences, fingerprint, launch_settings
from connector_tax.contract.index import IndexEntry, PhaseIndex, read_index, seal_cell, verify_cell
from connector_tax.contract.summary import SUMMARY_SCHEMA, FileCount, decode_summary, to_builtins
from connector_tax.loadgen.schedule.shapes import ShapeSampler

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def config() -> dict:
    return validate_config(yaml.safe_load((REPO / "configs" / "test-tiny.yaml").read_text()))


def _fingerprints(config: dict) -> dict[str, str]:
    """{config/phase/label: fingerprint} of every Phase A and Phase B cell, as the pipeline plans them."""
    out = {}
    reference = {"ref_safe": 4, "ref_load": 8}
    for variant in config["variants"]:
        launch = launch_settings(config, variant, ["argv", variant["name"]], {"server": "x"})
        code = code_versions(config["backend"])
        study = StudyConfig.from_mapping(config)
        cells = phase_a_cells(study) + phase_b_cells(study, variant["name"], reference)
        for cell in cells:
            out[f"{variant['name']}/{cell.key}"] = fingerprint(launch, cell_settings(config, cell), code)
    return out


def test_mix_and_pattern_labels_agree_with_the_load_generator() -> None:
    for shape in (
        {"input": 512, "output": 64},
        {"mix": [{"input": 1, "output": 2, "weight": 3}, {"input": 4, "output": 5}]},
        {"pattern": [{"input": 6000, "output": 16}, {"input": 128, "output": 16}]},
    ):
        assert shape_label(shape) == ShapeSampler(shape, 0).label()


@pytest.mark.parametrize(
    ("edit", "changed"),
    [
        (lambda c: c["workload"]["phase_a"]["shape"].update(input=300), {"phase_a/r4", "phase_a/r8"}),
        (lambda c: c["workload"].update(warmup_s=0.3), "all"),
        (lambda c: c["workload"].update(min_completed=6), "all"),
        (lambda c: c["workload"].update(request_timeout_s=31), "all"),
        (lambda c: c["loadgen"].update(workers=2), "all"),
        (lambda c: c.update(seed=8), "all"),
        (lambda c: c["sim"].update(hardware_profile="h20-qwen3-30b-a3b"), "all"),
        (lambda c: c["variants"][2].update(sim={"admission": {"policy": "pack"}}), "mooncake_both"),
        (lambda c: c["variants"][1].update(server={"max_num_seqs": 64}), "noop_connector"),
        (lambda c: c["variants"][1]["connector"].update(role="kv_producer"), "noop_connector"),
        (lambda c: c["variants"][0].update(env={"X": "1"}), "plain"),
        (lambda c: c["model"].update(name="other/model"), "all"),
        (lambda c: c["workload"]["arrival"].update(process="gamma", gamma_shape=0.5), "all"),
    ],
)
def test_a_measurement_setting_changes_exactly_the_cells_it_touches(config, edit, changed) -> None:
    before = _fingerprints(config)
    edited = copy.deepcopy(config)
    edit(edited)
    after = _fingerprints(validate_config(edited))
    differ = {k for k in before if before[k] != after[k]}
    if changed == "all":
        assert differ == set(before)
    elif "/" in next(iter(changed)):
        assert differ == {f"{v['name']}/{key}" for v in config["variants"] for key in changed}
    else:
        assert differ == {k for k in before if k.startswith(f"{changed}/")}


def test_analysis_only_settings_and_number_spelling_do_not_change_a_fingerprint(config) -> None:
    before = _fingerprints(config)
    edited = copy.deepcopy(config)
    edited["saturation"]["ttft_p90_ratio_max"] = 3.0  # re-analysed, never re-measured
    edited["workload"]["phase_a"]["rates"] = [4.0, 8.0]  # 8 and 8.0 are one rate
    assert _fingerprints(validate_config(edited)) == before


def test_differences_name_the_changed_key() -> None:
    assert differences({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}}) == ["a.c: 2 -> 3"]
    assert differences({"x": 1}, {"x": 1.0}) == []
    # Lists from the first element that differs, so a long argv shows what changed.
    argv = ["<python>", "-m", "connector_tax.cli", "sim", "--config", "<study_config>", "--seed", "1"]
    assert differences({"argv": argv}, {"argv": argv[:-1] + ["2"]}) == ['argv[7]: "1" -> "2"']
    assert differences({"argv": argv}, {"argv": argv + ["--x"]}) == ['argv[8:]: [] -> ["--x"]']


@pytest.mark.parametrize(
    ("edit", "where", "words"),
    [
        (lambda w: w["phase_a"].update(rates=[100, 100.000001]), "workload.phase_a.rates[1]", "same cell label r100"),
        (
            lambda w: w["phase_b"].update(shapes=[{"input": 128, "output": 16}]),
            "workload.phase_b.shapes[0]",
            "repeats the shape of workload.phase_b (inputs x outputs: 128x16)",
        ),
        (
            lambda w: w["phase_b_prime"].update(shapes=[{"input": 1, "output": 2}, {"input": 1, "output": 2}]),
            "workload.phase_b_prime.shapes[1]",
            "repeats the shape",
        ),
    ],
)
def test_colliding_labels_are_a_one_line_config_error(config, edit, where, words) -> None:
    edit(config["workload"])
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert str(err.value).startswith(f"{where}: ") and words in str(err.value) and "\n" not in str(err.value)


def test_phase_b_runs_in_another_seeded_order(config) -> None:
    study = StudyConfig.from_mapping(validate_config(config))
    study = dataclasses.replace(study, variants=tuple(Variant(f"c{i}", None, {"name": f"c{i}"}) for i in range(8)))
    assert run_order(study, PHASE_A) == run_order(study, PHASE_A)
    assert run_order(study, PHASE_A) != run_order(study, PHASE_B)
    assert sorted(run_order(study, PHASE_B)) == sorted(run_order(study, PHASE_A))


def _staged_cell(layout: StudyLayout, label: str = "r4") -> tuple:
    phase = layout.phase("plain", PHASE_A)
    staging, final = phase.staging(label), phase.cell(label)
    staging.folder.mkdir(parents=True)
    staging.requests.write_text('{"request_id": "a"}\n{"request_id": "b"}\n')
    staging.metrics.write_text('{"t_ns": 1}\n')
    staging.summary.write_text(json.dumps({"complete": True, "counts": {"ok": 2}}))
    (staging.folder / f"chunks_{staging.stem}_w0.jsonl").write_text("{}\n")
    return staging, final


def test_a_sealed_cell_vouches_for_its_files_and_their_sizes(tmp_path) -> None:
    layout = StudyLayout(tmp_path / "study")
    staging, final = _staged_cell(layout)
    summary = seal_cell(staging, final, "f" * 64)
    assert summary.files is not None
    assert summary.files["requests"].records == 2 and summary.files["engine_step"] == FileCount(0, 0)
    assert not staging.folder.exists() and not staging.folder.parent.exists()
    assert {p.name for p in final.existing()} == {
        "requests_phase_a_r4.jsonl",
        "metrics_phase_a_r4.jsonl",
        "engine_step_phase_a_r4.jsonl",
        "threads_phase_a_r4.jsonl",  # no thread sample in the window: an empty file, vouched for
        "summary_phase_a_r4.json",
        "chunks_phase_a_r4_w0.jsonl",
    }
    assert verify_cell(final, "f" * 64) == (True, "")
    assert verify_cell(final, "e" * 64) == (False, "measured with other settings (fingerprint differs)")
    with open(final.requests, "a") as fh:
        fh.write('{"request_id": "c"}\n')
    ok, why = verify_cell(final, "f" * 64)
    assert not ok and why.startswith("requests_phase_a_r4.jsonl has")
    final.requests.write_text('{"request_id": "a"}\n{"request_id": "b"}\n')
    assert verify_cell(final, "f" * 64) == (True, "")
    final.metrics.unlink()
    assert verify_cell(final)[1] == "metrics_phase_a_r4.jsonl is missing"


def test_an_unsealed_or_failed_cell_is_not_complete(tmp_path) -> None:
    layout = StudyLayout(tmp_path / "study")
    staging, final = _staged_cell(layout)
    final.folder.mkdir(parents=True, exist_ok=True)
    final.summary.write_text(json.dumps({"complete": True}))  # the load generator's own summary, not a seal
    assert verify_cell(final) == (False, "summary was not sealed by the pipeline")
    seal_cell(staging, final, "f" * 64, status="failed", reason="server exited with code -9 during the cell")
    ok, why = verify_cell(final, "f" * 64)
    assert not ok and why == "failed: server exited with code -9 during the cell"


def test_the_index_round_trips_and_rejects_another_schema(tmp_path) -> None:
    index = PhaseIndex(
        study="s",
        variant="plain",
        phase=PHASE_A,
        backend="sim",
        launch={"a": 1},
        code={"b": 2},
        cells=[IndexEntry(PHASE_A, "r4", "f" * 64, {"rate": 4}, status="complete")],
    )
    path = tmp_path / "run.json"
    index.write(path)
    again = read_index(path)
    assert again == index
    doc = json.loads(path.read_text())
    assert doc["cells_run"] == ["phase_a/r4"] and doc["simulated"] is True
    path.write_text(json.dumps({**doc, "schema": "something/else"}))
    assert read_index(path) is None


def _held(written: object, back: object) -> bool:
    """Every key and value of `written` is in `back` (which may have more keys: new defaults)."""
    if isinstance(written, dict) and isinstance(back, dict):
        return all(k in back and _held(v, back[k]) for k, v in written.items())
    if isinstance(written, list) and isinstance(back, list):
        return len(written) == len(back) and all(_held(a, b) for a, b in zip(written, back))
    return written == back


def test_a_summary_sealed_before_the_typed_record_reads_whole() -> None:
    """A sealed summary as the pipeline wrote it before CellSummary existed (a simulated Phase A
    cell): it decodes, every field it holds comes back unchanged, and a summary with fewer fields
    (an older writer) or more (a newer one) decodes too."""
    raw = (Path(__file__).parents[1] / "data" / "sealed_summary_before_types.json").read_bytes()
    summary = decode_summary(raw)
    assert summary.schema == SUMMARY_SCHEMA and summary.complete and summary.files is not None
    assert summary.validity.host_busy is True and summary.host is not None and summary.host.busy  # a busy host
    assert _held(json.loads(raw), to_builtins(summary))  # every value written comes back
    old = decode_summary(json.dumps({"complete": True, "counts": {"ok": 2}, "a_field_from_later": 1}))
    assert old.counts.ok == 2 and old.counts.error == 0 and old.validity.valid and old.host is None
    with pytest.raises(ValueError, match="not a cell summary"):
        decode_summary(json.dumps({"counts": {"ok": "two"}}))


def test_an_estimate_reads_its_interval_and_unit_from_the_analysis_document() -> None:
    est = Estimate.of({"value": 0.12, "ci": [0.05, 0.2], "note": "paired"}, unit_of("ttft_p90"))
    assert (est.value, est.lo, est.hi, est.unit, est.note) == (0.12, 0.05, 0.2, "relative", "paired")
    assert Estimate.of({"value": 3.0, "ci": [None, 4.0]}, unit_of("step_p50_us")).interval is None
    assert unit_of("step_p50_us") == "us"
    with pytest.raises(ValueError, match="no unit"):
        unit_of("ttft_p99")
    den = {"denominator": "multi", "value": 0.01, "ci": [-0.02, 0.04], "half_width": 0.03, "why": "covers 0"}
    assert Estimate.of({"value": None, "ci": None, "unresolved": den}, "ratio").unresolved.half_width == 0.03
