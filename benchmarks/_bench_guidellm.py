"""guidellm as a peer of the load-generator benchmarks: one cell at a rate, and its offline
set-up (a word-level tokenizer built with guidellm's own libraries: no model hub here)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _bench_procs import MODEL, CpuMonitor, kill_tree, spawn
from _common import pct

if TYPE_CHECKING:
    from _capacity import Ctx

PROMPT_TOKENS = 64


# -- one cell of guidellm ---------------------------------------------------------------------
def run_guidellm(ctx: Ctx, rate: float, procs: int | None) -> dict[str, Any]:
    a = ctx.args
    tag = f"guidellm-p{procs or 'default'}"
    work = ctx.tmp / f"{tag}-r{rate:g}-{time.monotonic_ns()}"
    work.mkdir(parents=True)
    out = work / "out.json"
    total = a.warmup + a.seconds
    profile = {
        "kind": "constant" if a.arrival == "fixed" else "poisson",
        "rate": [rate],
        "warmup": round(a.warmup / total, 6),
    }
    cmd = [
        str(ctx.competitor_bin),
        "run",
        "--backend",
        f"kind=openai_http,target={ctx.server.url},model={MODEL},request_format=/v1/completions",
        "--profile",
        json.dumps(profile),
        "--constraint",
        f"kind=max_duration,seconds={total:g}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={a.tokens}",
        "--tokenizer",
        f"kind=hf_auto,model={a.tokenizer_dir}",
        "--metrics",
        "kind=generative,sample_size=0",
        "--output",
        f"kind=json,path={out}",
        "--disable-console",
    ]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        GUIDELLM__LOGGING__LOG_FILE=str(work / "guidellm.log"),
    )
    if procs:
        env["GUIDELLM__MAX_WORKER_PROCESSES"] = str(procs)
    limit = total + a.competitor_overhead_s
    s0 = ctx.server.stats()
    proc = spawn(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mon = CpuMonitor({"client": proc.pid, "server": ctx.server.proc.pid}).start()
    try:
        output, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        output = f"timed out after {limit:g} s"
    finally:
        kill_tree(proc)
    d = json.loads(out.read_text()) if proc.returncode == 0 and out.exists() else None
    b = d["benchmarks"][0] if d else None
    # Its measured window (epoch times in its report); the whole run where there is none.
    window = (b["scheduler_metrics"]["measure_start_time"], b["scheduler_metrics"]["measure_end_time"]) if b else None
    cpu = mon.stop(window)
    s1 = ctx.server.stats()
    cell: dict[str, Any] = {"client": tag, "rate": rate, "cpu": cpu, "server_requests": s1["requests"] - s0["requests"]}
    if b is None:
        cell.update(passed=False, reason=f"guidellm exit {proc.returncode}: {(output or '').strip()[-300:]}")
        return cell
    tot = b["metrics"]["request_totals"]
    sm = b["scheduler_metrics"]
    window = b["duration"]
    ok = tot["successful"]
    completed_rps = ok / window if window else 0.0
    # Send lateness and dispatch rate from its per-request timings, in its measured window.
    t_lo, t_hi = sm["measure_start_time"], sm["measure_end_time"]
    starts, late = [], []
    for group in ("successful", "errored", "incomplete"):
        for r in b["requests"].get(group) or []:
            t = (r.get("info") or {}).get("timings") or {}
            ts, tt = t.get("request_start"), t.get("targeted_start")
            if ts is None or tt is None or not (t_lo <= tt <= t_hi):
                continue
            starts.append(ts)
            late.append((ts - tt) * 1e6)
    late.sort()
    dispatch = (len(starts) - 1) / (max(starts) - min(starts)) if len(starts) > 1 and max(starts) > min(starts) else 0.0
    reasons = []
    if completed_rps < 0.99 * rate:
        reasons.append(f"completed {completed_rps:.1f}/s < 99% of {rate:g}")
    if tot["errored"]:
        reasons.append(f"{tot['errored']} errored")
    cell.update(
        passed=not reasons,
        reason="; ".join(reasons) or None,
        achieved_rps=round(completed_rps, 2),
        dispatch_rps=round(dispatch, 2),
        ok=ok,
        errored=tot["errored"],
        incomplete=tot["incomplete"],
        window_s=round(window, 3),
        completed_rps=round(completed_rps, 2),
        events_per_s=round(ok * ctx.events_per_stream / window, 1) if window else 0.0,
        lateness_us={"p50": pct(late, 50), "p99": pct(late, 99), "max": round(late[-1], 1) if late else None},
        requests_made=sm["requests_made"],
    )
    return cell


# -- competitor setup -----------------------------------------------------------------------
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


def find_competitor(args: argparse.Namespace) -> tuple[Path | None, str]:
    venv = Path(args.competitor_venv)
    exe, py = venv / "bin" / "guidellm", venv / "bin" / "python"
    if not exe.exists() or not py.exists():
        return None, (
            f"guidellm not found in {venv} (install: python -m venv {venv} && "
            f"{venv}/bin/pip install 'guidellm[perf]'); measuring ours only"
        )
    try:
        version = subprocess.run(
            [str(py), "-c", "import importlib.metadata as m; print(m.version('guidellm'))"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"guidellm in {venv} does not run ({exc}); measuring ours only"
    tok = Path(args.tokenizer_dir)
    if not (tok / "tokenizer.json").exists():
        try:
            subprocess.run(
                [str(py), "-c", TOKENIZER_SCRIPT, str(tok)], capture_output=True, text=True, timeout=300, check=True
            )
        except (subprocess.SubprocessError, OSError) as exc:
            return None, f"could not build an offline tokenizer for guidellm ({exc}); measuring ours only"
    return exe, f"guidellm {version}"
