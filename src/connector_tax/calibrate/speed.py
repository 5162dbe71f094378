"""`ctax calibrate --check --launch-speed`: the check again with each launch's own host speed.

A profile is fitted on one study, on one day's host; a study checked against it ran on another
day, and on a shared host every launch finds a different share of the CPU (on the development
host the same vLLM's decode step differed by up to 5x between launches an hour apart). That is
not something the engine model can predict before a study runs. To tell it apart from what the
model gets wrong, this diagnostic measures each launch's speed from the checked study's own
engine-step records: the ratio of the measured to the profile's predicted step time over the
launch's scheduled steps (the same batches, the profile's costs). The replay then scales that
launch's model time (forward and the scheduler's share) by it. The latencies are still the
simulator's prediction from the arrivals; only the steps' mean speed is taken from the
measurement. It is a diagnostic, never the headline: the check's goals are judged without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from connector_tax.calibrate.study_tables import StudyData
from connector_tax.config import LAUNCH_OF
from connector_tax.config.profile import EngineProfile, VariantProfile, dump_profile


def predicted_step(profile: EngineProfile, variant: VariantProfile | None, steps: pd.DataFrame) -> np.ndarray:
    """The profile's engine step (forward, with the variant's scale and offset, plus its hooks)
    for each row of a step table (study_tables.py)."""
    hw = profile.hardware
    forward = (
        hw["step_base_us"]
        + hw["prefill_token_us"] * steps["prefill_tokens"].fillna(0).to_numpy()
        + hw["decode_seq_us"] * steps["decode_tokens"].fillna(0).to_numpy()
        + hw["context_token_us"] * steps["context_tokens"].fillna(0).to_numpy()
    )
    if variant is None:
        return np.asarray(forward, dtype=float)
    total = forward * variant.forward_scale + variant.extra_us
    running = steps["num_running"].fillna(0).to_numpy()
    blocks = steps["blocks"].fillna(0).to_numpy()
    for terms in variant.hooks.values():
        total = total + terms["fixed_us"] + terms["per_request_us"] * running + terms["per_block_us"] * blocks
    return np.asarray(total, dtype=float)


def launch_speeds(profile: EngineProfile, data: StudyData) -> dict[tuple[str, str], float]:
    """{(variant, launch phase): measured / predicted engine time over the launch's steps}."""
    out: dict[tuple[str, str], float] = {}
    for cell in data.cells:
        key = (cell.variant, LAUNCH_OF[cell.phase])
        if key in out:
            continue
        frames = [c.steps for c in data.cells if (c.variant, LAUNCH_OF[c.phase]) == key]
        steps = pd.concat(frames, ignore_index=True)
        tokens = steps["prefill_tokens"].fillna(0) + steps["decode_tokens"].fillna(0)
        steps = steps[steps["step_duration_us"].notna() & (tokens > 0)]
        connector = data.study.settings.variant(cell.variant).connector
        fitted = profile.variant_for(cell.variant, None if connector is None else dict(connector))
        predicted = predicted_step(profile, fitted, steps)
        if len(steps) and predicted.sum() > 0:
            out[key] = float(steps["engine_step_us"].sum() / predicted.sum())
    return out


def at_speed(
    profile: EngineProfile, variant: str, connector: Mapping[str, Any] | None, speed: float, folder: Path
) -> Path:
    """A copy of the profile whose `variant` runs `speed` times slower, written under `folder`."""
    fitted = profile.variant_for(variant, connector) or VariantProfile(
        connector=None if connector is None else dict(connector)
    )
    slowed = dataclasses.replace(
        fitted,
        forward_scale=fitted.forward_scale * speed,
        extra_us=fitted.extra_us * speed,
        schedule_scale=fitted.schedule_scale * speed,
    )
    variants = {**profile.variants, variant: slowed}
    copy = dataclasses.replace(profile, variants=variants)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"profile.{variant}.{speed:.4f}.yaml"
    path.write_text(dump_profile(copy), encoding="utf-8")
    return path
