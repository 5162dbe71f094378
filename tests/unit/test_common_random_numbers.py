"""Common random numbers: in the same (phase, cell, replicate) every variant gets the same
arrival schedule, the same shapes and the same prompts (token ids), on both clocks; another cell
or another replicate gets traffic of its own; the cell's summary records its traffic seed."""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
from pathlib import Path

from typed import typed

from connector_tax.config import PHASE_A, PHASE_B, load_study, planned_cells
from connector_tax.config.cells import traffic_seed
from connector_tax.contract.layout import CellFiles
from connector_tax.loadgen.schedule.options import LoadgenOptions
from connector_tax.loadgen.schedule.realtime import RealTimeRun, Session
from connector_tax.loadgen.schedule.rules import CellRules
from connector_tax.loadgen.stats.collect import Progress
from connector_tax.loadgen.worker.prompts import BodyBuilder, BodySettings, prompt_key
from connector_tax.oracle.virtual_run import VirtualTimeRun
from connector_tax.sim.settings import resolve

REPO = Path(__file__).resolve().parents[2]
T0 = 10**12


def _study():
    return load_study(REPO / "configs" / "default.yaml")


def test_every_variant_plans_the_same_traffic_seed_per_cell_and_replicate():
    study = _study()
    reference = {"ref_safe": 16, "ref_load": 32}
    plans = {
        (name, r): planned_cells(study, name, phase, reference, replicate=r)
        for name in ("plain", "mooncake_both")
        for phase in (PHASE_A, PHASE_B)
        for r in (1, 2)
    }
    seeds = {
        (name, r, c.key): c.seed for (name, r), cells in plans.items() for c in cells if c.phase != "phase_b_prime"
    }
    keys = {(r, key) for (_, r, key) in seeds}
    for r, key in keys:
        assert seeds[("plain", r, key)] == seeds[("mooncake_both", r, key)]  # common to the variants
    per_replicate = {r: [seeds[("plain", r, key)] for rr, key in sorted(keys) if rr == r] for r in (1, 2)}
    assert len(set(per_replicate[1])) == len(per_replicate[1])  # every cell its own traffic
    assert set(per_replicate[1]).isdisjoint(per_replicate[2])  # every replicate its own traffic
    cell = plans[("plain", 2)][0]
    assert cell.seed == traffic_seed(study.seed, cell.phase, cell.label, 2)
    assert cell.settings()["traffic_seed"] == cell.seed and cell.settings()["replicate"] == 2
    assert "replicate" not in plans[("plain", 1)][0].settings()  # replicate 1: as before


def _virtual(tmp_path: Path, variant: str, cell) -> tuple[dict, list[dict]]:
    config = _study().raw
    files = CellFiles(tmp_path / variant, cell.phase, cell.label)
    options = LoadgenOptions(url="virtual:", model="m", seed=config["seed"])
    settings = resolve(*typed(config, variant), {})
    summary = VirtualTimeRun(settings, cell, options, files, T0, lambda: True, lambda: False, [], 1.0).run()
    return summary, [json.loads(line) for line in files.requests.read_text().splitlines()]


def _real_schedule(cell, n: int) -> list[tuple[int, int, int, str]]:
    """The real-time run's first n (offset, input, output, prompt key), without a server."""
    options = LoadgenOptions(url="http://127.0.0.1:9", model="m", seed=_study().seed)
    session = Session(options, None, [Progress()], threading.Event(), None)  # type: ignore[arg-type]
    run = RealTimeRun(session, cell, [Path("/nonexistent")], None, None)
    run.rules = CellRules(cell, options, 0)
    return [
        (t, spec.input_len, spec.output_len, spec.prompt_key)
        for t, spec in itertools.islice(run._schedule(0), n)  # noqa: SLF001 - the schedule itself
    ]


def test_both_clocks_send_every_variant_the_same_requests(tmp_path):
    study = _study()
    mix = {"mix": [{"input": 64, "output": 8}, {"input": 256, "output": 16, "weight": 2}]}
    base = planned_cells(study, "plain", PHASE_A, None)[0]
    cell = dataclasses.replace(base, shape=mix, duration_s=2.0, min_completed=5, warmup_s=0.5)
    plain_summary, plain = _virtual(tmp_path, "plain", cell)
    _, mooncake = _virtual(tmp_path, "mooncake_both", cell)
    assert plain_summary.traffic_seed == cell.seed and plain_summary.replicate == 1
    sent = [(r["t_scheduled_ns"] - T0, r["input_len"], r["output_len"]) for r in plain]
    assert sent == [(r["t_scheduled_ns"] - T0, r["input_len"], r["output_len"]) for r in mooncake]
    assert len({s[1] for s in sent}) == 2  # the mix drew both shapes
    real = _real_schedule(cell, len(sent))
    assert [(t, i, o) for t, i, o, _ in real] == sent  # the real-time clock sends the same
    assert [k for *_, k in real] == [prompt_key(cell.seed, i) for i in range(len(sent))]
    # The token ids the worker sends are the ones the virtual clock hands the engine.
    builder = BodyBuilder(BodySettings(model="m"), study.seed)
    body = json.loads(builder.body(real[3][3], 300, 8, None))
    assert body["prompt"] == builder.token_id_list(prompt_key(cell.seed, 3), 300)
    other = dataclasses.replace(cell, replicate=2, seed=traffic_seed(study.seed, cell.phase, cell.label, 2))
    assert [t for t, *_ in _real_schedule(other, 20)] != [t for t, *_ in real[:20]]
    assert builder.token_id_list(prompt_key(other.seed, 3), 300) != body["prompt"]


def test_a_cell_measured_again_sends_the_same_schedule_with_prompts_of_its_own():
    """The server's prefix cache holds the first attempt's prompts: sent again, 7 of 8 KV blocks
    of a 128-token prompt hit and the cell's TTFT falls (a knee hidden, the default study's
    ref_safe 32). A later attempt keeps the schedule and shapes and draws fresh token ids, on
    both clocks (the virtual one takes its key from the same function)."""
    study = _study()
    cell = planned_cells(study, "plain", PHASE_A, None)[0]
    again = dataclasses.replace(cell, attempt=2)
    first, second = _real_schedule(cell, 30), _real_schedule(again, 30)
    assert [s[:3] for s in first] == [s[:3] for s in second]
    assert [k for *_, k in first] == [prompt_key(cell.seed, i) for i in range(30)]  # attempt 1: as before
    builder = BodyBuilder(BodySettings(model="m"), study.seed)
    for (*_, k1), (*_, k2) in zip(first, second):
        assert k1 != k2
        assert builder.token_id_list(k1, 128)[:16] != builder.token_id_list(k2, 128)[:16]  # no first block shared
    assert again.settings() == cell.settings()  # not a setting: the fingerprint stays
    assert again.describe()["attempt"] == 2 and "attempt" not in cell.describe()
