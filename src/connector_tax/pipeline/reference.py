"""The reference-rate checkpoint: saturation of every Phase A cell, then ref_safe and ref_load.

ctax pipeline reference --config results/STUDY/study_config.yaml
"""

from __future__ import annotations

from connector_tax.analysis.reference_rates import reference_rates
from connector_tax.atomic import write_json
from connector_tax.config import load_config
from connector_tax.contract import StudyLayout


def job(config: str) -> int:
    """The reference rule's job: reference_rates.json of the study at `config`."""
    layout = StudyLayout.of(load_config(config)["study"])
    reference = reference_rates(layout.root)
    write_json(layout.reference_rates, reference)
    print(f"ref_safe={reference['ref_safe']} ref_load={reference['ref_load']}")
    return 0
