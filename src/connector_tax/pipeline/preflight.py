"""Pre-flight readiness: does each configuration's server start and serve one streamed request?

A configuration that fails is SKIP with its reason; that is a result, not an error, so the
study goes on without it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from connector_tax.atomic import write_json
from connector_tax.config import ConfigError, StudyConfig, Variant, load_study
from connector_tax.contract import StudyLayout
from connector_tax.contract.layout import now_iso
from connector_tax.launch.command import SIDECAR_PORTS, launch_spec, sidecar_names
from connector_tax.launch.hostcheck import check_host
from connector_tax.measure.cellplan import launch_digest
from connector_tax.planning.job_resources import GATE_S
from connector_tax.serving.gpus import Gpu, gpu_env, gpu_lease, wait_released
from connector_tax.serving.lifecycle import AncestorWatch, GroupWatchdog, die_with_parent, stop_on_signals
from connector_tax.serving.server_process import ServerProcess, ServerStartError, free_port, ready_timeout_s
from connector_tax.serving.sidecar import Sidecars
from connector_tax.serving.slurm import adopt


def _one_streamed_request(url: str, model: str) -> None:
    body = {
        "model": model,
        "prompt": list(range(1, 17)),
        "max_tokens": 4,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(timeout=30.0) as client, client.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise ServerStartError(f"test request answered HTTP {resp.status_code}: {resp.read()[:200]!r}")
        if not any(line.strip() == "data: [DONE]" for line in resp.iter_lines()):
            raise ServerStartError("test request's stream did not end with data: [DONE]")


def run_group(argv: list[str], env: dict[str, str], timeout_s: float) -> int:
    """Run a script in its own process group and take the whole group down with it: on return,
    on timeout, on any exception, and (watchdog, parent-death signal) if this process dies. A
    verify script's `vllm serve` never outlives it."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env, start_new_session=True, preexec_fn=die_with_parent)
    watchdog = GroupWatchdog(proc.pid)
    try:
        return proc.wait(timeout_s)
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            if sig == signal.SIGTERM:
                time.sleep(2.0)
        proc.wait()
        watchdog.release()


def _on_gpu(gpu: Gpu | None, study: StudyConfig, variant: Variant) -> dict[str, str]:
    """The environment of a launch on `gpu`, once its memory is released (serving.gpus)."""
    if gpu is None:
        return {}
    wait_released(gpu.index, float(study.server_of(variant).get("gpu_memory_utilization") or 0.0))
    return gpu_env(gpu.index)


STATUS_FILE = "preflight_status.json"  # what a verify script writes in its OUT_DIR (tools/README.md)


def run_gate(study: StudyConfig, name: str, script: Path, out_dir: Path) -> dict[str, Any]:
    """The study's verify script for a gated vLLM configuration (tools/verify_*.sh), run with a
    run ID of its own that it must write back into its verdict. The verdict counts only when it
    is this run's and the script exited 0 (gate_verdict); everything else is a SKIP saying why."""
    variant = study.variant(name)
    port = free_port(study.host, block=3)
    run = uuid.uuid4().hex
    start_s = ready_timeout_s(study, variant)
    argv = ["bash", str(script), str(study.source), str(out_dir), "--only", name, "--port", str(port)]
    argv += ["--start-timeout", f"{start_s:g}", "--run", run]
    timeout_s = start_s + GATE_S
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with gpu_lease("vllm", device=study.device) as gpu:
            # The script asks this package (for_tools, launch-command) through this interpreter:
            # without it, it looks for `ctax` on PATH, absent when snakemake runs from a venv
            # that was never activated, and every gated variant would SKIP.
            env = {**os.environ, "CTAX_PYTHON": sys.executable, **_on_gpu(gpu, study, variant)}
            code = run_group(argv, env, timeout_s=timeout_s)
        status, reason = gate_verdict(out_dir / STATUS_FILE, name, run, code, script.name)
    except subprocess.TimeoutExpired:
        status, reason = "skip", f"{script.name} timed out after {timeout_s:g} s and was stopped"
    except (OSError, RuntimeError) as exc:
        status, reason = "skip", f"{script.name} could not run: {_one_line(exc)}"
    return {"variant": name, "status": status, "reason": reason, "backend": "vllm", "gate": script.name, "run": run}


def gate_verdict(path: Path, name: str, run: str, code: int, script: str) -> tuple[str, str | None]:
    """(status, reason) of a verify script that exited with `code`: its verdict for `name` in
    `path` when the script exited 0 and the verdict is stamped with this `run`; else "skip" with
    one line saying what was wrong. The status file lives in a log folder that outlives runs: an
    entry without this run's stamp is an earlier run's (or a script's that ignored --run), and a
    script that failed has no verdict to trust, whatever the file says."""
    verdict, missing = _verdict_of_run(path, name, run)
    if code != 0:
        ended = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        if verdict is None:
            return "skip", f"{script} {ended} and gave no verdict of this run ({missing})"
        if verdict["status"] == "ok":
            return (
                "skip",
                f"{script} {ended} though its verdict says ok ({verdict.get('reason')}): a failed check passes nothing",
            )
        return "skip", f"{verdict.get('reason') or 'skip'} ({script} {ended})"
    if verdict is None:
        return "skip", f"{script} exited 0 but gave no verdict of this run: {missing}"
    return verdict["status"], verdict.get("reason")


