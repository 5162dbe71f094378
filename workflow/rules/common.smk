# Validate the config before any rule runs, and name what every stage shares.
import os
import shlex
import sys

from connector_tax.config import ConfigError, validate_config
from connector_tax.pipeline.cells import run_order

try:
    _validated = validate_config(config)
except ConfigError as _err:
    sys.exit(f"config error: {_err}")
config.clear()
config.update(_validated)

STUDY = config["study"]
RESULTS = f"results/{STUDY}"
CONFIGS = [c["name"] for c in config["configs"]]
STUDY_CONFIG = f"{RESULTS}/study_config.yaml"
PREFLIGHT_STATUS = f"{RESULTS}/preflight/preflight_status.json"
REFERENCE_RATES = f"{RESULTS}/reference_rates.json"
RUN_ORDER = run_order(config)
# Each real-vLLM job holds one GPU (--resources gpu=N runs N side by side); the simulator none.
GPUS_PER_JOB = 1 if config["backend"] == "vllm" else 0
# Jobs run the interpreter snakemake runs under, whatever is first on PATH, or the conda
# environment's own python under --sdm conda (the environment.yml conda users install).
_CONDA = any(m.name == "CONDA" for m in workflow.deployment_settings.deployment_method)
PYTHON = "python" if _CONDA else shlex.quote(sys.executable)
ENV = "../../environment.yml"


rule study_config:
    """The validated config the servers are launched with (the file plus any --config)."""
    output:
        STUDY_CONFIG,
    log:
        f"{RESULTS}/logs/study_config.log",
    params:
        config=config,
    run:
        import yaml

        with open(output[0], "w", encoding="utf-8") as f:
            yaml.safe_dump(params.config, f, sort_keys=False)
