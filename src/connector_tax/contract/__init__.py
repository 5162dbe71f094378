"""The study contract: what a study's results are, where they live, and when one may be reused.

This package is the single truth that writers (rules, pipeline, load generator) and readers
(analysis, manifest) share; docs/study-design.md (What is recorded) is its background.

Layout (`StudyLayout`, `PhaseLayout`, `CellFiles`)::

    results/<study>/
      study.json                  which study and backend this folder holds (one backend only)
      study_config.yaml           the validated config the study ran with (file + --config)
      preflight/                  ready_<config>.json, preflight_status.json, <config>/ logs,
                                  connector_probe.json (vLLM's errors for libraries it lacks)
      <config>/phase_a/           one server launch: run.json (its index), job.json (the job
                                  ended with a recorded outcome), launch.json (the last
                                  launch's facts), config.json, env.txt, launch.sh, server logs,
                                  raw_steps/, interventions/<launch>/ (what each declared
                                  intervention did, per process), and per cell:
                                    requests_<phase>_<label>.jsonl
                                    metrics_<phase>_<label>.jsonl
                                    engine_step_<phase>_<label>.jsonl
                                    summary_<phase>_<label>.json      (written last: the seal)
                                  .staging/<phase>_<label>/   a cell being measured
                                  superseded/<phase>_<label>.<why>.<UTC time>/   cells moved aside
      <config>/phase_b/           the Phase B launch (its run.json also indexes Phase B' cells)
      <config>/phase_b_prime/     Phase B' cells (measured in the Phase B launch)
      <config>/phase_a.r2/ ...    with workload.replicates k > 1: launch r of each phase in
                                  <phase>.r<r>/ (r = 2..k), laid out as above; the first
                                  launch keeps the folders of a study without replicates
      reference_rates.json, analysis/, MANIFEST.md, MANIFEST.tsv, logs/

Cells are the study config's (`connector_tax.config.cells`): a cell is (variant, phase, label,
replicate);
labels are `r<rate>` (Phase A) or the shape's label (`4096x256`, `mix-<hash>`,
`pattern-<hash>`), unique per phase by construction: colliding rates or repeated shapes are a
config error.

Records (`records`, `summary`, `estimate`): one msgspec Struct per record file (RequestRecord,
StepRecord, MetricsSample, ThreadSample), the cell summary (CellSummary, every field defaulted so
that older summaries decode), and an estimate with its interval and unit; writers encode them,
readers decode them (`decode_lines`, `decode_summary`).

Fingerprint (`fingerprint`): the sha256 of every setting that can change a cell's measurement
(the launch: backend, model, variant, merged server settings, simulator or vLLM settings, the
normalized launch argv and the server's versions; the cell: rate, arrival, shape, warm-up,
duration floor, min-completed, request settings and timeouts, load-generator and validity
settings, seed, the cell's traffic seed and replicate; the code of the load generator, metrics sampler, and simulator or
instrumentation). It is stored in the cell's summary and in the launch's index (run.json).

When a cell is reused: a re-run measures a cell again unless its sealed summary says complete,
carries exactly the fingerprint the current settings give, and every record file it vouches for
is present with the byte size it recorded. Otherwise its old files are moved to superseded/
(kept, never read by the analysis) and it is measured again; a label that exists with another
fingerprint is never overwritten. Failed cells are redone on the next run.

The analysis takes the cells from the study config and the launch indexes, never from a folder
listing: it verifies every fingerprint and refuses to mix fingerprints, backends or studies;
superseded and orphan folders are listed in the report and otherwise ignored.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from connector_tax.contract.estimate import Estimate
    from connector_tax.contract.layout import CELL_RECORDS, CellFiles, PhaseLayout, StudyLayout, phase_folder
    from connector_tax.contract.records import MetricsSample, RequestRecord, StepRecord, ThreadSample, decode_lines
    from connector_tax.contract.summary import CellSummary, decode_summary

# Each name's module, imported on first use (PEP 562): a load-generator worker, which needs only
# the records, then starts without the layout and the config and jsonschema behind it (~0.25 s
# of each worker's start, on the critical path of every launch).
_MODULE_OF = {
    "Estimate": "estimate",
    "CELL_RECORDS": "layout",
    "CellFiles": "layout",
    "PhaseLayout": "layout",
    "StudyLayout": "layout",
    "phase_folder": "layout",
    "MetricsSample": "records",
    "RequestRecord": "records",
    "StepRecord": "records",
    "ThreadSample": "records",
    "decode_lines": "records",
    "CellSummary": "summary",
    "decode_summary": "summary",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CELL_RECORDS",
    "CellFiles",
    "CellSummary",
    "Estimate",
    "MetricsSample",
    "PhaseLayout",
    "RequestRecord",
    "StepRecord",
    "StudyLayout",
    "ThreadSample",
    "decode_lines",
    "decode_summary",
    "phase_folder",
]