def _verdict_of_run(path: Path, name: str, run: str) -> tuple[dict[str, Any] | None, str]:
    """`name`'s entry of the status file when it is this run's and says ok or skip, else (None, why not)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"no {path}"
    except (OSError, ValueError) as exc:
        return None, f"{path} unreadable: {_one_line(exc)}"
    entry = doc.get(name) if isinstance(doc, dict) else None
    if not isinstance(entry, dict):
        return None, f"no verdict for {name} in {path}"
    if entry.get("run") != run:
        stamped = f"stamped run {entry['run']}" if entry.get("run") else "with no run stamp"
        when = f", checked at {entry['checked_at']}" if entry.get("checked_at") else ""
        return None, f"the verdict for {name} in {path} is another run's ({stamped}{when}; this run is {run})"
    if entry.get("status") not in ("ok", "skip"):
        return None, f"the verdict for {name} in {path} says {entry.get('status')!r}, neither ok nor skip"
    return entry, ""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def check_readiness(study: StudyConfig, name: str, log_dir: Path) -> dict[str, Any]:
    """ok, or SKIP with the reason: any failure to launch is a result, never a traceback."""
    try:
        return _readiness(study, study.variant(name), log_dir)
    except Exception as exc:  # noqa: BLE001 - every launch error is this configuration's SKIP
        return {
            "variant": name,
            "status": "skip",
            "reason": f"{type(exc).__name__}: {exc}",
            "backend": study.backend,
        }


def missing_library(study: StudyConfig, variant: Variant, env: dict[str, str], cache: Path) -> dict[str, Any] | None:
    """Why the first connector library of `variant` cannot serve vLLM here, found without a launch
    (launch/connector_probe.py); None when every library is there and usable, or the probe cannot
    tell: the real launch decides then. The answer's `kind`:

    * "absent": vLLM's Python cannot import the package; `error` is vLLM's own start-up error;
    * "broken": the package is there but the module vLLM imports from it fails (Mooncake's engine
      without libibverbs.so.1); `error` is that import's error, which vLLM hides;
    * "degraded": the library imports but says, by its own check, that it cannot serve vLLM's
      worker on this host (LMCache 0.5.6 on CPU): vLLM would start and run it degraded, which is
      a SKIP, never a measurement.

    The package check runs every time (a library installed since is launched for real). vLLM's
    errors and the libraries' own checks cost imports (seconds to tens of seconds), so they are
    probed once and kept in `cache` (preflight/connector_probe.json) for the same interpreter,
    PYTHONPATH and versions."""
    from connector_tax.launch.connector_probe import LIBRARIES, libraries, probe
    from connector_tax.launch.provenance import server_versions
    from connector_tax.launch.vllm_install import installed_vllm

    libs = libraries(variant)
    if not libs:
        return None
    try:
        python = installed_vllm(study.vllm_executable).python
    except ValueError:
        return None
    quick = probe(python, env, libs, errors=False)
    for lib in libs:
        answer = quick[lib]
        if answer.get("present") is False and answer.get("error"):  # there, but does not import
            return {"library": lib, "python": python, "kind": "broken", **answer}
    absent = [lib for lib in libs if quick[lib].get("present") is False]
    checked = [lib for lib in libs if quick[lib].get("present") is True and lib == "lmcache"]
    if not absent and not checked:
        return None
    key = {"python": python, "pythonpath": env.get("PYTHONPATH"), "server_versions": server_versions(study)}
    kept = _read(cache) or {}
    if kept.get("key") != key:
        kept = {"key": key}
    answers, works = kept.get("libraries") or {}, kept.get("works") or {}
    if any(lib not in answers for lib in absent):
        answers = probe(python, env, list(LIBRARIES), errors=True)
        kept.update(probed=now_iso(), libraries=answers)
        write_json(cache, kept)
    if any(lib not in works for lib in checked):
        works = {**works, **probe(python, env, checked, errors=False, works=True)}
        kept.update(probed=kept.get("probed") or now_iso(), works=works)
        write_json(cache, kept)
    for lib in libs:
        answer = answers.get(lib) or {}
        if lib in absent and answer.get("present") is False and answer.get("error"):
            return {"library": lib, "python": python, "probed": kept["probed"], "kind": "absent", **answer}
        check = works.get(lib) or {}
        if lib in checked and check.get("works") is False and check.get("error"):
            return {"library": lib, "python": python, "probed": kept["probed"], "kind": "degraded", **check}
    return None


def _probe_skip(name: str, missing: dict[str, Any]) -> dict[str, Any]:
    kind, error, by = missing.get("kind", "absent"), missing["error"], missing["raised_by"]
    if kind == "broken":
        reason = (
            f"{error} ({by} fails in vLLM's Python, found without a launch; vLLM would only say "
            f"'{missing['library'].capitalize()} is not available')"
        )
    elif kind == "degraded":
        reason = (
            f"{error} ({by}, asked in vLLM's Python without a launch: {missing.get('consequence')}; "
            "a connector that comes up degraded is not measured)"
        )
    else:
        packages = " or ".join(f"'{p}'" for p in missing.get("packages") or [missing["library"]])
        # "vllm....MooncakeConnectorWorker" or "import lmcache.x (vllm....)"
        by = "its " + by.split(" (")[0] if by.startswith("import ") else by.rsplit(".", 1)[-1]
        reason = f"{error} (vLLM's own error, from {by} in vLLM's Python, without a launch: no {packages} there)"
    return {"variant": name, "status": "skip", "reason": reason, "backend": "vllm", "probe": missing}


def _readiness(study: StudyConfig, typed: Variant, log_dir: Path) -> dict[str, Any]:
    name, backend = typed.name, study.backend
    host = typed.host or study.host
    port = free_port(host, block=3 if backend == "vllm" else 1)
    sidecar_ports = {n: free_port(host, block=SIDECAR_PORTS) for n in sidecar_names(study, typed)}
    spec = launch_spec(str(study.source), study, typed, port, sidecars=sidecar_ports)
    if backend == "vllm":
        from connector_tax.launch.vllm import preflight_script

        # A connector library vLLM's Python lacks: vLLM's own error, without a launch that can only fail.
        missing = missing_library(study, typed, spec.env, StudyLayout.of(study.study).preflight_probe)
        if missing is not None:
            return _probe_skip(name, missing)
        script = preflight_script(study, name)
        if script is not None:
            return run_gate(study, name, script, log_dir)
        if study.preflight_gated_only:
            # One vLLM start-up saved where launches run one at a time; the probe above has
            # already refused a missing library, and a phase launch that fails records its reason.
            return {
                "variant": name,
                "status": "ok",
                "reason": None,
                "backend": backend,
                "launched": False,
                "note": "not launched (vllm.preflight_launch: gated): its first phase launch is its readiness check",
            }
    url = spec.url or f"http://{host}:{port}"
    model = study.model.served
    started = time.monotonic()
    try:
        with gpu_lease(backend, device=study.device) as gpu:
            spec.env.update(_on_gpu(gpu, study, typed))
            # Sidecars first (an LMCache MP server): ready before the server starts, stopped after it.
            with Sidecars(spec.sidecars, log_dir) as sidecars, ServerProcess(spec, url, log_dir) as server:
                server.wait_ready(ready_timeout_s(study, typed), sidecars.failure)
                sidecars.check_registered()  # the server's connector reached its sidecar
                ready_s = time.monotonic() - started
                _one_streamed_request(server.url, model)
                if (why := sidecars.failure()) is not None:
                    raise ServerStartError(why)
    except (ServerStartError, httpx.HTTPError, RuntimeError) as exc:
        return {"variant": name, "status": "skip", "reason": str(exc), "backend": backend}
    out: dict[str, Any] = {
        "variant": name,
        "status": "ok",
        "reason": None,
        "backend": backend,
        "ready_s": round(ready_s, 3),
    }
    if spec.sidecars:
        out["sidecars"] = [
            f"{s.name}: {s.label}, ready" + (" and registered" * bool(s.registered)) for s in spec.sidecars
        ]
    return out


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def merge_status(parts: list[Path]) -> dict[str, Any]:
    statuses = [json.loads(p.read_text(encoding="utf-8")) for p in parts]
    return {s["variant"]: {k: v for k, v in s.items() if k != "variant"} for s in statuses}


def check_job(config: str, variant: str, out: Path, log_dir: Path, placement: str) -> int:
    """The preflight rule's job for one variant: its readiness verdict into `out`."""
    stop_on_signals()
    try:
        adopt(placement)
    except RuntimeError as exc:
        print(f"{variant}: {exc}", file=sys.stderr)
        return 2
    study = load_study(config)
    try:  # what this host would fail on minutes into every launch, refused before the first
        check_host(study)
    except ConfigError as exc:
        print(f"{variant}: refused before any launch: {exc}", file=sys.stderr)
        return 2
    # The verdict says which launch settings it checked: a phase job takes it for those only.
    digest = launch_digest(study, config, variant)
    with AncestorWatch():
        result = check_readiness(study, variant, log_dir)
    write_json(out, {**result, "launch": digest})
    why = result.get("reason") or result.get("note")
    print(f"{variant}: {result['status']}" + (f" ({why})" if why else ""))
    return 0


def merge_job(out: Path, parts: list[Path]) -> int:
    """The preflight rule's closing job: the variants' verdicts in one file."""
    stop_on_signals()
    write_json(out, merge_status(parts))
    return 0
