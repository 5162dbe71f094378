"""The reference-rate checkpoint: saturation of every Phase A cell, then ref_safe and ref_load.

    python -m connector_tax.pipeline.reference --config STUDY.yaml --results results/STUDY
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from connector_tax.analysis.saturation import reference_rates
from connector_tax.config import load_config
from connector_tax.atomic import write_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connector_tax.pipeline.reference")
    parser.add_argument("--config", required=True)
    parser.add_argument("--results", required=True, type=Path)
    args = parser.parse_args(argv)
    reference = reference_rates(args.results, load_config(args.config))
    write_json(args.results / "reference_rates.json", reference)
    print(f"ref_safe={reference['ref_safe']} ref_load={reference['ref_load']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
